"""The effective single-variable guarantee: did a variant change one thing inside the engine?

After a variant's engine resolves its config, it is diffed against the
baseline's over every resolved field. The varied knob may move its own fields
(knobs.Knob.moves); anything else that moved is a side effect (K moves vLLM's
default capture size). Policy `single_variable.side_effects`:
  pin    - restart with the baseline's values set explicitly through the knob
           that sets them (e.g. cudagraph.capture=512) and record the pin;
           where no knob can restore a field, say why and fall back to flag
  flag   - run it, tag the run oneknob.confounded, say so in the report
  refuse - do not measure it
Capture fields are inert when neither side runs graphs (cudagraph_mode NONE,
e.g. on CPU); a variant that differs from the baseline only in inert fields,
or not at all, is a no-op: measured only with single_variable.run_noops=true.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oneknob import knobs, store

INERT_WITHOUT_GRAPHS = ("max_capture_size", "capture_sizes")


class SideEffectPolicy(enum.Enum):
    RUN = "run"
    SKIP = "skip"


@dataclass
class Check:
    requested: dict[str, Any]
    resolved: dict[str, Any]
    diff: dict[str, list] | None = None  # field -> [baseline, variant]; None without a baseline
    side_effects: list[str] = field(default_factory=list)
    inert: list[str] = field(default_factory=list)
    pinned: dict[str, Any] = field(default_factory=dict)
    confounded: bool = False
    policy: SideEffectPolicy = SideEffectPolicy.RUN
    status: str = "ok"
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"diff": self.diff, "side_effects": self.side_effects, "inert": self.inert,
                "pinned": self.pinned, "confounded": self.confounded, "status": self.status,
                "note": self.note}


def baseline_path(sweep_dir: str | Path) -> Path:
    return Path(sweep_dir) / "baseline.json"


def diff(baseline: dict, variant: dict) -> dict[str, list]:
    return {f: [baseline.get(f), variant.get(f)] for f in knobs.RESOLVED_FIELDS
            if baseline.get(f) != variant.get(f)}


def _split(knob_key: str, baseline: dict, variant: dict) -> tuple[dict, list[str], list[str]]:
    """(diff, side effects, inert fields) of a variant of one knob."""
    changed = diff(baseline, variant)
    no_graphs = baseline.get("cudagraph_mode") == "NONE" and variant.get("cudagraph_mode") == "NONE"
    inert = [f for f in changed if no_graphs and f in INERT_WITHOUT_GRAPHS]
    allowed = knobs.knob(knob_key).moves
    side = [f for f in changed if f not in allowed and f not in inert]
    return changed, side, inert


def check_against_baseline(cfg, requested: dict[str, Any], resolved: dict[str, Any],
                           resolve: Callable[[dict[str, Any]], dict[str, Any]]) -> Check:
    """Compare with the sweep's baseline; pin, flag or refuse side effects per policy."""
    knob_key = cfg.sweep.knob
    if cfg.sweep.dir and knob_key is None:  # the baseline job: publish what it resolved to
        store.write_json_atomic(baseline_path(cfg.sweep.dir), {"knobs": requested, "resolved": resolved})
    path = baseline_path(cfg.sweep.dir) if cfg.sweep.dir else None
    if knob_key is None or path is None or not path.exists():
        return Check(requested, resolved)
    baseline = json.loads(path.read_text())["resolved"]
    policy = cfg.single_variable.side_effects
    changed, side, inert = _split(knob_key, baseline, resolved)
    check = Check(requested, resolved, changed, side, inert)
    if not [f for f in changed if f not in inert]:
        what = "only in capture fields that no CUDA graph uses" if inert else "in nothing"
        check.note = f"no-op: its resolved config differs from the baseline's {what}"
        if not cfg.single_variable.run_noops:
            check.policy, check.status = SideEffectPolicy.SKIP, "noop"
            check.note += " (not measured; single_variable.run_noops=true measures it)"
        return check
    if not side:
        return check
    moved = ", ".join(f"{f} {changed[f][0]} -> {changed[f][1]}" for f in side)
    if policy == "refuse":
        check.policy, check.status = SideEffectPolicy.SKIP, "refused"
        check.note = f"refused: {knob_key} also moved {moved} (single_variable.side_effects=refuse)"
        return check
    if policy == "pin":
        pins, unpinnable = {}, []
        for f in side:
            pinner = knobs.pinning_knob(f)
            if pinner is None or pinner.key == knob_key:
                unpinnable.append(f)
            else:
                pins[pinner.key] = baseline[pinner.pins[0]]
        if pins:
            check.requested = requested | pins
            check.resolved = resolve(check.requested)
            check.pinned = pins
            check.diff, check.side_effects, check.inert = _split(knob_key, baseline, check.resolved)
            side = check.side_effects
        if not side:
            check.note = f"pinned {json.dumps(pins)} to undo {moved}"
            return check
        reasons = [f"no knob sets {f}" if f in unpinnable else f"pinning did not restore {f}" for f in side]
        check.note = f"{'; '.join(reasons)}: flagged instead. "
    check.confounded, check.status = True, "confounded"
    moved = ", ".join(f"{f} {check.diff[f][0]} -> {check.diff[f][1]}" for f in check.side_effects)
    check.note += f"confounded: {knob_key} also moved {moved}"
    return check
