"""The follow-up runs as what they are: one knob from the run whose edge each tests, added by the explanation.

A follow-up (study.followups) is no configured variant: the sweep started it to test "the edge lo|hi of run R
tracks quantity X" by moving X with one knob from R, and it predicts where the edge lands. report.md and the
terminal say so: which run it comes from, what it tested, what it predicted and what it found (run["followup_of"],
set by the sweep; the verdict on the hypothesis itself is summary["conclusions"], rendered by answer.py).
"""

from __future__ import annotations

import json

from oneknob.config.quantities import label
from oneknob.explain.answer import the
from oneknob.verdict.search import Transition

LEGEND = ("follow-up X: a run the explanation added, the baseline with X (follow-up R + X: run R with X); its "
          "columns compare it with the run it tests")


def followups(summary: dict) -> list[dict]:
    return [r for r in summary["runs"] if r.get("followup") and r.get("followup_of")]


def _measured(run: dict) -> bool:
    return run["status"] in ("ok", "confounded") and bool(run["points"])


def _span(pair) -> str:
    return pair if isinstance(pair, str) else f"{pair[0]}|{pair[1]}"


def _offset(offset: int | None) -> str:
    return "" if not offset else f" {'+' if offset > 0 else '-'} {abs(offset)}"


def hypothesis(of: dict) -> str:
    """The question a follow-up asks: "does 424|425 track the resolved max capture size - 87? it predicts 296|297"."""
    quantity = the(of.get("label") or label(of["quantity"]))
    return f"does {of['transition']} track {quantity}{_offset(of.get('offset'))}? it predicts {_span(of['predicted'])}"


def _records(run: dict, oracle: str | None) -> list[dict]:
    if oracle and oracle in (run.get("oracles") or {}):
        return run["oracles"][oracle]["transitions"]
    return run["transitions"]


def outcome(run: dict) -> str:
    """What the follow-up found against its prediction: "found 384|385, as predicted", "left it at 424|425"."""
    of = run["followup_of"]
    if not _measured(run):
        return f"measured nothing ({run['status']})"
    found = [Transition.from_dict(t) for t in _records(run, of.get("oracle"))]
    texts = [t.text for t in found]
    predicted = _span(of["predicted"])
    if predicted in texts:
        return f"found {predicted}, as predicted"
    if of["transition"] in texts:
        return f"left it at {of['transition']}, not the predicted {predicted}"
    if not found:
        return f"found no boundary (predicted {predicted})"
    return f"found {', '.join(texts)}, not the predicted {predicted}"


def line(run: dict) -> str:
    """One follow-up in a sentence: where it comes from, what it tested, what it found."""
    of = run["followup_of"]
    return f"{run['name']} (one knob from {of['run']}; {hypothesis(of)}): {outcome(run)}"


def compared(summary: dict) -> str:
    """The header's part on follow-ups: "and 1 follow-up run the explanation added (cudagraph.capture=384 from the
    baseline)"."""
    found = followups(summary)
    if not found:
        return ""
    each = ", ".join(f"{r['followup_of']['knob']}={_value(r['followup_of']['value'])} from {r['followup_of']['run']}"
                     for r in found)
    return f"; and {len(found)} follow-up run(s) the explanation added, each one knob from the run it tests: {each}"


def _value(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)
