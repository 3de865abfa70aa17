"""The report's two plots, each on one axes so runs compare by eye.

    nll_vs_length.png    delta NLL (NLL - NLL ref; NLL in absolute mode) against prompt length, every run
                         overlaid, each transition a dotted line in its run's colour
    boundary_vs_knob.png each run's boundary (the side of its first transition that the claim names), with the
                         quantity the boundary is claimed to track; a run without a transition has no point

Drawn from summary.json's rows alone (report.write), so a plot rebuilt from MLflow is the same plot.
A run without a transition is drawn as an absence and said so in its label, never as a value.
"""

from __future__ import annotations

from pathlib import Path

from oneknob.explain import axis_text
from oneknob.explain import confounds
from oneknob.verdict.search import DOWN, Transition, relation_text

NLL_PLOT, BOUNDARY_PLOT = "nll_vs_length.png", "boundary_vs_knob.png"
# Runs often coincide (identical curves): decreasing marker sizes keep each visible behind the next.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _short(record: dict) -> str:
    t = Transition.from_dict(record)
    return f"{t.text} {'p->c' if t.direction == DOWN else 'c->p'}"


def plot_nll(summary: dict, path: Path, tolerance: float | None = None) -> Path | None:
    fig = nll_figure(summary, tolerance)
    return None if fig is None else _save(_pyplot(), fig, path)


def nll_figure(summary: dict, tolerance: float | None = None):
    """`tolerance`: verdict.tol_nll, drawn as the band a clean point's delta stays in."""
    runs = [r for r in summary["runs"] if r["points"]]
    if not runs:
        return None
    relative = any(p.get("nll_ref") is not None for r in runs for p in r["points"])
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 5.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    marked: set[str] = set()
    for i, run in enumerate(runs):
        color, marker = colors[i % len(colors)], MARKERS[i % len(MARKERS)]
        points = [p for p in run["points"] if not relative or p.get("nll_ref") is not None]
        ys = [p["nll"] - p["nll_ref"] if relative else p["nll"] for p in points]
        found = ", ".join(_short(t) for t in run["transitions"]) or "no transition"
        ax.plot([p["length"] for p in points], ys, "-", marker=marker, ms=max(3.0, 9.0 - 0.8 * i), color=color,
                lw=1.2, alpha=0.85, label=f"{run['name']}: {found}")
        for record in run["transitions"]:
            t = Transition.from_dict(record)
            ax.axvline((t.lo + t.hi) / 2, color=color, ls=":", lw=1.2)
            if t.text not in marked:  # each distinct transition named once, above the axes
                marked.add(t.text)
                ax.annotate(t.text, xy=((t.lo + t.hi) / 2, 1.0), xycoords=("data", "axes fraction"),
                            xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8, color=color)
    if relative:
        if tolerance:
            ax.axhspan(-tolerance, tolerance, color="green", alpha=0.08, label=f"|delta| <= {tolerance:g} nats")
        ax.axhline(0, color="gray", lw=0.6)
    units = {axis_text.axis_of(r).unit for r in runs}
    ax.set_xlabel("prompt length (tokens)" if units == {"prompt tokens"} else " / ".join(sorted(units)))
    ax.set_ylabel("mean NLL - reference NLL (nats)" if relative else "mean NLL (nats)")
    ax.set_title("delta NLL against prompt length, every run; dotted: a run's transition" if relative
                 else "mean NLL against prompt length, every run; dotted: a run's transition", fontsize=10, pad=16)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    return fig


def _side(run: dict, relation: str) -> int | None:
    """The `relation` side of the run's first transition that has one ("lo": the first transition's lo)."""
    for record in run["transitions"]:
        t = Transition.from_dict(record)
        if relation == "lo":
            return t.lo
        if relation in t.relations() and t.resolved:
            return t.relations()[relation]
    return None


def plot_boundaries(summary: dict, path: Path) -> Path | None:
    fig = boundary_figure(summary)
    return None if fig is None else _save(_pyplot(), fig, path)


def boundary_figure(summary: dict):
    runs = [r for r in summary["runs"] if r["points"]]
    if not summary["tracks_detail"] or not runs:
        return None
    claimed = [d for d in [*summary["tracks_detail"].values(), summary["overall"]] if d.get("quantity")]
    relation = next((d["relation"] for d in claimed if d.get("relation")), "lo")
    quantity = claimed[0]["quantity"] if claimed else None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(runs)), 4.4))
    xs = list(range(len(runs)))
    ys = [_side(r, relation) for r in runs]
    label = relation_text(relation) if relation != "lo" else "first transition (lo)"
    ax.plot([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], "o", ms=8,
            color="red", label=f"measured: {label}", zorder=3)
    if quantity:
        values = [confounds.derived_quantities(r["resolved"]).get(quantity) if r["resolved"] else None
                  for r in runs]
        ax.plot([x for x, v in zip(xs, values) if v is not None], [v for v in values if v is not None], "_",
                ms=22, mew=2, color="gray", label=confounds.label(quantity))
    ticks = [f"{r['name']}\n{'(no transition)' if y is None else ''}".strip() for r, y in zip(runs, ys)]
    ax.set_xticks(xs, ticks, fontsize=7, rotation=20, ha="right")
    ax.set_xlim(-0.5, len(xs) - 0.5)
    ax.set_ylabel("prompt length (tokens)")
    ax.set_title("boundary per run (a run without a transition has no point)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig
