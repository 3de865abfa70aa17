"""What a job shows while it runs: an engine-start spinner, then progress over lengths."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from oneknob.executor import Ready


def make_console(stderr: bool = True) -> Console:
    """A console that soft-wraps, and is 200 columns wide in a pipe or a test rather than 80."""
    console = Console(stderr=stderr, highlight=False, soft_wrap=True)
    return console if console.is_terminal else Console(stderr=stderr, highlight=False, soft_wrap=True, width=200)


class JobProgress:
    def __init__(self, console: Console, name: str):
        self.console = console
        self.name = name
        self.progress = Progress(SpinnerColumn(), TextColumn("[bold]{task.fields[name]}[/]"),
                                 TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=True,
                                 disable=not console.is_terminal)  # nothing to draw in a pipe or a log
        self.engine_task = None
        self.length_task = None
        self.progress.start()

    def engine_wait(self, elapsed: float, phase: str) -> None:
        if self.engine_task is None:
            self.engine_task = self.progress.add_task("starting engine", total=None, name=self.name)
        self.progress.update(self.engine_task, description=f"starting engine {elapsed:4.0f}s {phase}")

    def engine_ready(self, ready: Ready) -> None:
        if self.engine_task is not None:
            self.progress.remove_task(self.engine_task)
            self.engine_task = None
        self.console.print(f"  {self.name}: engine ready in {ready.start_s:.1f} s (pid {ready.pid})")

    def point(self, length: int, verdict: str, nll: float) -> None:
        if self.length_task is None:
            self.length_task = self.progress.add_task("lengths", total=None, name=self.name)
        self.progress.update(self.length_task, advance=1, description=f"L={length} {verdict} nll={nll:.3f}")

    def close(self) -> None:
        self.progress.stop()
