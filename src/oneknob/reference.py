"""The reference: what each job's prompt logprobs are compared with.

By default the same model, corpus and samples with `enforce_eager=true` and
`spec.k=0` (the `reference` block of the config). One request per sample at the
longest length gives every shorter prefix's reference too (causal scoring), so
a reference is measured once per (engine and versions, hardware, model, corpus,
samples, reference knobs), stored as a file that later sweeps reuse, and
logged as its own MLflow run with role `reference`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from oneknob import store
from oneknob.executor import Worker
from oneknob.plan import JobPlan
from oneknob.tracking import JournaledTracker, flat_params
from oneknob.verdict import mean, mean_nll


@dataclass(frozen=True)
class Reference:
    logprobs: tuple[tuple[float, ...], ...]  # per sample: positions 1..max_length-1
    max_length: int
    run_id: str | None

    def prefix(self, sample: int, length: int) -> list[float]:
        return list(self.logprobs[sample][: length - 1])


def _path(plan: JobPlan) -> Path:
    key = plan.cache_key(plan.reference_knobs)
    return Path(plan.cache_dir) / "references" / f"{store.digest(key)}.json"


def _load(path: Path, needed: int) -> Reference | None:
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if data["max_length"] < needed:
        return None
    return Reference(tuple(map(tuple, data["logprobs"])), data["max_length"], data.get("run_id"))


def get_or_measure(plan: JobPlan, tracker: JournaledTracker, *, on_wait=None, console=None) -> Reference:
    """The stored reference for this plan, measured first if there is none long enough."""
    path = _path(plan)
    needed = max(plan.lengths)
    with store.locked(path.with_suffix(".lock")):
        found = _load(path, needed)
        if found is not None:
            return found
        if console:
            console.print(f"[bold]reference[/]: measuring {plan.samples} sample(s) at {needed} tokens "
                          f"with {plan.reference_knobs} (once; later sweeps reuse it)")
        ref_plan = plan.with_knobs(plan.reference_knobs)
        run_id = tracker.start_run(f"reference {needed}", {"oneknob.role": "reference",
                                                            "oneknob.sweep_id": plan.sweep.id if plan.sweep else ""})
        worker = Worker(ref_plan.worker, path.with_suffix(".worker.log"), **plan.timeouts,
                        record_path=Path(plan.cache_dir) / "workers.jsonl", role="reference")
        try:
            with worker:
                ready = worker.start(on_wait)
                logprobs = [worker.prompt_logprobs(plan.corpus.prompt(needed, s))[0]
                            for s in range(plan.samples)]
            tracker.log_params(run_id, flat_params("knob.", plan.reference_knobs)
                               | flat_params("resolved.", ready.resolved)
                               | {"model": plan.worker["model"]["path"],
                                  "corpus.fingerprint": plan.corpus.fingerprint, "samples": plan.samples,
                                  "max_length": needed})
            tracker.log_metrics(run_id, [("nll_ref", mean([mean_nll(lp[: length - 1]) for lp in logprobs]), length)
                                         for length in plan.lengths])
            store.write_json_atomic(path, {"key": plan.cache_key(plan.reference_knobs), "max_length": needed,
                                           "logprobs": logprobs, "run_id": run_id, "resolved": ready.resolved,
                                           "provenance": ready.provenance, "time": time.time()})
            tracker.log_artifact(run_id, path)
            tracker.finish(run_id, "FINISHED")
        except BaseException:
            tracker.finish(run_id, "FAILED")
            raise
        return Reference(tuple(map(tuple, logprobs)), needed, run_id)
