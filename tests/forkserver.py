"""The CLI tests' fork server: `python run.py ...` without paying Python's start and oneknob's imports each time.

A test that runs the CLI (helpers.run_cli, helpers.python_module) pays ~1-2 s of interpreter start and imports
(Hydra, oneknob, MLflow, matplotlib) before the command does anything; 700 tests pay it hundreds of times. This
server, one per pytest process, imports those modules once, single-threaded, then forks a child per command: the
child chdirs, takes the command's environment, points fds 0/1/2 at /dev/null and two files, sets sys.argv and
runs run.py (or `-m module`) as __main__, exactly as `python` would from there on: Hydra parses the real
command line, oneknob's own code runs unchanged, its workers and uploaders are real processes. The child is the
leader of a session of its own (as start_new_session), so a timeout kills it and everything it started.

What the child does not redo is what `python` does before the script: start the interpreter and import. So a
command whose point is its imports or its interpreter (`python -X importtime`, a sitecustomize or LD_PRELOAD in
its environment) runs as a real subprocess instead: helpers.run_cli decides (see `forkable`).

    python tests/forkserver.py SOCKET     # serves until its parent (the pytest process) is gone
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path

# What `python run.py` imports on its way (the CLI, a one-job run, a sweep, the report): imported once here.
PRELOAD = ("hydra", "omegaconf", "hydra._internal.utils", "hydra.core.hydra_config", "hydra_plugins.oneknob_sweepers",
           "oneknob.config.schema", "oneknob.cli", "oneknob.plan.jobs", "oneknob.study.job", "oneknob.study.sweep",
           "oneknob.record.journaled", "oneknob.record.tracking", "oneknob.explain.compare", "oneknob.explain.plots",
           "oneknob.__main__", "oneknob.explain.report_command", "oneknob.record.sync", "mlflow", "mlflow.tracking",
           "matplotlib.pyplot",
           # what every command imports on its first store, report or plot (MLflow's SQL store and its schema check,
           # the terminal's rich, the PNG writer): ~1.2 s of CPU per command otherwise
           "oneknob.config.helptext", "oneknob.run.prepared", "omegaconf._impl", "hydra._internal.logging_config",
           "sqlalchemy", "sqlalchemy.dialects.sqlite", "alembic.config", "mlflow.store.db.utils",
           "mlflow.store.tracking.sqlalchemy_store", "mlflow.store.tracking.sqlalchemy_workspace_store", "netrc",
           "rich._emoji_codes", "PIL.PngImagePlugin", "matplotlib.backends.backend_agg")
# What the interpreter reads at start-up, before any script: such a command cannot reuse this one.
STARTUP_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONHASHSEED",
               "PYTHONWARNINGS", "PYTHONDEVMODE", "PYTHONMALLOC", "PYTHONFAULTHANDLER", "PYTHONIOENCODING",
               "PYTHONUTF8", "PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE", "LD_PRELOAD", "LD_LIBRARY_PATH",
               "MPLBACKEND", "MPLCONFIGDIR", "COLUMNS", "LINES", "TERM", "NO_COLOR", "FORCE_COLOR", "HOME",
               "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "TMPDIR")


def _send(conn: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    conn.sendall(struct.pack("!I", len(data)) + data)


def _receive(conn: socket.socket) -> dict | None:
    head = _exactly(conn, 4)
    if head is None:
        return None
    data = _exactly(conn, struct.unpack("!I", head)[0])
    return None if data is None else json.loads(data)


def _exactly(conn: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = conn.recv(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _child(conn: socket.socket, request: dict) -> None:
    """In the forked child: become the command, report its pid, run it, report its exit code."""
    import runpy

    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server ignores it; the command waits for its children
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    _send(conn, {"pid": os.getpid()})
    argv = request["argv"]
    code = 0
    try:
        if argv[0] == "-m":
            # preloaded: `python -m` runs a fresh copy as __main__ (of a package: its __main__ module, the package kept)
            sys.modules.pop(argv[1] if not hasattr(sys.modules.get(argv[1]), "__path__") else f"{argv[1]}.__main__",
                            None)
            sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's own path in argv[0]
            sys.path[0] = request["cwd"]  # `python -m` puts the working directory first on the path
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = str(Path(argv[0]).resolve().parent)  # `python script.py` puts the script's folder first
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # what `python` does with an exception nobody caught: its traceback, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            import atexit
            import threading

            threading._shutdown()  # as the interpreter's exit: wait for the command's non-daemon threads, then atexit
            atexit._run_exitfuncs()  # what the interpreter runs at exit (logging's flush, MLflow's end_run, ...)
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            try:
                _send(conn, {"exit": code})
            finally:
                os._exit(code)


def serve(path: str) -> None:
    for name in PRELOAD:
        __import__(name)
    parent = os.getppid()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel: the client waits on exit
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    server.settimeout(1.0)
    print("ready", flush=True)
    while os.getppid() == parent:  # the pytest process that started this server is gone: stop
        try:
            conn, _ = server.accept()
        except socket.timeout:
            continue
        conn.settimeout(None)
        request = _receive(conn)
        if request is None:
            conn.close()
            continue
        gc.freeze()  # the preloaded modules: the command's collections skip them (as oneknob.run.worker's host)
        if os.fork() == 0:
            server.close()
            _child(conn, request)
        conn.close()


class Client:
    """The pytest side: starts the server on first use and runs commands through it."""

    def __init__(self) -> None:
        self.proc = None
        self.path = None

    def _start(self) -> None:
        import subprocess
        import tempfile

        self.path = os.path.join(tempfile.mkdtemp(prefix="oneknob-fork-"), "socket")
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        env.update({"PYTHONUNBUFFERED": "1", "COLUMNS": "200"})  # as helpers.cli_env gives every command
        self.env = env
        self.proc = subprocess.Popen([sys.executable, __file__, self.path], stdout=subprocess.PIPE, env=env,
                                     stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"the CLI fork server did not start (exit {self.proc.poll()})")

    def forkable(self, env: dict) -> bool:
        """Whether a command with this environment can run in a child of the server: what the interpreter read
        at start-up (and the modules imported with it) must be what that command's `python` would read."""
        if self.proc is None:
            self._start()
        return all(env.get(key) == self.env.get(key) for key in STARTUP_ENV)

    def run(self, argv: list[str], cwd, env: dict, timeout: float) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of `python ARGV...` run in cwd with env, killed (its whole session) after
        timeout seconds, as subprocess.run(..., timeout=) would raise TimeoutExpired."""
        import subprocess
        import tempfile

        if self.proc is None or self.proc.poll() is not None:
            self._start()
        folder = tempfile.mkdtemp(prefix="oneknob-fork-out-")
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        try:
            _send(conn, {"argv": argv, "cwd": str(cwd), "env": env, "stdout": out, "stderr": err})
            conn.settimeout(30)
            started = _receive(conn)
            if started is None:
                raise RuntimeError("the CLI fork server's child ended before it started the command")
            conn.settimeout(timeout)
            try:
                ended = _receive(conn)
            except socket.timeout:
                try:
                    os.killpg(started["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
                raise subprocess.TimeoutExpired(argv, timeout) from None
            if ended is None:  # killed by a signal: what subprocess reports as -N
                ended = {"exit": -signal.SIGKILL}
            texts = [Path(p).read_text(errors="replace") if os.path.exists(p) else "" for p in (out, err)]
            return ended["exit"], texts[0], texts[1]
        finally:
            conn.close()
            import shutil

            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repository root, as run.py's folder
    serve(sys.argv[1])
