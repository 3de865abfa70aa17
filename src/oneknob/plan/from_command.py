"""A bug report's command line as oneknob's knobs, read by the job build's own vLLM parser.

    from_command="vllm serve MODEL --max-num-seqs 128 --speculative-config '{...}' ..."
    from_command="python -m vllm.entrypoints.openai.api_server --model MODEL ..."
    from_command="LLM(model='MODEL', max_num_seqs=128, ...)"          from_command=@report.txt

The text is split as a shell would (shlex: quotes, JSON values, backslash-newline continuations, leading
`VLLM_X=1` assignments); the flags are parsed by vLLM's `vllm serve` parser in the build's interpreter
(engines/vllm_command.py, cached per build and line), an `LLM(...)` call by Python's own parser with the names
checked against EngineArgs. What vLLM refuses (an unknown flag, a bad JSON value, two models) is refused here
with vLLM's message, exit 2, before any engine. Each flag becomes the knob that owns its field (a named knob,
else `engine_args.<field>`), a setting (model.*, seed), or is said and not carried (a server flag, the GPU's
memory share); a flag equal to vLLM's default (the server's, for a `vllm serve` line) is listed and not ablated.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from oneknob.config import model_override, secrets
from oneknob.errors import ConfigError
from oneknob.plan.from_command_files import HASHED_BYTES, MAX_CHARS, read, reads  # noqa: F401 (callers' names)

SCRIPT = Path(__file__).resolve().parent.parent / "engines" / "vllm_command.py"
SERVE_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main")
SETTINGS = {"dtype": "model.dtype", "max_model_len": "model.max_model_len", "seed": "seed",
            "tokenizer": "model.tokenizer", "tensor_parallel_size": "model.tensor_parallel_size"}
NOT_CARRIED = {"gpu_memory_utilization": "the share of this machine's memory is engine.gpu_memory_utilization's"}
NAMED = {"max_num_seqs": "sched.max_num_seqs", "enforce_eager": "cudagraph.enforce_eager"}
SPEC_KEYS = {"method", "num_speculative_tokens"}


@dataclass
class Flag:
    name: str  # vLLM's field (the parser's dest), or the environment variable
    option: str  # as vLLM spells it: --max-num-seqs
    value: Any  # the reporter's
    default: Any  # vLLM's (the server's for max_num_seqs / max_num_batched_tokens on a serve line)
    status: str = "ablated"  # ablated | default | setting | not carried
    knob: str | None = None
    knob_value: Any = None  # the knob's value for the reporter's flag
    reset: Any = None  # the knob's value for vLLM's default
    why: str = ""
    deprecated: bool = False


@dataclass
class Line:
    text: str
    kind: str  # serve | llm
    model: str | None
    flags: list[Flag]
    overrides: list[str] = field(default_factory=list)  # settings the line sets (spec.method, model.dtype, ...)
    notes: list[str] = field(default_factory=list)
    vllm_version: str = "?"

    @property
    def ablated(self) -> list[Flag]:
        return [f for f in self.flags if f.status == "ablated"]

    @property
    def knobs(self) -> dict[str, Any]:
        return {f.knob: f.knob_value for f in self.flags if f.knob and f.status in ("ablated", "default")}

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.text, "kind": self.kind, "model": self.model, "vllm_version": self.vllm_version,
                "flags": {f.name: asdict(f) for f in self.flags}, "notes": self.notes}


ASKS_FOR_TEXT = ("-h", "--help", "--version")  # vLLM prints text and runs nothing: no configuration to study


def split(text: str) -> tuple[str, dict[str, str], list[str]]:
    """(kind, leading environment, argv after the command) of a pasted line, as a shell splits it."""
    if re.match(r"^\s*(\w+\s*=\s*)?(vllm\.)?LLM\s*\(", text):
        return "llm", {}, [text]
    joined = re.sub(r"\\\r?\n", " ", text)
    joined = re.sub(r"^\s*[$#>]\s+", "", joined)  # a pasted shell prompt
    try:
        words = shlex.split(joined, comments=True)
    except ValueError as exc:
        raise ConfigError(f"from_command: the line does not split as a shell line ({exc}); check its quotes") from None
    env = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if asked := next((w for w in words if w in ASKS_FOR_TEXT or w.startswith("--help=")), None):
        raise ConfigError(f"from_command: the line asks vLLM for {asked}, which prints text and starts nothing, so "
                          f"there is no configuration to study; drop {asked} from the line")
    if len(words) >= 2 and Path(words[0]).name == "vllm" and words[1] == "serve":
        return "serve", env, words[2:]
    if len(words) >= 3 and Path(words[0]).name.startswith("python") and words[1] == "-m" and words[2] in SERVE_MODULES:
        rest = words[3:]
        return "serve", env, rest[1:] if words[2].endswith("cli.main") and rest[:1] == ["serve"] else rest
    start = secrets.mask_line(" ".join(words[:3]) or text[:40])[:80]
    raise ConfigError(f"from_command: not a `vllm serve ...` line, a `python -m vllm.entrypoints.openai.api_server "
                      f"...` line or an LLM(...) call: it starts with {start!r}")


def llm_call(text: str) -> tuple[str | None, dict[str, Any]]:
    """(model, kwargs) of `LLM(...)` by Python's own parser; every argument must be a literal."""
    try:
        tree = ast.parse(text.strip())
    except SyntaxError as exc:
        raise ConfigError(f"from_command: the LLM(...) call is not Python ({exc.msg}, column {exc.offset})") from None
    call = next((n for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", getattr(n.func, "attr", None)) == "LLM"), None)
    if call is None:
        raise ConfigError("from_command: no LLM(...) call in the line")
    kwargs: dict[str, Any] = {}
    for name, node in [("model", a) for a in call.args[:1]] + [(k.arg, k.value) for k in call.keywords]:
        if name is None or len(call.args) > 1:
            raise ConfigError("from_command: LLM(...) with **kwargs or several positional arguments; write each "
                              "argument as name=value")
        try:
            kwargs[name] = ast.literal_eval(node)
        except ValueError:
            raise ConfigError(f"from_command: LLM({name}={ast.unparse(node)}): not a literal value; paste the "
                              "value itself") from None
    return kwargs.pop("model", None), kwargs


SECRET = ("a secret (masked as *** wherever oneknob writes or prints it): credentials change no numerics; the "
          "engine takes them from the environment it runs in")


def parse(text: str, python: str, env: dict[str, str], run_script) -> Line:
    """The line as the build's vLLM reads it. `run_script(python, env, command, spec)` runs vllm_command.py.
    Secrets (config.secrets) are masked before anything reads the line: the parser, its cache and the Line see
    MASK in their place; a flag vLLM's parser marks secret is masked in the line's text after it answers."""
    hidden = secrets.line_values(text)
    kind, line_env, argv = split(secrets.mask(text, hidden) if kind_of(text) == "llm" else text)
    argv = [secrets.mask(word, hidden) for word in argv]
    line_env = {name: secrets.MASK if secrets.secret_name(name) else value for name, value in line_env.items()}
    if kind == "llm":
        model, kwargs = llm_call(argv[0])
        found = run_script(python, env, "engine_args", {"kwargs": kwargs})
    else:
        found = run_script(python, env, "serve", {"argv": argv, "reads": reads(argv)})
        model = found.get("model")
    if found.get("refused"):
        what = "`vllm serve` parser" if kind == "serve" else "EngineArgs"
        raise ConfigError(f"from_command: vLLM {found.get('vllm_version', '')}'s {what} refuses the line: "
                          f"{secrets.mask(found['refused'], hidden)}".replace("vLLM 's", "vLLM's"))
    if not model:
        raise ConfigError("from_command: the line names no model; give it as vLLM takes it (vllm serve MODEL, "
                          "--model MODEL or LLM(model=...))")
    marked = tuple(o for f in found["flags"] if f.get("secret") for o in f.get("options") or [f["option"]])
    hidden |= secrets.values_in_words(argv, marked) if marked else set()
    flags = []
    for f in found["flags"]:
        secret = f.get("secret") or secrets.secret_name(f["dest"])
        flags.append(Flag(f["dest"], f["option"], secrets.MASK if secret and f["value"] not in (None, False, True)
                          else f["value"], f["default"], deprecated=f["deprecated"],
                          status="ablated" if f["engine_arg"] and not secret else "not carried",
                          why=SECRET if secret else "" if f["engine_arg"] else
                          "a server flag, not an engine argument: it never reaches the engine"))
    flags += [Flag(name, f"{name}=", value, None) for name, value in line_env.items()]
    return Line(secrets.mask(text, hidden), kind, model, flags, vllm_version=found.get("vllm_version", "?"))


def kind_of(text: str) -> str:
    return "llm" if re.match(r"^\s*(\w+\s*=\s*)?(vllm\.)?LLM\s*\(", text) else "serve"


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def assign(line: Line, defaults: dict[str, Any]) -> None:
    """Each flag's knob, reset value and status. `defaults`: the engine's default_max_num_seqs and
    max_num_batched_tokens (the server's for a `vllm serve` line)."""
    own = {"max_num_seqs": defaults.get("default_max_num_seqs"),
           "max_num_batched_tokens": defaults.get("max_num_batched_tokens")}
    for flag in line.flags:
        if flag.status != "ablated":
            continue
        if flag.name in own and own[flag.name] is not None:
            flag.default = own[flag.name]
        if flag.option.endswith("="):  # an environment variable before the command
            _env(flag)
        elif flag.name in NOT_CARRIED:
            flag.status, flag.why = "not carried", NOT_CARRIED[flag.name]
        elif flag.name in SETTINGS:
            flag.status, flag.why = "setting", f"{SETTINGS[flag.name]} (a setting of the study, not ablated)"
            line.overrides.append(f"{SETTINGS[flag.name]}={_override(flag.value)}")
        elif flag.name == "hf_overrides":  # the user typed a flag: say what to write instead of it
            leaves = model_override.leaves(flag.value) if isinstance(flag.value, dict) else {}
            instead = " ".join(f"{model_override.PREFIX}{path}={_override(v)}" for path, v in leaves.items()) \
                or f"{model_override.PREFIX}<path>=VALUE"
            raise ConfigError(f"from_command: {flag.option} {_json(flag.value)[:200]}: a field of the model's "
                              f"config.json is a knob of its own (checked against config.json); drop {flag.option} "
                              f"from the line and add {instead}")
        elif flag.name == "speculative_config":
            _spec(line, flag)
        elif flag.name == "compilation_config" and "max_cudagraph_capture_size" in (flag.value or {}):
            if set(flag.value) != {"max_cudagraph_capture_size"}:
                raise ConfigError(f"from_command: {flag.option} {_json(flag.value)}: max_cudagraph_capture_size "
                                  "beside other keys is two knobs (cudagraph.capture and engine_args."
                                  "compilation_config); give them as two flags' worth of overrides by hand")
            flag.knob, flag.knob_value, flag.reset = "cudagraph.capture", flag.value["max_cudagraph_capture_size"], None
        elif flag.name in NAMED:
            flag.knob, flag.knob_value = NAMED[flag.name], flag.value
            flag.reset = own.get(flag.name) if flag.name in own else bool(flag.default)
        else:
            flag.knob, flag.knob_value = f"engine_args.{flag.name}", flag.value
            flag.reset = own.get(flag.name) if flag.name in own else None
        if flag.status == "ablated" and _json(flag.value) == _json(flag.default):
            flag.status, flag.why = "default", "equal to vLLM's default: not ablated"
        if flag.deprecated:
            line.notes.append(f"{flag.option} is deprecated in vLLM {line.vllm_version}")
    for flag in line.flags:
        if flag.status == "not carried":
            line.notes.append(f"{flag.option} not carried: {flag.why}")


def _env(flag: Flag) -> None:
    if secrets.secret_name(flag.name):
        flag.status, flag.why, flag.value = "not carried", SECRET, secrets.MASK
    elif flag.name == "VLLM_USE_V2_MODEL_RUNNER":
        flag.knob, flag.knob_value = "runner", "v2" if flag.value.strip() in ("1", "true", "True") else "v1"
    elif flag.name.startswith("VLLM_"):
        flag.knob, flag.knob_value = f"env.{flag.name}", flag.value
    else:
        flag.status, flag.why = "not carried", "an environment variable vLLM does not own"
    flag.default = "unset"


def _spec(line: Line, flag: Flag) -> None:
    value = flag.value or {}
    extra = sorted(set(value) - SPEC_KEYS)
    if extra or "num_speculative_tokens" not in value:
        raise ConfigError(f"from_command: {flag.option} {_json(value)}: oneknob's spec.k / spec.method own "
                          f"method and num_speculative_tokens; {', '.join(extra) or 'a missing num_speculative_tokens'}"
                          " cannot be carried beside them yet: give the study spec.k=K spec.method=M by hand")
    flag.knob, flag.knob_value, flag.reset = "spec.k", value["num_speculative_tokens"], 0
    if "method" in value:
        line.overrides.append(f"spec.method={_override(value['method'])}")


def _override(value: Any) -> str:
    from oneknob.plan.jobs import override_value

    return override_value(value)


def serve_line(model: str, flags: list[Flag], env: dict[str, str] | None = None) -> str:
    """The reporter's line with only these flags: what to paste into the issue."""
    words = [f"{k}={v}" for k, v in (env or {}).items()] + ["vllm", "serve", model]
    for flag in flags:
        if flag.option.endswith("="):
            words.insert(0, f"{flag.name}={flag.value}")
        elif flag.value is True and flag.option.startswith("--"):
            words.append(flag.option)
        elif flag.value is False and flag.option.startswith("--"):
            words.append("--no-" + flag.option[2:])
        else:
            words += [flag.option, _json(flag.value) if isinstance(flag.value, (dict, list)) else str(flag.value)]
    return shlex.join(words)


def hydra_quoted(text: str) -> str:
    """A raw text as one Hydra quoted value (Hydra unescapes backslashes only before a quote or at the end)."""
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return "'" + text.replace("${", "\\${") + "'"


def rewrite_argument(argument: str) -> str:
    """from_command=<raw line> as Hydra reads it: from_command.line='<the line>' (run.py does this first)."""
    key, sep, value = argument.partition("=")
    if sep and key.strip() in ("from_command", "+from_command", "++from_command"):
        return f"from_command.line={hydra_quoted(value)}"
    return argument


def script_runner(cache_dir: str, build: str):
    """Runs vllm_command.py in a build's interpreter; each answer cached per build and request (the study's
    cache, then the machine's, as vLLM's config checks are: oneknob.engines.vllm_validate)."""
    from oneknob.engines import vllm_validate as vv

    def run(python: str, env: dict[str, str], command: str, spec: dict) -> dict:
        def make() -> dict:
            return vv._run(python, env, command, spec, vv.TIMEOUT_S, "from_command", script=SCRIPT,
                           doing="vLLM's parser")

        key = vv._digest([build, command, spec, SCRIPT.read_text()])  # a changed script asks again
        return vv._cached(Path(cache_dir) / "vllm-command" / f"{key}.json", make)

    return run
