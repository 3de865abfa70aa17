"""Prefill steps by each run's resolved token budget (axis=length): which measured lengths the engine prefilled
in chunks, and whether the step rule "a length is polluted when one of its prefill steps fits a captured graph
size" agrees with each run's verdicts. Said only where some run chunked a measured length (its budget is below
it): there a knob can move the verdicts without moving the capture size, and the transition-vs-quantity claims
see no transition to read.

The steps are what the resolved budget implies (vLLM's chunked prefill schedules at most max_num_batched_tokens
tokens of one prompt per step: budget, budget, ..., the rest); oneknob does not record the steps of an
axis=length point. The rule is a hypothesis checked against the measurements, never a verdict.
"""

from __future__ import annotations

from typing import Any


def prefill_steps(length: int, budget: int) -> list[int]:
    """Tokens per prefill step of one prompt under a token budget: [budget] * full chunks, then the rest."""
    full, rest = divmod(length, budget)
    return [budget] * full + ([rest] if rest else [])


def _graphs(resolved: dict[str, Any]) -> int | None:
    """The largest captured size when the run replays graphs, else None (every step then runs eager)."""
    capture = resolved.get("max_capture_size")
    if resolved.get("enforce_eager") or resolved.get("cudagraph_mode") in (None, "NONE"):
        return None
    return capture if isinstance(capture, int) and not isinstance(capture, bool) else None


def run_steps(run: dict[str, Any]) -> dict[str, Any] | None:
    """One run's steps and the rule's agreement; None off axis=length, unmeasured, or with no budget."""
    budget = run["resolved"].get("max_num_batched_tokens") if run.get("resolved") else None
    if (run.get("axis", "length") != "length" or run["status"] not in ("ok", "confounded") or not run["points"]
            or not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
        return None
    capture = _graphs(run["resolved"])
    points = sorted(run["points"], key=lambda p: p["length"])
    predicted = {p["length"]: capture is not None and min(prefill_steps(p["length"], budget)) <= capture
                 for p in points}
    wrong = [p["length"] for p in points if predicted[p["length"]] != p["polluted"]]
    return {"name": run["name"], "budget": budget, "capture": capture,
            "chunked": [p["length"] for p in points if p["length"] > budget],
            "lengths": len(points), "wrong": wrong}


def _lengths(values: list[int]) -> str:
    return ", ".join(map(str, values)) if len(values) <= 6 else f"{len(values)} lengths ({values[0]}..{values[-1]})"


def _example(length: int, budget: int) -> str:
    steps = prefill_steps(length, budget)
    shown = " + ".join(map(str, steps)) if len(steps) <= 4 else f"{len(steps) - 1} x {budget} + {steps[-1]}"
    return f"{length} = {shown}"


def lines(runs: list[dict[str, Any]]) -> list[str]:
    """The report's lines: one per measured run when any run chunked a measured length, else none."""
    found = [s for run in runs if (s := run_steps(run))]
    if not any(s["chunked"] for s in found):
        return []
    out = []
    for s in found:
        budget, capture = s["budget"], s["capture"]
        chunks = (f"prefilled {_lengths(s['chunked'])} in chunks of at most {budget} tokens "
                  f"(e.g. {_example(s['chunked'][0], budget)})" if s["chunked"] else
                  f"prefilled every measured length in one step (budget {budget} tokens)")
        fits = ("no step replays a graph (cudagraph_mode NONE or eager)" if capture is None else
                f"a step of <= {capture} tokens (the resolved capture size) replays a captured graph")
        agrees = (f"the step rule (polluted when a prefill step fits a captured size) agrees at all {s['lengths']} "
                  "measured lengths" if not s["wrong"] else
                  f"the step rule (polluted when a prefill step fits a captured size) fails at "
                  f"{_lengths(s['wrong'])} of {s['lengths']} measured lengths")
        out.append(f"{s['name']}: token budget {budget} (resolved max_num_batched_tokens): {chunks}; {fits}; "
                   f"{agrees}")
    out.append("steps follow from each run's resolved budget, not from recorded steps (axis=length records none); "
               "the rule is a hypothesis the verdicts test, not a finding of its own")
    return out
