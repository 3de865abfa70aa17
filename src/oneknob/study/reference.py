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

from oneknob.record import store
from oneknob.study.bookkeeping import error_text
from oneknob.run.executor import worker_for
from oneknob.plan.jobs import JobPlan
from oneknob.record.tracking import JournaledTracker, flat_params
from oneknob.verdict.judge import judge, mean, mean_nll


@dataclass(frozen=True)
class Reference:
    logprobs: tuple[tuple[float, ...], ...]  # per sample: positions 1..max_length-1
    max_length: int
    run_id: str | None
    topk: tuple | None = None  # per sample: the top-k rows of positions 1..max_length-1 (oracle topk)

    def prefix(self, sample: int, length: int) -> list[float]:
        return list(self.logprobs[sample][: length - 1])

    def prefix_topk(self, sample: int, length: int) -> list | None:
        return None if self.topk is None else list(self.topk[sample][: length - 1])


class ReferenceMismatch(RuntimeError):
    """The reference config scores a prefix differently from the same tokens inside a longer prompt."""


def key(plan: JobPlan) -> dict:
    """What decides the reference: its knobs (a vLLM reference) or its engine and dtype (transformers)."""
    return plan.cache_key(plan.reference_knobs) | {"reference_engine": plan.reference_engine,
                                                    "reference_dtype": plan.reference_dtype}


def _path(plan: JobPlan) -> Path:
    return Path(plan.cache_dir) / "references" / f"{store.digest(key(plan))}.json"


def describe(plan: JobPlan) -> str:
    """The reference in words, for the console and reports."""
    if plan.reference_engine == "transformers":
        from oneknob.engines.transformers import dtype_name

        return f"HF transformers, eager, {dtype_name(plan.worker['model']['dtype'], plan.reference_dtype)}"
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in plan.reference_knobs.items())


def _topk(plan: JobPlan) -> int:
    return plan.verdict.topk if "topk" in plan.oracles else 0


def _read(path: Path) -> dict | None:
    """The stored reference; a corrupt file is set aside (never deleted), named, and measured afresh."""
    return store.read_json_or_set_aside(path, "the stored reference")


def _measure(plan: JobPlan, path: Path, lengths: list[int], on_wait, *, topk: int = 0,
             greedy: int = 0) -> tuple[dict[int, list[dict]], object]:
    """{length: per-sample scores} from one reference engine, and its Ready record."""
    outside = plan.reference_engine == "transformers"  # else the job's own engine (vLLM, or its simulation)
    worker = worker_for(plan, plan.reference_knobs, path.with_suffix(".worker.log"), role="reference",
                        engine="transformers" if outside else None, options={"reference_dtype": plan.reference_dtype})
    try:
        ready = worker.start(on_wait)
        return {length: [worker.score(plan.corpus.prompt(length, s), topk=topk, greedy=greedy)
                         for s in range(plan.samples)] for length in lengths}, ready
    except KeyboardInterrupt:
        worker.stop(grace_s=0)  # one Ctrl-C is enough: no waiting for the engine to wind down
        raise
    finally:
        worker.stop()


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
        if data is None or data["max_length"] < longest or data.get("topk_k", 0) < _topk(plan):
            data = _measure_new(plan, tracker, path, longest, shortest, on_wait, console)
        elif shortest < data["max_length"] and str(shortest) not in data.get("checks", {}):
            if console:
                console.print(f"[bold]reference[/]: checking the stored reference at {shortest} tokens")
            measured, _ = _measure(plan, path, [shortest], on_wait)
            data.setdefault("checks", {})[str(shortest)] = [m["logprobs"] for m in measured[shortest]]
            store.write_json_atomic(path, data)
    reference = Reference(tuple(map(tuple, data["logprobs"])), data["max_length"], data.get("run_id"),
                          tuple(data["topk"]) if data.get("topk") else None)
    if shortest < reference.max_length:
        self_check(plan, reference, shortest, data["checks"][str(shortest)])
    return reference


def _measure_new(plan: JobPlan, tracker: JournaledTracker, path: Path, longest: int, shortest: int, on_wait,
                 console) -> dict:
    """Measure the reference at the longest length (and the shortest, for the self-check) into a new run."""
    if console:
        console.print(f"[bold]reference[/]: measuring {plan.samples} sample(s) at {longest} tokens (and at "
                      f"{shortest} to check it) with {describe(plan)} (once; later sweeps reuse it)")
    run_id = tracker.start_run(f"reference {longest}", {"oneknob.role": "reference",
                                                         "oneknob.sweep_id": plan.sweep.id if plan.sweep else ""})
    try:
        greedy = plan.verdict.greedy_tokens if "greedy" in plan.oracles else 0
        lengths = sorted({longest, shortest, *(plan.lengths if greedy else ())})  # grid continuations in one go
        measured, ready = _measure(plan, path, lengths, on_wait, topk=_topk(plan), greedy=greedy)
        logprobs = [m["logprobs"] for m in measured[longest]]
        knob_params = {} if plan.reference_engine == "transformers" else flat_params("knob.", plan.reference_knobs)
        tracker.log_params(run_id, knob_params | flat_params("resolved.", ready.resolved)
                           | flat_params("provenance.", ready.provenance)
                           | {"reference_engine": plan.reference_engine, "model": plan.worker["model"]["path"],
                              "corpus.fingerprint": plan.corpus.fingerprint, "samples": plan.samples,
                              "max_length": longest, "check_length": shortest})
        tracker.log_metrics(run_id, [("nll_ref", mean([mean_nll(lp[: length - 1]) for lp in logprobs]), length)
                                     for length in plan.lengths])
        data = {"key": key(plan), "max_length": longest, "logprobs": logprobs,
                "topk": [m["topk"] for m in measured[longest]] if _topk(plan) else None, "topk_k": _topk(plan),
                "checks": {str(shortest): [m["logprobs"] for m in measured[shortest]]} if shortest < longest else {},
                **({"greedy": {str(L): [m["greedy"] for m in measured[L]] for L in lengths}, "greedy_tokens": greedy}
                   if greedy else {}),
                "run_id": run_id,
                "resolved": ready.resolved, "provenance": ready.provenance, "time": time.time()}
        store.write_json_atomic(path, data)  # kept even when the check fails: later jobs fail without an engine
        tracker.log_artifact(run_id, path)
        if shortest < longest:
            self_check(plan, Reference(tuple(map(tuple, logprobs)), longest, run_id), shortest,
                       data["checks"][str(shortest)])
        tracker.finish(run_id, "FINISHED")
    except KeyboardInterrupt:
        tracker.finish(run_id, "KILLED")
        raise
    except Exception as exc:  # the check, an engine failure, a full disk: this reference run fails, named
        tracker.set_tags(run_id, {"oneknob.error": error_text(exc)[:1000]})
        tracker.finish(run_id, "FAILED")
        raise
    return data


def greedy_continuations(plan: JobPlan, lengths: list[int], on_wait=None, console=None) -> dict[tuple, list[int]]:
    """{(length, sample): the reference's greedy continuation} (oracle greedy). A continuation depends on the
    whole prompt, so unlike logprobs it is measured per length: once, in one reference engine session for all
    the lengths the stored reference lacks, and stored beside it."""
    path, greedy = _path(plan), plan.verdict.greedy_tokens
    with store.locked(path.with_suffix(".lock")):
        data = _read(path) or {}
        stored = data.get("greedy", {}) if data.get("greedy_tokens") == greedy else {}
        missing = [L for L in lengths if str(L) not in stored]
        if missing:
            if console:
                console.print(f"[bold]reference[/]: greedy continuations of {greedy} tokens at {missing}")
            measured, _ = _measure(plan, path, missing, on_wait, greedy=greedy)
            stored |= {str(L): [m["greedy"] for m in measured[L]] for L in missing}
            if data:  # beside the stored reference (a reference measured this very job is always there)
                store.write_json_atomic(path, data | {"greedy": stored, "greedy_tokens": greedy})
    return {(L, s): stored[str(L)][s] for L in lengths for s in range(plan.samples)}
