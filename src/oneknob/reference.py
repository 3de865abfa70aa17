"""The reference: what each job's prompt logprobs are compared with.

By default the same model, corpus and samples with `enforce_eager=true` and
`spec.k=0` (the `reference` block of the config). One request per sample at the
longest length gives every shorter prefix's reference too (causal scoring), so
a reference is measured once per (engine and versions, hardware, model, corpus,
samples, reference knobs), stored as a file that later sweeps reuse, and
logged as its own MLflow run with role `reference`.

That prefix property is checked, not assumed: the reference is also measured
at the shortest grid length and compared, per token and with the verdict's
tolerances, with the prefix sliced from the long measurement. A reference
config that is itself length-dependent (graphs and speculation on: the very
fault under study) fails that check, and the job stops before any verdict
(`ReferenceMismatch`, naming `reference`). The short measurements are stored
in the same file, so a later job re-checks without starting an engine.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from oneknob import store
from oneknob.executor import worker_for
from oneknob.plan import JobPlan
from oneknob.tracking import JournaledTracker, flat_params
from oneknob.verdict import judge, mean, mean_nll


@dataclass(frozen=True)
class Reference:
    logprobs: tuple[tuple[float, ...], ...]  # per sample: positions 1..max_length-1
    max_length: int
    run_id: str | None

    def prefix(self, sample: int, length: int) -> list[float]:
        return list(self.logprobs[sample][: length - 1])


class ReferenceMismatch(RuntimeError):
    """The reference config scores a prefix differently from the same tokens inside a longer prompt."""


def _path(plan: JobPlan) -> Path:
    key = plan.cache_key(plan.reference_knobs)
    return Path(plan.cache_dir) / "references" / f"{store.digest(key)}.json"


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _measure(plan: JobPlan, path: Path, lengths: list[int], on_wait) -> tuple[dict[int, list], object]:
    """{length: per-sample logprobs} from one reference engine, and its Ready record."""
    worker = worker_for(plan, plan.reference_knobs, path.with_suffix(".worker.log"), role="reference")
    with worker:
        ready = worker.start(on_wait)
        return {length: [worker.prompt_logprobs(plan.corpus.prompt(length, s))[0] for s in range(plan.samples)]
                for length in lengths}, ready


def self_check(plan: JobPlan, reference: Reference, length: int, logprobs: list[list[float]]) -> None:
    """Raise ReferenceMismatch when the reference measured at `length` differs from its own sliced prefix."""
    for sample, measured in enumerate(logprobs):
        point = judge(length, sample, measured, 0.0, reference.prefix(sample, length), plan.verdict)
        if point.polluted:
            raise ReferenceMismatch(
                f"reference={json.dumps(plan.reference_knobs)}: the reference config is itself length-dependent: "
                f"measured at {length} tokens (sample {sample}) its mean NLL is {point.nll:.3f}, but the first "
                f"{length} tokens of its {reference.max_length}-token measurement give {point.nll_ref:.3f} "
                f"(|delta| {abs(point.delta_nll):.3f} > verdict.tol_nll={plan.verdict.tol_nll:g} and > "
                f"verdict.rtol_nll={plan.verdict.rtol_nll:g} of it; {point.share_deviating:.0%} of its tokens "
                f"deviate by > verdict.tol_token={plan.verdict.tol_token:g}), so no verdict can be drawn against "
                "it and none was recorded. Pick a reference with graphs off and no speculation, e.g. "
                "reference.cudagraph.enforce_eager=true reference.spec.k=0 (the default reference)")


def get_or_measure(plan: JobPlan, tracker: JournaledTracker, *, on_wait=None, console=None) -> Reference:
    """The stored reference for this plan (measured first if there is none long enough), self-checked at the
    shortest grid length; raises ReferenceMismatch when the check fails."""
    path = _path(plan)
    longest, shortest = max(plan.lengths), min(plan.lengths)
    with store.locked(path.with_suffix(".lock")):
        data = _read(path)
        if data is None or data["max_length"] < longest:
            data = _measure_new(plan, tracker, path, longest, shortest, on_wait, console)
        elif shortest < data["max_length"] and str(shortest) not in data.get("checks", {}):
            if console:
                console.print(f"[bold]reference[/]: checking the stored reference at {shortest} tokens")
            measured, _ = _measure(plan, path, [shortest], on_wait)
            data.setdefault("checks", {})[str(shortest)] = measured[shortest]
            store.write_json_atomic(path, data)
    reference = Reference(tuple(map(tuple, data["logprobs"])), data["max_length"], data.get("run_id"))
    if shortest < reference.max_length:
        self_check(plan, reference, shortest, data["checks"][str(shortest)])
    return reference


def _measure_new(plan: JobPlan, tracker: JournaledTracker, path: Path, longest: int, shortest: int, on_wait,
                 console) -> dict:
    """Measure the reference at the longest length (and the shortest, for the self-check) into a new run."""
    if console:
        console.print(f"[bold]reference[/]: measuring {plan.samples} sample(s) at {longest} tokens (and at "
                      f"{shortest} to check it) with {plan.reference_knobs} (once; later sweeps reuse it)")
    run_id = tracker.start_run(f"reference {longest}", {"oneknob.role": "reference",
                                                         "oneknob.sweep_id": plan.sweep.id if plan.sweep else ""})
    try:
        measured, ready = _measure(plan, path, sorted({longest, shortest}), on_wait)
        logprobs = measured[longest]
        tracker.log_params(run_id, flat_params("knob.", plan.reference_knobs)
                           | flat_params("resolved.", ready.resolved)
                           | {"model": plan.worker["model"]["path"], "corpus.fingerprint": plan.corpus.fingerprint,
                              "samples": plan.samples, "max_length": longest, "check_length": shortest})
        tracker.log_metrics(run_id, [("nll_ref", mean([mean_nll(lp[: length - 1]) for lp in logprobs]), length)
                                     for length in plan.lengths])
        data = {"key": plan.cache_key(plan.reference_knobs), "max_length": longest, "logprobs": logprobs,
                "checks": {str(shortest): measured[shortest]} if shortest < longest else {}, "run_id": run_id,
                "resolved": ready.resolved, "provenance": ready.provenance, "time": time.time()}
        store.write_json_atomic(path, data)  # kept even when the check fails: later jobs fail without an engine
        tracker.log_artifact(run_id, path)
        if shortest < longest:
            self_check(plan, Reference(tuple(map(tuple, logprobs)), longest, run_id), shortest,
                       measured[shortest])
        tracker.finish(run_id, "FINISHED")
    except ReferenceMismatch as exc:
        tracker.set_tags(run_id, {"oneknob.error": str(exc)[:1000]})
        tracker.finish(run_id, "FAILED")
        raise
    except BaseException:
        tracker.finish(run_id, "FAILED")
        raise
    return data
