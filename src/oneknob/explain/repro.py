"""repro.py beside report.md: the study's boundary reproduced with vLLM alone, for a maintainer to run.

    choose(summary)          the polluted run, its transition and a run clean at both of its sides (same build)
    script(summary)          repro.py's text, or None and why not (report_lines says which)
    write(summary, out)      repro.py, and repro_prompts.json (the prompts' token ids) from the sweep's plans
    report_lines(summary)    report.md's section: what the script does, the script itself folded

The configurations are the runs' own: the `LLM(...)` arguments each run's engine recorded (provenance
`llm_kwargs`, what VllmEngine.llm_kwargs built for it) and the environment its knobs set (config.knobs.engine_args,
the function the engine calls); the study's reference, where it is a vLLM configuration, is the polluted run's
arguments with the knob-made ones replaced by the reference knobs'. The script scores each configuration in its
own process, judges the polluted one against the clean one with the study's tolerances and prints REPRODUCED or
NOT REPRODUCED. On vLLM's CPU build, where the runs emulated the CUDA-graph pool, it turns on oneknob's emulation
(the plugin's ONEKNOB_VLLM_PLUGIN) and says it needs it; on a GPU it needs vLLM alone. engine=vllm_server: the
`vllm serve` flags (vllm_server.server_flags, the server's own rule) and /v1/completions requests instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from oneknob.config import knobs
from oneknob.explain.answer import measured
from oneknob.verdict.search import Transition

SCRIPT, PROMPTS = "repro.py", "repro_prompts.json"
ENGINES = ("vllm", "vllm_server")
HERE = Path(__file__).parent
MARKER = "# --- code ---\n"
SAMPLING = {"vllm": {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0, "detokenize": False},
            "vllm_server": {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0, "add_special_tokens": False}}
IMPORTS = {"vllm": ["json", "os", "subprocess", "sys"],
           "vllm_server": ["json", "os", "signal", "socket", "subprocess", "sys", "time", "urllib.error",
                           "urllib.request"]}
EMULATION = {"ONEKNOB_VLLM_PLUGIN": json.dumps({"emulate_cuda_graphs": True})}  # engines/vllm_plugin.py's settings


def _verdicts(run: dict, oracle: str) -> dict[int, bool]:
    record = (run.get("oracles") or {}).get(oracle) or {}
    return {int(k): bool(v) for k, v in (record.get("verdicts") or {}).items()}


def _clean_at(run: dict, lengths: tuple[int, int]) -> bool:
    points = {p["length"]: p for p in run["points"]}
    return all(L in points and points[L]["polluted"] is False for L in lengths)


def choose(summary: dict) -> tuple[dict | None, str]:
    """({"polluted", "clean", "transition"}, "") or (None, why none): a run with a resolved transition (baseline
    first) and another run of the same build that is clean at both of its sides; where no run has such a
    partner, the first such transition with "clean" None (the study's reference stands in)."""
    runs = [r for r in summary["runs"] if measured(r)]
    why, alone = "no run has a resolved transition (lo|hi adjacent lengths): there is no boundary to reproduce", None
    for run in runs:
        for record in run["transitions"]:
            edge = Transition.from_dict(record)
            if not edge.resolved:
                continue
            lengths = (edge.polluted_side, edge.clean_side)
            nll = _verdicts(run, "nll")
            if nll and not nll.get(edge.polluted_side, True):  # another oracle's edge (top-k, decode)
                others = ", ".join(o for o in run["oracles"] if o != "nll")
                why = f"{run['name']}'s {edge.text} is an edge of the {others} oracle, not of the prompt NLL, which " \
                      "repro.py scores"
                continue
            if not (run.get("provenance") or {}).get("llm_kwargs"):
                why = f"{run['name']} recorded no LLM(...) arguments (its MLflow param provenance.llm_kwargs)"
                continue
            build = run["resolved"].get("build")
            clean = next((r for r in runs if r is not run and r["resolved"].get("build") == build
                          and _clean_at(r, lengths) and (r.get("provenance") or {}).get("llm_kwargs")), None)
            if clean is not None:
                return {"polluted": run, "clean": clean, "transition": record}, ""
            alone = alone or {"polluted": run, "clean": None, "transition": record}
    return (alone, "") if alone else (None, why)


def _settings(run: dict) -> dict:
    return {"spec_method": run["resolved"].get("spec_method") or "mtp"}


def _env(requested: dict, settings: dict) -> tuple[dict, list[str]]:
    """The variables these knob values set (what the worker sets before vLLM is imported), and those the knobs own
    that they leave unset (a value in the shell must not decide a knob set to null)."""
    env = knobs.engine_args(requested, settings).env
    return dict(sorted(env.items())), [v for v in knobs.owned_env() if v not in env]


def config(run: dict) -> dict:
    """A run's configuration as its engine was built: the recorded LLM(...) kwargs, its knobs' environment."""
    env, unset = _env(run["requested"], _settings(run))
    return {"run": run["name"], "llm": run["provenance"]["llm_kwargs"], "env": env, "unset": unset}


def reference_config(run: dict) -> dict | None:
    """The study's vLLM reference as an LLM(...): the run's kwargs without those its knobs made, with the reference
    knobs' instead (the reference's other knobs at the registry's defaults, as the study measured it)."""
    reference = run.get("reference") or {}
    values = reference.get("knobs")
    if not values or reference.get("engine") == "transformers":
        return None
    try:
        settings = _settings(run)
        made = knobs.engine_args(run["requested"], settings).kwargs
        wanted = {key: knob.default for key, knob in knobs.KNOBS.items()} | values
        theirs = knobs.engine_args(wanted, settings).kwargs
        env, unset = _env(wanted, settings)
    except (ValueError, KeyError):  # a knob this oneknob no longer has
        return None
    kwargs = {k: v for k, v in run["provenance"]["llm_kwargs"].items() if k not in made} | theirs
    shown = " ".join(f"{k}={json.dumps(v)}" for k, v in values.items() if v is not None)
    return {"run": f"the study's reference ({shown})", "llm": kwargs, "env": env, "unset": unset}


def _serve(found: dict) -> dict:
    """engine=vllm_server: the configuration as `vllm serve` flags, by the server engine's own rule."""
    from oneknob.engines.vllm_server import server_flags

    flags = server_flags(found["llm"])
    return {"run": found["run"], "model": str(found["llm"]["model"]), "serve": flags, "env": found["env"],
            "unset": found["unset"]}


def emulated(run: dict) -> bool:
    return run["resolved"].get("platform") == "cpu" and bool(run.get("emulated")
                                                            or run["resolved"].get("cudagraph_emulated"))


def serve_line(found: dict) -> str:
    import shlex

    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in found["env"].items())
    flags = found["serve"]
    argv = ["vllm", "serve", flags[1], *flags[2:]] if flags[:1] == ["--model"] else ["vllm", "serve", *flags]
    return (f"{env} " if env else "") + shlex.join(argv)


def script(summary: dict) -> tuple[str | None, str]:
    """(repro.py's text, "") or (None, why there is none)."""
    engine = summary.get("engine")
    if engine == "synthetic":
        return None, ("engine=synthetic ran no vLLM (a simulation of its rules), so there is no vLLM configuration "
                      "to reproduce; the same study with engine=vllm writes one")
    if engine not in ENGINES:
        return None, f"engine={engine}: repro.py is written for vLLM's engines ({', '.join(ENGINES)})"
    chosen, why = choose(summary)
    if chosen is None:
        return None, why
    polluted, clean, record = chosen["polluted"], chosen["clean"], chosen["transition"]
    configs = {"polluted": config(polluted)}
    if clean is not None:
        configs["clean"] = config(clean)
    if (reference := reference_config(polluted)) is not None:
        configs["reference"] = reference
    if "clean" not in configs:
        if "reference" not in configs:
            return None, (f"no run is clean at both sides of {polluted['name']}'s "
                          f"{Transition.from_dict(record).text}, and the reference is no vLLM configuration")
        configs["clean"] = configs.pop("reference")
    if engine == "vllm_server":
        configs = {name: _serve(found) for name, found in configs.items()}
    edge = Transition.from_dict(record)
    verdict = polluted.get("verdict") or {}
    data = {"CONFIGS": configs, "ORDER": ("polluted", "clean"),
            "SIDES": {"polluted": edge.polluted_side, "clean": edge.clean_side},
            "TOLERANCE": {"nll": float(verdict.get("tol_nll", 0.1)), "rtol": float(verdict.get("rtol_nll", 0.05))},
            "SAMPLING": SAMPLING[engine], "EMULATION": EMULATION if emulated(polluted) else {}, "PROMPTS": PROMPTS}
    return _render(summary, engine, data, polluted, clean), ""


def _code(name: str) -> str:
    return (HERE / name).read_text().split(MARKER, 1)[1]


def literal(value, indent: int = 0, width: int = 100) -> str:
    """A Python literal of JSON-like data as a person would write it: double quotes, one line where it fits, else
    one entry per line."""
    if isinstance(value, str):
        return json.dumps(value)
    if not isinstance(value, (dict, list, tuple)):
        return repr(value)
    one = (("{" + ", ".join(f"{json.dumps(k)}: {literal(v, width=10**6)}" for k, v in value.items()) + "}")
           if isinstance(value, dict) else
           ("(" if isinstance(value, tuple) else "[") + ", ".join(literal(v, width=10**6) for v in value)
           + (",)" if isinstance(value, tuple) and len(value) == 1 else ")" if isinstance(value, tuple) else "]"))
    if indent + len(one) <= width or not value:
        return one
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        inner = [f"{pad}{json.dumps(k)}: {literal(v, indent + 4, width)}," for k, v in value.items()]
        return "{\n" + "\n".join(inner) + "\n" + " " * indent + "}"
    opening, closing = ("(", ")") if isinstance(value, tuple) else ("[", "]")
    return opening + "\n" + "\n".join(f"{pad}{literal(v, indent + 4, width)}," for v in value) + "\n" \
        + " " * indent + closing


def _render(summary: dict, engine: str, data: dict, polluted: dict, clean: dict | None) -> str:
    import textwrap

    configs, sides = data["CONFIGS"], data["SIDES"]
    low, high = sorted(sides.values())
    build = polluted["resolved"].get("build") or "the installed vLLM"
    where = ("vLLM's CPU build, which runs no CUDA graphs: the runs emulated their output pool with oneknob's "
             "vLLM plugin, so this script needs oneknob installed beside vLLM and turns the emulation on "
             "(EMULATION); on a GPU, set EMULATION = {} and real CUDA graphs run" if data["EMULATION"] else
             "a GPU, with vLLM alone: nothing of oneknob" if polluted["resolved"].get("platform") == "cuda" else
             "this machine, with vLLM alone: nothing of oneknob")
    against = (f"{clean['name']} (clean at {low} and {high})" if clean is not None else
               f"{configs['clean']['run']} (no run of the sweep was clean at both)")
    paragraphs = [
        f"{polluted['name']}: {'polluted' if sides['polluted'] == low else 'clean'} at {low} tokens, "
        f"{'clean' if sides['polluted'] == low else 'polluted'} at {high}, with vLLM alone.",
        f"Written by oneknob for sweep {summary.get('sweep_id') or '-'} (its report.md is beside this script). "
        f"The runs used {build} on {where}.",
        f"It builds two engines from the runs' exact arguments (CONFIGS): {polluted['name']} (polluted at "
        f"{sides['polluted']}) and {against}; scores the study's prompts ({PROMPTS}, beside it) at {low} and "
        f"{high} tokens with the same sampling parameters (SAMPLING), each configuration in a process of its own; "
        "and judges them with the study's tolerances (TOLERANCE). Its last line is REPRODUCED or NOT REPRODUCED."]
    lines = ["#!/usr/bin/env python3",
             '"""' + "\n\n".join(textwrap.fill(p, 100, break_on_hyphens=False, break_long_words=False)
                                 for p in paragraphs), "",
             "    python repro.py                            # polluted against clean",
             f"    python repro.py --configs TESTED AGAINST   # any two of: {', '.join(configs)}"]
    if engine == "vllm_server":
        lines += ["", "The servers it starts, one at a time:", ""]
        lines += [f"    {name}: {serve_line(found)}" for name, found in configs.items()]
        request = json.dumps({"model": "...", "prompt": ["token ids"], **data["SAMPLING"]})
        lines += ["", "and per prompt:", "", f"    POST /v1/completions {request}"]
    lines += ['"""', "", "from __future__ import annotations", "", *[f"import {m}" for m in IMPORTS[engine]],
              "from pathlib import Path", ""]
    lines += [f"{name} = {literal(value)}" for name, value in data.items()]
    body = _code("repro_server.py" if engine == "vllm_server" else "repro_offline.py") + "\n\n" + \
        _code("repro_common.py")
    return "\n".join(lines) + "\n\n\n" + body.strip() + '\n\n\nif __name__ == "__main__":\n' \
        "    sys.exit(main(sys.argv[1:], score))\n"


def prompts(summary: dict, sweep_dir: str | Path | None) -> dict | None:
    """The prompts' token ids at the boundary's longer side, from the sweep's plan files (plans/<i>.json), where
    the corpus is the polluted run's."""
    chosen, _ = choose(summary)
    if chosen is None or not sweep_dir or not (Path(sweep_dir) / "plans").is_dir():
        return None
    run, edge = chosen["polluted"], Transition.from_dict(chosen["transition"])
    fingerprint = (run.get("corpus") or {}).get("fingerprint")
    for path in sorted((Path(sweep_dir) / "plans").glob("*.json")):
        try:
            corpus = json.loads(path.read_text()).get("corpus") or {}
        except (OSError, ValueError):
            continue
        if corpus.get("fingerprint") == fingerprint and corpus.get("samples"):
            samples = corpus["samples"]
            samples = json.loads(samples) if isinstance(samples, str) else samples
            longest = max(edge.lo, edge.hi)
            return {"corpus": fingerprint, "samples": [list(s[:longest]) for s in samples[: run.get("samples")]]}
    return None


def write(summary: dict, out: Path) -> list[Path]:
    """repro.py and repro_prompts.json in `out`, where there is a reproduction and the prompts are at hand."""
    text, _ = script(summary)
    if text is None:
        return []
    (out / SCRIPT).write_text(text)
    written = [out / SCRIPT]
    found = prompts(summary, summary.get("sweep_dir"))
    if found is not None:
        (out / PROMPTS).write_text(json.dumps(found) + "\n")
        written.append(out / PROMPTS)
    return written


def report_lines(summary: dict, with_script: bool = True) -> list[str]:
    """report.md's section: what repro.py does and the script folded, or why there is none."""
    text, why = script(summary)
    lines = ["## Reproduce with vLLM alone", ""]
    if text is None:
        return lines + [f"No {SCRIPT}: {why}."]
    chosen, _ = choose(summary)
    edge = Transition.from_dict(chosen["transition"])
    against = chosen["clean"]["name"] if chosen["clean"] else "the study's reference"
    first = next((r for r in summary["runs"] if measured(r) and r["transitions"]), None)
    if first is not None and first is not chosen["polluted"]:  # the anchor's edge has no run clean at its sides
        lines += [f"No run of the sweep is clean at both sides of {first['name']}'s boundary, so the reproduction "
                  f"is {chosen['polluted']['name']}'s {edge.text}.", ""]
    lines.append(f"`{SCRIPT}` beside this report (with `{PROMPTS}`, the prompts' token ids; both are artifacts of "
                 f"the parent run) builds {chosen['polluted']['name']}'s engine and {against}'s from their exact "
                 f"arguments, scores the prompts at {edge.polluted_side} and {edge.clean_side} tokens with the same "
                 "sampling parameters, and prints REPRODUCED when the first differs beyond the study's tolerance "
                 "and the second does not"
                 + ("; on vLLM's CPU build it turns on oneknob's CUDA-graph-pool emulation, which it needs there"
                    if emulated(chosen["polluted"]) else "") + ".")
    if with_script:
        lines += ["", "<details>", f"<summary>{SCRIPT}</summary>", "", "```python", *text.splitlines(), "```", "",
                  "</details>"]
    return lines
