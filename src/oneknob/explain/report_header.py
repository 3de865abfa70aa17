"""The header of report.md: what was compared, on what, and how to reproduce it.

A SIMULATION banner for the synthetic engine and one for emulated CUDA graphs (`banners`); then one line each
for what was compared, the engine, the vLLM / torch / CUDA versions, the GPU or CPU, the model and its
fingerprint, the prompts, the reference, the verdict's tolerances, the baseline's knobs, the command and
commit to reproduce, where it is in MLflow and the user's tags. Everything is read from the runs' recorded
params and tags (compare.load_run), the baseline's first.
"""

from __future__ import annotations

import json
from typing import Any

from oneknob.config import model_override
from oneknob.explain import answer_followups
from oneknob.explain import warnings_text
from oneknob.record.tags import EMULATED_TEXT

SIMULATION = ("> **SIMULATION.** `engine=synthetic` is oneknob's deterministic stand-in for vLLM: no model and no "
              "GPU ran; prompt logprobs are corrupted by its configured fault model (`engine.fault.*`). These "
              "numbers test oneknob's logic; they are not vLLM's behaviour.")
# The terminal's line, first and last in the output of a synthetic run, so a pasted log cannot hide it.
SIMULATION_LINE = ("SIMULATION: engine=synthetic stands in for vLLM (no model, no GPU): these numbers test oneknob, "
                   "not vLLM")
EMULATED = (f"> **{EMULATED_TEXT}.** vLLM's CPU build ran these runs with oneknob's plugin emulating the "
            "CUDA-graph output pool (`engine.emulate_cuda_graphs`): vLLM's own order of events on real prompt "
            "logprobs, but no GPU and no real CUDA graph. Not a GPU result.")


SERVED = {"vllm_server": " (through vllm serve, HTTP: /v1/completions with prompt_logprobs)"}


def show(value: Any) -> str:
    return "null" if value is None else value if isinstance(value, str) else json.dumps(value)


def _first(runs: list[dict], key: str) -> dict:
    return next((r[key] for r in runs if r.get(key)), {})


def _versions(runs: list[dict]) -> str:
    provenance, versions = _first(runs, "provenance"), _first(runs, "versions")
    vllm = provenance.get("vllm") or versions.get("vllm")
    if not vllm:
        return f"no vLLM (oneknob {versions.get('oneknob', '?')})"
    torch = provenance.get("torch") or versions.get("torch") or "?"
    cuda = provenance.get("cuda") if "cuda" in provenance else None
    builds = sorted({r["resolved"]["build"] for r in runs if r["resolved"].get("build")})
    text = f"vLLM {vllm}, torch {torch}, CUDA {cuda or 'none (CPU build)'}"
    return text + (f"; builds per run: {', '.join(builds)}" if len(builds) > 1 else "")


def _device(runs: list[dict], emulated: bool) -> str:
    hardware = _first(runs, "hardware")
    if hardware.get("gpu"):
        count = hardware.get("gpu_count")
        return (f"GPU: {hardware['gpu']}{f' (x{count} visible)' if count and count != '1' else ''}, "
                f"{hardware.get('memory_gib', '?')} GiB, compute capability {hardware.get('compute_capability', '?')}, "
                f"driver {hardware.get('driver', '?')}")
    cpu = f"CPU: {hardware.get('cpu') or 'unknown'}" + (f" ({hardware['machine']})" if hardware.get("machine") else "")
    return cpu + (f"; {EMULATED_TEXT}" if emulated else "")


def _reference(runs: list[dict]) -> str:
    reference = _first(runs, "reference")
    knobs = reference.get("knobs")
    if not reference:
        return "-"
    if knobs is None:
        return "none: absolute mode (polluted when mean NLL > verdict.max_nll)"
    how = (f"measured per length ({reference['per_length']})" if reference.get("per_length")
           else "measured once at the longest length")
    run = f", run `{reference['run_id']}`" if reference.get("run_id") else ""
    # a model.override.<path> sweep: every job's reference runs the job's own model config (it judges that model)
    model = "; each job's reference with that job's model.override.* fields" if any(
        model_override.is_override(r.get("knob") or "") for r in runs) else ""
    if reference.get("engine") == "transformers":  # the knobs are unused there: never name them
        return f"`reference_engine=transformers` (HF transformers, eager, the same checkpoint), {how}{run}{model}"
    set_knobs = " ".join(f"{k}={show(v)}" for k, v in knobs.items() if v is not None)
    return f"`{set_knobs}` (other knobs at the engine's defaults), {how}{run}{model}"


def banners(summary: dict) -> list[str]:
    """The SIMULATION banner of the synthetic engine and the one of emulated CUDA graphs, each with a blank line."""
    lines = [SIMULATION, ""] if summary["engine"] == "synthetic" else []
    return lines + ([EMULATED, ""] if any(r.get("emulated") for r in summary["runs"]) else [])


def _warnings(summary: dict) -> tuple[list[str], list[str]]:
    """The header's line for the warnings every run's engine logged, and the folded block that lists them."""
    found = warnings_text.header_lines(summary)
    if not found:
        return [], []
    count, compared = len(found) - 1, len((summary.get("engine_warnings") or {}).get("compared") or [])
    where = "its worker log" if compared == 1 else f"the worker log of each of the {compared} runs"
    return ([f"- **engine warnings**: {count} in {where}, listed below (those only some runs have: What each knob "
             "did)"],
            ["", "<details>", f"<summary>Engine warnings in every run ({count})</summary>", "",
             *[w.removeprefix("  ") for w in found[1:]], "", "</details>"])


def header_lines(summary: dict, links=None) -> list[str]:
    """The metadata list (banners: `banners`). `links`: report_md.Links, whose overlay (the UI's nll view of the
    runs) the MLflow line names."""
    runs, baseline = summary["runs"], next((r for r in summary["runs"] if r["knob"] is None), None)
    anchor = baseline or (runs[0] if runs else {})
    configured = [r for r in runs if not r.get("followup")]  # a follow-up is one knob from the run it tests
    knobs = list(dict.fromkeys(r["knob"] for r in configured if r["knob"]))
    variants = sum(r["knob"] is not None for r in configured)
    compared = (f"the baseline and {variants} variant(s), each changing one knob: {', '.join(knobs)}" if baseline
                else f"{len(configured)} selected run(s)") + answer_followups.compared(summary)
    emulated = any(r.get("emulated") for r in runs)
    synthetic = summary["engine"] == "synthetic"
    served = SERVED.get(summary["engine"], "")
    engine = ("synthetic: a SIMULATION of vLLM's rules (no model, no GPU)" if synthetic
              else f"{summary['engine']}{served}" + (f", {EMULATED_TEXT}" if emulated else ""))
    model = anchor.get("model") or {}
    verdict, samples = anchor.get("verdict") or {}, anchor.get("samples")
    git = anchor.get("git") or {}
    lines = [f"- **compared**: {compared}", f"- **engine**: {engine}"]
    commands = list(dict.fromkeys(r["provenance"]["server_command"] for r in ([anchor] + runs)
                                  if (r.get("provenance") or {}).get("server_command")))
    if commands:  # the baseline's first: what a reader pastes to reproduce the server
        lines.append("- **server**: " + "; ".join(f"`{c}`" for c in commands[:3])
                     + (f" (and {len(commands) - 3} more)" if len(commands) > 3 else ""))
    lines += [
              f"- **versions**: {_versions(runs)}", f"- **device**: {_device(runs, emulated)}"]
    warned, folded = _warnings(summary)
    lines += warned
    if not synthetic and model.get("path"):
        lines.append(f"- **model**: `{model['path']}` (fingerprint `{model.get('fingerprint')}`)")
    corpus = anchor.get("corpus") or {}
    if corpus.get("source"):
        lines.append(f"- **prompts**: the first L tokens of {samples} {corpus['source']} sample(s) per length "
                     f"(corpus `{corpus.get('fingerprint')}`)")
    lines.append(f"- **reference**: {_reference(runs)}")
    if verdict:
        lines.append(f"- **verdict**: polluted when \\|NLL - NLL ref\\| > {verdict.get('tol_nll')} nats and > "
                     f"{100 * float(verdict.get('rtol_nll', 0)):g} % of NLL ref; a length is polluted when any "
                     "sample is")
    if baseline:
        lines.append("- **baseline**: `" + " ".join(f"{k}={show(v)}" for k, v in baseline["requested"].items()) + "`")
    if summary.get("command"):
        commit = f" at oneknob `{git['commit'][:12]}`" if git.get("commit") else ""
        lines.append(f"- **reproduce**: `{summary['command']}`{commit}"
                     + (" (with uncommitted changes)" if git.get("dirty") else ""))
    experiment = (summary.get("experiment") or {}).get("name")
    where = [f"experiment `{experiment}`"] if experiment else []
    where += [f"parent run `{summary['parent_run_id']}`"] if summary.get("parent_run_id") else []
    if links and links.overlay:
        where.append(f"[nll against prompt length, the runs overlaid]({links.overlay})")
    if where:
        lines.append(f"- **MLflow**: {', '.join(where)}")
    if anchor.get("tags"):
        lines.append(f"- **tags**: {', '.join(anchor['tags'])}")
    return lines + folded
