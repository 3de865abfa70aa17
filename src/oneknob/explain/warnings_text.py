"""The engine's warnings across the runs of a comparison: those every run's engine logged (the environment:
said once, in the report's header) and those only some runs have (a finding, beside those runs).

Runs are compared by their warnings' `engine_log.key` (PIDs, times, memory amounts blanked). Only runs whose
warnings were recorded and that measured take part in "every run": a run whose points all came from the cache
started no engine, and one that failed may have stopped before its engine said everything.
"""

from __future__ import annotations

from oneknob.run.engine_log import key

MEASURED = ("ok", "confounded")


def split(runs: list[dict]) -> dict:
    """{"shared": [...], "only_in": {run name: [...]}, "compared": [run names]} (summary.json's engine_warnings)."""
    recorded = [r for r in runs if r.get("engine_warnings") is not None]
    compared = [r for r in recorded if r["status"] in MEASURED] or recorded
    shared_keys = set.intersection(*({key(w) for w in r["engine_warnings"]} for r in compared)) if compared else set()
    shared: dict[str, str] = {}  # one text per key, the first seen
    for run in compared:
        for warning in run["engine_warnings"]:
            if key(warning) in shared_keys:
                shared.setdefault(key(warning), warning)
    only_in = {r["name"]: rest for r in recorded if (rest := [w for w in r["engine_warnings"]
                                                             if key(w) not in shared_keys])}
    return {"shared": list(shared.values()), "only_in": only_in, "compared": [r["name"] for r in compared]}


def _who(names: list[str], runs: list[dict]) -> str:
    """"the baseline", "the variant X", "the baseline and the variants X, Y", "the runs X, Y" (no baseline)."""
    kinds = {r["name"]: r.get("knob") for r in runs}
    has_baseline = any(kinds.get(n, "") is None for n in names) and any(k is None for k in kinds.values())
    variants = [n for n in names if kinds.get(n, "") is not None]
    if not any(k is None for k in kinds.values()):
        return f"the run{'s' if len(names) > 1 else ''} {', '.join(names)}"
    said = [f"the variant{'s' if len(variants) > 1 else ''} {', '.join(variants)}"] if variants else []
    return " and ".join((["the baseline"] if has_baseline else []) + said)


def _grouped(summary: dict) -> list[tuple[str, list[str]]]:
    """(warning, the runs that have it) for every warning not in every run, in the runs' order."""
    found: dict[str, tuple[str, list[str]]] = {}
    for name, warnings in (summary.get("engine_warnings") or {}).get("only_in", {}).items():
        for warning in warnings:
            found.setdefault(key(warning), (warning, []))[1].append(name)
    return list(found.values())


def finding_lines(summary: dict) -> list[str]:
    """Result: "engine warning only in the variant X: ...", one per warning that not every run has."""
    return [f"engine warning only in {_who(names, summary['runs'])}: {warning}"
            for warning, names in _grouped(summary)]


def header_lines(summary: dict) -> list[str]:
    """The header's environment: the warnings every compared run's engine logged, once."""
    split_ = summary.get("engine_warnings") or {}
    if not split_.get("shared"):
        return []
    compared = len(split_.get("compared") or [])
    which = "its worker log" if compared == 1 else f"the worker log of each of the {compared} runs"
    return ([f"- **engine warnings** (in {which}; those only some runs have: Result):"]
            + [f"  - `{w.replace('`', chr(39))}`" for w in split_["shared"]])


def run_lines(summary: dict, run: dict) -> list[str]:
    """Beside one run: the warnings it has that not every run has."""
    return [f"engine warning only in {_who(names, summary['runs'])}: {warning}"
            for warning, names in _grouped(summary) if run["name"] in names]


def terminal_lines(summary: dict, shown: set[str] = frozenset()) -> list[str]:
    """What the end of a sweep prints: each warning not `shown` yet (keys the jobs printed), then one line
    counting those that were."""
    split_ = summary.get("engine_warnings") or {}
    shared = split_.get("shared") or []
    lines = [f"engine warning in every run: {w}" for w in shared if key(w) not in shown]
    grouped = _grouped(summary)
    lines += [f"engine warning only in {_who(names, summary['runs'])}: {w}" for w, names in grouped
              if key(w) not in shown]
    told_shared = sum(key(w) in shown for w in shared)
    told_only = [(w, names) for w, names in grouped if key(w) in shown]
    if told_shared or told_only:
        parts = [f"{told_shared} in every run (report.md: the header)"] if told_shared else []
        runs = ", ".join(dict.fromkeys(name for _, names in told_only for name in names))
        parts += [f"{len(told_only)} only in some runs ({runs}; report.md: What each knob did)"] if told_only else []
        lines.append(f"engine warnings shown above with their jobs: {', '.join(parts)}")
    return lines
