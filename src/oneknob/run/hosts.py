"""Worker hosts: one engine import for every worker of a sweep on the same interpreter and environment.

`hosting()` is entered by a sweep whose jobs run in its process (oneknob.study.sweep); within it the executor's
workers of an engine that imports itself ahead (vLLM) are forked from a host (`python -m oneknob.run.worker host`)
instead of each starting and importing by itself. `Forked` stands in for the subprocess.Popen of a started worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from oneknob.run import stopping
from oneknob.run.procs import proc_stat

_hosts: dict[str, Host | None] | None = None  # while hosting(): key -> its host (None: it could not start)
_lock = threading.RLock()  # jobs side by side ask for hosts from threads of their own


@contextlib.contextmanager
def hosting(enabled: bool = True):
    """Within this, a worker of an engine that imports itself ahead (the vLLM engine's `prepare`) is forked from a
    host: a process that imported the engine once, for the interpreter and environment it runs with (`python -m
    oneknob.run.worker host`). Workers whose knobs set other variables (a reference's runner) are forked from it
    too where the engine's import read none of those (vLLM records what it read), else from a host of their own.
    A sweep's workers then pay one `import vllm` per build instead of one each (~9 s of CPU on this project's
    machines; seconds on a GPU host). The forked worker is what a started one is: a session of its own, its own
    log, the same protocol, stopped the same way; only its parent is the host, which reports its exit code. Where
    a host cannot start (the import fails, or initialises CUDA), workers start as before. The hosts end with the
    block (they hold no engine); a new host ends those that forked and have no worker running (a bisection's
    earlier builds), so a few are up at once.
    A host is per device set too: CUDA_VISIBLE_DEVICES (oneknob.run.devices) is part of the environment it is
    started with, so the engine's import, and whatever it learns of the device then, sees the devices of the
    workers forked from it. A sweep on N device sets pays N imports (in parallel, once per set and build)
    instead of one; vLLM's import does not initialise CUDA (a host refuses to serve where it did), but it reads
    the device's properties, which a host shared across devices would have read for the wrong one."""
    global _hosts
    if not enabled or _hosts is not None:
        yield
        return
    _hosts = {}
    try:
        yield
    finally:
        hosts, _hosts = _hosts, None
        for host in hosts.values():
            if host is not None:
                host.close()


def _hostable(spec: dict[str, Any]) -> bool:
    """An engine whose import is worth sharing: one that imports itself ahead (the vLLM engine's `prepare`)."""
    from oneknob.engines.base import engine_class

    return hasattr(engine_class(spec["engine"]), "prepare")


def _knob_env(spec: dict[str, Any]) -> dict[str, str]:
    from oneknob.config import knobs

    return knobs.engine_args(spec["knobs"], spec.get("settings")).env


def host_for(python: str, env: dict[str, str], spec: dict[str, Any], log_path: Path,
              timeout_s: float) -> Host | None:
    """The host for a worker of this interpreter and environment while hosting(): one that imported the engine
    with the worker's knob environment, else one with another that has not refused this one (the engine's import
    read none of the variables it changes: the host says so when asked to fork, Host.fork), else a new one,
    started now (its output to `log_path`, the log of the worker that needed it first); None outside hosting()."""
    if _hosts is None or not _hostable(spec):
        return None
    with _lock:
        return _host_for(python, env, spec, log_path, timeout_s)


def _host_for(python: str, env: dict[str, str], spec: dict[str, Any], log_path: Path, timeout_s: float) -> Host | None:
    base = json.dumps([python, env, spec["engine"]], sort_keys=True)  # the build; then the knobs' variables
    key = json.dumps([base, _knob_env(spec)], sort_keys=True)
    if key not in _hosts:
        shared = next((host for host in _hosts.values() if host is not None and host.base == base
                       and host.alive() and host.ready is not False and not host.refuses(spec)), None)
        if shared is not None:
            return shared
        device = env.get("CUDA_VISIBLE_DEVICES")
        for other, idle in list(_hosts.items()):  # a host per build of a bisection need not all stay up (those of
            if idle is not None and idle.device == device and idle.forked and not idle.busy():  # other devices do)
                idle.close()
                del _hosts[other]
        _hosts[key] = Host.start(python, env, spec, log_path, timeout_s, base)
    host = _hosts[key]
    if host is not None and not host.alive():
        host.close()
        _hosts[key] = host = None
    return host


class Host:
    """The executor's side of a worker host (oneknob.run.worker.host): forks workers, collects their exit codes."""

    def __init__(self, proc: subprocess.Popen, control: socket.socket, timeout_s: float, base: str,
                 device: str | None = None):
        self.proc, self.control, self.timeout_s, self.base = proc, control, timeout_s, base
        self.device = device  # its CUDA_VISIBLE_DEVICES: the workers forked from it run there
        self.lock = threading.RLock()  # one conversation on the socket at a time (jobs side by side)
        self.exited: dict[int, int] = {}
        self.forked: list[int] = []  # the workers it forked
        self.ready: bool | None = None  # it imported the engine (None: not known yet)
        self.refused: dict[str, list[str]] = {}  # knob environments it cannot fork for -> the variables why
        self._buffer = b""
        self._gone = False  # its socket ended: no message will come

    @classmethod
    def start(cls, python: str, env: dict[str, str], spec: dict[str, Any], log_path: Path,
              timeout_s: float, base: str) -> Host | None:
        """The host's process, importing the engine; the first fork waits for that (`timeout_s` at most)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([python, "-m", "oneknob.run.worker", "host"], stdin=theirs,
                                    stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True)
        theirs.close()
        host = cls(proc, ours, timeout_s, base, env.get("CUDA_VISIBLE_DEVICES"))
        try:
            host._send({"op": "host", "spec": spec})
        except OSError:
            host.close()
            return None
        return host

    def alive(self) -> bool:
        return self.proc.poll() is None

    def refuses(self, spec: dict[str, Any]) -> bool:
        """It said it cannot fork a worker of this spec's knob environment (fork)."""
        return json.dumps(_knob_env(spec), sort_keys=True) in self.refused

    def fork(self, env: dict[str, str], log, spec: dict[str, Any]) -> Forked | None:
        """A worker for `spec` forked from this host, with `env` and `log` as its environment and stderr; None
        where the host could not import the engine or is gone (the caller starts one itself), or where the spec's
        knob environment changes a variable the host's import read (refuses(): the caller asks host_for again)."""
        with self.lock:
            return self._fork(env, log, spec)

    def _fork(self, env: dict[str, str], log, spec: dict[str, Any]) -> Forked | None:
        if self.ready is None:
            answer = self._answer(self.timeout_s)
            self.ready = answer is not None and answer.get("type") == "hosting"
        if not self.ready or not self.alive():
            return None
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            self._send({"op": "fork", "env": env, "knob_env": _knob_env(spec)}, [stdin_r, stdout_w, log.fileno()])
            answer = self._answer(60)
        except OSError:
            answer = None
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        if answer is not None and answer.get("type") == "stale":
            self.refused[json.dumps(_knob_env(spec), sort_keys=True)] = answer["read"]
        if answer is None or answer.get("type") != "forked":
            os.close(stdin_w)
            os.close(stdout_r)
            return None
        self.forked.append(answer["pid"])
        return Forked(self, answer["pid"], os.fdopen(stdin_w, "wb"), os.fdopen(stdout_r, "rb"))

    def busy(self) -> bool:
        """A worker it forked may still run (its end not reported yet)."""
        return any(self.exit_code(pid, 0) is None for pid in self.forked)

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        """The worker's exit code once it has ended (the host reports it within 0.2 s), waiting up to `timeout` s
        (0: what has arrived; None: as long as it takes)."""
        with self.lock:
            return self._exit_code(pid, timeout)

    def _exit_code(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.exited:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._next(0.25 if left is None else min(0.25, left)) is not None:
                continue  # a message came: there may be more
            if not self.alive():  # the host is gone: nobody reports the worker's end (its code is lost: SIGKILL)
                stat = proc_stat(pid)
                if stat is None or stat[1] in "ZX":
                    self.exited[pid] = -signal.SIGKILL
                    break
            if left is not None and left <= 0:
                return None
        return self.exited[pid]

    def close(self) -> None:
        """End the host: it holds no engine, so its socket's end ends it; killed if it lingers, and at once where it
        forked no worker (a worker prepared early that no job started: its import may still be under way)."""
        try:
            self.control.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10 if self.forked else 0)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def _send(self, message: dict, fds: list[int] | None = None) -> None:
        self.control.settimeout(None)
        data = json.dumps(message).encode()
        data = struct.pack("!I", len(data)) + data
        sent = socket.send_fds(self.control, [data], fds) if fds else self.control.send(data)
        if sent < len(data):
            self.control.sendall(data[sent:])

    def _next(self, timeout: float | None) -> dict | None:
        """The host's next message (an exit report is also kept in `exited`); None: timeout, or the host gone."""
        self.control.settimeout(timeout)
        while True:
            if len(self._buffer) >= 4 and len(self._buffer) >= 4 + (size := struct.unpack("!I", self._buffer[:4])[0]):
                message, self._buffer = json.loads(self._buffer[4:4 + size]), self._buffer[4 + size:]
                if message.get("type") == "exited":
                    self.exited[message["pid"]] = message["code"]
                return message
            try:
                chunk = self.control.recv(1 << 16)
            except (TimeoutError, BlockingIOError):  # nothing yet (a timeout of 0 is non-blocking)
                return None
            except OSError:  # the socket closed
                self._gone = True
                return None
            if not chunk:
                self._gone = True
                return None
            self._buffer += chunk

    def _answer(self, timeout: float) -> dict | None:
        """The answer to the message just sent (exit reports on its way are kept), None if none came in time."""
        deadline = time.monotonic() + timeout
        while True:  # in steps, so that a sweep's interrupt reaches a job thread waiting on the host's import
            stopping.check()
            left = deadline - time.monotonic()
            message = self._next(max(0.0, min(0.5, left)))
            if message is None and left > 0.5 and not self._gone:
                continue
            if message is None or message.get("type") != "exited":
                return message


class Forked:
    """A worker forked from a Host, standing in for the subprocess.Popen of a started one."""

    def __init__(self, host: Host, pid: int, stdin, stdout):
        self.host, self.pid, self.stdin, self.stdout = host, pid, stdin, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.host.exit_code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.host.exit_code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
        return self.returncode
