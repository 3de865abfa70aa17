"""Typed configuration: the structured configs Hydra composes and checks.

The knob groups (`cudagraph`, `sched`, `spec`, `runner`) are generated from the
knob registry in knobs.py, so adding a knob never touches this file. Everything
else a study needs is a plain dataclass below. Registered in Hydra's
ConfigStore as `oneknob_schema`, which conf/config.yaml names first in its
defaults list: a typo or a wrong type fails at compose time with Hydra's own
message.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from oneknob.config.knobs import KNOBS

REPO_ROOT = Path(__file__).resolve().parents[3]
ORACLES = ("nll", "topk", "greedy", "decode")  # the signals a run is judged by (oneknob.verdict.oracles), `oracles=`
DECODE_ORACLES = ("greedy", "decode")  # judged on a generated continuation (oneknob.verdict.decode)


def _knob_groups() -> dict[str, type]:
    """One dataclass per knob group, fields typed from the registry."""
    groups: dict[str, list] = {}
    for knob in KNOBS.values():
        if knob.group:
            typ = Optional[knob.type] if knob.nullable else knob.type
            groups.setdefault(knob.group, []).append((knob.name, typ, field(default=knob.default)))
    # Study settings that live beside a knob but are not varied by sweeps.
    groups["spec"].append(("method", str, field(default="mtp")))
    groups["vllm"].append(("source", Optional[str], field(default=None)))  # a vLLM git checkout (vllm.commit)
    groups["vllm"].append(("build_from_source", bool, field(default=False)))  # vllm.commit touching csrc/
    return {
        name: make_dataclass(f"{name.capitalize()}Config", fields) for name, fields in groups.items()
    }


KNOB_GROUPS = _knob_groups()


@dataclass
class ModelConfig:
    name: str = MISSING
    path: str = MISSING  # a local directory, or a hub id for GPU studies
    dtype: str = "auto"
    max_model_len: int = 2048
    tokenizer: str | None = None  # defaults to the model's own
    build: str | None = None  # "tiny": oneknob builds it locally when missing
    tensor_parallel_size: int = 1  # GPUs one engine spans (LLM(tensor_parallel_size=...))
    start_timeout_s: float | None = None  # a model that loads slowly raises engine.start_timeout_s to this
    # run the checkpoint's own Python (config, tokenizer, model classes) where transformers/vLLM do not know its
    # model_type: vLLM (both engines, the server's flag, its config check), the tokenizer and the transformers reference
    trust_remote_code: bool = False
    # knobs model.override.<path>=VALUE: fields of the model's config.json changed for the job (config.model_override)
    override: dict[str, Any] = field(default_factory=dict)


@dataclass
class CorpusConfig:
    path: str | None = None  # a text file; null = the Python standard library's sources
    sample_tokens: int = 2048  # each sample is this many consecutive corpus tokens


@dataclass
class BatchConfig:
    """axis=batch (oneknob.plan.axis): one probe prompt scheduled in one step with neighbour prompts."""

    probe_length: int | None = None  # the probe's prompt length in tokens (required for axis=batch)
    neighbours: list[int] | None = None  # the axis: the number of neighbours, each `neighbour_length` tokens
    neighbour_length: int = 64
    neighbour_lengths: list[int] | None = None  # or the axis: one neighbour's length in tokens (0: the probe alone)


@dataclass
class RepeatConfig:
    """axis=repeat: the same request `concurrency` times in one engine call, `n` times, judged against the first."""

    n: int = 3  # repeats of each engine call (>= 2: the first is what the others are judged against)
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8])  # the axis: identical requests per call
    length: int | None = None  # the repeated prompt's length in tokens (null: the shortest of `lengths`)


@dataclass
class FaultConfig:
    """The synthetic engine's fault model (engines/synthetic.py); ignored by vLLM."""

    # The mechanism gates every shape: graphs on, K > 0, a polluting runner (and `pollute`).
    pollute: bool = True
    polluting_runners: list[str] = field(default_factory=lambda: ["v1"])
    # The shape: polluted where the prompt length L is on `side` of `edge`, or inside an island.
    edge: str | None = "max_capture_size"  # a resolved quantity (config.quantities.CANDIDATES); null: none
    edge_offset: int = 0  # the shape's edge is the named quantity plus this (a limit plus the speculative tokens)
    side: str = "le"  # le: polluted when L <= edge; lt: L < edge; gt: L > edge
    islands: list[list[int]] = field(default_factory=list)  # [[lo, hi], ...]: polluted when lo <= L <= hi
    shift: float | None = None  # null: garbage logprobs; else nats added to every token's NLL (may be < 0)
    prompt_prefix: str | None = None  # only prompts whose text starts with this (null: every prompt)
    target: str = "prompt"  # what a polluted prompt corrupts: prompt (logprobs) | generation (decode) | both
    decode_from_position: int | None = None  # generation: corrupt generated tokens at positions >= this instead
    decode_from: str | None = None  # ... or at positions >= this quantity (as `edge` names one) + decode_offset
    decode_offset: int = 0
    decode_shift: float | None = None  # generation: lower a corrupted token's logprob this much, keep the token
    crash_at_length: int | None = None
    hang_at_length: int | None = None
    crash_on_start: bool = False
    delay_s: float = 0.0  # every request takes this much longer (tests that act mid-run)
    warnings: list[str] = field(default_factory=list)  # logged at start as vLLM's WARNING lines ({field}: resolved)
    # A reference that is length-dependent by design (HF's longrope switches per forward pass): the engine in
    # the reference role scores a prompt of at most `reference_switch` tokens with `reference_shift` nats added
    # to every token's NLL, so a prefix scores differently from the same tokens inside a longer prompt.
    reference_switch: int | None = None
    reference_shift: float = 0.5
    # What the simulated model's config.json declares (its length fields are candidates model.<path>).
    model_config: dict[str, Any] = field(default_factory=dict)
    # Nondeterminism: in an engine call of more than this many requests, every request's logprobs carry noise of
    # up to `nondeterminism` nats per token that differs from call to call (a batch-variant kernel); null: none.
    nondeterministic_above: int | None = None
    nondeterminism: float = 0.5
    # An interaction of engine arguments (from_command's ddmin is tested on it): when set, the mechanism is these
    # engine_args.<field> values ALL as given, instead of graphs / K / runner ({enable_prefix_caching: true, ...}).
    requires_args: dict[str, Any] = field(default_factory=dict)
    # A polluted prompt's answer malformed instead of wrong in value (engines.synthetic._malformed): lacking |
    # missing | short | none | nan | inf, from the middle of the prompt (or continuation, by `target`) on; null: off.
    malformed: str | None = None


@dataclass
class EngineConfig:
    name: str = MISSING
    # vLLM
    gpu_memory_utilization: float | None = None  # null: 0.2 on CPU (host RAM share), vLLM's own on a GPU
    max_num_batched_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # removed: refused with a pointer to engine_args.*
    emulate_cuda_graphs: bool = False  # CPU build: emulate the CUDA-graph output pool (oneknob.engines.vllm_plugin)
    target_gpu: str | None = None  # plan (dry_run=true) for this GPU: A100, L40S, H100, H200, B200, B300, GB10, cpu
    # synthetic
    default_max_num_seqs: int = 256
    default_runner: str = "v2"
    fault: FaultConfig = field(default_factory=FaultConfig)
    # both
    start_timeout_s: float = 900.0
    request_timeout_s: float = 300.0


@dataclass
class ServerConfig:
    """engine=vllm_server only (oneknob.engines.vllm_server)."""

    clients: int = 1  # concurrent HTTP clients: a point's batch neighbours / repeats at once (none yet: 1)


@dataclass
class VerdictConfig:
    tol_nll: float = 0.1  # |NLL - NLL_ref| above this (nats) is polluted ...
    rtol_nll: float = 0.05  # ... and above this share of NLL_ref
    tol_token: float = 0.1  # a position deviates when |delta logprob| exceeds this
    max_nll: float = 8.0  # absolute mode (reference=null): NLL above this is polluted
    topk: int = 5  # oracle topk: the k of the top-k prompt logprobs compared per position
    topk_min_overlap: float = 0.8  # ... polluted when the mean share of shared top-k ids is below this
    topk_max_kl: float = 0.1  # ... or the mean KL over the shared support is above this (nats)
    greedy_tokens: int = 16  # oracles greedy and decode: the length of the engine's greedy continuation
    greedy_min_match: float = 1.0  # oracle greedy: polluted when the share of matching tokens is below this
    tol_decode: float = 0.1  # oracle decode: polluted when the mean |delta logprob| of generated tokens exceeds this
    tol_decode_token: float = 0.5  # ... or any one generated token's |delta logprob| does (nats)


@dataclass
class SearchConfig:
    bisect: bool = True
    max_probes: int = 64
    cover_capture: bool = False  # add lengths past the predicted max capture size when the grid ends there
    suspects: bool = True  # probe q - 1, q, q + 1 of every candidate threshold q in the grid (islands)


@dataclass
class ExplainConfig:
    """What a sweep does to explain its boundaries (oneknob.study.followups)."""
    followups: int = 3  # follow-up runs per sweep that each move one candidate quantity alone; 0: suggest only


@dataclass
class BisectConfig:
    """`bisect=true` on a one-knob multirun (oneknob.study.bisect); the command line's bisect=true is
    bisect.enabled=true (a key cannot be both a switch and a group in Hydra)."""
    enabled: bool = False
    criterion: str = "verdicts"  # verdicts | transition | polluted_at:<length>


@dataclass
class FromCommandConfig:
    """`from_command="<vllm serve line | LLM(...) call | @file>"` (oneknob.study.reduce): the command line's
    from_command=... is from_command.line=... (a key cannot be both a value and the group holding drop)."""
    line: Optional[str] = None
    drop: Optional[str] = None  # null: the reporter's configuration alone | each (leave-one-out) | minimal (ddmin)
    criterion: str = "verdicts"  # what must stay as the baseline's: verdicts | transition | polluted_at:<length>


@dataclass
class SingleVariableConfig:
    side_effects: str = "pin"  # pin | flag | refuse
    run_noops: bool = False


@dataclass
class TrackingConfig:
    uri: str | None = None  # null: $MLFLOW_TRACKING_URI, else sqlite under paths.mlruns
    experiment: str = "oneknob"
    trail: bool = True  # a one-job run on a local store: MLflow trails the journal (record.trail)


@dataclass
class PathsConfig:
    root: str = "${hydra:runtime.cwd}"
    mlruns: str = "${paths.root}/mlruns"
    cache: str = "${paths.root}/.cache/oneknob"
    # vllm.version environments, vllm.patch copies and vllm.commit overlays (GBs each): $ONEKNOB_BUILDS points
    # every study at one folder of them, else they live in this study's cache
    builds: str = "${oc.env:ONEKNOB_BUILDS,${paths.cache}}"
    models: str = str(REPO_ROOT / "models")


@dataclass
class SweepConfig:
    """Set by oneknob's sweeper for each job: the file holding the job's plan. Not for users."""

    plan: str | None = None


def _default_reference() -> dict[str, Any]:
    return {"cudagraph": {"enforce_eager": True}, "spec": {"k": 0}}


Config = make_dataclass(
    "Config",
    [(name, cls, field(default_factory=cls)) for name, cls in KNOB_GROUPS.items()]
    + [(k.key, Optional[k.type] if k.nullable else k.type, field(default=k.default))
       for k in KNOBS.values() if not k.group]
    + [
        # the knob families (oneknob.config.knobs): engine_args.<EngineArgs field>, env.VLLM_<NAME>
        ("engine_args", dict[str, Any], field(default_factory=dict)),
        ("env", dict[str, Any], field(default_factory=dict)),
        ("engine", EngineConfig, field(default_factory=EngineConfig)),
        ("server", ServerConfig, field(default_factory=ServerConfig)),
        ("model", ModelConfig, field(default_factory=ModelConfig)),
        ("corpus", CorpusConfig, field(default_factory=CorpusConfig)),
        ("lengths", list[int], field(default_factory=lambda: [128, 256, 384, 512, 640, 768, 1024])),
        ("axis", str, field(default="length")),  # length | batch | repeat (oneknob.plan.axis)
        ("batch", BatchConfig, field(default_factory=BatchConfig)),
        ("repeat", RepeatConfig, field(default_factory=RepeatConfig)),
        ("samples", int, field(default=2)),
        ("seed", int, field(default=0)),
        ("reference", Optional[dict[str, Any]], field(default_factory=_default_reference)),
        ("reference_engine", str, field(default="vllm")),
        ("reference_dtype", Optional[str], field(default=None)),
        ("reference_per_length", str, field(default="auto")),
        ("oracles", list[str], field(default_factory=lambda: ["nll", "topk"])),
        ("tags", list[str], field(default_factory=list)),
        ("verdict", VerdictConfig, field(default_factory=VerdictConfig)),
        ("search", SearchConfig, field(default_factory=SearchConfig)),
        ("single_variable", SingleVariableConfig, field(default_factory=SingleVariableConfig)),
        ("bisect", BisectConfig, field(default_factory=BisectConfig)),
        ("explain", ExplainConfig, field(default_factory=ExplainConfig)),
        ("from_command", FromCommandConfig, field(default_factory=FromCommandConfig)),
        ("ablation", dict[str, Any], field(default_factory=dict)),
        ("tracking", TrackingConfig, field(default_factory=TrackingConfig)),
        ("paths", PathsConfig, field(default_factory=PathsConfig)),
        ("cache", bool, field(default=True)),
        ("dry_run", bool, field(default=False)),
        ("sweep", SweepConfig, field(default_factory=SweepConfig)),
    ],
)
Config.__doc__ = "The root config: knobs first, then the study around them."


def register() -> None:
    ConfigStore.instance().store(name="oneknob_schema", node=Config)


register()


def job_minutes(model_start_s, engine_start_s, points_min: int = 120) -> int:
    """A Slurm job's --time (conf/hydra/launcher/slurm_gpu.yaml): room for two engine starts of the model (the
    job's and, with reference_per_length, the reference's, one after the other), each as long as its start timeout
    (model.start_timeout_s when it is longer than engine.start_timeout_s), plus `points_min` for the points."""
    start_s = max(float(engine_start_s or 0), float(model_start_s or 0))
    return int(points_min + 2 * -(-start_s // 60))


OmegaConf.register_new_resolver("oneknob_job_minutes", job_minutes, replace=True)
