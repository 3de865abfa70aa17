"""The reference: what each job's prompt logprobs are compared with.

By default the same model, corpus and samples with `enforce_eager=true` and
`spec.k=0` (the `reference` block of the config), or HF transformers
(`reference_engine=transformers`). One request per sample at the longest length
gives every shorter prefix's reference too (causal scoring) when the reference
is prefix-consistent. That is checked, not assumed: the reference is also
measured at the shortest grid length and, with `reference_per_length=auto`, at
every candidate threshold q inside the grid (q and q+1: the engine's resolved
quantities, the model's config.json length fields, the knobs' values), and
compared, per token and with the verdict's tolerances, with the prefix sliced
from the long measurement.

When that check fails:
* for a reference that is not a configuration under study (`reference_engine=transformers`: HF legitimately
  scores a 128-token prompt differently from the first 128 tokens of a 1024-token one when the model's
  positional scaling switches at a length its config declares), the reference is measured at every length
  the search needs (one request per length and sample, the cost said), and why is said ("it changes between
  L and L+1: model.X = L");
* for a vLLM reference (or its simulation) the reference cannot judge: the job stops before any verdict
  (`ReferenceMismatch`, naming the reference engine actually used); `reference_per_length=true` measures it
  per length anyway (for a reference known to be length-dependent by design), `false` never does.

Stored measurements are content-addressed and never replaced by a different one: under
`references/<digest of the key>/` a long measurement per maximum length (`long-<N>.k<topk>.json`), one
file per directly measured length (`at-<L>.k<topk>.json`) and, for the decode oracles, one per scored
continuation (`continuations/`, oneknob.study.continuations), each written once. A job takes the shortest
long measurement that covers its grid (its own, when it measured one), so a rerun gives the verdicts it gave
before whatever ran in between.
Each new long measurement is logged as its own MLflow run with role `reference`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from oneknob.console import say
from oneknob.engines.answers import reason_text
from oneknob.record import store, validate
from oneknob.study.job_end import error_text
from oneknob.run import devices
from oneknob.run.executor import worker_for
from oneknob.plan.jobs import JobPlan
from oneknob.record.journaled import JournaledTracker
from oneknob.record.tracking import flat_params
from oneknob.verdict.judge import judge, mean, mean_nll
from oneknob.verdict.oracles import TopKTable


from oneknob.config import knobs
from oneknob.config.quantities import derived_quantities
from oneknob.config.schema import default_reference_knobs


@dataclass
class Reference:
    logprobs: tuple[tuple[float, ...], ...]  # per sample: positions 1..max_length-1
    max_length: int
    run_id: str | None
    topk: tuple | None = None  # per sample: the top-k rows of positions 1..max_length-1 (oracle topk)
    # per-length mode: length -> (per-sample logprobs, per-sample top-k rows or None), measured directly
    per_length: dict[int, tuple[list, list | None]] | None = None
    session: PerLength | None = None  # measures a length per_length lacks
    why: str | None = None  # why the reference is measured per length
    # two engines may not share the device (JobPlan.exclusive_device): the job's engine is stopped (this
    # callback) before the reference starts, and the reference after each measurement
    stop_engine: object = None
    device: str | None = None  # where its longest-length run ran (oneknob.run.devices.of); None: an older store
    # per sample: self.topk's rows read into arrays once (prefix_topk)
    _tables: dict[int, TopKTable] = field(default_factory=dict, init=False, repr=False, compare=False)

    def _at(self, length: int) -> tuple[list, list | None]:
        self.prefetch([length])
        return self.per_length[length]

    def _measure(self, lengths: list[int]) -> None:
        exclusive = self.session.plan.exclusive_device
        if exclusive and self.stop_engine is not None:
            self.stop_engine()
        try:
            self.per_length |= self.session.measure(lengths)
        finally:
            if exclusive:
                self.session.stop()

    def prefix(self, sample: int, length: int) -> list[float]:
        if self.per_length is not None:
            return list(self._at(length)[0][sample])
        return list(self.logprobs[sample][: length - 1])

    def prefix_topk(self, sample: int, length: int) -> list | TopKTable | None:
        """The reference's top-k rows of a prompt of `length` tokens. Sliced from the long measurement's table,
        read into arrays once per sample, not once per length: what a length's judgement does between two
        engine requests."""
        if self.per_length is not None:
            rows = self._at(length)[1]
            return None if rows is None else list(rows[sample])
        if self.topk is None:
            return None
        if sample not in self._tables:
            rows = self.topk[sample]
            self._tables[sample] = TopKTable.read(rows, max(map(len, rows), default=0))
        return self._tables[sample][: length - 1]

    def prefetch(self, lengths) -> None:
        """Measure these lengths now, in one reference session (per-length mode; else nothing to do)."""
        if self.per_length is not None and (missing := sorted(set(lengths) - set(self.per_length))):
            self._measure(missing)

    @property
    def cost(self) -> str | None:
        """The per-length mode's cost in words (for the console, the report and the run's tags)."""
        if self.per_length is None:
            return None
        n, measured = len(self.per_length), self.session.measured if self.session else 0
        return (f"reference measured per length: {n} length(s) x {self.session.plan.samples} sample(s) "
                f"({measured} request(s) this job, the rest stored)")

    def close(self) -> None:
        if self.session is not None:
            self.session.stop()


class ReferenceMismatch(RuntimeError):
    """The reference config scores a prefix differently from the same tokens inside a longer prompt."""


class ReferenceMalformed(ReferenceMismatch):
    """The reference answered a request wrongly in shape or with NaN / inf (oneknob.engines.answers): what every
    job is judged against cannot judge, so the sweep stops as for a reference that fails its own check."""


def key(plan: JobPlan) -> dict:
    """What decides the reference: its knobs (a vLLM reference) or its engine and dtype (transformers)."""
    return plan.cache_key(plan.reference_knobs) | {"reference_engine": plan.reference_engine,
                                                    "reference_dtype": plan.reference_dtype}


def store_dir(plan: JobPlan) -> Path:
    return Path(plan.cache_dir) / "references" / store.digest(key(plan))


def describe(plan: JobPlan) -> str:
    """The reference in words, for the console and reports."""
    if plan.reference_engine == "transformers":
        from oneknob.engines.transformers import dtype_name

        return f"HF transformers, eager, {dtype_name(plan.worker['model']['dtype'], plan.reference_dtype)}"
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in plan.reference_knobs.items())


def engine_text(plan: JobPlan) -> str:
    """The reference engine actually used, named as the command line sets it."""
    if plan.reference_engine == "transformers":
        return f"reference_engine=transformers ({describe(plan)})"
    return f"reference={json.dumps(plan.reference_knobs)} on engine={plan.engine}"


def topk_of(plan: JobPlan) -> int:
    return plan.verdict.topk if "topk" in plan.oracles else 0


def _read(path: Path) -> dict | None:
    """The stored reference; a corrupt file is set aside (never deleted), named, and measured afresh."""
    return store.read_json_or_set_aside(path, "the stored reference",
                                        check=lambda data: validate.reference_problem(path.name, data))


def _write_once(path: Path, data: dict) -> dict:
    """Content-addressed: a stored measurement is never replaced (a concurrent writer's stays); the stored one."""
    if not path.exists():
        store.write_json_atomic(path, data)
    return _read(path)


def _find(folder: Path, prefix: str, at_least: int, k: int) -> Path | None:
    """The stored `<prefix>-<N>.k<K>.json` with the smallest N >= at_least (exactly at_least for "at") and
    K >= k: deterministic, so a rerun takes the file it took before."""
    found = []
    for path in folder.glob(f"{prefix}-*.k*.json"):
        n, kk = path.name[len(prefix) + 1: -len(".json")].split(".k")
        if int(n) >= at_least and (prefix != "at" or int(n) == at_least) and int(kk) >= k:
            found.append((int(n), int(kk), path))
    return min(found)[2] if found else None


def _measure(plan: JobPlan, log_path: Path, lengths: list[int], on_wait, *,
             topk: int = 0, before_start=None) -> tuple[dict[int, list[dict]], object]:
    """{length: per-sample scores} from one reference engine, and its Ready record."""
    session = PerLength(plan, log_path, on_wait, topk=topk, folder=None, before_start=before_start)
    try:
        return session.score(lengths), session.ready
    finally:
        session.stop()


class PerLength:
    """One reference engine, started on first use and kept until `stop()`: measures lengths on demand (the
    per-length mode: lengths the search asks for while the job's own engine runs), each stored once."""

    def __init__(self, plan: JobPlan, log_path: Path, on_wait, *, topk: int, folder: Path | None,
                 before_start=None):
        self.plan, self.log_path, self.on_wait, self.topk = plan, log_path, on_wait, topk
        self.folder, self.worker, self.ready, self.measured = folder, None, None, 0
        self.before_start = before_start  # called before its engine starts: the job's engine leaves the device

    @property
    def running(self) -> bool:
        return self.worker is not None

    def _worker(self):
        plan = self.plan
        if self.worker is None:
            if self.before_start is not None:
                self.before_start()
            outside = plan.reference_engine == "transformers"  # else the job's own engine (vLLM, or its simulation)
            self.worker = worker_for(plan, plan.reference_knobs, self.log_path, role="reference",
                                     engine="transformers" if outside else None,
                                     options={"reference_dtype": plan.reference_dtype})
            self.ready = self.worker.start(self.on_wait)
        return self.worker

    def tokens(self, prompts: list[list[int]], topk: int) -> list[dict]:
        """Any token sequences, one request each (the decode oracles' teacher-forced scores)."""
        worker = self._worker()
        try:
            results = worker.score_all(prompts, topk=topk)
        except KeyboardInterrupt:
            worker.stop(grace_s=0)  # one Ctrl-C is enough: no waiting for the engine to wind down
            raise
        for prompt, result in zip(prompts, results):
            if result.get("malformed"):
                raise ReferenceMalformed(
                    f"the reference ({describe(self.plan)}) answered a {len(prompt)}-token request "
                    f"{reason_text(result['malformed'])}: a reference that answers wrongly cannot judge any job; "
                    "pick another reference (reference=..., or reference_engine=transformers / vllm)")
        return results

    def score(self, lengths: list[int]) -> dict[int, list[dict]]:
        plan = self.plan
        prompts = [plan.corpus.prompt(L, s) for L in lengths for s in range(plan.samples)]
        scores = iter(self.tokens(prompts, self.topk))
        self.measured += len(prompts)
        return {L: [next(scores) for _ in range(plan.samples)] for L in lengths}

    def measure(self, lengths: list[int]) -> dict[int, tuple[list, list | None]]:
        """{length: (per-sample logprobs, per-sample top-k)} from the store, else measured and stored once."""
        found, missing = {}, []
        with store.locked(self.folder / "lock"):
            for L in lengths:
                path = _find(self.folder, "at", L, self.topk)
                if stored := (_read(path) if path else None):  # a corrupt file was set aside: measured again
                    found[L] = stored
                else:
                    missing.append(L)
            if missing:
                for L, scores in self.score(missing).items():
                    found[L] = _write_once(self.folder / f"at-{L}.k{self.topk}.json", {
                        "key": key(self.plan), "length": L, "logprobs": [m["logprobs"] for m in scores],
                        "topk": [m["topk"] for m in scores] if self.topk else None, "time": time.time()})
        return {L: (d["logprobs"], d.get("topk")) for L, d in found.items()}

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None


def default_reference(plan: JobPlan) -> bool:
    """Whether this vLLM reference already is the default one (graphs off, no speculation)."""
    return all(plan.reference_knobs.get(k) == v for k, v in knobs.flatten(default_reference_knobs()).items())


def _mismatch(plan: JobPlan, long: Reference, length: int, logprobs: list[list[float]]):
    """The first polluted point when the reference measured at `length` is compared with its own sliced prefix."""
    for sample, measured in enumerate(logprobs):
        point = judge(length, sample, measured, 0.0, long.prefix(sample, length), plan.verdict)
        if point.polluted:
            return point
    return None


def mismatch_text(plan: JobPlan, long: Reference, point, why: str) -> str:
    what = "reference" if plan.reference_engine == "transformers" else "reference config"
    text = (f"{engine_text(plan)}: the {what} is itself length-dependent: measured at {point.length} tokens "
            f"(sample {point.sample}) its mean NLL is {point.nll:.3f}, but the first {point.length} tokens of its "
            f"{long.max_length}-token measurement give {point.nll_ref:.3f} (|delta| {abs(point.delta_nll):.3f} > "
            f"verdict.tol_nll={plan.verdict.tol_nll:g} and > verdict.rtol_nll={plan.verdict.rtol_nll:g} of it; "
            f"{point.share_deviating:.0%} of its tokens deviate by > verdict.tol_token={plan.verdict.tol_token:g})"
            f"{'; ' + why if why else ''}, so no verdict can be drawn against it and none was recorded. ")
    if plan.reference_engine == "transformers":
        return text + ("reference_per_length=false forbids measuring it per length; reference_per_length=auto "
                       "(the default) measures it at every length the search needs instead")
    if default_reference(plan):
        return text + ("This is already the default reference (graphs off, no speculation), so the engine itself "
                       "scores a prefix differently from the same tokens inside a longer prompt: a bug of its own "
                       "(judge it with reference_engine=transformers), or the model's design, in which case "
                       "reference_per_length=true measures the reference at every length instead")
    return text + ("Pick a reference with graphs off and no speculation, e.g. reference.cudagraph.enforce_eager=true "
                   "reference.spec.k=0 (the default reference), or reference_per_length=true to measure this one "
                   "at every length")


def _why(plan: JobPlan, checked: list[int], failing: set[int]) -> str:
    """"the reference's scoring depends on the prompt length (it changes between 256 and 257: model.X = 256)"."""
    named = derived_quantities(plan.predicted) | plan.model_quantities
    for a, b in zip(checked, checked[1:]):
        if b == a + 1 and (a in failing) != (b in failing):
            at = [q for q, v in named.items() if v == a]
            said = f": {', '.join(f'{q} = {a}' for q in at)}" if at else ""
            return f"the reference's scoring depends on the prompt length (it changes between {a} and {b}{said})"
    holds = [L for L in checked if L not in failing]
    agrees = f", agrees at {', '.join(map(str, holds))})" if holds else ")"
    return (f"the reference's scoring depends on the prompt length (its prefix differs at "
            f"{', '.join(map(str, sorted(failing)))}{agrees}")


def check_lengths(plan: JobPlan, longest: int, thresholds=()) -> list[int]:
    """Where the prefix property is checked: the shortest length, and with auto every candidate threshold q
    inside the grid (q and q+1)."""
    shortest = min(plan.lengths)
    extra = {x for q in thresholds for x in (q, q + 1)} if plan.reference_per_length == "auto" else set()
    return sorted(L for L in {shortest, *extra} if shortest <= L < longest)


def get_or_measure(plan: JobPlan, tracker: JournaledTracker, *, on_wait=None, console=None,
                   thresholds=(), log_path: Path | None = None, stop_engine=None) -> Reference:
    """The reference for this plan: the stored long measurement covering the grid (measured first if there is
    none, with the check lengths in the same engine session), self-checked; per length when the check fails for
    a reference not under study (or when reference_per_length=true); raises ReferenceMismatch otherwise (the
    reference run this job measured, if any, is marked FAILED with the reason). `stop_engine`: called before a
    reference engine starts here, where the job's own engine runs already on a device two may not share."""
    folder, longest, k = store_dir(plan), max(plan.lengths), topk_of(plan)
    log_path = log_path or folder.with_suffix(".worker.log")
    new_run = None
    with store.locked(folder / "lock"):
        path = _find(folder, "long", longest, k)
        stored = _read(path) if path else None  # None too when that file was corrupt (set aside, said)
        max_length = stored["max_length"] if stored else longest
        checked = [] if plan.reference_per_length == "true" else check_lengths(plan, max_length, thresholds)
        if stored is None:
            data = _measure_new(plan, tracker, folder, longest, checked, on_wait, console, log_path, stop_engine)
            new_run = data["run_id"]
        else:
            data = stored
    long = Reference(tuple(map(tuple, data["logprobs"])), data["max_length"], data.get("run_id"),
                     tuple(data["topk"]) if data.get("topk") else None, device=data.get("device"))
    session = PerLength(plan, log_path, on_wait, topk=k, folder=folder, before_start=stop_engine)
    try:
        measured = session.measure(checked) if checked else {}
    finally:
        session.stop()  # the job's engine comes next; a per-length reference restarts when it is asked for more
    failing = {L: p for L in checked if (p := _mismatch(plan, long, L, measured[L][0])) is not None}
    if plan.reference_per_length == "true":
        why = "reference_per_length=true"
    elif not failing:
        why = None
    elif plan.reference_per_length == "auto" and plan.reference_engine == "transformers":
        why = _why(plan, checked, set(failing))
    else:
        error = mismatch_text(plan, long, failing[min(failing)], _why(plan, checked, set(failing)))
        if new_run:
            tracker.set_tags(new_run, {"oneknob.error": error[:1000]})
            tracker.finish(new_run, "FAILED")
        raise ReferenceMismatch(error)
    if new_run:
        tracker.finish(new_run, "FINISHED")
    if why is None:
        return long
    if console:
        say(console, f"[bold]reference[/]: {why}; measuring it at every length the search needs "
                     f"({describe(plan)}, one request per length and sample)")
    return Reference(long.logprobs, long.max_length, long.run_id, long.topk, per_length=dict(measured),
                     session=session, why=why, device=long.device)


def _measure_new(plan: JobPlan, tracker: JournaledTracker, folder: Path, longest: int, checked: list[int], on_wait,
                 console, log_path: Path, before_start=None) -> dict:
    """Measure the reference at the longest length (and at the check lengths, in the same engine session) into
    a new run, left open for the check, and new stored files (each written once)."""
    if console:
        also = f" (and at {', '.join(map(str, checked))} to check it)" if checked else ""
        on = f" on device(s) {','.join(plan.devices)}" if plan.devices else ""
        say(console, f"[bold]reference[/]: measuring {plan.samples} sample(s) at {longest} tokens{also}{on} with "
                      f"{describe(plan)} (once; later sweeps reuse it)")
    run_id = tracker.start_run(f"reference {longest}", {"oneknob.role": "reference",
                                                         "oneknob.sweep_id": plan.sweep.id if plan.sweep else "",
                                                         "oneknob.device": devices.of(plan.devices)})
    try:
        k = topk_of(plan)
        measured, ready = _measure(plan, log_path, sorted({longest, *checked}), on_wait, topk=k,  # one session
                                   before_start=before_start)
        logprobs = [m["logprobs"] for m in measured[longest]]
        knob_params = {} if plan.reference_engine == "transformers" else flat_params("knob.", plan.reference_knobs)
        tracker.log_params(run_id, knob_params | flat_params("resolved.", ready.resolved)
                           | flat_params("provenance.", ready.provenance)
                           | {"reference_engine": plan.reference_engine, "model": plan.worker["model"]["path"],
                              "corpus.fingerprint": plan.corpus.fingerprint, "samples": plan.samples,
                              "max_length": longest, "check_length": min(plan.lengths)})
        tracker.log_metrics(run_id, [("nll_ref", mean([mean_nll(lp[: length - 1]) for lp in logprobs]), length)
                                     for length in plan.lengths])
        data = {"key": key(plan), "max_length": longest, "logprobs": logprobs,
                "topk": [m["topk"] for m in measured[longest]] if k else None, "topk_k": k,
                "run_id": run_id, "device": devices.of(plan.devices), "resolved": ready.resolved,
                "provenance": ready.provenance, "time": time.time()}
        path = folder / f"long-{longest}.k{k}.json"
        data = _write_once(path, data)
        for L in checked:
            _write_once(folder / f"at-{L}.k{k}.json", {
                "key": key(plan), "length": L, "logprobs": [m["logprobs"] for m in measured[L]],
                "topk": [m["topk"] for m in measured[L]] if k else None, "time": time.time()})
        tracker.log_artifact(run_id, path)
    except KeyboardInterrupt:
        tracker.finish(run_id, "KILLED")
        raise
    except Exception as exc:  # an engine failure, a full disk: this reference run fails, named
        tracker.set_tags(run_id, {"oneknob.error": error_text(exc)[:1000]})
        tracker.finish(run_id, "FAILED")
        raise
    return data
