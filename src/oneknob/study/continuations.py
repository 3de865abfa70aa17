"""The reference's scores of the engine's continuations: what the decode oracles (greedy, decode) judge by.

The engine generates; the reference scores what it generated, teacher-forced: one prefill request over the
prompt followed by the engine's continuation, with the top-1 at every position, gives each generated token's
reference logprob and the reference's own choice after the same prefix (oneknob.verdict.decode). A score
depends on the continuation, so it exists only after the engine's request: each is stored once under the
reference's folder, `continuations/<length>-<sample>-<digest of the tokens>.json`, so a continuation any job
produced before (a variant that generates what the baseline did, a rerun) costs no reference request.

Scores a round of lengths lacks come from one reference engine (`reference`'s PerLength session): where the
job's engine and the reference may run side by side (vLLM's CPU build, whose shares are of host RAM; the
simulation), it starts on the first score the store lacks and stays up for the job's search; where two
engines cannot share the device (a GPU, where vLLM claims `gpu_memory_utilization` of it), the job's engine is
stopped before the reference starts, and the reference after the round (the job's engine restarts for the
next round of the search, if there is one). Either way two engines never hold one GPU at once.
"""

from __future__ import annotations

from pathlib import Path

from oneknob.plan.jobs import JobPlan
from oneknob.record import store, validate
from oneknob.study import reference as reference_mod


class Scorer:
    def __init__(self, plan: JobPlan, *, on_wait=None, console=None, stop_engine=None):
        self.plan, self.console, self.stop_engine = plan, console, stop_engine
        self.folder = reference_mod.store_dir(plan) / "continuations"
        self.session = reference_mod.PerLength(plan, reference_mod.store_dir(plan).with_suffix(".worker.log"), on_wait,
                                               topk=1, folder=None)
        self.requests = 0  # reference requests this job made (the rest came from the store)

    def _path(self, length: int, sample: int, tokens: list[int]) -> Path:
        return self.folder / f"{length}-{sample}-{store.digest({'tokens': [int(t) for t in tokens]})}.json"

    def scores(self, wanted: dict[tuple[int, int], list[int]]) -> dict[tuple[int, int], dict]:
        """{(length, sample): {"logprobs", "argmax"}} of each continuation (its generated tokens only)."""
        found, missing = {}, {}
        for (length, sample), tokens in wanted.items():
            path = self._path(length, sample, tokens)
            stored = store.read_json_or_set_aside(path, "the stored continuation score",
                                                  check=lambda data, t=tokens: validate.continuation_problem(data, t)) \
                if path.exists() else None
            if stored is not None:
                found[(length, sample)] = stored
            else:
                missing[(length, sample)] = tokens
        if missing:
            found |= self._measure(missing)
        return found

    def _measure(self, missing: dict[tuple[int, int], list[int]]) -> dict[tuple[int, int], dict]:
        plan, exclusive = self.plan, self.plan.exclusive_device
        if exclusive and self.stop_engine is not None:
            self.stop_engine()  # the job's engine gives the device back before the reference takes it
        if self.console and not self.session.running:
            self.console.print(f"  reference: scoring {len(missing)} continuation(s) of {plan.verdict.greedy_tokens} "
                               f"token(s) teacher-forced ({reference_mod.describe(plan)})")
        keys = sorted(missing)
        prompts = [plan.corpus.prompt(L, s) + [int(t) for t in missing[(L, s)]] for L, s in keys]
        try:
            results = self.session.tokens(prompts, topk=1)
        finally:
            if exclusive:
                self.session.stop()
        self.requests += len(keys)
        found = {}
        self.folder.mkdir(parents=True, exist_ok=True)
        for (length, sample), result in zip(keys, results):
            rows = result["topk"][length - 1:]  # row i predicts token i + 1: the generated tokens' rows
            score = {"length": length, "sample": sample, "tokens": [int(t) for t in missing[(length, sample)]],
                     "logprobs": result["logprobs"][length - 1:], "argmax": [int(row[0][0]) for row in rows]}
            path = self._path(length, sample, missing[(length, sample)])
            if not path.exists():  # content-addressed: written once, a concurrent writer's stays
                store.write_json_atomic(path, score)
            found[(length, sample)] = score
        return found

    def close(self) -> None:
        self.session.stop()

    @property
    def cost(self) -> str:
        return f"{self.requests} reference request(s) for continuations this job"

