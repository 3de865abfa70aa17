"""The single-variable rules, requested and resolved, and the sentences that explain them.

Requested (the command line, before anything is composed or started):
  - `+`, `++` and `~` on any key under a knob group are refused (Hydra would add
    or delete the key silently), typos included, naming the closest knob;
  - a sweep varies at most one knob; a knob list beside other swept keys is refused, and so is a sweep of
    `engine` or `axis` (STUDY_DEFINING). The arguments themselves (as Hydra reads them, as a user types them,
    a sweep's values read lazily) are plan/arguments.py's.
Resolved (after a variant's engine resolved its config): the variant is diffed
against the baseline's resolved config. The varied knob may move its own
fields (knobs.Knob.moves); anything else that moved is a side effect, handled
by `single_variable.side_effects`:
  pin    - restart with the baseline's value set explicitly through the knob
           that sets it (e.g. cudagraph.capture=512) and record the pin; where no
           knob can restore a field, say why and fall back to flag
  flag   - run it, tag the run oneknob.confounded, say so in the report
  refuse - do not measure it
Capture fields are inert when neither side runs graphs (cudagraph_mode NONE);
a variant that differs from the baseline only in inert fields, or not at all,
is a no-op: measured only with single_variable.run_noops=true. The job records
its `Check` (resolved_diff.json, tag oneknob.check); the comparison reads it.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hydra.core.override_parser.types import Override, OverrideType

from oneknob.config import knobs
from oneknob.errors import Refused
from oneknob.plan.arguments import (  # noqa: F401 (the command line's arguments, for the guard's callers)
    FREE_MAPPINGS,
    MAX_SWEEP_JOBS,
    RangeValues,
    as_typed,
    force_add_families,
    parse,
    said,
    values_of,
)

INERT_WITHOUT_GRAPHS = ("max_capture_size", "capture_sizes")
POLICIES = ("pin", "flag", "refuse")
KNOB_GROUPS = tuple(sorted({k.group or k.key for k in knobs.KNOBS.values()} | set(knobs.FAMILIES)))


class GuardError(Refused):
    """A request that breaks the single-variable rules; refused before anything starts."""


# -- requested -------------------------------------------------------------------------------------

def in_knob_group(key: str) -> bool:
    return key.split(".")[0] in KNOB_GROUPS or f"{key}.".startswith("model.override.")  # model.override.<path>


def closest_knob(key: str) -> str | None:
    found = difflib.get_close_matches(key, list(knobs.KNOBS), n=1, cutoff=0.6)
    return found[0] if found else None


def check_release_text(override: Override) -> None:
    """vllm.version=0.30 reaches oneknob as 0.3: Hydra reads an unquoted release as a number. Refuse it, quoted."""
    if override.key_or_group != "vllm.version" or override.type is OverrideType.DEL:
        return
    value = override.value()
    elements = list(value.list) if hasattr(value, "list") else [value]
    if any(isinstance(v, float) for v in elements):
        typed = override.input_line.split("=", 1)[1]
        quoted = ",".join(f"'{t.strip()}'" for t in typed.split(","))
        raise GuardError(f"{override.input_line}: Hydra reads {typed} as a number ({', '.join(map(str, elements))}), "
                         f"which drops a release's digits (0.30 becomes 0.3); quote it: vllm.version={quoted}")


def check_prefixes(parsed: list[Override], *, rewritten: bool = False) -> None:
    """Refuse +, ++ and ~ on any key under a knob group, naming the closest knob, and a knob given twice.
    `rewritten`: the arguments went through force_add_families, so `++` on a family knob is oneknob's own."""
    keys = [o.key_or_group for o in parsed if knobs.is_knob(o.key_or_group)]
    for key in dict.fromkeys(k for k in keys if keys.count(k) > 1):
        raise GuardError(f"{key} is given {keys.count(key)} times on the command line; give it once "
                         f"({key}=a,b for a sweep over its values)")
    for override in parsed:
        key = override.key_or_group
        check_release_text(override)
        if knobs.is_family(key) and (override.type is OverrideType.CHANGE
                                     or (rewritten and override.type is OverrideType.FORCE_ADD)):
            continue
        if override.type is OverrideType.CHANGE and in_knob_group(key) and "." in key and key not in knobs.KNOBS:
            group, _, field_name = key.partition(".")
            from oneknob.config.schema import KNOB_GROUPS as SCHEMA

            # Hydra would refuse it suggesting +key, which the guard refuses next: say the knob it resembles
            if group in SCHEMA and field_name not in {f.name for f in dataclasses.fields(SCHEMA[group])}:
                near = closest_knob(key)
                hint = (f"did you mean {near}? Write {near}={override.value()}" if near is not None
                        else f"the knobs are {', '.join(knobs.KNOBS)}")
                raise GuardError(f"{override.input_line}: {key} is not a knob or a setting; {hint}")
            continue
        if override.type is OverrideType.CHANGE or not in_knob_group(key):
            continue
        sign = {OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++", OverrideType.DEL: "~"}[override.type]
        value = override.input_line.split("=", 1)[1] if "=" in override.input_line else "VALUE"  # as typed: runs
        if knobs.is_knob(key):
            hint = f"write {key}={value}"
        elif (near := closest_knob(key)) is not None:
            hint = f"{key} is not a knob: did you mean {near}? Write {near}={value}"
        else:
            hint = f"{key} is not a knob; the knobs are {', '.join(knobs.KNOBS)}"
        raise GuardError(f"{override.input_line}: '{sign}' on {key} is refused: knobs always exist and "
                         f"nothing else may be added under {key.split('.')[0]} (Hydra would add or delete "
                         f"the key silently); {hint}")


# Keys that define what a study is, so they cannot vary inside one: the engine decides the MLflow experiment, the
# reference and what a resolved config means; the axis decides what a point is (a prompt length, neighbours, a
# concurrency), so points of two axes are not comparable.
STUDY_DEFINING = {"engine": "on one engine (each engine has its own MLflow experiment, reference and resolved "
                            "config)",
                  "axis": "along one axis (a prompt length, a neighbour count and a concurrency are not comparable "
                          "points)"}


@dataclass(frozen=True)
class SweepShape:
    knob: str | None  # the varied knob, if any
    values: Sequence[str]  # its values as typed (a range: RangeValues, computed when asked)
    other: dict[str, Sequence[str]]  # non-knob keys with several values (a sweep of study settings)


def sweep_shape(overrides: list[str]) -> SweepShape:
    parsed = parse(force_add_families(overrides))
    check_prefixes(parsed, rewritten=True)
    varied = {o.key_or_group: values_of(o) for o in parsed if o.is_sweep_override()}
    swept_knobs = {k: v for k, v in varied.items() if knobs.is_knob(k)}
    other = {k: v for k, v in varied.items() if not knobs.is_knob(k)}
    for key, values in other.items():
        if key == "devices":  # where the engines run (oneknob.run.devices): one placement per sweep, not a variant
            listed = f"'devices=[{','.join(values)}]'" if len(values) <= MAX_SWEEP_JOBS else "'devices=[0,1,2,3]'"
            raise GuardError(f"devices={said(values)}: devices says where the sweep's engines run, one placement "
                             f"for the whole sweep, so a sweep does not vary it (devices=0,1 on the command line of "
                             f"-m is a list of values to sweep); give the devices as one list: {listed}")
        if key in STUDY_DEFINING:
            raise GuardError(f"{key}={said(values)}: a sweep compares variants against one baseline "
                             f"{STUDY_DEFINING[key]}, so {key} cannot vary within one; run one sweep per {key} "
                             f"({key}={values[0]}, then {key}={values[1]}, each with the same other arguments)")
        if in_knob_group(key):  # a setting beside the knobs (spec.method) changes the engine but is not a knob
            raise GuardError(f"{key}={said(values)}: {key} is not a knob, so a sweep cannot vary it (it would "
                             f"change the engine config beside the single-variable rules); give it one value per "
                             f"run. The knobs a sweep varies: {', '.join(knobs.KNOBS)}")
    if len(swept_knobs) > 1:
        listed = "; ".join(f"{key} over {said(values)}" for key, values in swept_knobs.items())
        raise GuardError(
            f"this sweep varies {len(swept_knobs)} knobs ({listed}), so no result could be pinned on one of "
            "them. Vary one knob per sweep, or put them in an ablation block, which runs one knob at a time "
            "against the baseline: python run.py -m "
            + " ".join([*(shlex.quote(a) for a in as_typed([o.input_line for o in parsed
                                                               if o.key_or_group not in swept_knobs])),
                        *(shlex.quote(f"+ablation.{key}=[{','.join(values)}]") if len(values) <= MAX_SWEEP_JOBS
                          else f"'+ablation.{key}=[...]'" for key, values in swept_knobs.items())]))
    if swept_knobs and other:
        knob = next(iter(swept_knobs))
        listed = ", ".join(f"{key}={said(values)}" for key, values in other.items())
        raise GuardError(
            f"this sweep varies the knob {knob} and also {listed}: the runs of {knob} would not share one "
            f"baseline. Give {', '.join(other)} one value per sweep (run one sweep per value)")
    knob = next(iter(swept_knobs), None)
    return SweepShape(knob, swept_knobs.get(knob, []), other)


def variants_of_block(block: dict, baseline: dict[str, Any]) -> list[tuple[str, Any]]:
    """(knob, value) per value of an `ablation:` block that differs from the baseline."""
    try:
        flat = knobs.flatten(block)
    except knobs.KnobError as exc:
        raise GuardError(f"ablation: {exc}") from None
    found = []
    for key, values in flat.items():
        for value in values if isinstance(values, list) else [values]:
            try:
                knobs.check(key, value)
            except knobs.KnobError as exc:
                raise GuardError(f"ablation: {exc}") from None
            if value != baseline.get(key) and (key, value) not in found:
                found.append((key, value))
    return found


# -- resolved --------------------------------------------------------------------------------------

@dataclass
class Check:
    """What one variant did inside the engine, relative to the baseline."""

    knob: str | None
    diff: dict[str, list] = field(default_factory=dict)  # field -> [baseline, variant]
    side_effects: list[str] = field(default_factory=list)
    inert: list[str] = field(default_factory=list)
    pinned: dict[str, Any] = field(default_factory=dict)
    undone: str = ""  # what the pin undid, in words
    confounded: bool = False
    status: str = "ok"  # ok | confounded | noop | refused | unchecked
    note: str = ""

    @property
    def skip(self) -> bool:
        return self.status in ("noop", "refused")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def diff(baseline: dict, variant: dict, *, full: bool = False) -> dict[str, list]:
    """Every resolved field that differs: oneknob's summary fields and the family knobs' values as passed
    (dotted keys); with `full`, every field of vLLM's own resolved config too (the engine's "vllm" mapping,
    "<section>.<field>"), so whatever vLLM derived from a knob is found without a list of ours."""
    def view(resolved: dict) -> dict:
        flat = {k: v for k, v in resolved.items() if k != "vllm"}
        return (resolved.get("vllm") or {}) | flat if full else flat

    a, b = view(baseline), view(variant)
    dotted = sorted({f for f in (*a, *b) if "." in f and f not in knobs.RESOLVED_FIELDS})
    return {f: [a.get(f), b.get(f)] for f in (*knobs.RESOLVED_FIELDS, *dotted) if a.get(f) != b.get(f)}


def mispredicted(predicted: dict, resolved: dict) -> dict[str, list]:
    """The fields the resolution rules predicted that the engine resolved otherwise: [predicted, engine] by field.
    Only what the rules predict counts; what they say nothing of (the build, a family knob's echo, vLLM's own
    sections) is the engine's to say and no misprediction."""
    return diff(predicted, {field: resolved.get(field) for field in predicted})


def _sizes(values: list) -> str:
    return str(values) if len(values) <= 6 else f"{len(values)} sizes ({values[0]}..{values[-1]})"


def change_text(name: str, before: Any, after: Any) -> str:
    if isinstance(before, list) and isinstance(after, list):
        gained, lost = sorted(set(after) - set(before)), sorted(set(before) - set(after))
        parts = ([f"gained {_sizes(gained)}"] if gained else []) + ([f"lost {_sizes(lost)}"] if lost else [])
        return f"{name} {' and '.join(parts) or 'reordered'}"
    return f"{name} {json.dumps(before)} -> {json.dumps(after)}"


def _compare(knob: str, baseline: dict, variant: dict) -> Check:
    # A family knob's diff covers vLLM's whole resolved config; a named knob's, oneknob's summary fields
    # (which vLLM fields each named knob owns is not mapped)
    changed = diff(baseline, variant, full=knobs.is_family(knob))
    no_graphs = baseline.get("cudagraph_mode") == "NONE" and variant.get("cudagraph_mode") == "NONE"
    inert = [f for f in changed if no_graphs and f in INERT_WITHOUT_GRAPHS]
    side = [f for f in changed if not knobs.knob(knob).owns(f) and f not in inert]
    return Check(knob, changed, side, inert)


def check(knob: str | None, baseline: dict | None, resolved: dict, *, policy: str, run_noops: bool) -> Check:
    """The first look at a variant. A `pin` result has `pinned` set and status "pin": resolve the pinned
    config and call `after_pin`."""
    if knob is None:
        return Check(None)
    if baseline is None:
        return Check(knob, status="unchecked",
                     note="not checked against the baseline: the baseline job did not resolve a config")
    found = _compare(knob, baseline, resolved)
    if not [f for f in found.diff if f not in found.inert]:
        what = "only in capture fields that no CUDA graph uses (cudagraph_mode NONE)" if found.inert else "in nothing"
        found.note = f"no-op: its resolved config differs from the baseline's {what}"
        if not run_noops:
            found.status = "noop"
            found.note += "; not measured (single_variable.run_noops=true measures it)"
        return found
    if not found.side_effects:
        return found
    moved = ", ".join(change_text(f, *found.diff[f]) for f in found.side_effects)
    if policy == "refuse":
        found.status = "refused"
        found.note = f"refused: {knob} also moved {moved} (single_variable.side_effects=refuse)"
        return found
    if policy == "pin":
        pins = {pinner.key: baseline[pinner.pins[0]] for f in found.side_effects
                if (pinner := knobs.pinning_knob(f)) is not None and pinner.key != knob}
        if pins:
            found.pinned, found.undone, found.status = pins, moved, "pin"
            return found
        found.note = f"no knob sets {', '.join(found.side_effects)}: flagged instead; "
    return _flag(found)


def after_pin(first: Check, baseline: dict, resolved: dict) -> Check:
    """The pinned variant's check: clean when the pin restored every side effect, else flagged."""
    found = _compare(first.knob, baseline, resolved)
    found.pinned, found.undone = first.pinned, first.undone
    pins = ", ".join(f"{k}={json.dumps(v)}" for k, v in first.pinned.items())
    found.note = f"pinned {pins} (the baseline's resolved value) to undo {first.undone}"
    if found.side_effects:
        found.note += f"; pinning did not restore {', '.join(found.side_effects)}: flagged. "
        return _flag(found)
    return found


def _flag(found: Check) -> Check:
    moved = ", ".join(change_text(f, *found.diff[f]) for f in found.side_effects)
    found.confounded, found.status = True, "confounded"
    found.note = f"{found.note}confounded: {found.knob} also moved {moved}".strip()
    return found
