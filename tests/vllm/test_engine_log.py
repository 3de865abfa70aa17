"""What oneknob reads in a worker's log, on real vLLM logs (tests/logs/README.md says how each was made): the
engine's warnings, normalised and compared across runs, and the root cause of a failed start."""

from __future__ import annotations

from pathlib import Path

import pytest

from oneknob.explain import warnings_text
from oneknob.run import engine_log
from oneknob.run.executor import Worker
from oneknob.study import job_end, terminal

LOGS = Path(__file__).parents[1] / "logs"
JOB = (LOGS / "vllm_0.32.0_cpu_job.worker.log").read_text().splitlines()
FAILED = (LOGS / "vllm_0.32.0_cpu_gpu_memory_utilization_0.99.worker.log").read_text().splitlines()
REPORTED = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
TRITON = "Triton is not installed. triton-cpu is expected on x86 CPUs."
LD_PRELOAD = ("libtcmalloc is not found in LD_PRELOAD. For best performance, please follow the section `set "
              "LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required "
              "pre-loaded libraries.")
MTP = ("Enabling num_speculative_tokens > 1 will run multiple times of forward on same MTP layer,which may result "
       "in lower acceptance rate")


def test_a_real_jobs_warnings_are_vllms_own_once_each_without_process_time_or_file_and_without_its_shutdown():
    found = engine_log.warnings(JOB)
    assert found[0] == MTP and TRITON in found and LD_PRELOAD in found
    assert found.count(TRITON) == 1  # logged by MainProcess, Worker and EngineCore
    assert len(found) == 8
    assert not [w for w in found if "pid" in w or "shutdown" in w or "force killing" in w or w.startswith("[")]
    assert sum("[shutdown] Process manager: force killing remaining process" in line for line in JOB) == 2
    assert not [w for w in found if "FutureWarning" in w or "NUMA binding" in w]  # Python's and torch's own: not vLLM


def test_normalise_strips_the_process_the_time_and_file_line_and_drops_chatter_and_other_levels():
    line = next(line for line in JOB if "[cpu.py:224]" in line)
    assert line.startswith("(MainProcess pid=11706) WARNING 12-02 16:44:30 [cpu.py:224] ")
    assert engine_log.normalise(line) == TRITON
    chatter = next(line for line in JOB if "force killing remaining processes" in line)
    assert engine_log.normalise(chatter) is None
    assert engine_log.normalise(next(line for line in JOB if " INFO " in line)) is None
    # what varies from one process to the next is blanked for the comparison only
    assert engine_log.key("force killing remaining process EngineCore pid 12168") == engine_log.key(
        "force killing remaining process EngineCore pid 99")
    assert engine_log.key("Auto set 2.07 GiB for KV cache") == engine_log.key("Auto set 1.47 GiB for KV cache")
    assert engine_log.key(TRITON) == TRITON


def test_what_follows_oneknobs_stop_mark_is_shutdown_until_the_next_start():
    warning = next(line for line in JOB if "[cpu.py:224]" in line)
    other = next(line for line in JOB if "[cpu_worker.py:114] libtcmalloc" in line)
    lines = [engine_log.START_MARK, warning, engine_log.STOP_MARK, other, engine_log.START_MARK + " (job)"]
    assert engine_log.warnings(lines) == [TRITON]
    assert engine_log.warnings(lines + [other]) == [TRITON, LD_PRELOAD]


def _runs() -> list[dict]:
    """The K=3 job's warnings as the baseline, the K=0 start's (which has only Triton's) as a variant."""
    return [{"name": "baseline", "knob": None, "status": "ok", "engine_warnings": engine_log.warnings(JOB)},
            {"name": "spec.k=0", "knob": "spec.k", "status": "ok", "engine_warnings": engine_log.warnings(FAILED)},
            {"name": "spec.k=1", "knob": "spec.k", "status": "ok", "engine_warnings": None}]  # all from the cache


def test_warnings_every_run_has_are_shared_and_the_rest_are_only_in_their_runs():
    runs = _runs()
    assert runs[1]["engine_warnings"] == [TRITON]
    found = warnings_text.split(runs)
    assert found["shared"] == [TRITON]
    assert found["only_in"] == {"baseline": [w for w in engine_log.warnings(JOB) if w != TRITON]}
    assert found["compared"] == ["baseline", "spec.k=0"]  # spec.k=1 started no engine
    summary = {"runs": runs, "engine_warnings": found}
    assert f"engine warning only in the baseline: {MTP}" in warnings_text.finding_lines(summary)
    assert warnings_text.header_lines(summary)[1] == f"  - `{TRITON}`"
    assert warnings_text.run_lines(summary, runs[1]) == []
    # a failed run is not compared (it may have stopped before its engine said everything): its own are only its
    runs.append({"name": "spec.k=2", "knob": "spec.k", "status": "failed", "engine_warnings": [TRITON, "oops"]})
    found = warnings_text.split(runs)
    assert found["shared"] == [TRITON] and found["only_in"]["spec.k=2"] == ["oops"]
    summary = {"runs": runs, "engine_warnings": found}
    assert "engine warning only in the variant spec.k=2: oops" in warnings_text.finding_lines(summary)


def test_the_end_of_a_sweep_prints_only_what_its_jobs_did_not_and_counts_the_rest():
    runs = _runs()
    summary = {"runs": runs, "engine_warnings": warnings_text.split(runs)}
    every = warnings_text.terminal_lines(summary)
    assert every[0] == f"engine warning in every run: {TRITON}" and len(every) == 8
    shown = {engine_log.key(w) for w in engine_log.warnings(JOB)}
    assert warnings_text.terminal_lines(summary, shown) == [
        "engine warnings shown above with their jobs: 1 in every run (report.md: the header), 7 only in some runs "
        "(baseline; report.md: What each knob did)"]


def test_each_distinct_warning_is_shown_once_per_sweep_directory(tmp_path):
    first, second = engine_log.warnings(JOB), engine_log.warnings(FAILED)
    assert terminal.unshown_warnings(str(tmp_path), first) == first
    assert terminal.unshown_warnings(str(tmp_path), second + ["new"]) == ["new"]
    assert terminal.shown_warnings(tmp_path) == {engine_log.key(w) for w in first + ["new"]}
    assert terminal.unshown_warnings(None, second) == second  # a job outside a sweep shows all of its own


def test_the_root_cause_of_a_failed_start_is_the_workers_valueerror_not_the_errors_that_point_to_it():
    cause = engine_log.root_cause(FAILED, besides=REPORTED)
    assert cause["exception"] == "ValueError" and cause["kind"] == "out of host memory"
    assert cause["message"].startswith("Available memory on node 0 (10.7/14.84 GiB) on startup is less than "
                                       "desired CPU memory utilization (0.99, 14.69 GiB).")
    assert cause["process"] == "VllmWorker-0 pid=18481"
    # EngineCore's and the front end's errors point to it; a log without the worker's says the last of them
    without = [line for line in FAILED if not line.startswith("(VllmWorker-0")]
    assert engine_log.root_cause(without, besides=REPORTED)["exception"] == "Exception"
    assert engine_log.root_cause(FAILED[:23], besides=REPORTED) is None  # no traceback has ended yet
    assert engine_log.root_cause(JOB) is None


def test_interleaved_processes_do_not_mix_their_tracebacks():
    worker = [line for line in FAILED if line.startswith("(VllmWorker-0")]
    core = [line for line in FAILED if line.startswith("(EngineCore pid=18048) ERROR")]
    mixed = [line for pair in zip(worker, core) for line in pair] + worker[len(core):] + core[len(worker):]
    assert engine_log.root_cause(mixed)["exception"] == "ValueError"


def test_a_cause_from_an_earlier_engine_session_or_after_the_stop_is_not_this_failures():
    assert FAILED[-1] == engine_log.STOP_MARK
    assert engine_log.root_cause(FAILED + [engine_log.START_MARK + " (job)"]) is None
    assert engine_log.root_cause(FAILED + FAILED)["process"] == "VllmWorker-0 pid=18481"  # the second session's
    stopped = FAILED[:22] + [engine_log.STOP_MARK] + FAILED[22:]
    assert engine_log.root_cause(stopped) is None


def test_kinds_where_the_words_say_it():
    assert engine_log.classify("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB") == \
        "out of device memory"
    assert engine_log.classify("ValueError: Free memory on device (3.1/79.1 GiB) on startup is less than desired "
                               "GPU memory utilization (0.9, 71.2 GiB)") == "out of device memory"
    assert engine_log.classify("pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                               "CacheConfig") == "a configuration vLLM refused"
    assert engine_log.classify("MemoryError") == "out of host memory"
    assert engine_log.classify("Exception: WorkerProc initialization failed") is None


def test_the_workers_error_names_the_root_cause_on_its_first_line(tmp_path):
    log = tmp_path / "worker.log"
    log.write_text("\n".join(FAILED[:-1]) + "\n")  # as the worker reports its error: before the stop mark
    worker = Worker({}, log, start_timeout_s=1, request_timeout_s=1)
    error = worker._error(f"engine error during engine start: {REPORTED}\nTraceback ...", reported=REPORTED)
    first = str(error).splitlines()[0]
    assert first.startswith("engine error during engine start: out of host memory: ValueError: Available memory "
                            "on node 0 (10.7/14.84 GiB) on startup is less than desired CPU memory utilization")
    assert first.endswith(f"(raised in VllmWorker-0 pid=18481; the worker reported {REPORTED})")
    assert error.cause["kind"] == "out of host memory"
    outcome = job_end.failure(error)
    assert outcome["error"] == first and outcome["error_cause"]["exception"] == "ValueError"
    assert "error_cause" not in job_end.failure(RuntimeError("no log"))


def test_a_sweep_prints_each_distinct_engine_warning_once_and_reports_shared_and_only_in(tmp_path):
    """The synthetic engine logs engine.fault.warnings as vLLM logs its own (its process and PID, the time,
    file:line); one is the same in every job, the other names the job's resolved capture size."""
    import json

    from helpers import mlflow_runs, run_cli

    warnings = f'engine.fault.warnings=["{TRITON}","capture sizes up to {{max_capture_size}}"]'
    code, out = run_cli(tmp_path, "cudagraph.capture=256,384", "lengths=[128,512]", "samples=1",
                        "search.suspects=false", warnings, multirun=True)
    assert code == 0, out
    said = [line.split("engine warning: ", 1)[1] for line in out.splitlines() if "engine warning: " in line]
    assert sorted(said) == sorted([TRITON, "capture sizes up to 256", "capture sizes up to 384"]), out
    for text in said:
        assert out.count(text) == 1, text  # the end of the sweep counts them, it does not repeat them
    assert ("engine warnings shown above with their jobs: 1 in every run (report.md: the header), 2 only in some "
            "runs (baseline, cudagraph.capture=384; report.md: What each knob did)") in out
    (sweep_dir,) = (tmp_path / "multirun").iterdir()
    summary = json.loads((sweep_dir / "summary.json").read_text())
    assert summary["engine_warnings"] == {"shared": [TRITON], "compared": ["baseline", "cudagraph.capture=384"],
                                          "only_in": {"baseline": ["capture sizes up to 256"],
                                                      "cudagraph.capture=384": ["capture sizes up to 384"]}}
    report = (sweep_dir / "report.md").read_text()
    assert sum(TRITON in line for line in report.splitlines() if "**reproduce**" not in line) == 1
    assert f"\n- `{TRITON}`\n" in report.split("## What each knob did")[0]  # the header: the environment, folded
    result = report.split("## What each knob did")[1].split("## Coincidences")[0]
    assert "- engine warning only in the variant cudagraph.capture=384: capture sizes up to 384" in result
    assert "- engine warning only in the baseline: capture sizes up to 256" in result
    job = next(r for r in mlflow_runs(tmp_path, role="job") if r.data.tags["oneknob.knob"] != "baseline")
    assert json.loads(job.data.tags["oneknob.engine_warnings"]) == [TRITON, "capture sizes up to 384"]


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.xdist_group("vllm-failed-start")  # its own directory: free to run beside the others
def test_a_real_engine_that_cannot_start_says_vllms_own_reason(tmp_path):
    """vLLM's CPU build with all of host memory asked for (gpu_memory_utilization is its share of host RAM, checked
    at start-up unless VLLM_CPU_KVCACHE_SPACE sets the KV cache): its worker process refuses (after oneknob's
    check of the configuration passed), EngineCore and the front end re-raise that as errors pointing "above";
    the terminal, summary.json and report.md say the worker's reason. vLLM's own processes (no IN_PROCESS)."""
    import json

    from helpers import RUN_PY, run_python

    done = run_python([str(RUN_PY), "-m", "engine=vllm", "lengths=[128]", "samples=1", "reference=null", "spec.k=0",
                       "engine.gpu_memory_utilization=1.0", f"hydra.sweep.dir={tmp_path}/sweep"], tmp_path,
                      timeout=1200, env={"VLLM_CPU_KVCACHE_SPACE": None})  # the suite's KV cache size skips the check
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, out[-4000:]
    reason = ("out of host memory: ValueError: Available memory on node 0 (", "on startup is less than desired CPU "
              "memory utilization (1.0, ")
    assert f"FAILED baseline: engine error during engine start: {reason[0]}" in out and reason[1] in out, out[-4000:]
    assert "the worker reported RuntimeError: Engine core initialization failed. See root cause above." in out
    failed = out.split("1 of 1 job(s) failed:")[1]
    assert f"baseline: engine error during engine start: {reason[0]}" in failed and "retry: python" in failed
    summary = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    (run,) = summary["runs"]
    assert run["error_cause"]["kind"] == "out of host memory" and run["error_cause"]["exception"] == "ValueError"
    assert reason[0] in run["error"] and reason[1] in run["error"]
    notes = (tmp_path / "sweep" / "report.md").read_text().split("## Notes")[1]
    assert f"baseline: failed: engine error during engine start: {reason[0]}" in " ".join(notes.split())


def test_the_first_error_is_the_one_shown_and_what_followed_from_it_comes_after(tmp_path):
    """A step vLLM's engine core failed, then oneknob's own plugin file was gone when the closing engine wrote to it:
    the job's error was that FileNotFoundError, vLLM's RuntimeError only in parentheses in error.txt. The worker
    marks its error (ERROR_MARK) before it closes the engine; what any process raises after the mark follows."""
    core = "(EngineCore pid=4242) ERROR 12-07 08:00:01 [core.py:900] "
    vllm = "RuntimeError: shape '[-1, 2, 64]' is invalid for input of size 1000"
    gone = "FileNotFoundError: [Errno 2] No such file or directory: '/tmp/oneknob-plugin-x/steps.jsonl'"
    lines = [f"{engine_log.START_MARK} (job)",
             f"{core}Traceback (most recent call last):", f'{core}  File "gpu_model_runner.py", line 1, in execute',
             f"{core}{vllm}",
             f"{engine_log.ERROR_MARK}: EngineDeadError: EngineCore encountered an issue. See stack trace above.",
             "Traceback (most recent call last):", '  File "vllm_plugin.py", line 9, in _record_step', gone]
    assert engine_log.root_cause(lines)["line"] == vllm  # the last traceback was the root cause before the mark
    assert [e["line"] for e in engine_log.follow_ons(lines)] == [gone]
    log = tmp_path / "worker.log"
    log.write_text("\n".join(lines) + "\n")
    reported = "EngineDeadError: EngineCore encountered an issue. See stack trace above."
    error = Worker({}, log, start_timeout_s=1, request_timeout_s=1)._error(
        f"engine error during request at length 300: {reported}\nTraceback ...", reported=reported)
    first, *rest = str(error).splitlines()
    assert vllm in first and "FileNotFoundError" not in first, first
    assert rest[0] == "then, while the first error was handled (a consequence of it, not its cause):"
    assert rest[1].startswith(f"  {gone}") and rest[2] == "Traceback ..."  # error.txt keeps both, in order


def test_what_a_config_check_in_the_worker_logs_is_not_the_jobs_engines(tmp_path):
    """The job's worker checks every configuration of the sweep (the reference's too) before its engine starts:
    vLLM's words there ("Enforce eager set" of the reference) were the baseline's "engine warning only in the
    baseline". The worker's check marks the log around it, and the warnings are read outside the marks."""
    from types import SimpleNamespace

    from oneknob.run import executor

    log = tmp_path / "worker.log"
    log.write_text(engine_log.START_MARK + "\n")
    warning = next(line for line in JOB if "[cpu.py:224]" in line)
    other = next(line for line in JOB if "[cpu_worker.py:114] libtcmalloc" in line)

    def receive(timeout_s, what):
        with open(log, "a") as out:  # the check's own process logs into the worker's log
            out.write(other + "\n")
        return {"type": "checked", "result": {"ok": True}}

    worker = SimpleNamespace(log_path=log, _undefer=lambda: None, _send=lambda message: None, _receive=receive)
    worker._mark = lambda text: executor.Worker._mark(worker, text)
    assert executor.Worker.check(worker, {"knobs": {}}, {}, 5) == {"ok": True}
    with open(log, "a") as out:
        out.write(warning + "\n")  # the job's engine, after the check
    assert engine_log.warning_lines(log) == [TRITON]
    lines = [engine_log.START_MARK, engine_log.CHECK_MARK, other, engine_log.CHECKED_MARK, warning,
             engine_log.STOP_MARK, other]
    assert engine_log.warnings(lines) == [TRITON]
