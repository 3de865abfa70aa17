"""Reliability round three (issue 24): a hostile but realistic user. One test per defect.

Never touch a user's files, survive SIGTERM, refuse what cannot work before anything starts: every refusal
exits 2, names the key and the fix, starts no engine and records no run.
"""

import json
import os
import signal
import time

import pytest
from helpers import process_gone, process_tree
from helpers import (cache_points, job_journals, journal_records, mlflow_runs, python_module, run_cli, start_cli,
                     wait_for, worker_records)

# search.suspects=false: these tests inject faults at lengths the plain grid + bisection probes (the suspect
# probes of the capture sizes, 256|257 and 512|513, would settle the search before it reaches them)
SWEEP = ("cudagraph.capture=256,512", "lengths=[200,300,400,600]", "samples=1", "search.suspects=false")


def _refused(rc: int, out: str, tmp_path, *expected: str) -> None:
    assert rc == 2, out
    for text in expected:
        assert text.replace("TMP", str(tmp_path)) in out, f"{text!r} not in:\n{out}"
    assert "Traceback" not in out, out
    assert worker_records(tmp_path) == [], "an engine was started"
    assert mlflow_runs(tmp_path) == [], "a run was recorded"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# -- 1. a user's model directory is never written, moved or deleted ------------------------------------------------

def _user_model(tmp_path, config: str = '{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}'):
    """A user's checkpoint directory with config.json and a working tokenizer, but no weights."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from oneknob.provision import tiny_training

    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text(config)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(["def main():\n    return 0\n"] * 10, trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=[tiny_training.EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tiny_training.save_tokenizer(tok, model)
    return model


def _listing(path):
    return sorted((p.name, p.stat().st_mtime_ns, p.read_bytes()) for p in path.iterdir())


@pytest.mark.parametrize("case", ["build=tiny into a user's directory", "no weights", "malformed config.json"])
def test_a_users_model_directory_is_refused_and_left_as_it_was(tmp_path, case):
    model = _user_model(tmp_path, "{not json" if case == "malformed config.json" else
                        '{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}')
    before = _listing(model)
    build = [] if case == "build=tiny into a user's directory" else ["model.build=null"]
    rc, out = run_cli(tmp_path, "engine=vllm", f"model.path={model}", *build, "spec.k=0", *SWEEP[:1],
                      multirun=True)
    expected = {"build=tiny into a user's directory": ["model.build=tiny with model.path=TMP/my-model",
                                                       "not made by oneknob's tiny-model builder",
                                                       "set model.build=null"],
                "no weights": ["model.path=TMP/my-model: no weights in it"],
                "malformed config.json": ["model.path=TMP/my-model: its config.json cannot be read as JSON"]}[case]
    _refused(rc, out, tmp_path, *expected)
    assert _listing(model) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".my-model")) in ([], [".my-model.lock"])


def test_the_tiny_model_builder_recognises_its_own_builds_with_and_without_the_marker(tmp_path):
    from oneknob.provision import tiny_model

    legacy = tmp_path / "legacy"  # a build from before the marker: its oneknob_build.json names the builder
    legacy.mkdir()
    (legacy / "oneknob_build.json").write_text(json.dumps({"builder": tiny_model.BUILDER, "version": 1}))
    marked = tmp_path / "marked"
    marked.mkdir()
    (marked / tiny_model.MARKER).write_text("")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "oneknob_build.json").write_text(json.dumps({"builder": "someone else"}))
    assert tiny_model.may_build_into(legacy) and tiny_model.may_build_into(marked)
    assert tiny_model.may_build_into(tmp_path / "new")
    assert not tiny_model.may_build_into(foreign) and not tiny_model.may_build_into(_user_model(tmp_path))
    with pytest.raises(tiny_model.NotOurs):
        tiny_model.ensure(foreign)
    with pytest.raises(tiny_model.NotOurs):  # --force too, before any training
        tiny_model.build(foreign)
    assert os.listdir(foreign) == ["oneknob_build.json"]


# -- 2, 6, 7, 8, 9: refused before anything starts, naming the key and the fix ----------------------------------

REFUSED = {
    # 2. names that escape their folder
    "experiment with ..": (["tracking.experiment=../../etc/x"],
                           ["tracking.experiment='../../etc/x': an experiment name is a name, not a path"]),
    "absolute experiment": (["tracking.experiment=/tmp/x"], ["tracking.experiment='/tmp/x': an experiment name"]),
    # 6. values the engine refuses only after it started
    "negative seed": (["seed=-1"], ["seed=-1: the engine's random seed must be an integer in [0, 2**32)", "seed=0"]),
    "seed past 32 bits": (["seed=4294967296"], ["seed=4294967296: the engine's random seed"]),
    "memory share above 1": (["engine=vllm", "engine.gpu_memory_utilization=1.5"],
                             ["engine.gpu_memory_utilization=1.5: a share of the device's memory, must be in (0, 1]"]),
    "no batched tokens": (["engine=vllm", "engine.max_num_batched_tokens=0"],
                          ["engine.max_num_batched_tokens=0: must be a positive number of tokens"]),
    "max_model_len 0": (["model.max_model_len=0"], ["model.max_model_len=0: must be a positive number of tokens"]),
    "tensor parallel 0": (["model.tensor_parallel_size=0"], ["model.tensor_parallel_size=0: the GPUs one engine"]),
    # 7. typos without '+': Hydra's hint (+key) would be refused next
    "typo in a knob": (["cudagraph.captur=256"], ["cudagraph.captur is not a knob or a setting",
                                                  "did you mean cudagraph.capture? Write cudagraph.capture=256"]),
    "typo in spec": (["spec.kk=2"], ["spec.kk=2: spec.kk is not a knob", "did you mean spec.k? Write spec.k=2"]),
    # 8. a release Hydra turns into a number
    "float release": (["engine=vllm", "vllm.version=0.30"],
                      ["Hydra reads 0.30 as a number (0.3)", "quote it: vllm.version='0.30'"]),
    # 9. smaller ones
    "sweep of a non-knob": (["spec.method=mtp,eagle"], ["spec.method is not a knob, so a sweep cannot vary it",
                                                        "The knobs a sweep varies: cudagraph.capture"]),
    "oracle twice": (["oracles=[nll,nll]"], ["oracles=[nll,nll]: nll listed more than once",
                                             "oracles=[nll]"]),
    "reference equal to the job, which is the default reference": (
        ["cudagraph.enforce_eager=true", "spec.k=0", "sched.max_num_seqs=null", "runner=null",
         "cudagraph.capture=null,256"],
        ["it is this job's own requested config", "this job already runs without graphs and speculation",
         "reference_engine=transformers"]),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_before_anything_starts_naming_the_key_and_the_fix(tmp_path, case):
    given, expected = REFUSED[case]
    swept = any("," in o and "[" not in o for o in given)
    rc, out = run_cli(tmp_path, *given, *([] if swept else SWEEP[:1]), multirun=True)
    _refused(rc, out, tmp_path, *expected, "nothing was started and no run was recorded")
    assert not (tmp_path.parent / "etc").exists() and not list(tmp_path.glob("mlruns/artifacts/*"))


def test_a_value_listed_twice_in_a_sweep_is_said_once(tmp_path):
    rc, out = run_cli(tmp_path, "cudagraph.capture=256,512,512", "dry_run=true", multirun=True)
    assert rc == 0, out
    assert "cudagraph.capture=512 is listed more than once: it runs once" in out, out
    assert out.count("cudagraph.capture=512") >= 2  # the note, and the one job in the plan


# -- 4. unusable output places ----------------------------------------------------------------------------------

PLACES = {
    "sweep dir that is a file": (["hydra.sweep.dir=afile", *SWEEP[:1]], True,
                                 "hydra.sweep.dir=TMP/afile: cannot write there (Not a directory"),
    "sweep dir name of 300 characters": ([f"hydra.sweep.dir={'d' * 300}", *SWEEP[:1]], True,
                                         "cannot write there (File name too long"),
    "run dir that is a file": (["hydra.run.dir=afile"], False, "hydra.run.dir=afile: cannot write there"),
    "run dir name of 300 characters": ([f"hydra.run.dir={'d' * 300}/x"], False, "(File name too long"),
}


@pytest.mark.parametrize("case", list(PLACES))
def test_an_unusable_output_place_is_refused_naming_its_key(tmp_path, case):
    given, multirun, expected = PLACES[case]
    (tmp_path / "afile").write_text("a regular file")
    rc, out = run_cli(tmp_path, *given, multirun=multirun)
    _refused(rc, out, tmp_path, expected, "nothing was started and no run was recorded")
    assert (tmp_path / "afile").read_text() == "a regular file"


def test_report_out_that_cannot_be_written_is_refused(tmp_path):
    (tmp_path / "afile").write_text("a regular file")
    rc, out = python_module(tmp_path, "oneknob", "report", "--out", "afile/report")
    assert rc == 2, out
    assert "--out afile/report: cannot write there" in out and "Traceback" not in out, out
    assert not (tmp_path / "mlruns").exists()  # refused before any store is opened


# -- 3. SIGTERM / SIGHUP end a sweep like Ctrl-C -------------------------------------------------------------------

def test_each_length_is_journaled_as_it_is_measured_not_at_the_end_of_its_round(tmp_path):
    """The grid is the search's first round; a job that hangs (or is killed) at its third length has journaled,
    cached and logged the two before it already: what a kill keeps, what a rerun resumes from."""
    proc = start_cli(tmp_path, *SWEEP, "engine.fault.hang_at_length=400", multirun=True)
    try:
        wait_for(lambda: any("injected hang at length 400" in p.read_text(errors="replace")
                             for p in tmp_path.glob("multirun/*/0/worker.log")), timeout=60, what="the hang at 400")
        assert sorted(p["length"] for p in journal_records(job_journals(tmp_path)[0], "point")) == [200, 300]
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=120)  # clean-up: the exit's own speed is test_faults' to check
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_ends_a_sweep_like_ctrl_c_and_a_rerun_resumes(tmp_path, sig, code):
    proc = start_cli(tmp_path, *SWEEP, "engine.fault.hang_at_length=250", multirun=True)
    try:
        wait_for(lambda: any("injected hang at length 250" in p.read_text(errors="replace")
                             for p in tmp_path.glob("multirun/*/0/worker.log")), timeout=60, what="the hang at 250")
        worker = worker_records(tmp_path, "start", role="job")[-1]["pid"]
        os.kill(proc.pid, sig)  # to the CLI alone, as `timeout` does: its workers live in sessions of their own
        t0 = time.monotonic()
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = (tmp_path / "cli.log").read_text()
    assert rc == code, out
    assert f"interrupted ({signal.Signals(sig).name})" in out and "Traceback" not in out, out
    wait_for(lambda: not _alive(worker), timeout=15 - (time.monotonic() - t0), what="the worker to end")
    assert {r.data.tags["oneknob.role"]: r.info.status for r in mlflow_runs(tmp_path)} == {
        "reference": "FINISHED", "job": "KILLED", "sweep": "KILLED"}
    kept = sorted(p["length"] for p in journal_records(job_journals(tmp_path)[0], "point"))
    assert kept == [200, 300, 400, 600]
    rc, out = run_cli(tmp_path, *SWEEP, multirun=True)  # the rerun resumes from the cache
    assert rc == 0, out
    assert "4 cached" in out, out


@pytest.mark.slow
def test_submitits_preemption_signal_ends_a_job_in_its_own_process_like_sigterm(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    proc = start_cli(tmp_path, "hydra/launcher=local_procs", *SWEEP, "engine.fault.hang_at_length=250",
                     multirun=True)
    try:
        wait_for(lambda: any("injected hang at length 250" in p.read_text(errors="replace")
                             for p in tmp_path.glob("multirun/*/0/worker.log")), timeout=120, what="the hang at 250")
        worker = worker_records(tmp_path, "start", role="job")[-1]["pid"]
        job_process = int(open(f"/proc/{worker}/stat").read().rsplit(")", 1)[1].split()[1])
        assert job_process != proc.pid  # the job runs in a process of its own
        os.kill(job_process, signal.SIGUSR2)  # what Slurm sends before preempting (submitit's default)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = (tmp_path / "cli.log").read_text()
    assert not _alive(worker)
    jobs = {r.data.params.get("knob.cudagraph.capture"): r.info.status for r in mlflow_runs(tmp_path, role="job")}
    assert jobs["256"] == "KILLED", (jobs, out)  # the preempted job; the sweep went on with the other
    assert rc == 1 and "interrupted (SIGUSR2) in its own process" in out, out
    assert {r.info.status for r in mlflow_runs(tmp_path, role="sweep")} == {"FAILED"}


@pytest.mark.slow
@pytest.mark.vllm
def test_sigterm_mid_job_on_the_real_engine_kills_the_runs_and_leaves_no_vllm_process(tmp_path):
    """One engine start (reference=null): SIGTERM once the job has measured a point; ~60-90 s."""
    # enough requests after the first point (8 lengths x 16 samples: 30 ms to 2 s each here, with the machine's
    # load) that the signal lands mid-job, not in the gap between the job's end and the next one's start
    proc = start_cli(tmp_path, "cudagraph.capture=128,256", "lengths=[128,160,192,224,320,384,448,480]",
                     "samples=16", "reference=null", "search.bisect=false", "search.suspects=false", multirun=True,
                     engine="vllm")
    seen: dict[int, tuple[str, str]] = {}

    def measuring() -> bool:
        seen.update(process_tree(proc.pid))
        return proc.poll() is not None or any(journal_records(j, "point") for j in job_journals(tmp_path))

    try:
        wait_for(measuring, timeout=400, every=0.2, what="the job's first measured point")
        assert proc.poll() is None, (tmp_path / "cli.log").read_text()
        seen.update(process_tree(proc.pid))
        os.kill(proc.pid, signal.SIGTERM)
        t0 = time.monotonic()
        rc = proc.wait(timeout=60)
        left = {p: c for p, (t, c) in seen.items() if not process_gone(p, t)}
        while left and time.monotonic() - t0 < 15:
            time.sleep(0.1)
            left = {p: c for p, (t, c) in seen.items() if not process_gone(p, t)}
        print(f"SIGTERM -> CLI exit {time.monotonic() - t0:.1f} s; processes left: {left}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = (tmp_path / "cli.log").read_text()
    assert rc == 143, out
    assert "interrupted (SIGTERM)" in out and "Traceback" not in out, out
    assert "still exiting" not in out, out  # the exit watchdog ended it (terminal._exit_within): its stacks say where
    assert any("EngineCore" in c or "spawn_main" in c for _, c in seen.values()), seen  # vLLM's engine ran
    assert not left, f"still running 15 s after SIGTERM: {left}"
    runs = sorted(mlflow_runs(tmp_path), key=lambda r: r.info.start_time)
    assert [r.info.status for r in runs if r.data.tags["oneknob.role"] == "sweep"] == ["KILLED"]
    # the job running at the signal is KILLED; on a quiet machine the first job can finish its 16 requests before
    # the signal lands (then the second job is the one running)
    jobs = [r.info.status for r in runs if r.data.tags["oneknob.role"] == "job"]
    assert jobs[-1:] == ["KILLED"] and set(jobs[:-1]) <= {"FINISHED"}, jobs
    measured = [p["length"] for p in journal_records(job_journals(tmp_path)[0], "point")]
    assert measured and sum(len(v) for v in cache_points(tmp_path).values()) >= len(measured)  # kept: a rerun resumes


# -- 5. garbage in oneknob's own files -----------------------------------------------------------------------------

def test_a_corrupt_cache_record_or_stored_reference_is_set_aside_named_and_remeasured(tmp_path):
    small = ("lengths=[200,300]", "samples=1", "search.bisect=false")  # one job: its record and its reference
    rc, out = run_cli(tmp_path, *small)
    assert rc == 0, out
    cache = tmp_path / ".cache/oneknob"
    corrupted = [*cache.glob("points/*/meta.json"), *cache.glob("references/*/long-*.json")]  # record, reference
    assert len(corrupted) == 2, corrupted
    garbage = ["garbage", "[1, 2]"]  # not JSON; JSON but not a record
    for path, text in zip(corrupted, garbage):
        path.write_text(text)
    rc, out = run_cli(tmp_path, *small)
    assert rc == 0, out
    assert "Traceback" not in out and "FAILED" not in out, out
    for path, text in zip(corrupted, garbage):
        assert f"{path} is corrupt" in out.replace("\n", ""), (path, out)
        [aside] = path.parent.glob(f"{path.name}.corrupt-*")
        assert aside.read_text() == text  # set aside, never deleted
        json.loads(path.read_text())  # and written afresh
    assert {r.info.status for r in mlflow_runs(tmp_path)} == {"FINISHED"}


def test_sync_warns_of_a_garbage_journal_line_and_ends_the_run_it_orphaned(tmp_path):
    from helpers import mlflow_client

    rc, out = run_cli(tmp_path, "lengths=[200,300]", "samples=1", "reference=null")
    assert rc == 0, out
    [journal] = tmp_path.glob("outputs/*/journal.jsonl")
    lines = journal.read_text().splitlines()
    end = next(i for i, line in enumerate(lines) if json.loads(line).get("kind") == "end")
    lines[end] = "\x00garbage{"
    journal.write_text("\n".join(lines) + "\n")
    [run] = mlflow_runs(tmp_path, role="job")
    mlflow_client(tmp_path).update_run(run.info.run_id, status="RUNNING")  # as if MLflow never got the end
    rc, out = python_module(tmp_path, "oneknob", "sync", str(journal.parent))
    assert rc == 0, out
    assert f"line(s) {end + 1} are not journal records" in out, out
    [run] = mlflow_runs(tmp_path, role="job")
    assert run.info.status == "KILLED"
    assert "unreadable line(s)" in run.data.tags["oneknob.stale"]


def test_sync_of_a_path_that_does_not_exist_fails(tmp_path):
    rc, out = python_module(tmp_path, "oneknob", "sync", "/nonexistent")
    assert rc == 2, out
    assert "/nonexistent: no such file or directory" in out


# -- 9. the smaller ones ---------------------------------------------------------------------------------------------

def test_a_garbage_tracking_uri_from_the_environment_is_refused_under_its_own_name(tmp_path):
    rc, out = run_cli(tmp_path, *SWEEP[:1], multirun=True, env={"MLFLOW_TRACKING_URI": "garbage"})
    _refused(rc, out, tmp_path, "MLFLOW_TRACKING_URI=garbage (tracking.uri is null", "not a tracking URI")


def test_a_directory_as_the_sqlite_store_is_refused_at_once(tmp_path):
    t0 = time.monotonic()
    rc, out = run_cli(tmp_path, *SWEEP[:1], f"tracking.uri=sqlite:///{tmp_path}", multirun=True)
    _refused(rc, out, tmp_path, "tracking.uri=sqlite:///TMP: that path is a directory, not an SQLite file",
             "sqlite:///TMP/mlflow.db")
    assert time.monotonic() - t0 < 60  # MLflow's own retries took ~104 s


def test_a_sweep_id_that_is_a_path_or_a_filter_is_refused(tmp_path):
    from helpers import seed_store

    seed_store(tmp_path)
    for given in ("../../etc", "x' or tags.a = 'b"):
        rc, out = python_module(tmp_path, "oneknob", "compare", "--sweep", given)
        assert rc == 2 and "not an id" in out and "Traceback" not in out, out


def test_reading_commands_never_create_a_store_and_say_only_their_own_flags(tmp_path):
    new = tmp_path / "new.db"
    for command in ("compare", "report"):
        rc, out = python_module(tmp_path, "oneknob", command, "--tracking-uri", f"sqlite:///{new}")
        assert rc == 2, out
        assert "no SQLite store there (reading never creates one)" in out and "Traceback" not in out, out
        assert not new.exists()
    from helpers import seed_store

    seed_store(tmp_path)  # an empty store: no sweep yet
    rc, out = python_module(tmp_path, "oneknob", "report")
    assert rc == 2 and "no sweep in this tracking store yet" in out, out
    assert "--runs" not in out  # report has no such flag
    rc, out = python_module(tmp_path, "oneknob", "compare")
    assert rc == 2 and "--runs" in out, out


STUCK_EXIT = """
import sys, threading, time
from oneknob.study import terminal
terminal.EXIT_WITHIN_S = float(sys.argv[1])
if sys.argv[2] == "stuck":  # a thread the interpreter's exit joins, and that never ends
    threading.Thread(target=lambda: time.sleep(600), name="never-ends").start()
terminal.interrupted()
"""


@pytest.mark.parametrize("case", ["stuck", "clean"])
def test_an_interrupted_command_whose_exit_hangs_ends_anyway_saying_where(tmp_path, case):
    """After an interrupt's cleanup only the interpreter's exit is left; a thread it waits on forever must not keep
    the command alive: the watchdog prints every thread's stack and ends it with the interrupt's exit code. A clean
    exit never meets it."""
    import subprocess
    import sys

    script = tmp_path / "stuck_exit.py"
    script.write_text(STUCK_EXIT)
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script), "2", case], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert done.returncode == 130, done.stderr
    assert "interrupted (Ctrl-C)" in done.stdout + done.stderr
    if case == "stuck":
        assert "oneknob: still exiting 2 s after the interrupt" in done.stderr, done.stderr
        assert "thread never-ends:" in done.stderr and "time.sleep(600)" in done.stderr, done.stderr
        assert took < 30, took
    else:
        assert "still exiting" not in done.stderr, done.stderr


SWALLOWED_INTERRUPT = """
import os, signal, sys, time
from oneknob.study import terminal
terminal.handle_termination()
sig = getattr(signal, sys.argv[1])


class Finalized:
    def __del__(self):  # the garbage collector runs finalizers anywhere; an exception raised in one is swallowed
        os.kill(os.getpid(), sig)
        for _ in range(100000):  # the signal's handler runs, and raises, in here
            pass


try:
    Finalized()
    for _ in range(100):  # the study's work goes on
        time.sleep(0.1)
    print("not interrupted")
except KeyboardInterrupt as exc:
    print("interrupted:", type(exc).__name__)
"""


@pytest.mark.parametrize("sig, raised", [("SIGINT", "KeyboardInterrupt"), ("SIGTERM", "Terminated")])
def test_an_interrupt_raised_in_a_finalizer_is_delivered_again(tmp_path, sig, raised):
    """Python swallows an exception raised in a finalizer or a weakref callback ("Exception ignored in ..."), and a
    signal's is raised wherever the main thread is: 1 of 25 synthetic sweeps interrupted at random moments ran on
    to its end with exit 0 after Ctrl-C, its KeyboardInterrupt lost in SQLAlchemy's weakref callback. The signal
    is sent again, to be raised where the study catches it."""
    import subprocess
    import sys

    script = tmp_path / "swallowed.py"
    script.write_text(SWALLOWED_INTERRUPT)
    done = subprocess.run([sys.executable, str(script), sig], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, f"interrupted: {raised}\n"), done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr


INTERRUPTED_WRITER_START = """
import sys, threading
from pathlib import Path
from oneknob.record import store

real_start = threading.Thread.start


def interrupted_start(self):  # a signal handler raising in the main thread while the cache's writer thread starts
    threading.Thread.start = real_start
    if sys.argv[2] == "after":  # inside start()'s wait for the new thread to run
        real_start(self)
    raise KeyboardInterrupt


threading.Thread.start = interrupted_start
cache = store.PointCache(Path(sys.argv[1]), {"k": 1})
cache.put(128, {0: {"logprobs": [-1.5, -2.5], "seconds": 0.01}})
try:
    cache.write()
except KeyboardInterrupt:
    print("interrupted")
sys.exit(130)
"""


@pytest.mark.parametrize("when", ["after", "before"])
def test_an_interrupt_while_the_cache_writer_starts_neither_hangs_the_exit_nor_loses_the_write(tmp_path, when):
    """A Ctrl-C or SIGTERM landing in Thread.start() of the point cache's writer (start() waits for the new thread
    to run) left, with a ThreadPoolExecutor, a worker Python joins at exit but never told to stop: the interrupted
    command hung in its exit (CI, stop 48; the watchdog's stacks named oneknob-cache_0). The queued write is done
    at exit either way, whether the thread had started or not."""
    import subprocess
    import sys

    from oneknob.files import read_jsonl

    script = tmp_path / "interrupted_writer.py"
    script.write_text(INTERRUPTED_WRITER_START)
    try:
        done = subprocess.run([sys.executable, str(script), str(tmp_path / "cache"), when], capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the interrupted process was still exiting after 60 s")
    assert (done.returncode, done.stdout) == (130, "interrupted\n"), done.stderr
    written = [record for path in (tmp_path / "cache").glob("points/*/points.jsonl") for record in read_jsonl(path)]
    assert written == [{"sample": 0, "length": 128, "logprobs": [-1.5, -2.5], "seconds": 0.01}], written


def test_an_fsync_whose_request_a_signal_cut_short_is_still_served(tmp_path):
    """A SIGTERM or Ctrl-C raised in the main thread inside the journal's fsync request, after the request and
    before its notify (or before the fsync thread was started), left it unserved: the command then waited the
    full 60 s at exit for it."""
    import time as clock

    from oneknob.record import store_threads

    journal = tmp_path / "journal.jsonl"
    journal.write_text("{}\n")
    for started in (True, False):
        fsyncs = store_threads.Fsyncs()
        if started:
            fsyncs.ask(journal)
            fsyncs.wait(timeout=10)  # its thread now waits for the next request
        with fsyncs._cond:
            fsyncs._pending[journal] = None  # requested; the notify (and the thread's start) never happened
        began = clock.monotonic()
        fsyncs.wait(timeout=10)
        assert not fsyncs._pending and clock.monotonic() - began < 5, (started, clock.monotonic() - began)
