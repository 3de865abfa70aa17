"""`python run.py --help`: the knobs (from the registry) and the keys a user sets, with their values as
composed for this command line; internal keys (sweep.*, paths.*) and the synthetic engine's fault model
(engine.fault.*, listed only under engine=synthetic) stay out.

conf/hydra/help/oneknob.yaml's template calls the `oneknob_help` resolver, which cli.main registers before
Hydra runs; Hydra then fills in $APP_CONFIG_GROUPS.
"""

from __future__ import annotations

import json
import textwrap

from omegaconf import OmegaConf

from oneknob.config.knobs import KNOBS

USAGE = """\
  python run.py                                       one job: the baseline
  python run.py -m cudagraph.capture=256,512          a sweep: the baseline, then one job per value
  python run.py -m experiment=mtp_prompt_logprobs     the seed's study, one knob at a time (engine: vLLM)
  make demo                                           the same study on the synthetic engine (seconds)
  python run.py -m 'sched.max_num_seqs=range(1,257)' bisect=true   the first value whose result differs
  python run.py -m vllm.commit=A..B vllm.source=PATH bisect=true   the first vLLM commit that changed it
  python run.py -m from_command="vllm serve M --flag ..." from_command.drop=each|minimal   which flags matter
  ... dry_run=true                                    the plan only: jobs and predicted resolved configs
  .venv/bin/python -m oneknob report                  the latest sweep's report.md, to paste into an issue"""

COMMON = (
    ("engine", "vllm | vllm_server (the same through `vllm serve`, HTTP) | synthetic (a simulation, for demos)"),
    ("model", "tiny (built locally, CPU) or a preset in conf/model/"),
    ("lengths", "prompt lengths in tokens: the search grid"),
    ("samples", "prompts per length; a length is polluted when any sample is"),
    ("reference", "knob overrides of the configuration each job is compared with; null: absolute mode"),
    ("verdict.tol_nll", "polluted when |NLL - NLL ref| > tol_nll nats ..."),
    ("verdict.rtol_nll", "... and > rtol_nll x NLL ref"),
    ("search.max_probes", "most lengths one job measures (grid and bisection)"),
    ("search.bisect", "narrow every flip down to adjacent lengths"),
    ("bisect.criterion", "bisect=true: verdicts | transition | polluted_at:<length>, what \"differs\" means"),
    ("vllm.source", "the vLLM git checkout vllm.commit reads (not a knob)"),
    ("single_variable.side_effects", "pin | flag | refuse: a variant that moves more than its knob"),
    ("engine.emulate_cuda_graphs", "vLLM's CPU build: emulate the CUDA-graph output pool (oneknob's plugin)"),
    ("tracking.uri", "null: ./mlruns/mlflow.db (make ui); or http://host:port"),
    ("tracking.experiment", "the MLflow experiment (oneknob-synthetic for engine=synthetic)"),
    ("tags", "free MLflow tags on every run: tags=[bisect-53488] or tags=[owner=alice]"),
    ("cache", "reuse measured points; false measures afresh"),
    ("dry_run", "print the plan and start nothing"),
)
SYNTHETIC = (
    ("engine.fault.edge", "the resolved quantity the fault's edge is (null: none); conf/engine/synthetic.yaml"),
    ("engine.fault.side", "le: polluted when L <= edge | lt: L < edge | gt: L > edge"),
    ("engine.fault.islands", "polluted ranges of L, e.g. [[300,400]]"),
    ("engine.fault.shift", "null: garbage logprobs; a number: nats added to every token's NLL"),
    ("engine.fault.prompt_prefix", "only prompts starting with this text are polluted (samples disagree)"),
)


_MISSING = object()
GROUPS = ("engine", "model")  # shown by the option chosen, not by their contents
WIDTH, COLUMN = 110, 34


def _value(root, key: str) -> str:
    if key in GROUPS:
        key = f"hydra.runtime.choices.{key}"
    value = OmegaConf.select(root, key, default=None, throw_on_resolution_failure=False)
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return "null" if value is None else value if isinstance(value, str) else json.dumps(value)


def _rows(root, items) -> list[str]:
    lines = []
    for key, text in items:
        if key not in GROUPS and OmegaConf.select(root, key, default=_MISSING) is _MISSING:
            continue  # a key this config does not have
        setting = f"{key}={_value(root, key)}"
        wrapped = textwrap.wrap(text, WIDTH - COLUMN - 4) or [""]
        pad = " " * COLUMN
        lines.append(f"  {setting:<{COLUMN}}  {wrapped[0]}" if len(setting) <= COLUMN
                     else f"  {setting}\n  {pad}  {wrapped[0]}")
        lines += [f"  {pad}  {more}" for more in wrapped[1:]]
    return lines


def body(*, _root_) -> str:
    """The knobs and the common keys, with this command line's values."""
    knobs = [(k.key, f"{k.description} [{k.vllm}]") for k in KNOBS.values()]
    families = ["  engine_args.<field>=VALUE  any EngineArgs field of the job's vLLM build: run.py --help engine_args",
                "  env.VLLM_<NAME>=VALUE      any variable its vllm.envs knows: run.py --help env",
                "  model.override.<path>=VALUE  a field of the model's config.json (vLLM's hf_overrides; the "
                "reference follows it)"]
    lines = ["Usage:", USAGE, "", "== Knobs: a sweep varies exactly one (values as composed here) ==",
             *_rows(_root_, knobs), *families, "", "== Common keys ==", *_rows(_root_, COMMON)]
    if _value(_root_, "engine.name") == "synthetic":
        lines += ["", "== The synthetic engine's fault model (engine=synthetic only) ==",
                  *_rows(_root_, SYNTHETIC)]
    return "\n".join(lines)


def register() -> None:
    OmegaConf.register_new_resolver("oneknob_help", body, replace=True)
