"""Does each study of this repository run on a vLLM release? The part of `make vllm-contract` past the names.

A study is the root configuration (conf/config.yaml: the default study; a break there fails the check) or a file in
experiments/ over it. What it needs of a release, read from the files themselves: the model runners its `runner`
values run (null: the release's default, vllm_release.default_runner), the patches its `vllm.patch` values name, and
the graph shapes of its baseline and ablation. Against the release:
  - runners: a runner the release lacks is a break of each study that pins it; every runner a study runs has its
    points (vllm_contract.RUNNER_POINTS) checked; the environment each `runner` value sets goes through the release's
    own validate_environ (vllm_release.own), whose refusal is quoted with oneknob's fix;
  - patches: each applies to the release's files (GNU patch --dry-run), or the file it lacks is named;
  - numbers: the release's own capture-size rule for each shape beside oneknob's (config/resolution.py), which must
    agree where oneknob has rules for the release (else "not predicted"), and vLLM's gpu_memory_utilization default;
  - install facts: the torch pin and the CUDA major its extensions link.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oneknob.config import knobs, resolution
from oneknob.engines import vllm_release, vllm_sources
from oneknob.engines.vllm_release import RUNNER_NAMES, RUNNER_POINTS, runner_file

SHAPE_KNOBS = ("cudagraph.capture", "spec.k", "sched.max_num_seqs")  # the knobs whose values change a graph shape


@dataclass(frozen=True)
class Study:
    name: str
    default: bool
    runners: tuple  # the `runner` values it runs: the baseline's, then the ablation's
    patches: tuple[str, ...]
    shapes: tuple[dict, ...]  # {"max_num_seqs", "spec_k", "max_num_batched_tokens", "max_capture"} per graph shape
    eager: bool = False


@dataclass
class Fit:
    study: Study
    breaks: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def studies(repo_root: Path, device: resolution.Device) -> list[Study]:
    """The root configuration and every experiments/*.yaml over it (with engine=vllm's group), as the fit needs."""
    from omegaconf import OmegaConf

    root = OmegaConf.merge(OmegaConf.load(repo_root / "conf" / "config.yaml"),
                           {"engine": OmegaConf.load(repo_root / "conf" / "engine" / "vllm.yaml")})
    found = [_study("conf/config.yaml (the default configuration)", True, OmegaConf.to_container(root), device)]
    for path in sorted((repo_root / "experiments").glob("*.yaml")):
        merged = OmegaConf.merge(root, OmegaConf.load(path))
        found.append(_study(f"experiments/{path.name}", False, OmegaConf.to_container(merged), device))
    return found


def _study(name: str, default: bool, cfg: dict, device: resolution.Device) -> Study:
    base = {key: value for key, value in knobs.from_config(cfg).items() if key in knobs.KNOBS}
    ablation = knobs.flatten(cfg.get("ablation") or {})
    runners = tuple(dict.fromkeys([base["runner"], *ablation.get("runner", [])]))
    patches = tuple(p for p in dict.fromkeys([base["vllm.patch"], *ablation.get("vllm.patch", [])]) if p)
    batched_tokens, default_seqs = device.llm_defaults()
    batched_tokens = (cfg.get("engine") or {}).get("max_num_batched_tokens") or batched_tokens
    variants = [base] + [base | {key: value} for key in SHAPE_KNOBS for value in ablation.get(key, [])]
    shapes = []
    for knob_values in variants:
        shape = {"max_num_seqs": knob_values["sched.max_num_seqs"] or min(default_seqs, batched_tokens),
                 "spec_k": knob_values["spec.k"], "max_num_batched_tokens": batched_tokens,
                 "max_capture": knob_values["cudagraph.capture"], "capability": list(device.capability or (9, 0))}
        if shape not in shapes:
            shapes.append(shape)
    return Study(name, default, runners, patches, tuple(shapes), bool(base["cudagraph.enforce_eager"]))


def _env(runner: str | None) -> dict[str, str]:
    return knobs.engine_args({"runner": runner}).env


def fit(tree: vllm_sources.Tree, study: Study, answers: dict[str, Any], questions: dict[str, Any],
        repo_root: Path) -> Fit:
    out, version = Fit(study), tree.version
    has, default = vllm_release.runners(tree), vllm_release.default_runner(tree)
    verdicts = dict(zip(map(_key, questions["environ"]), answers["environ"]))
    for runner in study.runners:
        runs = runner or default
        env = _env(runner)
        said = verdicts.get(_key(env))
        refused = isinstance(said, str) and said != "ok"
        setting = " ".join(f"{k}={v}" for k, v in env.items())
        if runs is None or not has.get(runs) or refused:
            why = [f"{RUNNER_NAMES.get(runs, runs)} is gone in vLLM {version} (no {runner_file(runs)})"] \
                if runs and not has.get(runs) else []
            why += [f"vLLM's own validate_environ refuses {setting}: \"{said}\""] if refused else []
            out.breaks.append(f"runner={runner or 'null'}: " + "; ".join(why or ["the release has no model runner"])
                              + f". Fix: {knobs.KNOBS['runner'].refused_fix}")
            continue
        verdict = "" if not env else f"; vLLM's validate_environ accepts {setting}" if said == "ok" else \
            f"; {setting} not checked by its validate_environ ({(said or {}).get('not_predicted', 'not asked')})"
        found = [vllm_sources.check_point(tree, kind, target) + (target,) for kind, target, _ in RUNNER_POINTS[runs]]
        missing = [f"{target}: {detail}" for ok, detail, target in found if not ok]
        if missing:
            out.breaks.append(f"runner={runner or 'null'} runs {RUNNER_NAMES[runs]}, which lacks: "
                              + "; ".join(missing))
        else:
            checked = ", ".join(t.rpartition(":")[2] for _, _, t in found)
            out.lines.append(f"runner={runner or 'null'}: runs {RUNNER_NAMES[runs]}"
                             + (" (the release's default)" if runner is None else "") + verdict
                             + f"; its points found: {checked}")
    for runner in (r for r, present in has.items() if not present):
        if runner not in {r or default for r in study.runners}:
            out.lines.append(f"{RUNNER_NAMES[runner]} is not in vLLM {version}: its points are not needed here")
    for patch in study.patches:
        from oneknob.provision import builds

        path = Path(builds._patch_path(patch, repo_root))
        applies, said = vllm_release.patch_applies(tree, path)
        (out.lines if applies else out.breaks).append(
            f"vllm.patch={patch}: {'applies to' if applies else 'does not apply to'} vLLM {version}: {said}")
    if not study.eager:
        own = dict(zip(map(_key, questions["capture"]), answers["capture"]))
        for shape in study.shapes:
            _numbers(out, shape, own.get(_key(shape)) or {"not_predicted": "not asked"}, version)
    memory = answers["defaults"].get("gpu_memory_utilization", {})
    out.lines.append("engine.gpu_memory_utilization=null leaves vLLM's own default: " + (
        f"{memory['value']}" if memory.get("value") is not None else
        "None (vLLM resolves it at start: 1.0 with its extensible KV cache, else 0.92; vllm/config/cache.py)"
        if "value" in memory else f"not read ({memory.get('not_predicted')})"))
    return out


def _numbers(out: Fit, shape: dict, own: dict, version: str) -> None:
    ceiling = resolution.BLACKWELL_CAPTURE_CEILING if shape["capability"][0] == 10 \
        else resolution.DEFAULT_CAPTURE_CEILING
    what = (f"K={shape['spec_k']} max_num_seqs={shape['max_num_seqs']} max_num_batched_tokens="
            f"{shape['max_num_batched_tokens']} cudagraph.capture={shape['max_capture'] or 'null'}")
    if "not_predicted" in own:
        out.lines.append(f"capture sizes for {what}: vLLM's own rule could not run here ({own['not_predicted']})")
        return
    theirs = f"vLLM {version}'s own rule: {len(own['sizes'])} sizes, max {own['max']} ({own['mode']})"
    if "max_decode_requests" in own:  # the quantities an explanation offers on this release (config/quantities.py)
        requests = own["max_decode_requests"]
        theirs += (f", widest prefill graph {own.get('max_prefill')} tokens, widest decode graph {requests} requests "
                   f"x (K+1) = {requests * (shape['spec_k'] + 1)}")
    if not resolution.has_rules(version):
        out.lines.append(f"capture sizes for {what}: {theirs}; oneknob: not predicted (its rules are vLLM "
                         f"{', '.join(resolution.RULES_FOR)}'s; a run reads vLLM's own)")
        return
    ours = resolution.capture_sizes(shape["max_capture"], max_num_seqs=shape["max_num_seqs"],
                                    spec_k=shape["spec_k"], max_num_batched_tokens=shape["max_num_batched_tokens"],
                                    ceiling=ceiling)
    if ours == own["sizes"]:
        out.lines.append(f"capture sizes for {what}: {theirs}; oneknob predicts the same")
    else:
        gained, lost = sorted(set(own["sizes"]) - set(ours)), sorted(set(ours) - set(own["sizes"]))
        out.breaks.append(f"capture sizes for {what}: {theirs}, but oneknob's rules (config/resolution.py) give "
                          f"{len(ours)} sizes, max {ours[-1] if ours else 0} (vLLM also has {gained[:8]}, lacks "
                          f"{lost[:8]})")


def _key(value: dict) -> str:
    import json

    return json.dumps(value, sort_keys=True)


def questions_for(found: list[Study]) -> dict[str, Any]:
    environ = list({_key(_env(r)): _env(r) for s in found for r in s.runners}.values())
    shapes = [dict(s) for s in {_key(shape): shape for study in found for shape in study.shapes}.values()]
    return {"environ": environ, "capture": shapes, "defaults": ["gpu_memory_utilization"]}


def report(tree: vllm_sources.Tree, source: Path | None, gpu: str, run: bool = True, say=print) -> list[Fit]:
    """Print the fit of every study to this release (`source` None: this interpreter's vLLM) and return them."""
    from oneknob.config.schema import REPO_ROOT

    device = resolution.device_named(gpu)
    found = studies(REPO_ROOT, device)
    questions = questions_for(found)
    if run:
        answers = vllm_release.own(source, questions)
    else:
        skipped = {"not_predicted": "--no-run"}
        answers = {"environ": [skipped] * len(questions["environ"]), "capture": [skipped] * len(questions["capture"]),
                   "defaults": {"gpu_memory_utilization": skipped}}
    version = tree.version
    say("")
    say(f"install: {vllm_release.install_text(vllm_release.install_facts(tree), version)}")
    has = vllm_release.runners(tree)
    say(f"runners: vLLM {version} has " + ", ".join(f"{RUNNER_NAMES[r]} ({vllm_release.RUNNER_MODULES[r]})"
                                                    for r, present in has.items() if present)
        + f"; runner=null runs {RUNNER_NAMES.get(vllm_release.default_runner(tree), 'none')} there")
    fits = [fit(tree, study, answers, questions, REPO_ROOT) for study in found]
    for one in fits:
        s = one.study
        runs = "runs on" if not one.breaks else "does NOT run on"
        say(f"study {s.name} (runner={', '.join(r or 'null' for r in s.runners)}"
            + (f"; vllm.patch={', '.join(s.patches)}" if s.patches else "") + f"): {runs} vLLM {version}"
            + ("" if not one.breaks or s.default else " (not the default study: the check still passes)"))
        for line in one.lines:
            say(f"  ok     {line}")
        for line in one.breaks:
            say(f"  BREAK  {line}")
    return fits
