"""engine=vllm_server (issue 27): the study through `vllm serve` over HTTP.

The fast tests check the pieces without a server: the flags derived from LLM(...)'s kwargs, the mapping of
/v1/completions' answer onto the offline engine's result, the signal ladder that stops a server's process group,
the planner's facts (the server's defaults, a cache key of its own) and the report's header. The slow ones run
real `vllm serve` on the CPU build (each start 40-90 s on 2 cores): one study against the offline engine, and
SIGTERM / Ctrl-C mid-request; after each, no `vllm serve` process may be left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from helpers import (IN_PROCESS, RUN_PY, job_journals, job_plan, journal_records, process_gone, process_tree,
                     run_python, start_cli, wait_for)

from oneknob.engines.vllm import server as vllm_server
from oneknob.engines.vllm.engine import VllmEngine

SEED_SPEC = {"knobs": {"cudagraph.capture": 256, "cudagraph.enforce_eager": False, "sched.max_num_seqs": 128,
                       "spec.k": 3, "runner": "v1", "vllm.version": None, "vllm.patch": None,
                       "engine_args.enable_prefix_caching": False},
             "settings": {"spec_method": "mtp"}, "model": {"path": "/m/tiny", "dtype": "auto", "max_model_len": 2048},
             "options": {"gpu_memory_utilization": 0.2, "max_num_batched_tokens": 2048}, "seed": 0}


def test_the_server_flags_are_the_offline_engines_kwargs():
    kwargs, env = VllmEngine().llm_kwargs(SEED_SPEC)
    assert vllm_server.server_flags(kwargs) == [
        "--model", "/m/tiny", "--dtype", "auto", "--max-model-len", "2048", "--seed", "0",
        "--gpu-memory-utilization", "0.2",
        "--max-num-batched-tokens", "2048", "--compilation-config", '{"max_cudagraph_capture_size": 256}',
        "--no-enforce-eager", "--max-num-seqs", "128",
        "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}', "--no-enable-prefix-caching"]
    assert env == {"VLLM_USE_V2_MODEL_RUNNER": "0"}  # the server inherits the knobs' environment
    assert vllm_server.server_flags({"model": "m", "cudagraph_capture_sizes": [1, 2, 4], "enforce_eager": True}) == [
        "--model", "m", "--cudagraph-capture-sizes", "1", "2", "4", "--enforce-eager"]


@pytest.mark.slow
def test_vllms_own_serve_parser_reads_the_flags_back_as_the_kwargs():
    """No engine: vLLM's `vllm serve` parser (~10 s to import on 2 cores)."""
    done = subprocess.run([sys.executable, "-c", """
import json, sys
from oneknob.engines.vllm.engine import VllmEngine
from oneknob.engines.vllm.server import server_flags, check_flags
spec = json.loads(sys.argv[1])
kwargs, _ = VllmEngine().llm_kwargs(spec)
kwargs["cudagraph_capture_sizes"] = [1, 2, 4]
check_flags(server_flags(kwargs), kwargs)
try:
    check_flags(server_flags(kwargs) + ["--max-num-seqs", "7"], kwargs)
except RuntimeError as exc:
    print("refused:", exc)
""", json.dumps(SEED_SPEC)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused: `vllm serve` reads max_num_seqs as 7" in done.stdout


def _answer(ids: list[int], topk: int, logprobs: int | None = None) -> dict:
    """A /v1/completions answer as vLLM 0.32 writes it: prompt_logprobs per position, token ids as JSON keys."""
    entries = [None]
    for position, token in enumerate(ids[1:], start=1):
        entry = {str(token): {"logprob": -0.5 * position, "rank": 3, "decoded_token": "x"}}
        for rank in range(1, topk + 1):
            entry[str(900 + rank)] = {"logprob": -0.1 * rank, "rank": rank, "decoded_token": "y"}
        entries.append(entry)
    choice = {"index": 0, "text": "", "prompt_logprobs": entries, "token_ids": [7, 8, 9]}
    if logprobs is not None:  # each generated token's own logprob (OpenAI's completions shape, as vLLM fills it)
        choice["logprobs"] = {"tokens": ["a", "b", "c"], "token_logprobs": [-0.25, -0.75, -9999.0],
                              "top_logprobs": [{"a": -0.25}, {"b": -0.75}, {"c": -9999.0}], "text_offset": [0, 1, 2]}
    return {"choices": [choice]}


def test_a_completions_answer_maps_onto_the_offline_engines_result():
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        return httpx.Response(200, json=_answer(body["prompt"], body["prompt_logprobs"], body.get("logprobs")))

    engine = vllm_server.VllmServerEngine()
    engine.kwargs = {"model": "/m/tiny"}
    engine.http = httpx.Client(base_url="http://server", transport=httpx.MockTransport(handler))
    result = engine.score([5, 6, 7, 8], topk=2, greedy=3)
    assert sent[0] | {"prompt": None} == {"model": "/m/tiny", "prompt": None, "max_tokens": 3, "temperature": 0.0,
                                          "prompt_logprobs": 2, "ignore_eos": True, "return_token_ids": True,
                                          "add_special_tokens": False, "logprobs": 0}
    assert sent[0]["prompt"] == [5, 6, 7, 8]  # token ids as they are: no BOS
    assert result["logprobs"] == [-0.5, -1.0, -1.5]  # the prompt tokens' own, L - 1 of them
    assert result["topk"] == [[(901, -0.1), (902, -0.2)]] * 3  # by rank, the prompt token (rank 3) left out
    assert result["greedy"] == [7, 8, 9]
    assert result["greedy_logprobs"] == [-0.25, -0.75, -9999.0]  # vLLM's API writes -inf as -9999.0
    assert engine.score([5, 6], topk=0, greedy=0) == {"logprobs": [-0.5]}
    assert sent[1]["max_tokens"] == 1 and sent[1]["prompt_logprobs"] == 0


def test_an_error_answer_says_what_the_server_said():
    engine = vllm_server.VllmServerEngine()
    engine.kwargs = {"model": "m"}
    engine.http = httpx.Client(base_url="http://server", transport=httpx.MockTransport(
        lambda request: httpx.Response(400, json={"error": {"message": "max_logprobs is 20"}})))
    with pytest.raises(RuntimeError, match="vllm serve answered 400 to a 3-token prompt: .*max_logprobs is 20"):
        engine.score([1, 2, 3], topk=50)


STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a server that ignores Ctrl-C, with a child that ignores SIGTERM too
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('child', flush=True); time.sleep(600)"])
time.sleep(600)
"""


def test_stopping_a_server_escalates_to_sigkill_of_its_whole_group():
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], start_new_session=True, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"child"
        assert vllm_server.group_alive(proc.pid)
        sent = vllm_server.stop_group(proc, waits=((signal.SIGINT, 0.5), (signal.SIGTERM, 0.5), (signal.SIGKILL, 5)))
        assert sent == ["SIGINT", "SIGTERM", "SIGKILL"]
        assert proc.returncode == -signal.SIGTERM  # the leader took SIGTERM; its child needed SIGKILL
        wait_for(lambda: not vllm_server.group_alive(proc.pid), timeout=10, what="the group to be empty")
    finally:
        if vllm_server.group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_polite_server_needs_only_sigint():
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
                            start_new_session=True, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"up"
    # SIGINT's wait stretched: on a loaded machine an interpreter's exit alone took longer than the default 8 s
    assert vllm_server.stop_group(proc, waits=((signal.SIGINT, 60.0), *vllm_server.STOP_WAITS[1:])) == ["SIGINT"]
    assert not vllm_server.group_alive(proc.pid)


def test_the_server_plans_with_its_own_defaults_and_its_own_cache_key(tmp_path):
    offline, served = (job_plan(tmp_path, "lengths=[256,512]", "samples=1", engine=engine)
                       for engine in ("vllm", "vllm_server"))
    assert served.engine == "vllm_server" and served.worker["options"]["server.clients"] == 1
    assert served.knobs == offline.knobs and served.corpus.fingerprint == offline.corpus.fingerprint
    if served.platform == "cpu":  # vllm/engine/arg_utils.py: OPENAI_API_SERVER vs LLM_CLASS on CPU
        assert (served.defaults["max_num_batched_tokens"], served.defaults["default_max_num_seqs"]) == (2048, 128)
        assert (offline.defaults["max_num_batched_tokens"], offline.defaults["default_max_num_seqs"]) == (4096, 256)
    # a server result never answers for an offline one: the engine is in the key (and what it reads)
    assert served.cache_key()["spec"]["engine"] == "vllm_server" != offline.cache_key()["spec"]["engine"]
    assert served.cache_key() != offline.cache_key()


def test_the_report_header_says_vllm_serve_and_its_command_line():
    from oneknob.explain.report_header import header_lines

    command = "VLLM_USE_V2_MODEL_RUNNER=0 vllm serve /m/tiny --max-num-seqs 128"
    run = {"knob": None, "requested": {"spec.k": 3}, "resolved": {}, "provenance": {"server_command": command}}
    lines = header_lines({"engine": "vllm_server", "runs": [run]})
    assert "- **engine**: vllm_server (through vllm serve, HTTP: /v1/completions with prompt_logprobs)" in lines
    assert f"- **server**: `{command}`" in lines


# -- the real server ---------------------------------------------------------------------------------------------

LENGTHS = [200, 256, 257, 512, 513, 600]  # a short grid around both of the seed's boundaries
STUDY = ["engine.emulate_cuda_graphs=true", "engine.max_num_batched_tokens=2048", "samples=1", "search.suspects=false"]
GRID = "lengths=[" + ",".join(map(str, LENGTHS)) + "]"
SERVE = ("vllm.entrypoints.cli.main serve", "vllm.entrypoints.openai.api_server")


def servers(root: Path) -> dict[int, tuple[str, str]]:
    """{PID: (start ticks, command line)} of every `vllm serve` process running in `root` (the CLI's working
    directory, which its workers and their servers inherit): another test's servers, beside this one, are not ours."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            ticks = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[19]
            if any(name in command for name in SERVE) and Path(os.readlink(f"/proc/{entry}/cwd")).is_relative_to(root):
                found[int(entry)] = (ticks, command)
        except (OSError, IndexError):
            continue
    return found


def left_over(root: Path, before: dict, wait_s: float = 15) -> dict:
    """`vllm serve` processes for runs under `root` started since `before`, still running after up to wait_s s."""
    deadline = time.monotonic() + wait_s
    while True:
        new = {p: c for p, (t, c) in servers(root).items() if before.get(p, (None,))[0] != t
               and not process_gone(p, t)}
        if not new or time.monotonic() > deadline:
            return new
        time.sleep(0.2)


def cli(workdir: Path, name: str, *overrides: str, timeout: float = 1800,
        env: dict | None = None) -> subprocess.CompletedProcess:
    return run_python([str(RUN_PY), "-m", *STUDY, *overrides, f"hydra.sweep.dir={workdir}/{name}"], workdir,
                      timeout=timeout, env=env)


@pytest.mark.slow
@pytest.mark.vllm
def test_the_server_finds_the_seeds_boundary_and_agrees_with_the_offline_engine(tmp_path):
    """Three engine starts: the server's baseline and capture=256 (the seed's two boundaries), then the offline
    baseline to compare NLL with. Absolute mode (no reference start; a server reference and topk through HTTP are
    test_a_batch_point_through_the_server's): on the tiny model the polluted side's mean NLL is >= 6.15 and the
    clean side's <= 5.26 at these lengths (measured), so max_nll=5.7 splits them."""
    before = servers(tmp_path)
    served = cli(tmp_path, "served", "engine=vllm_server", "reference=null", "oracles=[nll]", "verdict.max_nll=5.7",
                 "cudagraph.capture=null,256", GRID, env=IN_PROCESS)
    assert served.returncode == 0, served.stdout[-4000:] + served.stderr[-4000:]
    assert left_over(tmp_path, before) == {}
    summary = json.loads((tmp_path / "served" / "summary.json").read_text())
    runs = {r["name"]: r for r in summary["runs"]}
    run = runs["baseline"]
    assert [(t["lo"], t["hi"], t["direction"]) for t in run["transitions"]] == [(512, 513, "polluted->clean")]
    assert [(t["lo"], t["hi"], t["direction"]) for t in runs["cudagraph.capture=256"]["transitions"]] == [
        (256, 257, "polluted->clean")]
    resolved = run["resolved"]
    assert (resolved["max_capture_size"], resolved["max_num_seqs"], resolved["cudagraph_emulated"]) == (512, 128, True)
    assert runs["cudagraph.capture=256"]["resolved"]["max_capture_size"] == 256
    report = (tmp_path / "served" / "report.md").read_text()
    assert "vllm_server (through vllm serve, HTTP" in report
    server = next(line for line in report.splitlines() if line.startswith("- **server**: "))
    assert server.startswith("- **server**: `vllm serve ") and "--max-num-seqs 128" in server  # runner: vLLM's own

    offline = cli(tmp_path, "offline", "engine=vllm", "reference=null", "oracles=[nll]", "verdict.max_nll=5.7", GRID,
                  "explain.followups=0", env=IN_PROCESS)  # the same numbers, vLLM's engine core in or out of process
    assert offline.returncode == 0, offline.stdout[-4000:] + offline.stderr[-4000:]
    (off,) = json.loads((tmp_path / "offline" / "summary.json").read_text())["runs"]
    nll = {p["length"]: p["nll"] for p in run["points"]}
    nll_offline = {p["length"]: p["nll"] for p in off["points"]}
    assert set(LENGTHS) <= set(nll) and set(LENGTHS) <= set(nll_offline)
    assert [(t["lo"], t["hi"]) for t in off["transitions"]] == [(512, 513)]
    gaps = {L: abs(nll[L] - nll_offline[L]) for L in LENGTHS}
    print("server vs offline mean NLL per length:", {L: (nll[L], nll_offline[L], gaps[L]) for L in LENGTHS})
    # measured here: identical to the last bit at every length, polluted and clean alike (same kernels, same
    # order of events; the HTTP layer carries float64 text exactly)
    assert max(gaps.values()) < 1e-6, gaps
    assert nll[512] - nll[513] > 0.5  # the polluted side stays polluted through the server


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130)])
def test_a_signal_mid_request_leaves_no_server_running(tmp_path, sig, code):
    """One server start (reference=null): Ctrl-C once a point is measured, while the next requests run; SIGINT
    goes to the CLI's whole process group, as a terminal's does. SIGTERM reaches the worker the same way (the
    executor's stop): test_hostile_files_and_signals's real-engine SIGTERM test, and the synthetic [1-129]/[15-143]
    pair there."""
    before = servers(tmp_path)
    # ~40 requests of 1000-1950 tokens (~0.5-1 s each here) after the first point: the signal lands mid-job
    lengths = ",".join(str(L) for L in range(1000, 2000, 50))
    # a shell's background job starts with SIGINT ignored, and children inherit that (not a handler): the CLI
    # must start as a terminal's foreground job does, or Ctrl-C never reaches it (seen: exit 0 after SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = start_cli(tmp_path, f"lengths=[{lengths}]", "samples=2", "reference=null",
                         "search.bisect=false", "search.suspects=false", "oracles=[nll]", multirun=True,
                         engine="vllm_server")
    finally:
        signal.signal(signal.SIGINT, previous)
    seen: dict[int, tuple[str, str]] = {}

    def measuring() -> bool:
        seen.update(process_tree(proc.pid))
        return proc.poll() is not None or any(journal_records(j, "point") for j in job_journals(tmp_path))

    try:
        wait_for(measuring, timeout=600, every=0.2, what="the job's first measured point")
        assert proc.poll() is None, (tmp_path / "cli.log").read_text()
        seen.update(process_tree(proc.pid))
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        rc = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = (tmp_path / "cli.log").read_text()
    assert rc == code, f"exit {rc}: {out[-3000:]}"
    assert "still exiting" not in out, out[-6000:]  # the exit watchdog ended it (terminal._exit_within): see where
    assert any(name in command for name in SERVE for _, command in seen.values()), seen  # the server ran under the CLI
    left = {p: c for p, (t, c) in seen.items() if not process_gone(p, t)}
    assert left == {} and left_over(tmp_path, before, wait_s=5) == {}, left
    logs = " ".join(p.read_text(errors="replace") for p in tmp_path.glob("multirun/*/*/worker.log"))
    assert "oneknob: stopped `vllm serve`" in logs  # by the worker itself, not only by the executor's SIGKILL


# -- the worker's lifecycle around a stand-in server (no vLLM: seconds) ---------------------------------------------

FAKE_SERVER = r"""
import json, os, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
report = json.loads(os.environ["ONEKNOB_VLLM_PLUGIN"])["report"]
with open(report, "w") as f:
    json.dump({"resolved": {"max_num_seqs": 128}, "vllm": {}, "pid": os.getpid()}, f)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # an engine core in the same group

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200); self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(float(os.environ.get("FAKE_DELAY_S", "0")))
        ids = body["prompt"]
        entries = [None] + [{str(t): {"logprob": -1.0, "rank": 1}} for t in ids[1:]]
        data = json.dumps({"choices": [{"prompt_logprobs": entries, "token_ids": [1]}]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)

HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

WORKER = """
import sys
from oneknob.engines.vllm import server as vllm_server
vllm_server.serve_module = lambda: ("-c", sys.argv[1])
vllm_server.check_flags = lambda flags, kwargs: None
vllm_server.VllmServerEngine.resolved_config = lambda self: self.report["resolved"]
vllm_server.VllmServerEngine.provenance = lambda self: {"server_command": self.command, "server_pid": self.proc.pid}
from oneknob.run import worker
sys.stderr.flush()
worker.os._exit(worker.main())
"""


def _fake_worker(tmp_path, delay_s: float = 0.0):
    from oneknob.run.executor import Worker

    spec = dict(SEED_SPEC, engine="vllm_server", timeouts={"start_timeout_s": 30, "request_timeout_s": 30})
    worker = Worker(spec, tmp_path / "worker.log", start_timeout_s=60, request_timeout_s=60)
    worker_python = tmp_path / "python"  # the executor runs `<python> -m oneknob.run.worker`: a wrapper instead
    worker_python.write_text(f"#!/bin/sh\nshift 2\nexec {sys.executable} -c '{WORKER}' '{FAKE_SERVER}'\n")
    worker_python.chmod(0o755)
    worker.python = str(worker_python)
    worker.env = dict(os.environ, FAKE_DELAY_S=str(delay_s), PYTHONPATH=os.pathsep.join(sys.path))
    return worker


def test_the_worker_stops_its_server_at_the_end_of_a_job(tmp_path):
    worker = _fake_worker(tmp_path)
    ready = worker.start()
    server = ready.provenance["server_pid"]
    assert ready.provenance["server_command"].startswith("VLLM_USE_V2_MODEL_RUNNER=0 vllm serve /m/tiny --dtype")
    assert worker.score([5, 6, 7])["logprobs"] == [-1.0, -1.0]
    assert vllm_server.group_alive(server)
    worker.stop()
    assert not vllm_server.group_alive(server)
    assert "oneknob: stopped `vllm serve`" in worker.log_tail() and "with SIGINT" in worker.log_tail()


def test_sigterm_to_the_worker_mid_request_stops_its_server(tmp_path):
    worker = _fake_worker(tmp_path, delay_s=30)
    ready = worker.start()
    server = ready.provenance["server_pid"]
    worker._send({"op": "score", "id": 1, "tokens": __import__("oneknob.run.worker", fromlist=["pack"]).pack(
        [5, 6, 7], "q"), "topk": 0, "greedy": 0})
    time.sleep(1.0)  # the request is in flight, the stand-in server holds it for 30 s
    os.kill(worker.proc.pid, signal.SIGTERM)  # the worker alone, not its group: it must stop the server itself
    worker.proc.wait(timeout=20)
    wait_for(lambda: not vllm_server.group_alive(server), timeout=10, what="the server's group to be gone")
    assert "oneknob: stopped `vllm serve`" in worker.log_tail()
    worker.stop()


def test_a_worker_killed_outright_takes_its_server_with_it(tmp_path):
    """SIGKILL leaves the worker no say: the kernel's PR_SET_PDEATHSIG sends the server SIGTERM."""
    worker = _fake_worker(tmp_path)
    server = worker.start().provenance["server_pid"]
    ticks = open(f"/proc/{server}/stat").read().rsplit(")", 1)[1].split()[19]
    os.kill(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait(timeout=10)
    wait_for(lambda: process_gone(server, ticks), timeout=10, what="the server to die with its worker")
    if vllm_server.group_alive(server):  # its 'engine core' child: vLLM's own shutdown, or the executor, ends it
        os.killpg(server, signal.SIGKILL)
    worker.stop()


@pytest.mark.slow
@pytest.mark.vllm
def test_a_batch_point_through_the_server_is_concurrent_requests_in_one_step(tmp_path):
    """Two server starts (reference, job): the probe and its neighbour as concurrent HTTP requests, the scheduler
    held while they arrive; the plugin's steps in the server's engine process say they shared one, and the
    edge is the offline engine's 312|313 neighbour tokens (512|513 tokens per step)."""
    before = servers(tmp_path)
    done = cli(tmp_path, "batch", "engine=vllm_server", "oracles=[nll,topk]", "axis=batch", "batch.probe_length=200",
               "batch.neighbour_lengths=[0,312,313]", env=IN_PROCESS)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert left_over(tmp_path, before) == {}
    (run,) = json.loads((tmp_path / "batch" / "summary.json").read_text())["runs"]
    assert run["axis"] == "batch"
    assert [(t["lo"], t["hi"], t["direction"]) for t in run["transitions"]] == [(312, 313, "polluted->clean")]
    points = {p["length"]: p for p in run["points"]}
    assert {L: p["step_tokens"] for L, p in points.items()} == {0: 200, 312: 512, 313: 513}
    assert all(p["co_scheduled"] for p in points.values()), run.get("schedule_labels")


def test_recorded_steps_are_read_from_the_offset_and_named_by_prompt(tmp_path):
    from oneknob.engines.vllm.engine import recorded_steps, steps_offset

    path = tmp_path / "steps.jsonl"
    assert steps_offset(path) == 0 and recorded_steps(path, 0, len) == []
    path.write_text(json.dumps({"total": 9, "scheduled": {"old": 9}}) + "\n")
    start = steps_offset(path)
    with open(path, "a") as f:
        f.write(json.dumps({"total": 512, "scheduled": {"cmpl-oneknob-1-1-0-ab": 312, "cmpl-oneknob-1-0-0-cd": 200,
                                                        "other": 7}}) + "\n\n")
    tags = ["oneknob-1-0", "oneknob-1-1"]
    index = lambda rid: next((i for i, tag in enumerate(tags) if f"{tag}-" in rid), -1)  # noqa: E731
    assert recorded_steps(path, start, index) == [{"total": 512, "scheduled": [[-1, 7], [0, 200], [1, 312]]}]
