"""One job: one engine configuration, measured over lengths until the boundary is exact.

    plan (checked) -> tracking store -> reference -> engine (lazily, in a worker)
      -> single-variable check against the sweep's baseline -> grid, then bisection
      -> journal (fsynced) -> MLflow -> result.json

`run_job` is a plain function of the composed config; run.py is a thin Hydra
wrapper around it. A job never raises for an engine failure: its run is marked
FAILED with the worker log, and the outcome says so, so a sweep goes on.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any


from oneknob import store
from oneknob.executor import EngineSession, WorkerError
from oneknob.progress import make_console
from oneknob.measure import Point, disagreeing, judge, mean, verdict_of
from oneknob.plan import JobPlan, plan_job
from oneknob.reference import Reference, get_or_measure
from oneknob.search import find_boundaries
from oneknob.single_variable import SideEffectPolicy, check_against_baseline
from oneknob.single_variable import diff as resolved_diff
from oneknob.tracking import JournaledTracker, flat_params, reap_stale_runs

console = make_console()

POINT_FIELDS = ("length", "sample", "nll", "scored", "seconds", "nll_ref", "delta_nll", "max_abs_delta",
                "share_deviating", "first_deviation", "polluted", "cached")


def _run_tags(cfg, plan: JobPlan, sweep_id: str) -> dict[str, str]:
    knob = cfg.sweep.knob
    value = plan.knobs.get(knob) if knob else None
    return {"oneknob.role": "job", "oneknob.sweep_id": sweep_id, "oneknob.knob": knob or "baseline",
            "oneknob.value": json.dumps(value) if knob else "baseline", "oneknob.engine": plan.engine}


def _run_name(cfg, plan: JobPlan) -> str:
    knob = cfg.sweep.knob
    return f"{knob}={json.dumps(plan.knobs[knob])}" if knob else "baseline"


class Job:
    def __init__(self, cfg, job_dir: Path):
        from oneknob.progress import JobProgress

        self.cfg = cfg
        self.job_dir = Path(job_dir)
        self.job_dir.mkdir(parents=True, exist_ok=True)
        self.plan = plan_job(cfg)
        self.sweep_id = cfg.sweep.id or uuid.uuid4().hex[:12]
        self.journal = self.job_dir / "journal.jsonl"
        # Inside a sweep the store answered when the sweep started: an outage now is mid-run.
        self.tracker = JournaledTracker(self.journal, self.plan.tracking_uri, cfg.tracking.experiment,
                                        required=cfg.sweep.parent_run_id is None, console=console)
        if cfg.sweep.parent_run_id is None and self.tracker.ok:
            reap_stale_runs(self.tracker, console)
        self.progress = JobProgress(console, _run_name(cfg, self.plan))
        self.session = EngineSession(self.plan, self.job_dir, self.progress)
        self.points: dict[int, list[Point]] = {}
        self.cache: store.PointCache | None = None
        self._rechecked = False

    # -- measuring ---------------------------------------------------------
    def _measure_length(self, length: int) -> str:
        points, measured = [], {}
        for sample in range(self.plan.samples):
            hit = self.cache.get(sample, length)
            if hit is not None:
                logprobs, seconds = hit["logprobs"], hit["seconds"]
            else:
                logprobs, seconds = measured[sample] = self.session.logprobs(self.plan.corpus.prompt(length, sample))
            ref = self.reference.prefix(sample, length) if self.reference else None
            points.append(judge(length, sample, logprobs, seconds, ref, self.cfg.verdict, cached=hit is not None))
        # One write per length (not per sample) keeps the path between two engine requests short.
        if measured:
            self.cache.put(length, measured)
        store.append_jsonl(self.journal, *({"kind": "point", "run_id": self.run_id, **asdict(p)} for p in points))
        self.points[length] = points
        verdict = verdict_of(points)
        self._log_length(length, points)
        self.progress.point(length, verdict, mean([p.nll for p in points]))
        return verdict

    def _log_length(self, length: int, points: list[Point]) -> None:
        metrics = [("nll", mean([p.nll for p in points]), length),
                   ("polluted", float(verdict_of(points) == "polluted"), length)]
        if points[0].nll_ref is not None:
            metrics += [("nll_ref", mean([p.nll_ref for p in points]), length),
                        ("delta_nll", mean([p.delta_nll for p in points]), length),
                        ("max_abs_delta_logprob", max(p.max_abs_delta for p in points), length)]
        self.tracker.log_metrics(self.run_id, metrics)

    # -- the job -----------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg, plan = self.cfg, self.plan
        self.reference: Reference | None = None
        self.run_id = self.tracker.start_run(_run_name(cfg, plan), _run_tags(cfg, plan, self.sweep_id),
                                             parent_run_id=cfg.sweep.parent_run_id)
        outcome = {"run_id": self.run_id, "knob": cfg.sweep.knob, "knobs": plan.knobs,
                   "value": plan.knobs.get(cfg.sweep.knob) if cfg.sweep.knob else None,
                   "job_dir": str(self.job_dir), "sweep_id": self.sweep_id}
        status = "KILLED"
        try:
            if plan.reference_knobs is not None:  # inside the try: a reference that fails fails this run
                self.reference = get_or_measure(plan, self.tracker, sweep_id=self.sweep_id,
                                                on_wait=self.progress.engine_wait, console=console)
            outcome |= self._measure(outcome)
            status = "FINISHED"
        except KeyboardInterrupt:
            outcome |= {"status": "killed", "error": "interrupted (Ctrl-C)"}
            self.session.stop(grace_s=0)  # one Ctrl-C is enough: no waiting for the engine to wind down
            raise
        except Exception as exc:  # an engine failure, a timeout, a bug: this job fails, the sweep goes on
            error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if not isinstance(exc, (WorkerError, ValueError, RuntimeError)):
                error = f"{type(exc).__name__}: {error}"
            outcome |= {"status": "failed", "error": error}
            (self.job_dir / "error.txt").write_text(f"{exc}\n\n--- worker log tail ---\n"
                                                    f"{getattr(exc, 'log_tail', '') or self.session.log_tail()}")
            status = "FAILED"
            console.print(f"[red]FAILED[/] {_run_name(cfg, plan)}: {error}")
        finally:
            self.session.stop()
            self.progress.close()
            outcome.setdefault("status", "killed")
            self._finish(outcome, status)
        return outcome

    def _measure(self, outcome: dict) -> dict[str, Any]:
        cfg, plan = self.cfg, self.plan
        requested = dict(plan.knobs)
        resolved = self._resolve(requested)
        check = check_against_baseline(cfg, requested, resolved, self._resolve)
        requested, resolved = check.requested, check.resolved  # pinned: its own config and cache
        self.cache = self._cache(requested)
        self.session.target = requested
        skipped = check.policy is SideEffectPolicy.SKIP  # a no-op or refused job measures nothing: no engine
        if not skipped and not self.session.runs(requested) and not self._cache_covers_search():
            # The first fresh engine start of a cached job: does the engine still resolve it as cached?
            fresh = self.session.start(requested).resolved
            if fresh != resolved and not self._rechecked:
                self._invalidate(requested, resolved, fresh)
                return self._measure(outcome)
        result = {"requested": requested, "resolved": resolved, "single_variable": check.as_dict()}
        self._log_setup(requested, resolved, check)
        if check.policy is SideEffectPolicy.SKIP:
            return result | {"status": check.status, "note": check.note}
        search = find_boundaries(list(plan.lengths), self._measure_length, max_probes=self._max_probes())
        cached = sum(p.cached for pts in self.points.values() for p in pts)
        measured = sum(len(pts) for pts in self.points.values()) - cached
        boundary = search.first_boundary
        return result | {
            "status": "confounded" if check.confounded else "ok",
            "note": check.note,
            "describe": search.describe(),
            "last_polluted": boundary.last_polluted if boundary else None,
            "first_clean": boundary.first_clean if boundary else None,
            "transitions": [asdict(t) for t in search.transitions],
            "monotone": search.monotone, "budget_hit": search.budget_hit,
            "probes": search.probes, "points_cached": cached, "points_measured": measured,
            "disagreements": sorted(L for L, pts in self.points.items() if disagreeing(pts)),
            "nll_below": _mean_nll(self.points, lambda L: boundary and L <= boundary.last_polluted),
            "nll_above": _mean_nll(self.points, lambda L: boundary and L >= boundary.first_clean),
            "engine_started": self.session.ready is not None,
        }

    def _cache(self, requested: dict[str, Any]) -> store.PointCache:
        return store.PointCache(Path(self.cfg.paths.cache), self.plan.cache_key(requested), enabled=self.cfg.cache)

    def _resolve(self, requested: dict[str, Any]) -> dict[str, Any]:
        """The resolved config of a requested one: the live engine's, the cache's, else a started engine's."""
        if self.session.runs(requested):
            return self.session.ready.resolved
        cache = self._cache(requested)
        if cache.resolved is not None:
            return cache.resolved
        ready = self.session.start(requested)
        cache.remember_resolved(ready.resolved, ready.provenance)
        return ready.resolved

    def _cache_covers_search(self) -> bool:
        """Whether the search would find every point it needs in the cache (a dry run: nothing is measured)."""
        class Missing(Exception):
            pass

        def verdict(length: int) -> str:
            points = []
            for sample in range(self.plan.samples):
                hit = self.cache.get(sample, length)
                if hit is None:
                    raise Missing
                ref = self.reference.prefix(sample, length) if self.reference else None
                points.append(judge(length, sample, hit["logprobs"], hit["seconds"], ref, self.cfg.verdict))
            return verdict_of(points)

        try:
            find_boundaries(list(self.plan.lengths), verdict, max_probes=self._max_probes())
        except Missing:
            return False
        return True

    def _max_probes(self) -> int:
        return self.cfg.search.max_probes if self.cfg.search.bisect else len(self.plan.lengths)

    def _invalidate(self, requested: dict, cached: dict, fresh: dict) -> None:
        """The engine resolves a cached config differently now: drop the job's cached entries, say why."""
        self._rechecked = True
        changed = "; ".join(f"{f}: cached {a}, engine now {b}" for f, (a, b) in resolved_diff(cached, fresh).items())
        dropped = self.cache.invalidate()
        if requested != self.plan.knobs:  # its unpinned config's resolution came from the same cache
            dropped += self._cache(self.plan.knobs).invalidate()
        console.print(f"[yellow]cache: {_run_name(self.cfg, self.plan)}: the engine resolves "
                      f"{json.dumps(requested)} differently from its cached meta.json ({changed or 'other fields'}) "
                      f"in {self.cache.dir}; dropped {dropped} cached point(s) of this job and measuring "
                      "afresh[/]")
        self.cache.remember_resolved(fresh, self.session.ready.provenance)

    def _log_setup(self, requested: dict, resolved: dict, check) -> None:
        plan = self.plan
        params = (flat_params("knob.", requested) | flat_params("resolved.", resolved)
                  | {"engine": plan.engine, "model": plan.worker_spec["model"]["path"],
                     "model.fingerprint": plan.model_fingerprint, "corpus.source": plan.corpus.source,
                     "corpus.fingerprint": plan.corpus.fingerprint, "samples": plan.samples,
                     "lengths": list(plan.lengths), "seed": self.cfg.seed,
                     "reference": json.dumps(plan.reference_knobs),
                     "reference.run_id": self.reference.run_id if self.reference else None}
                  | flat_params("version.", plan.versions) | flat_params("hardware.", plan.hardware))
        if self.session.ready:
            params |= flat_params("provenance.", self.session.ready.provenance)
        self.tracker.log_params(self.run_id, params)
        tags = {"oneknob.pinned": json.dumps(check.pinned) if check.pinned else "",
                "oneknob.confounded": "true" if check.confounded else ""}
        self.tracker.set_tags(self.run_id, {k: v for k, v in tags.items() if v})
        store.write_json_atomic(self.job_dir / "resolved_config.json", resolved)
        if check.diff is not None:
            store.write_json_atomic(self.job_dir / "resolved_diff.json", check.as_dict())

    def _finish(self, outcome: dict, status: str) -> None:
        if self.cache is not None:
            self.cache.compact()  # cache=false or a concurrent job superseded some points
        cached = sum(p.cached for pts in self.points.values() for p in pts)
        outcome.setdefault("points_cached", cached)
        outcome.setdefault("points_measured", sum(len(pts) for pts in self.points.values()) - cached)
        store.write_json_atomic(self.job_dir / "result.json", outcome)
        self._write_points_csv()
        summary = [("points_cached", outcome["points_cached"], 0), ("points_measured", outcome["points_measured"], 0)]
        if outcome.get("last_polluted") is not None:
            summary += [("boundary_last_polluted", outcome["last_polluted"], 0),
                        ("boundary_first_clean", outcome["first_clean"], 0)]
        if "probes" in outcome:
            summary.append(("probes", outcome["probes"], 0))
        if self.session.ready is not None:
            summary.append(("engine_start_s", self.session.ready.start_s, 0))
        self.tracker.log_metrics(self.run_id, summary)
        tags = {"oneknob.status": outcome["status"]}
        if outcome.get("error"):
            tags["oneknob.error"] = outcome["error"][:1000]
        self.tracker.set_tags(self.run_id, tags)
        for name in ("points.csv", "result.json", "resolved_config.json", "resolved_diff.json", "error.txt"):
            if (self.job_dir / name).exists():
                self.tracker.log_artifact(self.run_id, self.job_dir / name)
        if status != "FINISHED" and (self.job_dir / "worker.log").exists():
            self.tracker.log_artifact(self.run_id, self.job_dir / "worker.log")
        self.tracker.finish(self.run_id, status, outcome=outcome)  # the journal's "end" record
        if self.tracker.ok:
            self.tracker.log_artifact(self.run_id, self.journal)  # complete now: after the end record
        else:
            outcome["tracking"] = f"incomplete ({self.tracker.problem}): run python -m oneknob.sync"
            store.write_json_atomic(self.job_dir / "result.json", outcome)
            console.print(f"[yellow]{_run_name(self.cfg, self.plan)}: finished into the journal "
                          f"{self.journal}, but MLflow lacks part of it: python -m oneknob.sync[/]")
        console.print(_one_line(outcome))

    def _write_points_csv(self) -> None:
        rows = [",".join(POINT_FIELDS)]
        for length in sorted(self.points):
            for p in self.points[length]:
                rows.append(",".join("" if (v := getattr(p, f)) is None else str(v) for f in POINT_FIELDS))
        (self.job_dir / "points.csv").write_text("\n".join(rows) + "\n")


def _mean_nll(points: dict[int, list[Point]], keep) -> float | None:
    values = [p.nll for L, pts in points.items() if keep(L) for p in pts]
    return mean(values) if values else None


def _one_line(outcome: dict) -> str:
    name = f"{outcome['knob']}={json.dumps(outcome['value'])}" if outcome.get("knob") else "baseline"
    status = outcome["status"]
    if status in ("failed", "killed"):
        return f"[red]{name}: {status}[/] - {outcome.get('error', '')}"
    if "describe" not in outcome:
        return f"[yellow]{name}: {status}[/] - {outcome.get('note', '')}"
    extra = f" [yellow]({status}: {outcome['note']})[/]" if status == "confounded" else ""
    return (f"[bold]{name}[/]: {outcome['describe']}; {outcome['probes']} probes, "
            f"{outcome['points_cached']} cached / {outcome['points_measured']} measured{extra}")


def run_job(cfg, job_dir: str | Path) -> dict[str, Any]:
    """Run one job; ConfigError/KnobError/TrackingError are raised before any engine starts."""
    job = Job(cfg, Path(job_dir))
    return job.run()

