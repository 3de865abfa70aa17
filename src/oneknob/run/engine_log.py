"""What a worker's log says about its engine: the engine's own warnings, normalised so that runs can be
compared, and the root cause of a failure (the last exception any of the engine's processes raised that does
not itself point elsewhere: vLLM re-raises a worker's error in its EngineCore as "... See stack trace for root
cause.", and that in the front end as "Engine core initialization failed. See root cause above.").

A worker's processes write one log, interleaved; vLLM prefixes every line with its process and its logger's
header: "(EngineCore pid=9906) WARNING 12-02 16:42:40 [cpu.py:224] Triton is not installed. ...". The
executor writes a mark when it starts a worker and one when it stops it: what the engine logs after the stop
(its shutdown, "[shutdown] Process manager: force killing remaining processes", as vLLM tags it) is process
management, not a warning about the run.
"""

from __future__ import annotations

import re
from pathlib import Path

START_MARK, STOP_MARK = "oneknob: worker started", "oneknob: worker stopping"
# written by the worker the moment it catches its error, before it closes its engine: what any process raises
# after it is a follow-on (the engine torn down under a step, oneknob's own files gone), never the root cause
ERROR_MARK = "oneknob: worker error"
# Around a config check in the worker (executor.check): vLLM's words there are of the configuration checked, which
# may be another job's or the reference's ("Enforce eager set" in the baseline's log), not of this job's engine.
CHECK_MARK, CHECKED_MARK = "oneknob: config check", "oneknob: config check done"
_PROCESS = re.compile(r"^\s*\((?P<name>[^()]*?)\s+pid=(?P<pid>\d+)\)\s?")  # vLLM's per-process prefix
_HEADER = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+"
                     r"(?:\[[^\]\s]+:\d+\]\s?)?")  # vLLM's logger: level, date and time, [file.py:line]
_WARNING = re.compile(r"\bWARNING\b[\s:]*(?:\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s*)?(?:\[[^\]\s]+:\d+\]\s*)?(.*\S)")
_CHATTER = ("[shutdown]",)  # vLLM's own tag on what it logs while it stops its processes
# What differs from one process to the next in the same warning: compared as one (the first text is shown).
_VARYING = ((re.compile(r"\bpid[= ]\d+"), "pid=N"), (re.compile(r"\b0x[0-9a-fA-F]{6,}\b"), "0x..."),
            (re.compile(r"\b\d\d:\d\d:\d\d(?:\.\d+)?\b"), "HH:MM:SS"), (re.compile(r"\b[0-9a-f]{16,}\b"), "<id>"),
            (re.compile(r"\d+(?:\.\d+)?(?=\s*(?:[KMGT]i?B|bytes)\b)"), "N"))
LIMIT, WIDTH = 20, 300  # warnings kept per job, characters per warning (an MLflow tag holds 8000)


def normalise(line: str) -> str | None:
    """A log line's warning without its process prefix, timestamp and file:line; None when the line is no
    engine WARNING, or is process-management chatter."""
    match = _WARNING.search(line)
    if match is None or match.group(1).startswith(_CHATTER):
        return None
    return match.group(1)[:WIDTH]


def key(warning: str) -> str:
    """What two runs' warnings are compared by: PIDs, addresses, times and memory amounts blanked."""
    for pattern, blank in _VARYING:
        warning = pattern.sub(blank, warning)
    return warning


def _read(log_path: Path) -> list[str]:
    try:
        return Path(log_path).read_text(errors="replace").splitlines()
    except OSError:
        return []


def warnings(lines: list[str], limit: int = LIMIT) -> list[str]:
    """The engine's own WARNING lines while it ran (not after oneknob asked it to stop), normalised, one per
    `key`, at most `limit`."""
    found: dict[str, str] = {}
    running = True
    for line in lines:
        if line.startswith((START_MARK, STOP_MARK, CHECK_MARK)):  # CHECKED_MARK starts with CHECK_MARK
            running = line.startswith((START_MARK, CHECKED_MARK))
        elif running and (warning := normalise(line)) is not None and len(found) < limit:
            found.setdefault(key(warning), warning)
    return list(found.values())


def warning_lines(log_path: Path, limit: int = LIMIT) -> list[str]:
    """`warnings` of a worker's log file ([] when there is none)."""
    return warnings(_read(log_path), limit)


# -- the root cause of a failure ------------------------------------------------------------------------

_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")
_DEFERS = re.compile(r"root cause|see (?:the )?(?:stack ?trace|above|logs?)\b", re.I)  # an error wrapping another
CAUSE_WIDTH = 600
# Where the cause is clear from vLLM's (or torch's, or the kernel's) own words; the first that matches wins.
_KINDS = (
    ("out of device memory", re.compile(r"OutOfMemoryError|CUDA out of memory|HIP out of memory|Free memory on "
                                        r"device|GPU memory utilization|No available memory for the cache blocks")),
    ("out of host memory", re.compile(r"\bMemoryError\b|Cannot allocate memory|Available memory on node|CPU memory "
                                      r"utilization|VLLM_CPU_KVCACHE_SPACE|not enough (?:host|CPU) memory", re.I)),
    ("a configuration vLLM refused", re.compile(r"^(?:[\w.]+\.)?(?:ValueError|ValidationError|TypeError|"
                                                r"NotImplementedError)\b")),
    ("a crash", re.compile(r"Segmentation fault|core dumped|EngineDeadError|died unexpectedly|killed by signal")),
)


def classify(text: str) -> str | None:
    """out of device memory | out of host memory | a configuration vLLM refused | a crash; None where the
    words do not say."""
    return next((kind for kind, pattern in _KINDS if pattern.search(text)), None)


def _strip(line: str) -> tuple[str, str]:
    """(the process a line came from, or "" for a line without vLLM's prefix; the line without prefixes)."""
    process = ""
    if match := _PROCESS.match(line):
        process, line = f"{match['name']} pid={match['pid']}", line[match.end():]
    return process, _HEADER.sub("", line, count=1)


def root_cause(lines: list[str], besides: str = "") -> dict | None:
    """The root cause of a failure in a log's last engine session: the last exception a traceback ended with,
    in whichever process raised it (each process's lines are read on their own, so interleaved tracebacks do not
    mix), passing over those that point to another ("See root cause above"): {"exception", "message", "line",
    "process", "kind"}. None when the log holds no traceback, or only the error the worker already reported
    (`besides`)."""
    ended, _ = _exceptions(lines)
    said = besides.strip().split("\n")[0]
    ended = [e for e in ended if e["line"] != said[:CAUSE_WIDTH]]
    found = next((e for e in reversed(ended) if not _DEFERS.search(e["message"])), ended[-1] if ended else None)
    return None if found is None else found | {"kind": classify(found["line"])}


def follow_ons(lines: list[str]) -> list[dict]:
    """The exceptions any process raised after the worker caught its error (ERROR_MARK) in the last engine
    session, in order: consequences of the first error (its engine closed under a running step), said after it."""
    return _exceptions(lines)[1]


def _exceptions(lines: list[str]) -> tuple[list[dict], list[dict]]:
    """(the exceptions tracebacks ended with before the worker caught its error, those after), in the log's last
    engine session up to oneknob's stop mark, each process's lines read on their own."""
    in_traceback: dict[str, bool] = {}
    ended: list[dict] = []
    after: list[dict] = []
    running, caught = True, False
    for raw in lines:
        if raw.startswith(START_MARK):  # an earlier engine session's errors are not this failure's
            in_traceback, ended, after, running, caught = {}, [], [], True, False
        elif raw.startswith(STOP_MARK):
            running = False  # what the engine raises while it is being stopped is not why it failed
        elif raw.startswith(ERROR_MARK):
            caught = True
        if not running:
            continue
        process, line = _strip(raw)
        if line.startswith("Traceback (most recent call last):"):
            in_traceback[process] = True
        elif in_traceback.get(process) and line and not line[0].isspace():
            in_traceback[process] = False
            if match := _EXCEPTION.match(line.strip()):
                (after if caught else ended).append({
                    "exception": match["type"], "message": (match["message"] or "").strip()[:CAUSE_WIDTH],
                    "line": line.strip()[:CAUSE_WIDTH], "process": process})
    return ended, after


def cause_text(cause: dict, reported: str = "") -> str:
    """One line: "out of host memory: ValueError: ... (raised in vLLM's EngineCore pid=9906; the worker
    reported RuntimeError: ...)"."""
    where = [f"raised in {cause['process']}"] if cause.get("process") else []
    where += [f"the worker reported {reported}"] if reported and reported != cause["line"] else []
    kind = f"{cause['kind']}: " if cause.get("kind") else ""
    return f"{kind}{cause['line']}" + (f" ({'; '.join(where)})" if where else "")


def failure_cause(log_path: Path, reported: str = "") -> dict | None:
    """`root_cause` of a worker's log file."""
    return root_cause(_read(log_path), besides=reported)


def failure_follow_ons(log_path: Path) -> list[dict]:
    """`follow_ons` of a worker's log file."""
    return follow_ons(_read(log_path))


def follow_on_text(errors: list[dict]) -> str:
    """The lines error.txt gives the errors that followed the first one, in order ("" when none)."""
    if not errors:
        return ""
    return "then, while the first error was handled (a consequence of it, not its cause):\n" + "\n".join(
        f"  {e['line']}" + (f" (raised in {e['process']})" if e.get("process") else "") for e in errors)
