"""The separating run: which single knob moves one candidate quantity, to what, and where the edge must go.

For a hypothesis "side = X + d" of a run's transition (explain.hypotheses), `design` tries the knobs that may move
X (its own knob first: `model.override.<path>` for a model field, `engine_args.<field>` for a field of the engine's
config, the knob itself for a knob's value, then the named knobs and the token budget), each at a few values
(3/4, 1/2, 5/4 and 2x of where it is; K from 1 to 4). It predicts the trial's quantities with the run's own
resolution rules and keeps a trial that moves X, alone among the transition's candidates where it can (another one
it moves must predict the edge elsewhere, so the run still tells them apart), that turns no mechanism on or off
(CUDA graphs, speculation), and that puts the predicted edge X' + d inside the lengths the run measured and the
model takes, off the old edge, off the powers of two where that matters and off every other candidate.
`decisive` reads a follow-up's first, targeted probes (the predicted edge's two lengths and the old edge's):
the edge is where the hypothesis says (both flips as predicted), or it stayed; anything else is for the full
search. Pure functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oneknob.config import knobs, model_override
from oneknob.config.quantities import is_config_quantity, is_power_of_two
from oneknob.config.resolution import capture_grid
from oneknob.explain.hypotheses import Hypothesis
from oneknob.verdict.search import CLEAN, DOWN, POLLUTED

NAMED = ("cudagraph.capture", "sched.max_num_seqs", "spec.k", "engine_args.max_num_batched_tokens")
SCALES = ((3, 4), (1, 2), (5, 4), (2, 1))
# where a knob is null, the resolved field it sets
RESOLVED_OF = {"cudagraph.capture": "max_capture_size", "sched.max_num_seqs": "max_num_seqs",
               "engine_args.max_num_batched_tokens": "max_num_batched_tokens"}
NO_KNOB = "no single knob moves it alone"
OUTSIDE = "the predicted edge falls outside the lengths measured"


@dataclass(frozen=True)
class Design:
    knob: str
    value: Any
    moved_to: int  # X in the follow-up, as predicted
    predicted: tuple[int, int]  # the edge lo|hi the hypothesis predicts there

    @property
    def transition(self) -> str:
        return f"{self.predicted[0]}|{self.predicted[1]}"


def movers(quantity: str, run: dict) -> list[str]:
    """The knobs to try for one quantity, its own first."""
    own = []
    if quantity.startswith("model."):
        own = [model_override.PREFIX + quantity.removeprefix("model.")]
    elif quantity.startswith("knob "):
        own = [quantity.removeprefix("knob ")]
    elif is_config_quantity(quantity):
        field = quantity.split(".", 1)[1]  # a nested field (compilation_config.pass_config.x) is no top-level one
        owner = knobs.named_owner(field)
        own = [owner or f"engine_args.{field}"]
    return [k for k in dict.fromkeys([*own, *NAMED]) if knobs.is_knob(k)]


def _current(knob: str, run: dict, quantities: dict[str, int]) -> Any:
    value = (run.get("requested") or {}).get(knob)
    if value is not None:
        return value
    if knob in RESOLVED_OF:
        return (run.get("resolved") or {}).get(RESOLVED_OF[knob])
    if model_override.is_override(knob):
        return quantities.get("model." + knob.removeprefix(model_override.PREFIX))
    if knob.startswith("engine_args."):
        field = knob.removeprefix("engine_args.")
        return next((v for q, v in quantities.items() if is_config_quantity(q) and q.endswith("." + field)),
                    None)
    return None


def trial_values(knob: str, current: Any) -> list[Any]:
    """A few values of one knob, in the order tried."""
    if knob == "spec.k":  # K = 0 turns speculation off: a mechanism, not a quantity
        return [k for k in range(1, 5) if k != current]
    if isinstance(current, bool) or not isinstance(current, int) or current < 2:
        return []
    values = [current * a // b for a, b in SCALES]
    if knob == "cudagraph.capture":  # on vLLM's capture grid (an off-grid maximum is truncated with a warning)
        grid = capture_grid(max(values))
        values = [max((s for s in grid if s <= v), default=v) for v in values]
    return [v for v in dict.fromkeys(values) if v > 1 and v != current]


def design(run: dict, h: Hypothesis, others: list[Hypothesis], trial_quantities: Callable[[dict], dict | None],
           limits: tuple[int, int], tried: list[dict]) -> Design | str:
    """The single-knob follow-up that tests `h` (moving it, alone among `others` where it can, the transition's other
    candidates), or why there is none (NO_KNOB, OUTSIDE). `trial_quantities(knob values)` predicts a trial's
    candidate quantities (None: a value no engine would start with); `tried` the knob values of runs that
    exist already (a trial equal to one is not proposed again)."""
    lo_limit, hi_limit = limits
    base = run.get("requested") or {}
    found, outside = [], False
    quantities = trial_quantities(base) or {}
    for rank, knob in enumerate(movers(h.quantity, run)):
        for order, value in enumerate(trial_values(knob, _current(knob, run, quantities))):
            trial = base | {knob: value}
            if any(trial == t for t in tried):
                continue
            after = trial_quantities(trial)
            if after is None or h.quantity not in after:
                continue
            if after[h.quantity] == h.value:
                continue
            side = after[h.quantity] + h.offset
            # another candidate may move too (max_num_seqs moves both of its multiples) only where it predicts
            # the edge elsewhere: the run still tells them apart
            moved = [o for o in others if after.get(o.quantity) != o.value]
            if any(after.get(o.quantity) is not None and after[o.quantity] + o.offset == side for o in moved):
                continue
            predicted = (side, side + 1) if h.relation.startswith("last") else (side - 1, side)
            if abs(side - h.side) < 2:
                continue
            if not (lo_limit <= predicted[0] and predicted[1] <= hi_limit):
                outside = True
                continue
            collides = after[h.quantity] in {v for q, v in after.items() if q != h.quantity}
            found.append(((collides, len(moved), is_power_of_two(side), rank, order),
                          Design(knob, value, after[h.quantity], predicted)))
    if found:
        return min(found, key=lambda f: f[0])[1]
    return OUTSIDE if outside else NO_KNOB


def targeted(predicted: tuple[int, int], edge: tuple[int, int]) -> list[int]:
    """A follow-up's first probes: the predicted edge's two lengths and the old edge's."""
    return sorted({*predicted, *edge})


def decisive(verdicts: dict[int, str], predicted: tuple[int, int], edge: tuple[int, int], direction: str) -> bool:
    """Whether the targeted probes settle the hypothesis: the flip is at the predicted lengths and gone from the
    old ones (it moved as predicted), or still at the old ones and not at the predicted ones (it stayed)."""
    before, after = (POLLUTED, CLEAN) if direction == DOWN else (CLEAN, POLLUTED)
    flips = lambda pair: (verdicts.get(pair[0]), verdicts.get(pair[1])) == (before, after)  # noqa: E731
    same = lambda pair: verdicts.get(pair[0]) is not None and verdicts.get(pair[0]) == verdicts.get(pair[1])  # noqa
    return (flips(predicted) and same(edge)) or (flips(edge) and same(predicted))


def limits_of(run: dict, quantities: dict[str, int]) -> tuple[int, int]:
    """The lengths a follow-up of this run may place its edge in: the run's measured range, within the model's
    length (max_model_len where the engine resolved one, else max_position_embeddings)."""
    lengths = [p["length"] for p in run.get("points") or []]
    if not lengths:
        return (1, 0)
    model_max = quantities.get("scheduler_config.max_model_len") or quantities.get("model.max_position_embeddings")
    return min(lengths), min(max(lengths), model_max or max(lengths))

