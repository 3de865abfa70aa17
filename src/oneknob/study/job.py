"""One job: one engine configuration, measured over prompt lengths until every flip is exact.

    decide the resolved config: the cache's record, else a started engine; diff it against the
        sweep's baseline (single_variable), restarting with pinned knobs when the policy says so
      -> ask the search which lengths it wants, measure them (cached points first; the engine is
         started only for a point the cache lacks), until it wants nothing more
      -> finish (oneknob.study.job_end): result.json, points.csv, artifacts, the run's final status, which
         is FINISHED, FAILED or KILLED whatever fails in the job's own bookkeeping (a full disk)

Every point goes to the journal (fsynced) before the cache and MLflow. `run_job(plan, job_dir)` is a plain
function of the plan; a job never raises for an engine failure: its run is marked FAILED with the worker
log and the outcome says so, so a sweep goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.markup import escape

from oneknob.study import job_end, published, terminal
from oneknob.study import points as axis_points
from oneknob.verdict import findings
from oneknob.verdict import oracles
from oneknob.verdict import search
from oneknob.record import store, trail
from oneknob.study import continuations
from oneknob.plan import single_variable as sv
from oneknob.run import devices
from oneknob.run.executor import EngineSession, Worker
from oneknob.plan.jobs import JobPlan
from oneknob.console import JobProgress, make_console
from oneknob.study.reference import Reference, ReferenceMismatch, get_or_measure
from oneknob.record.journaled import JournaledTracker
from oneknob.record.tracking import flat_params, reap_stale_runs
from oneknob.verdict import decode
from oneknob.verdict.judge import Point, judge, oracle_verdicts, verdict_of
from oneknob.verdict.malformed import finite_mean, fitting_malformed, malformed_text
from oneknob.config.schema import DECODE_ORACLES
from oneknob.config.quantities import config_quantities, derived_quantities, suspect_text
from oneknob.explain import followup_design

console = make_console()


@dataclass(frozen=True)
class Decision:
    requested: dict[str, Any]  # what the job measures (pins included)
    resolved: dict[str, Any]
    check: sv.Check
    from_cache: bool  # the resolved config came from the cache's record, not from an engine


class Job:
    def __init__(self, plan: JobPlan, job_dir: Path, prepared: Worker | None = None):
        self.plan = plan
        self.job_dir = Path(job_dir)
        self.job_dir.mkdir(parents=True, exist_ok=True)
        self.journal = self.job_dir / "journal.jsonl"
        # Inside a sweep the store answered when the sweep started: an outage now is mid-run.
        # One job on a local store: MLflow trails the journal in an uploader of its own (record.trail), which
        # also marks KILLED the runs killed processes left RUNNING
        trailing = plan.sweep is None and plan.trail and trail.usable(plan.tracking_uri)
        self.tracker = JournaledTracker(self.journal, plan.tracking_uri, plan.experiment, tags=plan.tags,
                                        required=plan.sweep is None, console=console, trail=trailing)
        if plan.sweep is None and not trailing and self.tracker.ok:
            reap_stale_runs(self.tracker, console)
        self.progress = JobProgress(console, plan.name)
        self.session = EngineSession(plan, self.job_dir, self.progress, prepared)
        self.points: dict[int, list[Point]] = {}
        self.continuations: dict[tuple[int, int], tuple] = {}  # (length, sample) -> (greedy ids, their logprobs)
        self.reference: Reference | None = None
        self.cache: store.PointCache | None = None
        self.prediction_wrong: str | None = None  # when the rules mispredicted a pinned config (said in the note)
        self.suspects: dict[int, list[str]] = {}  # suspect lengths added to the grid, and why (search.suspects)
        self._on_axis: dict[str, int] | None = None  # the candidate thresholds on the axis (_set_suspects)
        self._suspects_known = False
        self.scorer: continuations.Scorer | None = None  # the reference's scores of continuations (decode oracles)
        self.malformed: dict[int, dict] = {}  # length -> the malformed answers there: samples, reasons per oracle

    # -- deciding what runs ---------------------------------------------------------------------
    def _cache(self, requested: dict[str, Any]) -> store.PointCache:
        return store.PointCache(Path(self.plan.cache_dir), self.plan.cache_key(requested),
                                enabled=self.plan.use_cache)

    def _resolved(self, requested: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """(resolved config, whether it came from the cache): the live engine's, the cache's, else a new one's."""
        if self.session.runs(requested):
            return self.session.ready.resolved, False
        cache = self._cache(requested)
        if cache.resolved is not None:
            return cache.resolved, True
        ready = self.session.start(requested)
        cache.remember_resolved(ready.resolved, ready.provenance)
        return ready.resolved, False

    def _baseline(self, resolved: dict[str, Any]) -> dict[str, Any] | None:
        """The sweep's baseline resolved config; the baseline job publishes its own. Beside the baseline (a sweep
        whose jobs run side by side) a variant waits for it here, its own engine up."""
        sweep = self.plan.sweep
        if sweep is None:
            return None
        if sweep.publishes_baseline:
            store.write_json_atomic(sweep.baseline_path, {"knobs": self.plan.knobs, "resolved": resolved})
            return resolved
        found = published.baseline(sweep, "resolved")
        return found["resolved"] if found is not None else None

    def _decide_once(self) -> Decision:
        requested = dict(self.plan.knobs)
        policy = self.plan.single_variable
        if (predicted := self._predicted_pin(requested)) is not None:
            return predicted
        resolved, from_cache = self._resolved(requested)
        baseline = self._baseline(resolved)
        check = sv.check(self.plan.knob, baseline, resolved, policy=policy.side_effects, run_noops=policy.run_noops)
        if check.status == "pin":
            requested |= check.pinned
            resolved, pinned_from_cache = self._resolved(requested)
            from_cache = from_cache or pinned_from_cache
            check = sv.after_pin(check, baseline, resolved)
        if self.prediction_wrong:
            check.note += f" (the resolution rules mispredicted the pinned config: {self.prediction_wrong})"
        return Decision(requested, resolved, check, from_cache)

    def _predicted_pin(self, requested: dict[str, Any]) -> Decision | None:
        """One engine start for a side effect the resolution rules predict: start the pinned config directly and keep
        it when the engine's read-back is the pinned config the rules predicted (the check against the baseline is
        then the engine's, as always). None (learn from the unpinned engine, as before) when the rules predict no
        pin, the unpinned config is already known, or the engine resolved the pinned config otherwise than
        predicted (said on the terminal and in the check's note)."""
        sweep, policy = self.plan.sweep, self.plan.single_variable
        if (sweep is None or sweep.publishes_baseline or policy.side_effects != "pin"
                or self.session.runs(requested)
                or self.plan.predicted.get("not_predicted")  # a build the rules are not for (vLLM 0.34)
                or self._cache(requested).resolved is not None):
            return None
        found = published.baseline(sweep, "resolved", wait=False)
        # beside the baseline, whose engine may still be starting: the pin its predicted config calls for
        baseline = found["resolved"] if found is not None else sweep.baseline_predicted if sweep.side_by_side else None
        if baseline is None:
            return None
        first = sv.check(self.plan.knob, baseline, self.plan.predicted, policy="pin", run_noops=policy.run_noops)
        if first.status != "pin":
            return None
        pinned = requested | first.pinned
        resolved, from_cache = self._resolved(pinned)
        if found is None:  # the baseline's own resolved config decides; the same pin, or learn as before
            found = published.baseline(sweep, "resolved")
            first = sv.check(self.plan.knob, found["resolved"], self.plan.predicted, policy="pin",
                             run_noops=policy.run_noops) if found is not None else None
            if first is None or first.status != "pin" or requested | first.pinned != pinned:
                console.print(f"[yellow]{self.plan.name}: the baseline resolved otherwise than its prediction, so the "
                              "pin started ahead does not hold; learning the side effect from the unpinned engine[/]")
                return None
            baseline = found["resolved"]
        expected = self.plan.predict(pinned)
        wrong = sv.mispredicted(expected, resolved)
        if not wrong:  # the engine resolved the pinned config as predicted; its read-back says what pinning restored
            return Decision(pinned, resolved, sv.after_pin(first, baseline, resolved), from_cache)
        said = "; ".join(f"{f}: predicted {a}, engine {b}" for f, (a, b) in wrong.items())
        console.print(f"[yellow]{self.plan.name}: the resolution rules mispredicted the pinned config ({said}); "
                      "learning the side effect from the unpinned engine instead[/]")
        self.prediction_wrong = said
        return None

    def decide(self) -> Decision:
        """The config this job measures. A decision read from the cache is re-checked on the first engine
        start the search needs: an engine that now resolves differently invalidates the cached points."""
        decision = self._decide_once()
        self._set_suspects(decision.resolved)
        if decision.from_cache and not decision.check.skip:
            self._get_reference()  # the cached points are judged against it
        if not decision.from_cache or decision.check.skip or not self._needs_engine(decision.requested):
            return decision
        fresh = self.session.start(decision.requested)
        if fresh.resolved == decision.resolved:
            return decision
        changed = "; ".join(f"{f}: cached {a}, engine now {b}"
                            for f, (a, b) in sv.diff(decision.resolved, fresh.resolved).items())
        configs = {json.dumps(c, sort_keys=True): c for c in (self.plan.knobs, decision.requested)}
        dropped = sum(self._cache(c).invalidate() for c in configs.values())
        self._cache(decision.requested).remember_resolved(fresh.resolved, fresh.provenance)
        console.print(f"[yellow]cache: {self.plan.name}: the engine resolves {json.dumps(decision.requested)} "
                      f"differently from its cached record ({changed or 'other fields'}); dropped {dropped} "
                      "cached point(s) of this job and measuring afresh[/]")
        decision = self._decide_once()
        self._set_suspects(decision.resolved)
        return decision

    def _set_suspects(self, resolved: dict[str, Any]) -> None:
        """Candidate thresholds on the axis: prompt lengths as they are; on axis=batch the point whose step holds
        q tokens (probe + neighbours = q); none on axis=repeat (concurrency is no engine quantity's unit)."""
        axis = self.plan.axis
        on_axis = {name: v for name, q in self.candidates(resolved).items() if isinstance(q, int)
                   and not isinstance(q, bool) and (v := axis.value_at_step_tokens(q)) is not None}
        self._on_axis = on_axis if self.plan.search.suspects and axis.name != "repeat" else None
        self._suspects_known = False  # they lie in a grid that holds the baseline's transitions: _suspects()

    def _suspects(self) -> dict[int, list[str]]:
        """The suspect lengths, once the grid they lie in is known (beside the baseline, a variant waits for the
        baseline's transitions here)."""
        if not self._suspects_known:
            self.suspects = {} if self._on_axis is None else search.suspects(self._grid(with_suspects=False),
                                                                              self._on_axis)
            self._suspects_known = True
        return self.suspects

    def _ahead(self) -> list[int]:
        """What a variant beside the baseline measures before the baseline's transitions are known: its own grid
        and the suspects in it, every one of them in its first round whatever the baseline finds (a suspect is
        in the grid or is one of the baseline's lengths); the rest of the round follows. The same on any
        placement (also where the baseline is done first); none where the probe budget could not hold them all
        (the round's first lengths would then depend on the baseline's)."""
        sweep = self.plan.sweep
        if (sweep is None or not sweep.side_by_side or sweep.publishes_baseline or sweep.against
                or self.plan.followup or self._suspects_known):
            return []
        grid = sorted(self.plan.grid)
        ahead = set(grid) | (set(search.suspects(grid, self._on_axis)) if self._on_axis is not None else set())
        return sorted(ahead) if len(ahead) <= self.plan.search.max_probes else []

    def candidates(self, resolved: dict[str, Any]) -> dict[str, int]:
        return candidates(self.plan, resolved)

    # -- measuring ------------------------------------------------------------------------------
    def _extras(self) -> dict[str, int]:
        """What each request asks for beside prompt logprobs: the top-k per position, a greedy continuation (with
        each generated token's logprob) for the decode oracles."""
        asked, verdict = self.plan.oracles, self.plan.verdict
        return {"topk": verdict.topk if "topk" in asked else 0,
                "greedy": verdict.greedy_tokens if set(asked) & set(DECODE_ORACLES) else 0}

    @staticmethod
    def _hit(cache: store.PointCache, length: int, sample: int, extras: dict[str, int]) -> dict | None:
        """The cached record of a point, if it holds what the oracles ask for."""
        hit = cache.get(sample, length)
        return hit if hit is not None and oracles.covers(hit, **extras) else None

    def _points(self, cache: store.PointCache, length: int, measure: bool) -> list[Point] | None:
        """The judged points of one length (one axis value); None when `measure` is off and the cache lacks one."""
        if self.plan.axis.name != "length":
            return self._axis_points(cache, length, measure)
        extras, ref = self._extras(), self.reference
        points, measured = [], {}
        for sample in range(self.plan.samples):
            hit = self._hit(cache, length, sample, extras)
            if hit is None and not measure:
                return None
            prompt = self.plan.corpus.prompt(length, sample)
            record = hit if hit is not None else measured.setdefault(sample, self.session.score(prompt, **extras))
            if extras["greedy"]:
                self.continuations[(length, sample)] = (record["greedy"][: extras["greedy"]],
                                                        record["greedy_logprobs"][: extras["greedy"]])
            points.append(judge(length, sample, record["logprobs"], record["seconds"],
                                ref.prefix(sample, length) if ref else None, self.plan.verdict, cached=hit is not None,
                                oracles=self.plan.oracles, topk=record.get("topk") if extras["topk"] else None,
                                reference_topk=ref.prefix_topk(sample, length) if ref else None,
                                malformed=record.get("malformed")))
        if measured:  # one write per length, once the next request is on its way
            cache.put(length, measured)
            self.session.while_engine_works(cache.write)
        return points

    def _axis_points(self, cache: store.PointCache, value: int, measure: bool) -> list[Point] | None:
        """One point of axis=batch or axis=repeat (oneknob.study.points), from the cache or measured."""
        plan, axis, topk = self.plan, self.plan.axis, self._extras()["topk"]
        points, measured = [], {}
        for sample in range(plan.samples):
            hit = cache.get(sample, value)
            hit = hit if hit is not None and oracles.covers(hit, topk=topk if axis.name == "batch" else 0,
                                                            greedy=0) else None
            if hit is None and not measure:
                return None
            if hit is not None:
                record = hit
            elif axis.name == "batch":
                record = measured.setdefault(sample, axis_points.measure_batch(self.session, axis, plan.corpus,
                                                                               value, sample, topk))
            else:
                record = measured.setdefault(sample, axis_points.measure_repeat(self.session, axis, plan.corpus,
                                                                                value, sample))
            points.append(axis_points.judge_batch(axis, value, sample, record, self.reference, plan, hit is not None)
                          if axis.name == "batch" else
                          axis_points.judge_repeat(axis, value, sample, record, plan, hit is not None))
        if measured:
            cache.put(value, measured)
            self.session.while_engine_works(cache.write)
        return points

    def _grid(self, with_suspects: bool = True) -> list[int]:
        """The plan's lengths, the suspect lengths (candidate thresholds q and q + 1 inside the grid), and in a
        variant the baseline's transition lengths (the jump across them is compared in both runs: moved,
        cleared, unchanged)."""
        sweep, grid = self.plan.sweep, set(self.plan.grid) | (set(self._suspects()) if with_suspects else set())
        if sweep is not None and not sweep.publishes_baseline:  # beside the baseline: once it is measured
            found = (published.baseline(sweep, "transitions") or {}).get("transitions", [])
            grid |= {L for t in found for L in (t["lo"], t["hi"]) if L <= max(self.plan.grid)}
        return sorted(grid)

    def _search(self, round_at, announce: bool = False) -> tuple[search.SearchResult,
                                                                 dict[str, search.SearchResult]] | None:
        """Every oracle's search on shared probes: each round measures the lengths any oracle wants (one request
        serves them all), until every oracle's transitions are adjacent lengths or the budget is spent.
        (the combined result: polluted where any oracle is; each oracle's own). `announce`: say the suspects."""
        by_oracle: dict[str, dict[int, str]] = {name: {} for name in self.plan.oracles}
        if ahead := self._ahead():  # beside the baseline: the first round's own lengths while it measures
            if (found := round_at(ahead)) is None:
                return None
            for length, points in found.items():
                for name, verdict in oracle_verdicts(points, self.plan.oracles).items():
                    by_oracle[name][length] = verdict
        grid, budget = self._grid(), self.plan.search
        if announce:
            self._announce_suspects()
        extra = set(grid) - set(self.plan.grid) - set(self.suspects)  # the baseline's lengths are extra; the
        max_probes = budget.max_probes + len(extra)                      # suspects count against the budget
        lowest = 0 if self.plan.axis.name == "batch" else 1
        if first := self._targeted(lowest):  # a follow-up: where its hypothesis puts the edge, and where it was
            if (found := round_at(first)) is None:
                return None
            for length, points in found.items():
                for name, verdict in oracle_verdicts(points, self.plan.oracles).items():
                    by_oracle[name][length] = verdict
            if self._decided(by_oracle):
                return search.results(first, by_oracle, max_probes=None, bisect=budget.bisect, lowest=lowest)
            grid, max_probes = sorted(set(grid) | set(first)), max_probes + len(first)  # the full search, as any job
        while todo := search.wanted_each(grid, by_oracle, max_probes=max_probes, bisect=budget.bisect):
            found = round_at(todo)
            if found is None:
                return None
            for length, points in found.items():
                for name, verdict in oracle_verdicts(points, self.plan.oracles).items():
                    by_oracle[name][length] = verdict
        return search.results(grid, by_oracle, max_probes=max_probes, bisect=budget.bisect, lowest=lowest)

    def _targeted(self, lowest: int) -> list[int]:
        """A follow-up's first probes (explain.followup_design.targeted); none for any other job."""
        followup = self.plan.followup
        if not followup:
            return []
        return [L for L in followup_design.targeted(tuple(followup["predicted"]), tuple(followup["edge"]))
                if L >= lowest]

    def _decided(self, by_oracle: dict[str, dict[int, str]]) -> bool:
        """Whether a follow-up's targeted probes settle its hypothesis (the edge moved as predicted, or stayed)."""
        followup = self.plan.followup
        oracle = followup.get("oracle")
        verdicts = by_oracle[oracle] if oracle in by_oracle else search.combined(by_oracle)
        return followup_design.decisive(verdicts, tuple(followup["predicted"]), tuple(followup["edge"]),
                                        followup["direction"])

    def _round(self, cache: store.PointCache, lengths: list[int], measure: bool,
               judged: Callable[[int, list[Point]], None] | None = None) -> dict[int, list[Point]] | None:
        """The judged points of a round of lengths; None when `measure` is off and the cache lacks one. `judged`
        gets each length as soon as its points are judged: at once, or, where the decode oracles judge against the
        reference, once the round's continuations are scored (one reference session for the round)."""
        if measure and self.reference is not None and self.plan.axis.name == "length":
            self.reference.prefetch(lengths)  # a per-length reference: the round's lengths in one session
        extras = self._extras()
        if measure and self.plan.axis.name == "length":  # the engine goes from one to the next without waiting
            self.session.expect([self.plan.corpus.prompt(L, s) for L in lengths for s in range(self.plan.samples)
                                 if self._hit(cache, L, s, extras) is None], **extras)
        decode_pending = bool(extras["greedy"] and self.reference is not None)
        found = {}
        for length in lengths:
            if (points := self._points(cache, length, measure)) is None:
                return None
            found[length] = points
            if judged is not None and not decode_pending:  # journaled now: a job killed mid-round keeps it
                judged(length, points)
        if decode_pending:
            if self.scorer is None:
                self.scorer = continuations.Scorer(self.plan, on_wait=self.progress.reference_wait, console=console,
                                                   stop_engine=self.session.stop)
            # a continuation whose tokens are malformed has nothing to score teacher-forced: judged as it is
            scores = self.scorer.scores({(L, p.sample): self.continuations[(L, p.sample)][0]
                                         for L, points in found.items() for p in points
                                         if "greedy" not in (p.malformed or {})})
            found = {L: [decode.judge(p, *self.continuations[(L, p.sample)], scores.get((L, p.sample)),
                                      self.plan.oracles, self.plan.verdict) for p in points]
                     for L, points in found.items()}
            for length, points in found.items() if judged is not None else ():
                judged(length, points)
        return found

    def _announce_suspects(self) -> None:
        if self.suspects:
            said = search.suspects_text(self.suspects, suspect_text)
            console.say(f"  {escape(self.plan.name)}: suspect lengths probed beside the grid: {escape(said)}")
            self.tracker.set_tags(self.run_id, {"oneknob.suspects": json.dumps(
                {str(L): why for L, why in self.suspects.items()})})

    def _needs_engine(self, requested: dict[str, Any]) -> bool:
        cache = self._cache(requested)
        return self._search(lambda lengths: self._round(cache, lengths, measure=False)) is None

    def _measure_round(self, lengths: list[int]) -> dict[int, list[Point]]:
        return self._round(self.cache, lengths, measure=True, judged=self._record_length)

    def _record_length(self, length: int, points: list[Point]) -> None:
        store.append_jsonl(self.journal, *({"kind": "point", "run_id": self.run_id, **asdict(p)} for p in points))
        self.points[length] = points
        verdict = verdict_of(points)
        asked = self.plan.oracles
        if malformed := [p for p in points if set(p.malformed or {}) & set(asked)]:
            self.malformed[length] = {"samples": len(malformed), "of": len(points), "reasons": {
                o: r for p in malformed for o, r in p.malformed.items() if o in asked}}
        # a malformed answer may leave nothing readable: a NaN NLL, no delta (the verdict says polluted anyway)
        metrics = [("nll", finite_mean([p.nll for p in points]), length),
                   ("polluted", float(verdict == "polluted"), length),
                   ("polluted_samples", sum(p.polluted for p in points), length)]
        if points[0].nll_ref is not None:
            metrics += [("nll_ref", finite_mean([p.nll_ref for p in points]), length),
                        ("delta_nll", finite_mean([p.delta_nll for p in points]), length),
                        ("max_abs_delta_logprob", finite_mean([p.max_abs_delta for p in points], max), length)]
        if points[0].step_tokens is not None:  # axis=batch: what the probe's step held, at the same step
            metrics += [("step_tokens", points[0].step_tokens, length),
                        ("probe_steps", max(len(p.probe_steps or []) for p in points), length),
                        ("co_scheduled", float(all(p.schedule == "co-scheduled" for p in points)), length)]
        if points[0].agreement is not None:  # axis=repeat
            metrics += [("identical", float(all(p.agreement == "identical" for p in points)), length)]
        self.tracker.log_metrics(self.run_id, metrics + oracles.length_metrics(points, length))
        self.progress.point(length, verdict, finite_mean([p.nll for p in points]))

    def measure(self, decision: Decision) -> dict[str, Any]:
        self.cache = self._cache(decision.requested)
        self.session.target = decision.requested
        if self.reference is not None and self.reference.per_length is not None:
            # one reference session for the grid (the probe's length on axis=batch); bisection asks for more
            self.reference.prefetch(self._grid() if self.plan.axis.name == "length" else self.plan.lengths)
        result, by_oracle = self._search(self._measure_round, announce=True)
        sweep = self.plan.sweep
        if sweep is not None and sweep.publishes_baseline:  # what the variants probe too
            written = json.loads(sweep.baseline_path.read_text())
            edges = {(t.lo, t.hi): t for r in (result, *by_oracle.values()) for t in r.transitions}  # every oracle's
            store.write_json_atomic(sweep.baseline_path, written | {"transitions": [t.as_dict()
                                                                                    for t in edges.values()]})
        unscheduled = {str(v): pts[0].schedule for v, pts in sorted(self.points.items())
                       if pts[0].schedule not in (None, "co-scheduled")}
        if unscheduled:  # axis=batch: points whose step was not what they claim, labelled in the report
            self.tracker.set_tags(self.run_id, {"oneknob.schedule": json.dumps(unscheduled)})
            console.say(f"  {escape(self.plan.name)}: not co-scheduled: "
                        + escape(", ".join(f"{v} ({label})" for v, label in unscheduled.items())))
        cached = sum(p.cached for pts in self.points.values() for p in pts)
        if self.malformed:  # measurements like any other, judged polluted; said, as they may be the bug itself
            said = malformed_text(self.malformed)
            console.say(f"  {escape(self.plan.name)}: [yellow]{escape(said)}[/]")
            self.tracker.set_tags(self.run_id, {"oneknob.malformed": fitting_malformed(self.malformed)})
        if self.scorer is not None and self.scorer.requests:
            console.say(f"  {escape(self.plan.name)}: {escape(self.scorer.cost)}")
        per_length = self.reference.cost if self.reference is not None else None
        if per_length:
            self.tracker.set_tags(self.run_id, {"oneknob.reference_per_length": f"{self.reference.why}; {per_length}"})
            console.say(f"  {escape(self.plan.name)}: {escape(self.reference.why)}; {escape(per_length)}")
        return {"status": "confounded" if decision.check.confounded else "ok",
                **findings.found(result, self.points, self.plan.verdict, by_oracle),
                **({"suspects": {str(L): why for L, why in self.suspects.items()}} if self.suspects else {}),
                **({"reference_per_length": f"{self.reference.why}; {per_length}"} if per_length else {}),
                **({"continuation_scores": self.scorer.requests} if self.scorer is not None else {}),
                **({"malformed": {str(L): m for L, m in sorted(self.malformed.items())}} if self.malformed else {}),
                "points_cached": cached, "points_measured": sum(len(p) for p in self.points.values()) - cached,
                "engine_started": self.session.ready is not None}

    # -- the job ----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        plan = self.plan
        value = plan.knobs.get(plan.knob) if plan.knob else None
        tags = {"oneknob.role": "job", "oneknob.sweep_id": plan.sweep.id if plan.sweep else "",
                "oneknob.knob": plan.knob or "baseline", "oneknob.engine": plan.engine,
                "oneknob.value": json.dumps(value) if plan.knob else "baseline",
                "oneknob.axis": plan.axis.name,  # what the metric step counts (filterable in the UI)
                "oneknob.axis_detail": json.dumps(plan.axis.as_dict()),
                "oneknob.device": devices.of(plan.devices)}  # its engines' CUDA_VISIBLE_DEVICES (run.devices)
        if plan.followup:  # the transition it tests, and the hypothesis (explain.followups)
            tags |= {"oneknob.followup": "true", "oneknob.followup_of": json.dumps(plan.followup)}
        job_end.set_aside_error(self.job_dir)  # a resumed job's error.txt is its failed attempt's
        self.run_id = self.tracker.start_run(plan.name, tags,
                                             parent_run_id=plan.sweep.parent_run_id if plan.sweep else None)
        outcome: dict[str, Any] = {"run_id": self.run_id, "name": plan.name, "knob": plan.knob, "value": value,
                                   "knobs": plan.knobs, "job_dir": str(self.job_dir), "device": tags["oneknob.device"]}
        status = "KILLED"
        try:
            if self.tracker.disk_problem:  # the journal cannot take this run: no engine start to lose
                raise RuntimeError(self.tracker.disk_problem)
            # inside the try: a reference that fails fails this run. Beside other jobs the sweep measures it while
            # this engine starts, unless it is measured already (one device set: it was, and a failed one fails
            # this job before its engine starts)
            if not (plan.sweep and plan.sweep.side_by_side) or published.has_ended(plan.sweep, published.REFERENCE):
                self._get_reference()
            decision = self.decide()
            self._get_reference()
            self._log_setup(decision)
            outcome |= {"requested": decision.requested, "resolved": decision.resolved,
                        "single_variable": decision.check.as_dict(), "note": decision.check.note}
            outcome |= {"status": decision.check.status} if decision.check.skip else self.measure(decision)
            status = "FINISHED"
        except KeyboardInterrupt as exc:
            outcome |= {"status": "killed", "error": f"interrupted ({terminal.why_interrupted(exc)})"}
            self.session.close(grace_s=0)  # one Ctrl-C is enough: no waiting for the engine to wind down
            raise
        except Exception as exc:  # an engine failure, a timeout, a full disk, a bug: this job fails, the sweep goes on
            outcome |= job_end.failure(exc)  # the error, and the root cause from the worker's log
            if isinstance(exc, ReferenceMismatch):  # every other job would be judged against the same reference
                outcome["stops_sweep"] = True
            status = "FAILED"
            console.print(f"[red]FAILED[/] {escape(plan.name)}: {escape(outcome['error'])}")
            if problem := job_end.write_error(self.job_dir, str(exc),
                                                  getattr(exc, "log_tail", "") or self.session.log_tail()):
                outcome["bookkeeping"] = [problem]
        finally:
            try:
                self.session.close()
                if self.reference is not None:
                    self.reference.close()
                if self.scorer is not None:
                    self.scorer.close()
                if plan.sweep and not outcome.get("stops_sweep"):  # its device set to the next job, beside it
                    devices.engines_stopped(plan.sweep.dir, plan.sweep.index)
            finally:
                self.progress.close()
                outcome.setdefault("status", "killed")
                try:
                    job_end.finish(self, outcome, status)  # the run ends, whatever fails
                finally:
                    self.tracker.close()  # the journal is complete (a trailing uploader finishes it)
        return outcome

    def _get_reference(self) -> None:
        """The reference, once: stored, or measured now. Beside other jobs the sweep measures it ahead on a device
        of its own (study.side_by_side) while this job's engine starts; where the job must measure part of it
        after all (check lengths no job of the sweep was planned with), its engine leaves a device two may not
        share first."""
        plan = self.plan
        if plan.reference_knobs is None or self.reference is not None:
            return
        published.wait_ended(plan.sweep, published.REFERENCE)
        # the candidate thresholds are checked too, unless the study asked for the grid alone
        predicted = self.candidates(plan.predicted) if plan.search.suspects else {}
        self.reference = get_or_measure(plan, self.tracker, on_wait=self.progress.reference_wait,
                                        console=console, thresholds=set(predicted.values()),
                                        stop_engine=self.session.stop if plan.exclusive_device else None)
        self.reference.stop_engine = self.session.stop

    def _log_setup(self, decision: Decision) -> None:
        plan = self.plan
        summary = {k: v for k, v in decision.resolved.items() if k != "vllm"}  # vLLM's full config: the artifact
        params = (flat_params("knob.", decision.requested) | flat_params("resolved.", summary)
                  | flat_params("defaults.", plan.defaults)
                  | {"engine": plan.engine, "model": plan.worker["model"]["path"],
                     "model.fingerprint": plan.model_fingerprint, "corpus.source": plan.corpus.source,
                     "corpus.fingerprint": plan.corpus.fingerprint, "samples": plan.samples,
                     "lengths": list(plan.lengths), "seed": plan.worker["seed"],
                     "reference": json.dumps(plan.reference_knobs), "reference_engine": plan.reference_engine,
                     "oracles": ",".join(plan.oracles),
                     "reference.run_id": self.reference.run_id if self.reference else None,
                     "reference.device": self.reference.device if self.reference else None,
                     "reference_per_length": plan.reference_per_length}
                  | {f"model_config.{q.removeprefix('model.')}": v for q, v in plan.model_quantities.items()}
                  | flat_params("engine_config.", config_quantities(decision.resolved.get("vllm")))
                  | flat_params("verdict.", asdict(plan.verdict)) | flat_params("search.", asdict(plan.search))
                  | ({} if plan.axis.name == "length" else flat_params("axis.", plan.axis.as_dict()))
                  | flat_params("version.", plan.versions) | flat_params("hardware.", plan.hardware))
        if self.session.runs(decision.requested):
            params |= flat_params("provenance.", self.session.ready.provenance)
        elif cached := self._cache(decision.requested).provenance:  # no engine started: what measured the points
            params |= flat_params("provenance.", cached) | {"provenance.from_cache": True}
        self.tracker.log_params(self.run_id, params)
        check = decision.check
        tags = {"oneknob.check": json.dumps(check.as_dict()),
                "oneknob.pinned": json.dumps(check.pinned) if check.pinned else "",
                "oneknob.confounded": "true" if check.confounded else ""}
        self.tracker.set_tags(self.run_id, {k: v for k, v in tags.items() if v})
        store.write_json_atomic(self.job_dir / "resolved_config.json", decision.resolved)
        if plan.knob is not None:
            store.write_json_atomic(self.job_dir / "resolved_diff.json", check.as_dict())


def candidates(plan: JobPlan, resolved: dict[str, Any]) -> dict[str, int]:
    """Candidate thresholds, by name: the resolved config's quantities, the model's config.json length
    fields (model.<path>) and the knobs' integer values."""
    values = {k: v for k, v in plan.knobs.items() if isinstance(v, int) and not isinstance(v, bool)}
    return derived_quantities(resolved) | plan.model_quantities | values


def run_job(plan: JobPlan, job_dir: str | Path) -> dict[str, Any]:
    """One job of a sweep, with the worker its sweep prepared for it when this process holds one."""
    from oneknob.run import prepared

    return Job(plan, Path(job_dir), prepared.take(Path(job_dir), plan.knobs)).run()
