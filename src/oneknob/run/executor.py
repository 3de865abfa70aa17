"""The executor: starts a worker process, talks to it, and always reaps it.

One `Worker` per job (and one for the reference). Its process runs in its own
session, so the engine's helper processes share the worker's process group
(vLLM's EngineCore and its workers do: multiprocessing children, same group
and session); stopping kills that group by the worker's PID, never by name,
then any descendant that left the group (found under /proc before the first
signal: once the worker dies its children are reparented and lost), and
waits for them, so the next job starts on free memory. Every start is
appended to a workers.jsonl record, which is how engine starts are counted.
An `EngineSession` starts a job's worker only when a point is not in the cache.
Within `hosts.hosting()` (a sweep whose jobs run in its process) a vLLM worker is
forked from a host that imported vLLM once for its interpreter and environment,
instead of starting and importing by itself; it is stopped the same way.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from oneknob.run import cpus, engine_log, hosts
from oneknob.run.channel import Channel, Closed
from oneknob.run.procs import proc_stat
from oneknob.run.worker import pack, unpack

# requests sent beyond the one whose answer is awaited (EngineSession.expect, Worker.score_all)
AHEAD = 1


class WorkerError(RuntimeError):
    """The worker failed; `log_tail` holds the end of its log, `cause` the root cause read there
    (engine_log.root_cause: the last exception any engine process raised, classified), when there is one."""

    def __init__(self, message: str, log_tail: str = "", cause: dict | None = None):
        super().__init__(message)
        self.log_tail, self.cause = log_tail, cause


class WorkerDied(WorkerError):
    pass


class WorkerTimeout(WorkerError):
    pass


@dataclass(frozen=True)
class Ready:
    resolved: dict[str, Any]
    provenance: dict[str, Any]
    start_s: float
    pid: int


# Lines of the engine log worth showing while an engine starts.
_PHASES = ("Initializing", "Loading", "loading", "Compil", "compil", "Captur", "KV cache",
           "Automatically detected platform", "resolved", "non-default args", "Memory profiling")


class TopKRows(list):
    """A worker's top-k rows, [(id, logprob)] x k per position as every engine answers, that also hold the two
    arrays they arrived as: `arrays`, (ids, logprobs), positions x k. The top-k oracle reads those
    (oneknob.verdict.oracles) instead of walking the rows between two engine requests; the cache and the
    journal see a list."""
    arrays: tuple[np.ndarray, np.ndarray]


def _topk_rows(message: dict[str, Any], k: int) -> TopKRows:
    """A result's top-k rows from the worker's two packed arrays (the rows: one zip chunked k at a time, 2.6x
    faster than slicing both per row)."""
    ids = np.frombuffer(base64.b64decode(message["topk_ids"]), dtype=np.int64).reshape(-1, k)
    logprobs = np.frombuffer(base64.b64decode(message["topk_logprobs"]), dtype=np.float64).reshape(-1, k)
    pairs = zip(ids.ravel().tolist(), logprobs.ravel().tolist())
    rows = TopKRows(map(list, zip(*[pairs] * k)))
    rows.arrays = (ids, logprobs)
    return rows


def _scored(message: dict[str, Any], topk: int, greedy: int) -> dict[str, Any]:
    """A score request's answer: {"logprobs", "seconds"}, "topk" rows / a "greedy" continuation when asked, and
    "malformed" ({field: reason}) when the engine's answer was."""
    result = {"logprobs": unpack(message["logprobs"], "d"), "seconds": message["seconds"]}
    if message.get("malformed"):  # the engine answered, wrongly: a measurement (oneknob.engines.answers)
        result["malformed"] = message["malformed"]
    if topk:
        result["topk"] = _topk_rows(message, topk)
    if greedy:
        result["greedy"] = unpack(message["greedy"], "q")
        result["greedy_logprobs"] = unpack(message["greedy_logprobs"], "d")
    return result


def descendants(pid: int) -> dict[int, str]:
    """{PID: start ticks} of every process below `pid`, whatever its process group or session."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := proc_stat(int(entry))) is not None:
            children.setdefault(stat[0], []).append(int(entry))
            ticks[int(entry)] = stat[2]
    found, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = ticks[child]
                todo.append(child)
    return found


def kill_stragglers(processes: dict[int, str], wait_s: float = 10.0) -> list[int]:
    """SIGKILL those of `processes` still running (the same PID and start time: a reused PID is left
    alone) and wait until they are gone; returns their PIDs."""
    def running(pid: int) -> bool:
        stat = proc_stat(pid)
        return stat is not None and stat[2] == processes[pid] and stat[1] not in "ZX"

    stragglers = [pid for pid in processes if running(pid)]
    for pid in stragglers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while any(running(pid) for pid in stragglers) and time.monotonic() < deadline:
        time.sleep(0.05)
    return stragglers


def engine_phase(log_path: Path) -> str:
    """The most recent recognisable phase line of a worker log, shortened."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(log_path) - 8192))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if any(p in line for p in _PHASES):
            text = line.split("] ", 1)[-1].strip()
            return text[:80]
    return ""


class Worker:
    def __init__(self, spec: dict[str, Any], log_path: Path, *, start_timeout_s: float,
                 request_timeout_s: float, record_path: Path | None = None, role: str = "job",
                 python: str = sys.executable, env: dict[str, str] | None = None):
        self.spec = spec
        self.python, self.env = python, env
        self.log_path = Path(log_path)
        self.start_timeout_s = start_timeout_s
        self.request_timeout_s = request_timeout_s
        self.record_path = record_path
        self.role = role
        self.proc: subprocess.Popen | None = None
        self._next_id = 0
        self._pending: deque = deque()  # (id, what, read) of each request sent whose answer is not read yet
        self._channel: Channel | None = None  # the worker's pipes (_spawn)
        self._hung = False  # a timed-out worker gets no grace period when stopped
        self.started = False  # an engine start was asked for (a prepared worker may never be)
        self._deferred = False  # prepared while its host imports the engine: forked on first use (hosting)
        self._engine_pid: int | None = None  # the worker's PID once its engine is ready (oneknob.run.cpus)

    # -- lifecycle ---------------------------------------------------------
    def prepare(self) -> None:
        """Start the worker's process and have it import its engine (vLLM: seconds of CPU) without starting one,
        while the orchestrator does something else (waits for vLLM's config check); start() then starts the
        engine. A prepared worker that is never started is ended by stop() and records nothing: no engine ran."""
        if self.proc is None and not self._deferred:
            # within hosts.hosting(): the host imports now, and the worker is forked from it on first use
            self._deferred = hosts.host_for(self.python, self._env(), self.spec, self.log_path,
                                            self.start_timeout_s) is not None
            if not self._deferred:
                self._spawn(ahead=True)
                self._send({"op": "prepare", "spec": self.spec})

    def _undefer(self) -> None:
        """A prepared worker whose host was importing: forked now, prepared as any other."""
        if self._deferred:
            self._deferred = False
            self._spawn(ahead=True)
            self._send({"op": "prepare", "spec": self.spec})

    def check(self, spec: dict[str, Any], env: dict[str, str], timeout_s: float) -> dict[str, Any]:
        """The engine's config check of `spec` (vllm_introspect's validate spec: one environment, the worker's own)
        in this prepared, unstarted worker, `env` set for it: its answer. The worker forks for it, so the check
        shares the worker's engine import and leaves nothing behind in it."""
        self._undefer()
        self._mark(engine_log.CHECK_MARK)  # what the check logs is not the job's engine's (engine_log.warnings)
        self._send({"op": "check", "spec": spec, "env": env})
        message = self._receive(timeout_s, "the engine's config check")
        self._mark(engine_log.CHECKED_MARK)
        if message.get("type") != "checked":
            raise self._error(f"unexpected message during the config check: {message}")
        return message["result"]

    def start(self, on_wait: Callable[[float, str], None] | None = None) -> Ready:
        self._deferred = False  # a prepared worker not forked yet starts as any other
        if self.proc is None:
            self._spawn()
            self._send({"op": "start", "spec": self.spec})
        else:  # prepared: the spec went with the prepare message
            self._send({"op": "start"})
        self.started = True
        self._record("start")
        message = self._receive(self.start_timeout_s, "engine start",
                                lambda elapsed: on_wait and on_wait(elapsed, engine_phase(self.log_path)))
        if message["type"] != "ready":
            raise self._error(f"unexpected message during start: {message}")
        ready = Ready(message["resolved"], message["provenance"], message["start_s"], message["pid"])
        self._engine_pid = ready.pid
        if (moved := cpus.engine_ready(ready.pid, descendants(ready.pid))) is not None:
            bound, own = (",".join(map(str, sorted(c))) for c in moved)
            self._mark(f"[oneknob] the engine computes on CPU(s) {bound} (its threads are bound there): oneknob's "
                       f"own threads run on CPU(s) {own} while it runs (oneknob.run.cpus)")
        return ready

    def _spawn(self, ahead: bool = False) -> None:
        """The worker's process; `ahead`: prepared, importing its engine before it is asked to start one."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(f"{engine_log.START_MARK} ({self.role}{', importing its engine ahead' if ahead else ''})\n".encode())
        log.flush()
        env = self._env()
        try:
            host = hosts.host_for(self.python, env, self.spec, self.log_path, self.start_timeout_s)
            while host is not None:
                self.proc = host.fork(env, log, self.spec)
                if self.proc is not None or not host.refuses(self.spec):
                    break
                # its import read a variable this worker's knobs change: another host of the build that has not
                # refused them, at last one of this worker's own environment (which never does)
                host = hosts.host_for(self.python, env, self.spec, self.log_path, self.start_timeout_s)
            if self.proc is None:
                self.proc = subprocess.Popen(
                    [self.python, "-m", "oneknob.run.worker"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                    env=env, start_new_session=True,
                )
        finally:
            log.close()
        self._pending.clear()
        self._channel = Channel(self.proc.stdin, self.proc.stdout)  # writes never block: requests go ahead (submit)

    def _env(self) -> dict[str, str]:
        return dict(os.environ if self.env is None else self.env, PYTHONUNBUFFERED="1", **cpus.launch_env())

    def submit(self, token_ids: list[int], topk: int = 0, greedy: int = 0) -> int:
        """Send one request (one prompt): its id, for collect(). The worker answers requests in the order they
        were sent, one at a time, so a request sent before the answer to the one before is read changes nothing
        the engine sees: the worker only finds it waiting when it is done with the one before."""
        return self._post({"op": "score", "tokens": pack(token_ids, "q"), "topk": topk, "greedy": greedy},
                          f"request of {len(token_ids)} tokens", lambda message: _scored(message, topk, greedy))

    def collect(self, request_id: int, sent: Callable[[], None] | None = None) -> Any:
        """The answer to a request sent (submit), after the answers to those sent before it, which nobody waits
        for any more (a request sent ahead that was not asked for after all). `sent` runs first, while the engine
        works; its failure is raised once the answer is read, so the protocol stays in step."""
        failed = None
        if sent is not None:
            try:
                sent()
            except Exception as exc:
                failed = exc
        answer = self._answer(request_id)
        if failed is not None:
            raise failed
        return answer

    def score(self, token_ids: list[int], topk: int = 0, greedy: int = 0,
              sent: Callable[[], None] | None = None) -> dict[str, Any]:
        """One prompt, one request: {"logprobs", "seconds"}, and "topk" rows / a "greedy" continuation when
        asked (the oracles). `sent` runs while the engine works on it (collect)."""
        return self.collect(self.submit(token_ids, topk=topk, greedy=greedy), sent)

    def score_all(self, prompts: list[list[int]], topk: int = 0, greedy: int = 0) -> list[dict[str, Any]]:
        """score() of each prompt, in order, each request sent before the answer to the one before is read: the
        worker goes from one to the next without waiting for this process to wake up and ask."""
        waiting: deque[int] = deque()
        results = []
        for prompt in prompts:
            waiting.append(self.submit(prompt, topk=topk, greedy=greedy))
            if len(waiting) > AHEAD:
                results.append(self.collect(waiting.popleft()))
        results.extend(self.collect(request) for request in waiting)
        return results

    def batch(self, prompts: list[list[int]], scored: list[int], topk: int = 0,
              sent: Callable[[], None] | None = None) -> dict[str, Any]:
        """Several prompts in one engine call: {"results": {index: {"logprobs", "topk"?}}, "steps": [...],
        "seconds"} (worker protocol op "batch")."""

        def read(message: dict[str, Any]) -> dict[str, Any]:
            if message.get("type") != "batch":
                raise self._error(f"protocol out of step: expected a batch result, got {message}")
            results = {}
            for row in message["results"]:
                result = {"logprobs": unpack(row["logprobs"], "d")}
                if row.get("malformed"):
                    result["malformed"] = row["malformed"]
                if topk:
                    result["topk"] = _topk_rows(row, topk)
                results[row["index"]] = result
            return {"results": results, "steps": message["steps"], "seconds": message["seconds"]}
        return self.collect(self._post({"op": "batch", "prompts": [pack(p, "q") for p in prompts],
                                        "scored": list(scored), "topk": topk},
                                       f"batch of {len(prompts)} prompts ({sum(map(len, prompts))} tokens)", read),
                            sent)

    def _post(self, message: dict[str, Any], what: str, read: Callable[[dict], Any]) -> int:
        self._next_id += 1
        self._send({**message, "id": self._next_id})
        self._pending.append((self._next_id, what, read))
        return self._next_id

    def _answer(self, request_id: int) -> Any:
        while self._pending:
            expected, what, read = self._pending.popleft()
            message = self._receive(self.request_timeout_s, what)
            if message.get("id") != expected:
                raise self._error(f"protocol out of step: expected result {expected}, got {message}")
            if expected == request_id:
                return read(message)
        raise self._error(f"protocol out of step: no request {request_id} awaits an answer")

    def stop(self, grace_s: float = 30.0) -> None:
        """Ask the worker to stop, then kill its process group and any descendant that left it; always reap it."""
        proc, self._deferred = self.proc, False
        if proc is None:
            return
        tree = descendants(proc.pid) if proc.poll() is None else {}
        self._mark(engine_log.STOP_MARK)  # what the engine logs from here is its shutdown (engine_log)
        try:
            if proc.poll() is None and grace_s > 0 and not self._hung:
                try:
                    self._send({"op": "stop"})
                    deadline = time.monotonic() + grace_s
                    while self._channel.sending and time.monotonic() < deadline:  # behind requests sent ahead
                        self._pump(deadline - time.monotonic(), "stop")
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except (OSError, subprocess.TimeoutExpired, WorkerError):
                    pass
        finally:  # a Ctrl-C or SIGTERM during the graceful wait still ends the worker before it unwinds
            self._end(proc, tree)

    def _end(self, proc: subprocess.Popen, tree: dict) -> None:
        """Kill the worker's process group and any descendant that left it; reap it; record the stop."""
        if proc.poll() is None:
            tree |= descendants(proc.pid)  # what the engine started since
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)  # the group whose leader is our worker's PID
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                continue
        proc.wait()
        stragglers = kill_stragglers(tree)  # descendants in a group or session of their own
        self._channel.close()
        if self._engine_pid is not None:
            cpus.engine_gone(self._engine_pid)
            self._engine_pid = None
        if self.started:
            self._record("stop", returncode=proc.returncode, **({"stragglers": stragglers} if stragglers else {}))
        self.proc = None

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- plumbing ----------------------------------------------------------
    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _error(self, message: str, kind: type[WorkerError] = WorkerError, reported: str = "") -> WorkerError:
        """The error, with the root cause from the log (before the traceback the worker sent) when it has one: its
        first line is the first error (the engine's own, or the worker's); errors raised after the worker caught
        it (engine_log.follow_ons: the engine torn down under a step) come after, in order, never first."""
        cause = engine_log.failure_cause(self.log_path, reported)  # a hang too may follow a process's crash
        if cause is None and kind is WorkerDied and "killed by signal" in message:
            cause = {"kind": "a crash", "line": message.split(" during ")[0], "exception": None, "message": None,
                     "process": f"worker pid={self.proc.pid}"}
        elif cause is not None:  # the first line says it: the terminal, summary.json and report.md show that one
            first, _, rest = message.partition("\n")
            said = reported.split("\n")[0]
            first = (first.removesuffix(said) if said and first.endswith(said) else f"{first}: ")
            message = first + engine_log.cause_text(cause, said) + (f"\n{rest}" if rest else "")
        if follow := engine_log.follow_on_text(engine_log.failure_follow_ons(self.log_path)):
            first, _, rest = message.partition("\n")  # the first error first; what followed from it after
            message = f"{first}\n{follow}" + (f"\n{rest}" if rest else "")
        return kind(message, self.log_tail(), cause)

    def _mark(self, text: str) -> None:
        try:
            with open(self.log_path, "a") as log:
                log.write(f"{text}\n")
        except OSError:  # a full disk: the mark only tells warnings from shutdown chatter
            pass

    def _send(self, message: dict) -> None:
        """Send a message: what the pipe does not take now goes out while an answer is awaited (_pump)."""
        try:
            self._channel.send(message)
        except Closed:
            raise self._died("while sending a message") from None

    def _died(self, when: str) -> WorkerDied:
        code = self.proc.wait()
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return self._error(f"worker (pid {self.proc.pid}) {how} {when}", WorkerDied)

    def _receive(self, timeout_s: float, what: str, on_tick: Callable[[float], None] | None = None) -> dict:
        started = time.monotonic()
        while True:
            elapsed = time.monotonic() - started
            if elapsed > timeout_s:
                self._hung = True
                raise self._error(f"{what} timed out after {timeout_s:g} s "
                                  f"(pid {self.proc.pid}; raise engine.*_timeout_s if this is expected)",
                                  WorkerTimeout)
            if (message := self._channel.take()) is not None:
                if message.get("type") == "error":
                    raise self._error(f"engine error during {what}: {message['message']}\n"
                                      f"{message.get('traceback', '')}", reported=message["message"])
                return message
            if on_tick:
                on_tick(elapsed)
            self._pump(min(0.25, timeout_s - elapsed + 0.01), what)

    def _pump(self, wait_s: float, what: str) -> None:
        try:
            self._channel.pump(wait_s)
        except Closed:
            raise self._died(f"during {what}") from None

    def _record(self, event: str, **extra) -> None:
        if self.record_path is None:
            return
        record = {"event": event, "role": self.role, "pid": self.proc.pid, "engine": self.spec["engine"],
                  "knobs": self.spec["knobs"], "time": time.time(), **extra}
        if isinstance(self.proc, hosts.Forked):
            record["host"] = self.proc.host.proc.pid  # forked from it (hosting): the engine imported once
        try:
            self.record_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.record_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError:  # a full disk: the record only counts starts, and must not keep a worker unreaped
            pass


def worker_for(plan, requested: dict[str, Any], log_path: Path, role: str = "job", engine: str | None = None,
               options: dict[str, Any] | None = None) -> Worker:
    """A worker for these knob values, on the interpreter their engine build needs (made now if missing);
    `engine` another engine for the same model (the reference's: transformers), with `options` of its own."""
    from oneknob.engines.base import facts

    engine = engine or plan.engine
    python, env = facts(engine).interpreter(requested, plan.builds, settings=plan.worker["settings"])
    # role: the synthetic reference-side fault; timeouts: an engine that waits on its own (vllm_server's /health)
    spec = dict(plan.worker, knobs=requested, engine=engine, role=role, timeouts=plan.timeouts)
    if engine != plan.engine:
        spec["options"] = options or {}
    return Worker(spec, log_path, **plan.timeouts, python=python, env=env,
                  record_path=Path(plan.cache_dir) / "workers.jsonl", role=role)


class EngineSession:
    """A worker started on the first point the cache lacks, stopped when the job ends.

    `target` is the requested config the job measures (after any pinning);
    `logprobs` always runs on an engine of exactly that config.
    """

    def __init__(self, plan, job_dir: Path, progress, prepared: Worker | None = None):
        self.plan, self.job_dir, self.progress = plan, job_dir, progress
        self.prepared = prepared  # a worker for plan.knobs that imported its engine already (run.prepared)
        self._waiting: list[Callable[[], None]] = []  # run while the engine works on the next request
        self._expected: deque[tuple] = deque()  # (tokens, topk, greedy) of the score() calls announced (expect)
        self._ahead: deque[tuple] = deque()  # (that key, request id): sent to the worker before it was asked for
        self.worker: Worker | None = None
        self.ready: Ready | None = None
        self.running: dict[str, Any] | None = None  # the requested config of the live worker
        self.target: dict[str, Any] = dict(plan.knobs)

    def runs(self, requested: dict[str, Any]) -> bool:
        return self.worker is not None and self.running == requested

    def start(self, requested: dict[str, Any] | None = None) -> Ready:
        self.stop()
        requested = dict(requested or self.plan.knobs)
        prepared, self.prepared = self.prepared, None
        if prepared is not None and prepared.spec["knobs"] != requested:  # a pin changed what the job runs
            prepared.stop(grace_s=0)
            prepared = None
        self.worker = prepared or worker_for(self.plan, requested, self.job_dir / "worker.log")
        self.running = requested
        self.ready = self.worker.start(self.progress.engine_wait)
        self.progress.engine_ready(self.ready)
        return self.ready

    def expect(self, prompts: list[list[int]], topk: int = 0, greedy: int = 0) -> None:
        """The score() calls to come, in order (a round's lengths the cache lacks). Each is sent to the worker
        before the answer to the one before it is read (AHEAD at a time), so the engine goes from one request to
        the next without waiting for this process to judge, journal and record the last and wake up to ask: the
        worker still runs them one at a time, in order, so the engine sees the same requests. A score() that asks
        for anything else drops the rest (an answer sent ahead and not asked for is read and thrown away)."""
        self._expected = deque((tuple(prompt), topk, greedy) for prompt in prompts)

    def score(self, token_ids: list[int], topk: int = 0, greedy: int = 0) -> dict[str, Any]:
        if not self.runs(self.target):
            self.start(self.target)
        key = (tuple(token_ids), topk, greedy)
        if self._ahead and self._ahead[0][0] == key:
            request = self._ahead.popleft()[1]
        else:  # not what was announced (or nothing was): the answers sent ahead are dropped as they arrive
            self._ahead.clear()
            if self._expected and self._expected[0] == key:
                self._expected.popleft()
            else:
                self._expected.clear()
            request = self.worker.submit(token_ids, topk=topk, greedy=greedy)
        while self._expected and len(self._ahead) < AHEAD:
            tokens, k, n = nxt = self._expected.popleft()
            self._ahead.append((nxt, self.worker.submit(list(tokens), topk=k, greedy=n)))
        return self.worker.collect(request, sent=self._meanwhile())

    def batch(self, prompts: list[list[int]], scored: list[int], topk: int = 0) -> dict[str, Any]:
        if not self.runs(self.target):
            self.start(self.target)
        self._expected.clear()
        self._ahead.clear()
        return self.worker.batch(prompts, scored, topk=topk, sent=self._meanwhile())

    def while_engine_works(self, call: Callable[[], None]) -> None:
        """Run `call` once the next request is sent, while the engine works on it (its failure is raised with
        that request's answer): work of the previous point that holds the GIL, such as the point cache's JSON,
        then delays no answer."""
        self._waiting.append(call)

    def _meanwhile(self) -> Callable[[], None] | None:
        calls, self._waiting = self._waiting, []

        def run_all() -> None:
            for call in calls:
                call()
        return run_all if calls else None

    def stop(self, grace_s: float = 30.0) -> None:
        self._ahead.clear()
        if self.worker is not None:
            worker, self.worker, self.running = self.worker, None, None
            worker.stop(grace_s)

    def close(self, grace_s: float = 30.0) -> None:
        """Stop the engine, and a prepared worker the job never started (every point was cached)."""
        self.stop(grace_s)
        prepared, self.prepared = self.prepared, None
        if prepared is not None:
            prepared.stop(grace_s=0)

    def log_tail(self) -> str:
        return self.worker.log_tail() if self.worker else ""
