"""Where a command's CPU goes, by kind of process: what `make test` spends its two cores on.

    python -m benchmarks.suite_cpu -- make test            # the suite (from a fresh clone, as CI runs it)
    python -m benchmarks.suite_cpu --every 0.5 -- make ablate
    python -m benchmarks.suite_cpu --out cpu.json -- CMD   # also every process's record, as JSON

The suite is CPU-bound on this project's 2-core machines (`vmstat`: 0-3 % idle for the whole run), so its wall
time is its CPU time over two, and the question "why is it slow" is "which processes burn the CPU". This runs
the command and samples /proc every `--every` seconds meanwhile: each process's user + system time, counted
from when it was first seen (a process older than the command counts only what it burns after), and its
command line, read again as it changes (vLLM's processes rename themselves, `VLLM::EngineCore`). It prints the
CPU seconds per kind of process (`KINDS`: a job's worker, vLLM's engine core, its model-class inspection,
oneknob's check, a forked CLI, MLflow, the kernel's own threads...), how many processes of each, and the share
of the machine's CPU (cores x wall) that the samples account for. A process that lives less than one interval
between two samples is missed: the share says how much.

Exit status: the command's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")

# (kind, what its command line or its name holds), first match wins: the processes `make test` and `make ablate`
# run, oneknob's and vLLM's by their module, the rest by the program.
KINDS = (
    ("worker host (oneknob.run.worker host: a sweep's engine import)", ("oneknob.run.worker host",)),
    ("job worker (oneknob.run.worker)", ("oneknob.run.worker",)),
    ("vLLM model-class inspection (registry)", ("vllm.model_executor.models.registry",)),
    ("vLLM engine core", ("EngineCor",)),
    ("vLLM worker process", ("VLLM::Worker",)),
    ("vllm serve (API server)", ("vllm.entrypoints", "bin/vllm serve", "APIServer")),
    ("oneknob's vLLM check (standalone/introspect.py)", ("standalone/introspect.py",)),
    ("vLLM's own parser (standalone/command.py)", ("standalone/command.py",)),
    ("MLflow uploader (oneknob.record.uploader)", ("oneknob.record.uploader",)),
    ("MLflow server", ("mlflow server", "mlflow.server", "uvicorn", "gunicorn")),
    ("CLI forked by tests/forkserver.py", ("forkserver.py",)),
    ("CLI (run.py)", ("run.py",)),
    ("pytest-xdist worker", ("pytest-xdist", "execnet", "exec(eval(")),
    ("pytest", ("pytest",)),
    ("build environments (uv, compileall)", ("uv pip", "/uv ", "compileall", "uv venv")),
    ("C/C++ compiler (inductor)", ("cc1plus", "/ld ", "gcc", "g++")),
    ("Chromium (the UI check)", ("chrom", "headless_shell")),
    ("other multiprocessing child", ("spawn_main",)),
)


def kind(name: str, cmdline: str) -> str:
    text = f"{name} {cmdline}"
    for label, marks in KINDS:
        if any(mark in text for mark in marks):
            return label
    if not cmdline:  # no command line: a kernel thread (kworker, kdamond, rcu_*, ksoftirqd...)
        return "kernel threads"
    return f"other: {Path(cmdline.split()[0]).name}"


def _stat(pid: str) -> tuple[str, int] | None:
    """(start time in ticks, user + system ticks) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19], int(fields[11]) + int(fields[12])


def _names(pid: str) -> tuple[str, str] | None:
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    return name, cmdline


class Sampler:
    """Every process's CPU since it was first seen, keyed by (PID, start time): a reused PID is another process."""

    def __init__(self):
        self.seen: dict[tuple[str, str], dict] = {}
        self.sample(first=True)

    def sample(self, first: bool = False) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or (stat := _stat(pid)) is None:
                continue
            start, ticks = stat
            record = self.seen.get((pid, start))
            if record is None:
                if (names := _names(pid)) is None:
                    continue
                # a process already running when the command started counts from here; a new one from its start
                base = ticks if first else 0
                record = self.seen[(pid, start)] = {"pid": int(pid), "name": names[0], "cmdline": names[1],
                                                    "base": base, "ticks": ticks, "new": not first}
            elif ticks != record["ticks"]:
                record["ticks"] = ticks
                if (names := _names(pid)) is not None and names[1]:
                    record["name"], record["cmdline"] = names  # renamed since (setproctitle) or exec'd

    def records(self) -> list[dict]:
        return [{"pid": r["pid"], "kind": kind(r["name"], r["cmdline"]), "cpu_s": (r["ticks"] - r["base"]) / TICKS,
                 "new": r["new"], "cmdline": r["cmdline"][:300] or r["name"]} for r in self.seen.values()]


def table(records: list[dict], wall_s: float, cores: int) -> str:
    seconds, counts = Counter(), Counter()
    for record in records:
        if record["cpu_s"] > 0:
            seconds[record["kind"]] += record["cpu_s"]
            counts[record["kind"]] += record["new"]
    total, machine = sum(seconds.values()), wall_s * cores
    rows = [f"| {label} | {s:.1f} | {100 * s / total:.1f} | {counts[label]} |" for label, s in seconds.most_common()
            if s >= 0.5]
    return "\n".join([
        f"wall {wall_s:.0f} s on {cores} cores = {machine:.0f} CPU s available; sampled {total:.0f} CPU s "
        f"({100 * total / machine:.0f} % of it)",
        "", "| kind of process | CPU s | % of sampled | processes started |", "|---|---:|---:|---:|", *rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=1.0, help="seconds between two samples of /proc")
    parser.add_argument("--out", help="also write every process's record here (JSON)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: python -m benchmarks.suite_cpu -- make test")
    sampler = Sampler()
    started = time.monotonic()
    proc = subprocess.Popen(command)
    try:
        while proc.poll() is None:
            time.sleep(args.every)
            sampler.sample()
    except KeyboardInterrupt:
        proc.wait()
    sampler.sample()
    wall = time.monotonic() - started
    records = sampler.records()
    print("\n" + table(records, wall, os.cpu_count() or 1), file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": command, "wall_s": wall, "cores": os.cpu_count(),
                                              "returncode": proc.returncode, "processes": records}, indent=1))
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
