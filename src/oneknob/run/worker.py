"""The worker: one engine in its own process, driven over a line protocol.

    python -m oneknob.run.worker    (started by oneknob.run.executor, never by hand)
    python -m oneknob.run.worker host   (oneknob.run.hosts: imports the engine once, forks a worker per job; see host())

Every message is one JSON object on one line. The protocol channel is the
process's original stdout; fd 1 is then pointed at stderr, so whatever the
engine prints lands in the worker log and can never corrupt the protocol.

orchestrator -> worker (stdin)
    {"op": "start", "spec": {...}}                  first message, exactly once; or first:
    {"op": "prepare", "spec": {...}}                import the engine (vLLM: seconds of CPU), start nothing; then
                                                    {"op": "start"} starts it, {"op": "stop"} or EOF ends the
                                                    worker with no engine started (oneknob.run.executor.Worker.prepare)
    {"op": "check", "spec": {...}, "env": {...}}    after prepare, before start, any number of times: the engine's
                                                    config check of one environment's configurations, in a fork
                                                    (vllm_introspect.validate_imported)
    {"op": "score", "id": N, "tokens": B64, "topk": K, "greedy": N}   one prompt, one request
    {"op": "batch", "id": N, "prompts": [B64, ...], "scored": [i, ...], "topk": K}   several prompts, ONE
                                                    engine call (axis=batch: a probe and its neighbours;
                                                    axis=repeat: identical requests); logprobs of `scored` only
    {"op": "stop"}
    Requests (score, batch) are answered one at a time, in the order sent; the orchestrator may send the next
    before it reads the answer to the last (EngineSession.expect), and the worker finds it waiting in stdin. On
    an engine that takes a score in two halves (submit, collect), a score found waiting goes to the engine as
    soon as the engine is done with the one before, before that one's answer is sent (_score).
worker -> orchestrator (protocol fd)
    {"type": "ready", "resolved": {...}, "provenance": {...}, "start_s": S, "pid": P, "device": CUDA_VISIBLE_DEVICES}
    {"type": "checked", "result": {...}}            the check's answer (vllm_introspect's validate result)
    {"type": "result", "id": N, "logprobs": B64, "seconds": S,
     "topk_ids": B64, "topk_logprobs": B64 (K per scored position), "greedy": B64 (N ids),
     "greedy_logprobs": B64 (each generated token's own logprob),
     "malformed": {field: reason} (only when the answer is: engines.answers; the arrays then padded with NaN)}
    {"type": "batch", "id": N, "results": [{"index": i, "logprobs": B64, ...}], "seconds": S,
     "steps": [{"total": T, "scheduled": [[i, n], ...]}]}  (the tokens each step scheduled, per prompt)

Token ids and logprobs travel as base64 of packed arrays (int64, float64; see
`pack`/`unpack`): bit-exact, and ~20x cheaper to encode than JSON lists of
floats, which matters on the path between two engine requests.
    {"type": "error", "message": "...", "traceback": "..."}    then exit 1
    {"type": "bye"}                                            then exit 0
"""

from __future__ import annotations

import base64
import gc
import json
import os
import select
import sys
import time
import traceback
from array import array

from oneknob.engines import answers
from oneknob.run import cpus, engine_log


def pack(values, typecode: str) -> str:
    """A list of ints ("q") or floats ("d") as base64 text."""
    return base64.b64encode(array(typecode, values).tobytes()).decode("ascii")


def unpack(text: str, typecode: str) -> list:
    return array(typecode, base64.b64decode(text)).tolist()


def _send(channel, **message) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


class _Messages:
    """The orchestrator's messages, a JSON object per line, read from fd 0 (not through sys.stdin's buffer, so
    waiting() can tell, without blocking, whether a whole message is here already)."""

    def __init__(self, fd: int = 0):
        self.fd, self.buffer, self.ended = fd, b"", False

    def _read(self) -> None:
        data = os.read(self.fd, 1 << 16)
        self.buffer += data
        self.ended = not data

    def waiting(self) -> bool:
        while b"\n" not in self.buffer and not self.ended and select.select([self.fd], [], [], 0)[0]:
            self._read()
        return b"\n" in self.buffer

    def next(self) -> dict:
        """The next message; {} once the orchestrator is gone (end of file)."""
        while b"\n" not in self.buffer and not self.ended:
            self._read()
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line) if line.strip() else {}


def serve(channel) -> int:
    messages = _Messages()
    first = messages.next()
    if first.get("op") not in ("start", "prepare"):
        _send(channel, type="error", message=f"expected a start or prepare message, got {first!r}", traceback="")
        return 1
    spec = first["spec"]

    from oneknob.config import knobs

    # Engine environment (VLLM_USE_V2_MODEL_RUNNER, ...) must be set before the
    # engine is imported: vLLM reads it at import time.
    for var in knobs.owned_env():
        os.environ.pop(var, None)
    os.environ.update(knobs.engine_args(spec["knobs"], spec.get("settings")).env)
    from oneknob.engines.base import load

    started = time.perf_counter()
    engine = load(spec["engine"])
    try:  # whatever ends the job (an error, a signal the engine turns into one), the engine's processes go
        code = _serve(channel, messages, engine, first, spec, started)
    except BaseException as exc:
        # the first error, marked in the log before the engine closes: what closing it raises in any process
        # after this line follows from it (engine_log.follow_ons), and the error reported stays this one
        print(f"{engine_log.ERROR_MARK}: {type(exc).__name__}: {str(exc)[:500]}", file=sys.stderr, flush=True)
        try:
            engine.close()
        except BaseException:  # a follow-on error, logged after the mark; never the one reported
            traceback.print_exc()
        raise
    engine.close()
    return code


def _serve(channel, messages: _Messages, engine, first: dict, spec: dict, started: float) -> int:
    if first["op"] == "prepare":
        if hasattr(engine, "prepare"):
            engine.prepare()
        gc.freeze()  # the import's objects: the engine start's gc.collect() calls and the check's forks skip them
        go = messages.next()
        while go.get("op") == "check":  # the engine's own config check, in a fork of this process
            _send(channel, type="checked", result=engine.check(go["spec"], go.get("env") or {}))
            go = messages.next()
        if go.get("op") != "start":  # stop, or the orchestrator gone: no engine was started
            _send(channel, type="bye")
            return 0
        started = time.perf_counter()  # start_s: from the start command, the import done before it
    return _drive(channel, messages, engine, spec, started)


def _drive(channel, messages: _Messages, engine, spec: dict, started: float) -> int:
    engine.start(spec)
    _send(
        channel,
        type="ready",
        resolved=engine.resolved_config(),
        provenance=engine.provenance(),
        start_s=time.perf_counter() - started,
        pid=os.getpid(),
        device=os.environ.get("CUDA_VISIBLE_DEVICES"),  # what the engine was given (oneknob.run.devices)
    )
    message = messages.next()
    while message:
        if message["op"] == "score":
            message = _score(channel, messages, engine, message)
            continue
        if message["op"] == "batch":
            t0, topk = time.perf_counter(), message.get("topk", 0)
            prompts = [unpack(p, "q") for p in message["prompts"]]
            done = engine.batch(prompts, list(message["scored"]), topk=topk)
            results = [{"index": index, **_packed(answers.check(scored, len(prompts[index]), topk))}
                       for index, scored in sorted(done["results"].items())]
            _send(channel, type="batch", id=message["id"], results=results, steps=done["steps"],
                  seconds=time.perf_counter() - t0)
        elif message["op"] == "stop":
            break
        else:
            raise ValueError(f"unknown op {message['op']!r}")
        message = messages.next()
    engine.close()
    _send(channel, type="bye")
    return 0


def _score(channel, messages: _Messages, engine, message: dict) -> dict:
    """Answer score requests, from `message` on; returns the next message that is not one, read already ({} at
    the end). On an engine that takes a request in two halves (submit, collect: vLLM's), the next score request,
    when the orchestrator has sent it ahead already, goes to the engine as soon as the engine is done with this
    one, before this one's answer is read and sent: the engine does not wait for that. It still holds one request
    at a time, in the order sent. A request's `seconds`: from its submission to the engine being done with it."""
    if not hasattr(engine, "submit"):
        t0, tokens = time.perf_counter(), unpack(message["tokens"], "q")
        scored = engine.score(tokens, topk=message.get("topk", 0), greedy=message.get("greedy", 0))
        _send(channel, type="result", id=message["id"], seconds=time.perf_counter() - t0,
              **_packed(_checked(scored, message, len(tokens))))
        return messages.next()

    def submit(message: dict) -> tuple[dict, float, object]:
        tokens = unpack(message["tokens"], "q")
        return message, time.perf_counter(), engine.submit(tokens, topk=message.get("topk", 0),
                                                           greedy=message.get("greedy", 0))

    after: dict = {}  # what done() found: when the engine ended, and the next request submitted or message read

    def done() -> None:
        after["ended"] = time.perf_counter()
        if messages.waiting():
            following = messages.next()
            if following.get("op") == "score":
                after["submitted"] = submit(following)
            else:
                after["message"] = following

    request = submit(message)
    while True:
        after.clear()
        message, started, handle = request
        scored = engine.collect(handle, done)
        _send(channel, type="result", id=message["id"], seconds=after["ended"] - started,
              **_packed(_checked(scored, message, _tokens(message))))
        if "submitted" in after:
            request = after["submitted"]
            continue
        following = after.get("message") or messages.next()
        if following.get("op") != "score":
            return following
        request = submit(following)


def _tokens(message: dict) -> int:
    """How many tokens a score request's prompt holds (packed int64s), without unpacking them."""
    return len(base64.b64decode(message["tokens"])) // 8


def _checked(scored: dict, message: dict, length: int) -> dict:
    """A score's answer in the shape its request asked for, what is malformed in it said (engines.answers): every
    engine's answer passes here, so a malformed one is a measurement, whichever engine gave it."""
    return answers.check(scored, length, topk=message.get("topk", 0), greedy=message.get("greedy", 0))


def _packed(scored: dict) -> dict:
    """A checked answer as the protocol carries it: packed arrays (every top-k row holds exactly k (id, logprob)
    pairs, best first), and what is malformed in it ("malformed": {field: reason})."""
    packed: dict = {"logprobs": pack(scored["logprobs"], "d")}
    if scored.get("malformed"):
        packed["malformed"] = scored["malformed"]
    if "topk" in scored:
        packed["topk_ids"] = pack([t for row in scored["topk"] for t, _ in row], "q")
        packed["topk_logprobs"] = pack([lp for row in scored["topk"] for _, lp in row], "d")
    if "greedy" in scored:
        packed["greedy"] = pack(scored["greedy"], "q")
        packed["greedy_logprobs"] = pack(scored["greedy_logprobs"], "d")
    return packed


def host() -> int:
    """`python -m oneknob.run.worker host`: import the engine once, then fork a worker per job (oneknob.run.hosts).

    fd 0 is a Unix socket to the executor. Its first message, {"op": "host", "spec": {...}}, is answered
    {"type": "hosting"} once the engine is imported (as a prepared worker does: the knobs' environment set first,
    no engine started), or {"type": "error"}. Each {"op": "fork", "env": {...}} comes with three descriptors (the
    worker's stdin, its protocol pipe, its log): a child becomes that worker, in a session of its own, with that
    environment, exactly as `python -m oneknob.run.worker` would from its first message on, and the answer is
    {"type": "forked", "pid": P}; a fork message's "knob_env" (the worker's knobs' variables) that differs from the
    host's in a variable the engine's import read (the engine's `stale`) is answered {"type": "stale", "read": [...]}
    instead, as is any other one where the engine cannot tell. When a child ends,
    {"type": "exited", "pid": P, "code": C} (C as subprocess.Popen.returncode). The socket's end (the executor is
    done, or gone) ends this process at once."""
    import socket
    import struct

    control = socket.socket(fileno=os.dup(0))
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr  # as main(): vLLM's log handler, made at import, writes to this object (fd 2)

    def send(**message) -> None:
        data = json.dumps(message).encode()
        control.sendall(struct.pack("!I", len(data)) + data)

    def receive() -> tuple[dict | None, list[int]]:
        """One message and the descriptors sent with it (the executor sends one, then waits for the answer)."""
        data, fds, _, _ = socket.recv_fds(control, 1 << 16, 8)
        while data and len(data) < 4 + struct.unpack("!I", data[:4].ljust(4, b"\0"))[0]:
            more = control.recv(1 << 16)
            if not more:
                return None, fds
            data += more
        return (json.loads(data[4:]) if data else None), fds

    cpus.adopt_launch()  # before the engine's import: vLLM's CPU binding reads this process's CPUs
    first, _ = receive()
    if first is None or first.get("op") != "host":
        os._exit(1)
    try:
        from oneknob.config import knobs
        from oneknob.engines.base import load

        spec = first["spec"]
        for var in knobs.owned_env():
            os.environ.pop(var, None)
        os.environ.update(knobs.engine_args(spec["knobs"], spec.get("settings")).env)
        engine = load(spec["engine"])
        if hasattr(engine, "prepare"):
            engine.prepare()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            raise RuntimeError("importing the engine initialised CUDA, which a forked worker cannot use")
    except Exception as exc:  # the executor starts its workers itself; what went wrong is in the log
        traceback.print_exc()
        sys.stderr.flush()
        send(type="error", message=f"{type(exc).__name__}: {exc}")
        os._exit(1)
    own = knobs.engine_args(spec["knobs"], spec.get("settings")).env

    def stale(message: dict) -> list[str]:
        """What keeps this host from forking a worker of another knob environment: the variables it changes that
        the engine's import read (an engine that cannot tell: all of them)."""
        knob_env = message.get("knob_env") or {}
        if knob_env == own:
            return []
        if not hasattr(engine, "stale"):
            return sorted(k for k in set(knob_env) | set(own) if knob_env.get(k) != own.get(k))
        return engine.stale({k: v for k, v in message["env"].items() if k not in knobs.owned_env()} | knob_env)

    send(type="hosting", pid=os.getpid())
    sys.stderr.flush()
    try:
        _host_forks(control, send, receive, stale)
    except OSError:  # the executor is gone mid-message
        pass
    os._exit(0)


def _host_forks(control, send, receive, stale) -> None:
    """The host's loop (host()): fork a worker per fork message, report the ends of those it forked; a worker
    whose knob environment changes what the engine's import read is refused, {"type": "stale", "read": [...]}."""
    while True:
        while True:  # children that ended: reaped here, their exit codes to the executor
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            send(type="exited", pid=pid, code=os.waitstatus_to_exitcode(status))
        if not select.select([control], [], [], 0.2)[0]:
            continue
        message, fds = receive()
        if message is None:  # the executor is done, or gone
            return
        if message.get("op") != "fork" or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            send(type="error", message=f"expected a fork message with 3 descriptors, got {message!r}")
            continue
        if read := stale(message):
            for fd in fds:
                os.close(fd)
            send(type="stale", read=read)
            continue
        sys.stderr.flush()
        # Python's advice for a fork without exec: the parent's objects frozen, the child's collections (vLLM's
        # engine start runs gc.collect() 5 times: ~2 s over the import's objects) neither walk them nor write to
        # their GC headers, which copies the parent's pages (measured: a forked engine start of the tiny model,
        # 7.9 -> 4.4 CPU-s)
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            try:
                control.close()
                os.setsid()
                for fd, target in zip(fds, (0, 1, 2)):
                    os.dup2(fd, target)
                for fd in fds:
                    os.close(fd)
                try:  # `ps` shows a worker, as for one started by itself (setproctitle comes with vLLM); before
                    from setproctitle import setproctitle  # the environment changes, or it cannot move it

                    setproctitle(f"{sys.executable} -m oneknob.run.worker")
                except ImportError:
                    pass
                os.environ.clear()
                os.environ.update(message["env"])
                code = main()
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stderr.flush()
            os._exit(code)
        for fd in fds:
            os.close(fd)
        send(type="forked", pid=pid)


def main() -> int:
    cpus.adopt_launch()  # not the CPUs of the orchestrator's thread that started it (oneknob.run.cpus)
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        return serve(channel)
    except BaseException as exc:  # report everything, including KeyboardInterrupt
        _send(channel, type="error", message=f"{type(exc).__name__}: {exc}",
              traceback=traceback.format_exc())
        return 1


if __name__ == "__main__":
    # os._exit skips interpreter teardown, which can hang on engine threads.
    code = host() if sys.argv[1:] == ["host"] else main()
    sys.stderr.flush()
    os._exit(code)
