"""One run in report.md: its cells in the runs table (transitions, graphs), and its section under "Per prompt
length" (what it did to the baseline, its suspect lengths and engine warnings, the seed's per-length table), folded
in a <details> block that GitHub shows closed. Also each run's own MLflow description (publish.job_note)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from oneknob.config.quantities import label, suspect_text
from oneknob.explain import axis_text
from oneknob.explain import oracle_views
from oneknob.explain.numbers import nll
from oneknob.explain.report_header import show
from oneknob.record.tags import EMULATED_TEXT
from oneknob.verdict.judge import samples_text
from oneknob.verdict.search import DOWN, Transition, suspects_text

LENGTH_HEADER = "| prompt tokens | mean NLL | NLL ref | delta | verdict |"
PER_LENGTH = "## Per prompt length"


@dataclass(frozen=True)
class Links:
    """How the MLflow description links: a run id to its page, a plot file to the parent's artifact."""

    run: Callable[[str], str]
    image: Callable[[str], str]
    overlay: str | None = None  # the UI page of the runs' nll against prompt length, overlaid



def _short(record: dict) -> str:
    t = Transition.from_dict(record)
    return f"{t.text} {'p->c' if t.direction == DOWN else 'c->p'}{'' if t.resolved else ' (unresolved)'}"


def transitions_cell(run: dict) -> str:
    """Every transition of a run, short: "512|513 p->c", "299|300 c->p, 400|401 p->c", "510..513 p->c
    (unresolved)"; each oracle's, named, where they disagree ("nll: none (all clean); greedy/decode: 284|285
    c->p")."""
    if run.get("shape") and oracle_views.disagree(run):
        cells = []
        for names in oracle_views.groups(run):
            seen = oracle_views.view(run, names[0]) | {"oracles": {}, "shape": run["oracle_results"][names[0]]["shape"]}
            cells.append(f"{'/'.join(names)}: {transitions_cell(seen)}")
        return "; ".join(cells)
    if not run["transitions"]:
        if not run["points"] or not run["shape"]:  # nothing measured, or a search that did not finish
            return "-"
        return {"all clean": "none (all clean)", "all polluted": "none (all polluted)"}.get(run["shape"], "none")
    return ", ".join(_short(record) for record in run["transitions"])


def graphs_cell(run: dict) -> str:
    mode = show(run["resolved"].get("cudagraph_mode"))
    return f"{mode}, {EMULATED_TEXT}" if run.get("emulated") and mode != "NONE" else mode


def run_ref(run_id: str, links: Links | None, text: str | None = None) -> str:
    return f"[{text or run_id}]({links.run(run_id)})" if links else f"`{run_id}`"


def length_table(run: dict) -> list[str]:
    """The seed's table: one row per measured length (grid and bisection), samples aggregated; bold: the
    lengths on either side of a transition."""
    edges = {L for record in run["transitions"] for L in (record["lo"], record["hi"])}
    axis = axis_text.axis_of(run)
    header, extra = LENGTH_HEADER, ""
    if axis.name != "length":  # the first column names the axis; batch adds its step, repeat its agreement
        header = LENGTH_HEADER.replace("prompt tokens", axis.column)
        header += " tokens per step | schedule |" if axis.name == "batch" else " agreement |"
        extra = "---:|---|" if axis.name == "batch" else "---|"
    decode = run.get("decode") or {}
    if decode:  # the decode oracles (verdict.decode): each oracle's verdict, the continuation's agreement
        header += " oracles | greedy match | first divergent position | decode mean / max abs delta |"
        extra += "---|---:|---:|---:|"
    lines = [header, "|---:|---:|---:|---:|---|" + extra]
    labels = run.get("schedule_labels") or {}
    for p in run["points"]:
        delta = p.get("delta_nll")
        if delta is None and p.get("nll_ref") is not None:
            delta = p["nll"] - p["nll_ref"]
        verdict = "-" if p["polluted"] is None else "polluted" if p["polluted"] else "clean"
        if p["polluted"] and run.get("samples") and p.get("polluted_samples") is not None \
                and p["polluted_samples"] < run["samples"]:
            verdict = samples_text(p["polluted_samples"], run["samples"])
        length = f"**{p['length']}**" if p["length"] in edges else str(p["length"])
        row = (f"| {length} | {nll(p['nll'])} | {nll(p.get('nll_ref'))} | "
               f"{'-' if delta is None else f'{delta:+.3f}'} | {verdict} |")
        if axis.name == "batch":
            scheduled = labels.get(str(p["length"])) or ("co-scheduled" if p.get("co_scheduled") else "-")
            row += f" {p.get('step_tokens', '-')} | {scheduled} |"
        elif axis.name == "repeat":
            row += f" {axis_text.agreement_cell(p)} |"
        if decode:
            row += decode_cells(run, p["length"], decode.get(p["length"], {}))
        lines.append(row)
    return lines


def decode_cells(run: dict, length: int, values: dict) -> str:
    """A per-length row's oracle cells: "nll clean, greedy polluted", the greedy match, the first divergent token
    position (the length + the offset), the decode mean / max |delta logprob|."""
    verdicts = ", ".join(f"{name} {'polluted' if record['verdicts'][length] else 'clean'}"
                         for name, record in (run.get("oracles") or {}).items() if length in record["verdicts"])
    match = values.get("greedy_match")
    offsets = [o for key in ("greedy_first_divergence", "decode_first_deviation")
               if (o := values.get(key)) is not None and o >= 0]
    first = str(length + int(min(offsets))) if offsets else "-"
    delta = (f"{values['decode_delta']:.4f} / {values['decode_max_delta']:.4f}"
             if values.get("decode_delta") is not None else "-")
    return f" {verdicts or '-'} | {'-' if match is None else f'{match:.3f}'} | {first} | {delta} |"


def run_section(run: dict, links: Links | None, summary: dict | None = None) -> list[str]:
    """One run: its heading, what it did to the baseline's transitions, its engine warnings (those not every run
    of `summary` has), its per-length table."""
    emulated = f", {EMULATED_TEXT}" if run.get("emulated") else ""
    device = run.get("device")  # its engines' CUDA_VISIBLE_DEVICES (oneknob.run.devices); nothing for the host's one
    on = f"; its engines on device(s) {device}" if device and device != "host" else ""
    lines = [f"### {run['name']}: {transitions_cell(run)}", "",
             f"Status {run['status']}{emulated}; MLflow run {run_ref(run['run_id'], links)}{on}.", ""]
    if versus := run.get("versus_baseline"):
        lines += [f"Versus the baseline: {versus['text']}.", ""]
    if suspects := run.get("suspects"):
        said = suspects_text(suspects, suspect_text)
        what = "lengths" if run.get("axis", "length") == "length" else f"points ({axis_text.axis_of(run).unit})"
        lines += [f"Suspect {what} probed beside the grid (q - 1, q and q + 1 of each candidate threshold q, "
                  f"counted in the probe budget): {said}.", ""]
    lines += [f"{line}", ""] if (line := tested_line(run)) else []
    if per_length := run.get("reference_per_length"):
        lines += [f"Reference: {per_length}.", ""]
    if summary is None and (warnings := run.get("engine_warnings")):
        lines += ["Engine warnings (from the worker's log):", "", "```", *warnings, "```", ""]
    elif warnings := ((summary or {}).get("engine_warnings") or {}).get("only_in", {}).get(run["name"]):
        lines += ["Engine warnings in this run's worker log that not every run has (those every run has: the "
                  "header):", "", "```", *warnings, "```", ""]
    return lines + (length_table(run) if run["points"] else ["Nothing measured."]) + [""]


def tested_line(run: dict) -> str | None:
    """What the follow-ups tested of this run's transitions (explained entries carrying "tested")."""
    said = []
    for entry in run.get("explained") or []:
        if not (tested := entry.get("tested")):
            continue
        text = (f"tracks the {label(tested['tracks'])}" + (f" (offset {tested['offset']})" if tested.get("offset")
                                                           is not None else "")) if tested.get("tracks") \
            else "tracks none of the quantities tested"
        if tested.get("ruled_out"):
            text += f"; ruled out: {', '.join(label(q) for q in tested['ruled_out'])}"
        if tested.get("untestable"):
            text += f"; not testable here: {', '.join(label(q) for q in tested['untestable'])}"
        if tested.get("evidence"):
            text += f" (runs {', '.join(tested['evidence'])})"
        said.append((entry["transition"], entry.get("oracle"), text))
    return f"Tested: {'; '.join(_once_per_edge(said))}." if said else None


def _once_per_edge(said: list[tuple[str, str | None, str]]) -> list[str]:
    """(edge, oracle, text) as "edge text", once where several oracles test the same of one edge; the oracles'
    names only where they found different things at one edge."""
    found: dict[str, dict[str, list[str]]] = {}
    for edge, oracle, text in said:
        found.setdefault(edge, {}).setdefault(text, []).extend([oracle] if oracle else [])
    return [f"{', '.join(names)}: {edge} {text}" if len(texts) > 1 and names else f"{edge} {text}"
            for edge, texts in found.items() for text, names in texts.items()]


def details(summary_text: str, lines: list[str]) -> list[str]:
    """A block GitHub shows folded, its one-line summary clickable; blank lines keep the Markdown inside it."""
    while lines and not lines[-1]:
        lines = lines[:-1]
    return ["<details>", f"<summary>{summary_text}</summary>", "", *lines, "", "</details>"]


def per_length_lines(summary: dict, links: Links | None) -> list[str]:
    """Each run's section, folded: the answer and the runs table above say what they show."""
    samples = next((r["samples"] for r in summary["runs"] if r.get("samples")), None)
    lines = [PER_LENGTH, "", f"Mean over {samples or 'the'} sample(s) per length; NLL ref: the reference's; "
             "delta = mean NLL - NLL ref; bold: the lengths on either side of a transition.", ""]
    for run in summary["runs"]:
        count = len(run["points"])
        lines += [*details(f"{run['name']}: {transitions_cell(run)} ({count} length{'s' if count != 1 else ''})",
                           run_section(run, links, summary)), ""]
    return lines


