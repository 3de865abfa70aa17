"""Reliability round four (issue 41): a hostile but realistic user. One test per defect group, most severe first.

Bounded sizes, stored data checked before it is believed, every printed command runnable, no silent `+`. Each
refusal exits 2 before any engine starts (test_hostile_files_and_signals._refused); each test would fail on d7fc8c3.
"""

import glob
import json
import re
import shlex
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from helpers import run_cli, run_python, worker_records
from test_hostile_files_and_signals import _refused

from oneknob.config.schema import REPO_ROOT

SMALL = ("lengths=[200,300]", "samples=1", "search.bisect=false", "search.suspects=false")


def _plan(out: str) -> list[dict]:
    """The jobs of a dry run's plan.json (its path is the run's last line)."""
    path = re.findall(r"^plan: (.+plan\.json)$", out, re.M)[-1]
    return [{"name": j["name"], "requested": j["requested"]} for j in json.loads(Path(path).read_text())["jobs"]]


# -- 1. sizes have ceilings; a range is planned lazily -------------------------------------------------------------

def test_sizes_have_ceilings_and_a_range_is_never_materialised(tmp_path):
    rc, out = run_cli(tmp_path / "bisect", "sched.max_num_seqs=range(1,100000000)", "bisect=true", "dry_run=true",
                      multirun=True, timeout=90)  # materialised, the range took minutes before a MemoryError
    assert rc == 0, out
    assert [job["name"] for job in _plan(out)] == ["baseline", "sched.max_num_seqs=99999999"]  # two jobs up front
    assert "bisect sched.max_num_seqs over 99999999 values" in out
    refused = {
        ("sched.max_num_seqs=range(1,100000000)",): "this sweep would plan 99999999 jobs",
        ("axis=repeat", "repeat.concurrency=[1,100000000]", "samples=1"):
            "repeat.concurrency: 100000000 concurrent requests, but the engine schedules at most max_num_seqs=128",
        ("axis=repeat", "repeat.n=100000000", "samples=1"): "repeat.n=100000000: a point keeps every output",
        ("axis=batch", "batch.probe_length=200", "batch.neighbours=[0,1000000]"):
            "give at most 127 neighbours",
        ("oracles=[nll,greedy]", "verdict.greedy_tokens=100000000"):
            "must fit model.max_model_len=2048; give verdict.greedy_tokens=1024 or less",
    }
    for i, (given, expected) in enumerate(refused.items()):
        rc, out = run_cli(tmp_path / str(i), *given, multirun=True)
        _refused(rc, out, tmp_path / str(i), expected)


# -- 2. stored data that is valid JSON but wrong is set aside, never believed --------------------------------------

def test_a_stored_reference_or_cached_point_that_is_wrong_is_set_aside_and_measured_again(tmp_path):
    rc, first = run_cli(tmp_path, *SMALL)
    assert rc == 0, first
    cache = tmp_path / ".cache/oneknob"
    (long,) = cache.glob("references/*/long-*.json")
    data = json.loads(long.read_text())
    data["logprobs"][0][5] = float("nan")  # a NaN reference made every length "clean"
    long.write_text(json.dumps(data))
    (points,) = cache.glob("points/*/points.jsonl")
    records = [json.loads(line) for line in points.read_text().splitlines()]
    records[0]["logprobs"][3] = "x"  # was a TypeError
    records[1]["logprobs"] = records[1]["logprobs"][:10]  # was "the engine returned 9 logprobs"
    points.write_text("".join(json.dumps(r) + "\n" for r in records))
    rc, out = run_cli(tmp_path, *SMALL)
    assert rc == 0 and "Traceback" not in out and "FAILED" not in out and "engine returned" not in out, out
    flat = out.replace("\n", "")
    assert f"{long} is corrupt (logprobs[0] holds nan, not a finite logprob); the stored file is set aside" in flat
    assert f"{points} is corrupt (2 point(s) cannot be used: logprobs (sample 0 at 200) holds 'x'" in flat
    assert len(list(long.parent.glob(long.name + ".corrupt-*"))) == 1 == len(list(points.parent.glob("*.corrupt-*")))
    verdict = re.compile(r"^baseline: (.+?); \d+ probes", re.M)
    assert verdict.search(out).group(1) == verdict.search(first).group(1)  # measured again: the same verdicts
    assert "0 cached / 2 measured" in out, out
    from oneknob.record import validate

    assert validate.reference_problem("long-300.k0.json", {"max_length": 300, "logprobs": "garbage"}) is not None
    assert validate.reference_problem("at-200.k0.json", {"length": 200, "logprobs": [[-1.0] * 199]}) is None


# -- 3. every command oneknob prints runs as printed ---------------------------------------------------------------

def test_every_printed_command_runs_as_printed(tmp_path):
    sweep = ("engine_args.enable_prefix_caching=true,false", "env.VLLM_CPU_KVCACHE_SPACE=2",
             "engine.fault.crash_at_length=300", *SMALL)
    rc, out = run_cli(tmp_path / "run", *sweep, multirun=True)
    assert rc == 1, out  # the variant crashes at 300: the sweep prints retry
    retry = re.search(r"^retry: (.+?)  \(finished jobs", out, re.M).group(1)
    (report,) = (tmp_path / "run").glob("multirun/*/report.md")
    reproduce = re.search(r"\*\*reproduce\*\*: `(.+?)`", report.read_text()).group(1)
    assert "++" not in retry and "++" not in reproduce, (retry, reproduce)
    rc, out = run_cli(tmp_path / "plan", *sweep, "dry_run=true", multirun=True)
    assert rc == 0, out
    original = _plan(out)
    for printed in (retry, reproduce):
        argv = shlex.split(printed)
        assert argv[0] == "python"
        done = run_python([*argv[1:], "dry_run=true"], tmp_path / "plan", timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert _plan(done.stdout + done.stderr) == original, printed
    # the suggestions in refusals: did-you-mean, and the ablation block for a two-knob sweep (family knob included)
    rc, out = run_cli(tmp_path / "typo", "lenghts=[200,300]", "dry_run=true")
    suggested = re.search(r"Write (\S+) \(not \+lenghts\)", out).group(1)
    assert rc == 2 and suggested == "lengths=[200,300]", out
    rc, out = run_cli(tmp_path / "typo", suggested, "dry_run=true")
    assert rc == 0, out
    rc, out = run_cli(tmp_path / "two", "engine_args.enable_prefix_caching=true,false", "spec.k=1,3", "samples=1",
                      multirun=True)
    assert rc == 2, out
    argv = shlex.split(re.search(r"against the baseline: (python run\.py .+)$", out, re.M).group(1))
    done = run_python([str(REPO_ROOT / "run.py"), *argv[2:], "dry_run=true"], tmp_path / "two", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    names = [job["name"] for job in _plan(done.stdout + done.stderr)]
    assert "engine_args.enable_prefix_caching=false" in names and "spec.k=1" in names, names


# -- 4. a sweep across engines or axes is refused ------------------------------------------------------------------

def test_a_multirun_varying_engine_or_axis_is_refused(tmp_path):
    rc, out = run_cli(tmp_path, "engine=synthetic,vllm", "reference=null", multirun=True, engine=None)
    _refused(rc, out, tmp_path, "engine=synthetic,vllm: a sweep compares variants against one baseline on one engine",
             "run one sweep per engine (engine=synthetic, then engine=vllm")
    rc, out = run_cli(tmp_path, "axis=length,batch", multirun=True)
    _refused(rc, out, tmp_path, "axis=length,batch: a sweep compares variants against one baseline along one axis")


# -- 5. `+` never adds a key under oneknob's schema ----------------------------------------------------------------

def test_plus_on_a_mistyped_key_is_refused_with_did_you_mean(tmp_path):
    cases = {
        "lenghts=[200]": "lenghts is not a setting: did you mean lengths? Write lengths=[200]",
        "axsi=batch": "did you mean axis? Write axis=batch",
        "refrence=null": "did you mean reference? Write reference=null",
        "+lenghts=[200]": "+lenghts=[200]: lenghts is not a setting, and nothing may be added to oneknob's settings",
        "+batch.probe_lenght=3": "did you mean batch.probe_length? Write batch.probe_length=3",
        "+tracking.experment=x": "did you mean tracking.experiment? Write tracking.experiment=x",
        "+repeat.concurency=[1]": "did you mean repeat.concurrency?",
        "+model.bogus=1": "+model.bogus=1: model.bogus is not a setting",
        "+sample=1": "did you mean samples? Write samples=1",
        "+verdict.tol_nl=0.2": "did you mean verdict.tol_nll? Write verdict.tol_nll=0.2",
        "++search.max_probe=3": "did you mean search.max_probes? Write search.max_probes=3",
        "+engine.bogus=1": "+engine.bogus=1: engine.bogus is not a setting",
        "++samples=1": "samples is a setting; write samples=1 (without ++)",
    }
    for given, expected in cases.items():
        rc, out = run_cli(tmp_path, given)
        _refused(rc, out, tmp_path, expected)
    rc, out = run_cli(tmp_path, "+ablation.spec.k=[1]", "dry_run=true", multirun=True)  # a free-form block: Hydra's
    assert rc == 0, out


# -- 6. timeouts are finite ----------------------------------------------------------------------------------------

def test_a_nan_or_infinite_timeout_is_refused(tmp_path):
    for given in ("engine.request_timeout_s=nan", "engine.start_timeout_s=nan", "engine.start_timeout_s=inf",
                  "model.start_timeout_s=nan"):
        rc, out = run_cli(tmp_path, given)
        _refused(rc, out, tmp_path, f"{given}: must be > 0 seconds and finite")


# -- 7. the diagnosis after start is right: plugins kept, the server's port proven its own -----------------------

class _Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_plugin_list_without_oneknob_is_refused_and_a_squatter_on_the_port_is_not_the_server(tmp_path):
    import httpx

    from oneknob.engines.vllm.server import VllmServerEngine

    rc, out = run_cli(tmp_path, "env.VLLM_PLUGINS=nothing", "spec.k=0", engine="vllm")
    _refused(rc, out, tmp_path, "env.VLLM_PLUGINS=nothing: vLLM would load only nothing, not oneknob's",
             "add it: env.VLLM_PLUGINS=nothing,oneknob")
    squatter = HTTPServer(("127.0.0.1", 0), _Health)  # another process's server, answering /health first
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    server = VllmServerEngine()
    server.url = f"http://127.0.0.1:{squatter.server_address[1]}"
    server.proc = subprocess.Popen(["sleep", "30"], start_new_session=True)  # oneknob's server, still loading
    server.command, server.http = "vllm serve", httpx.Client(base_url=server.url)
    try:
        with pytest.raises(RuntimeError, match="answered /health, but not from the `vllm serve` oneknob started"):
            server._wait_healthy(10)
    finally:
        server.proc.kill()
        squatter.shutdown()
    # its own server in its own process group: ready
    own = subprocess.Popen([sys.executable, "-c", "import sys; from http.server import *; exec(sys.argv[1])",
                            "class H(BaseHTTPRequestHandler):\n def do_GET(self):\n  self.send_response(200); "
                            "self.end_headers()\n def log_message(self,*a): pass\n"
                            "s = HTTPServer(('127.0.0.1', 0), H); print(s.server_address[1], flush=True); "
                            "s.serve_forever()"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        server.proc, server.url = own, f"http://127.0.0.1:{own.stdout.readline().strip()}"
        server.http = httpx.Client(base_url=server.url)
        server._wait_healthy(10)
    finally:
        own.kill()


# -- 8. a commit's overlay carries every file its diff lists under vllm/ -------------------------------------------

def test_a_commits_overlay_carries_its_non_python_files(tmp_path):
    from oneknob.provision import commits

    repo = tmp_path / "vllm-src"
    (repo / "vllm").mkdir(parents=True)
    (repo / "vllm" / "__init__.py").write_text("")
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True,  # noqa: E731
                                    text=True).stdout
    git("init", "-q", "-b", "main")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "root")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "release")
    git("tag", "v0.32.0")
    (repo / "vllm" / "configs").mkdir()
    (repo / "vllm" / "configs" / "tuned.json").write_text('{"block": 64}\n')
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a tuned config")
    head = git("rev-parse", "HEAD").strip()
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("release\n")
    made = commits.ensure(str(repo), commits.check(str(repo), head), site, tmp_path / "cache", log=lambda text: None)
    assert (made / "vllm" / "configs" / "tuned.json").read_text() == '{"block": 64}\n'
    assert json.loads((made / commits.MARK).read_text())["files"] == ["vllm/configs/tuned.json"]


# -- 9. make ui / make server bind 127.0.0.1 unless HOST= is on make's command line --------------------------------

def test_make_ui_and_server_never_read_host_from_the_environment():
    def host(*args: str, env_host: str | None = None) -> list[str]:
        env = {k: v for k, v in __import__("os").environ.items() if k != "HOST"}
        env |= {"HOST": env_host} if env_host else {}
        done = subprocess.run(["make", "-n", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        return re.findall(r"--host (\S+)", done.stdout)

    assert host("ui", env_host="0.0.0.0") == ["127.0.0.1"]
    assert host("server", env_host="0.0.0.0") == ["127.0.0.1"]
    assert host("-e", "ui", env_host="0.0.0.0") == ["127.0.0.1"]  # make -e: the environment over the Makefile
    assert host("ui", "HOST=0.0.0.0", env_host="10.0.0.1") == ["0.0.0.0"]


# -- 10. axis=repeat refuses an oracle it cannot judge, as the other axes do ---------------------------------------

def test_axis_repeat_refuses_oracles_it_cannot_judge(tmp_path):
    from oneknob.errors import ConfigError
    from oneknob.plan import axis

    rc, out = run_cli(tmp_path, "axis=repeat", "oracles=[greedy]")
    _refused(rc, out, tmp_path, "oracles=[greedy] with axis=repeat: greedy cannot judge a point of this axis",
             "use oracles=[nll] with axis=repeat")
    for name in ("repeat", "batch"):  # by a rule, not a list of today's names: an oracle of a continuation too
        with pytest.raises(ConfigError, match="decode cannot judge"):
            axis.check_oracles(name, ["nll", "decode"])
        axis.check_oracles(name, ["nll", "topk"])


# -- 11. no traceback: refusals, exit 2 -----------------------------------------------------------------------------

def test_what_raised_a_traceback_is_refused_or_runs(tmp_path):
    (tmp_path / "afile").write_text("a regular file")
    rc, out = run_cli(tmp_path, "spec.k=1000")
    _refused(rc, out, tmp_path, "spec.k=1000 cudagraph.capture=null: no CUDA-graph size is left")
    rc, out = run_cli(tmp_path, f"model.path={tmp_path}/afile/sub", "spec.k=0", engine="vllm")
    _refused(rc, out, tmp_path, f"model.path={tmp_path}/afile/sub: the tiny model cannot be built there")
    rc, out = run_cli(tmp_path, "sched.max_num_seqs=range(1,10,0)", multirun=True)
    _refused(rc, out, tmp_path, "sched.max_num_seqs=range(1,10,0): a range needs a finite, non-zero step")
    rc, out = run_cli(tmp_path, "+ablation.engine_args.enable_prefix_caching=[true,false]", "+ablation.spec.k=[1,3]",
                      "dry_run=true", multirun=True)  # what the two-knob refusal suggests, planned
    assert rc == 0 and "Traceback" not in out, out
    assert (tmp_path / "afile").read_text() == "a regular file"


# -- 12. messages name the right key; a user's text is printed as typed --------------------------------------------

def test_messages_name_the_right_key_and_user_text_is_printed_literally(tmp_path):
    rc, out = run_cli(tmp_path, "engine_args.speculative_config={method:ngram}")
    _refused(rc, out, tmp_path, "speculative_config.method is spec.method's: set it with spec.method")
    rc, out = run_cli(tmp_path, "engine.extra.block_size=16")
    _refused(rc, out, tmp_path, "engine.extra.block_size: engine.extra is gone", "write engine_args.block_size=16")
    rc, out = run_cli(tmp_path, "engine.fault.model_config={max_position_embeddings:4096}", "dry_run=true")
    assert rc == 0, out  # documented, and now accepted as written
    rc, out = run_cli(tmp_path, "sched.max_num_seqs=1,2", "bisect=true", "bisect.criterion=polluted_at:abc",
                      multirun=True)
    _refused(rc, out, tmp_path, "bisect.criterion=polluted_at:abc: polluted_at needs one of the study's lengths")
    rc, out = run_cli(tmp_path / "sweep", "cudagraph.capture=256,512", "lengths=[200]", "samples=1",
                      "search.bisect=false", "search.suspects=false", 'tracking.experiment=":fire:[red]x"',
                      multirun=True)
    assert rc == 0, out
    assert "into MLflow experiment :fire:[red]x" in out and "🔥" not in out, out
    assert re.search(r"^report: multirun/\S+:fire:\[red\]x/report\.md", out, re.M), out


# -- 13. contradictions are refused, not resolved silently ---------------------------------------------------------

def test_contradictions_are_refused(tmp_path):
    for given, expected in (
            (["engine.max_num_batched_tokens=512", "engine_args.max_num_batched_tokens=256"],
             "engine.max_num_batched_tokens=512 and engine_args.max_num_batched_tokens=256: both set"),
            (["engine.gpu_memory_utilization=0.3", "engine_args.gpu_memory_utilization=0.2"],
             "engine.gpu_memory_utilization=0.3 and engine_args.gpu_memory_utilization=0.2: both set"),
            (["model.build=huge"], "model.build=huge: oneknob builds one model, the tiny one")):
        rc, out = run_cli(tmp_path, *given, "spec.k=0", engine="vllm")
        _refused(rc, out, tmp_path, expected)
    assert not worker_records(tmp_path) and not glob.glob(str(tmp_path / "outputs/*/result.json"))
