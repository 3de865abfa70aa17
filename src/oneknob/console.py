"""What a job shows while it runs: an engine-start spinner (the reference's labelled "reference"), then
progress over lengths; and a bar for a long one-time step (the tiny model's build). The consoles oneknob prints
with (`make_console`) say their prose within WIDTH columns (`say`), so a pasted terminal log reads as it did; what
is printed to be pasted back (a refusal, a command) is never broken."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

WIDTH = 120  # the widest line oneknob prints (but a path or a URL, which is never broken)


def wrap_width(console: Console) -> int:
    """WIDTH, narrower where the terminal is or where $COLUMNS says so (a pipe has no width of its own)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns) if not console.is_terminal else min(int(columns), console.width)
    return min(WIDTH, console.width) if console.is_terminal else WIDTH


def wrapped(text: Text, width: int) -> list[Text]:
    """The text as lines of at most `width` columns, broken at spaces only (a word longer than that, a path or a
    URL, stays whole on a line of its own); continuation lines indented two more than the first."""
    out = []
    for line in text.split("\n"):
        plain = line.plain
        if len(plain) <= width:
            out.append(line)
            continue
        indent = min(len(plain) - len(plain.lstrip(" ")) + 2, width // 2)
        cuts, start, limit, after_space = [], 0, width, None
        for space in re.finditer(r" +", plain):
            if space.start() - start > limit and after_space is not None and after_space > start:
                cuts.append(after_space)  # the line ends before the word that would not fit
                start, limit = after_space, width - indent
            after_space = space.end()
        if len(plain) - start > limit and after_space is not None and after_space > start:
            cuts.append(after_space)
        for i, piece in enumerate(line.divide(cuts)):
            piece.rstrip()
            out.append(Text(" " * indent) + piece if i else piece)
    return out


class WrappingConsole(Console):
    """A rich Console that can say a line of prose within the wrap width (`say`), broken at spaces and never inside
    a word: rich's own wrapping would cut a path in two. `print` prints as rich does with soft_wrap: a refusal,
    a command to paste, a table are never broken by oneknob."""

    def say(self, text: str | Text, **kwargs) -> None:
        """A line of prose (a job's progress, a note, the end of a sweep), wrapped at wrap_width."""
        found = text if isinstance(text, Text) else self.render_str(
            text, markup=kwargs.pop("markup", None), highlight=kwargs.pop("highlight", None),
            emoji=kwargs.pop("emoji", None))
        if style := kwargs.pop("style", None):
            found.stylize(style)
        for line in wrapped(found, wrap_width(self)):
            self.print(line, soft_wrap=True, **kwargs)


def say(console: Console, text: str, **kwargs) -> None:
    """`console.say(text)`, or a plain print on a console that is not oneknob's (a test's, a caller's)."""
    (console.say if isinstance(console, WrappingConsole) else console.print)(text, **kwargs)


def make_console(stderr: bool = True) -> WrappingConsole:
    """A console whose prose fits WIDTH columns (`say`, wrap_width), 200 columns wide for what rich lays out itself
    in a pipe or a test rather than 80. No emoji codes: a user's text (an experiment name, a criterion) is printed as
    typed, ":fire:" included."""
    console = WrappingConsole(stderr=stderr, highlight=False, soft_wrap=True, emoji=False)
    return console if console.is_terminal else WrappingConsole(stderr=stderr, highlight=False, soft_wrap=True,
                                                               width=200, emoji=False)


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

    def engine_wait(self, elapsed: float, phase: str, label: str | None = None) -> None:
        if self.engine_task is None:
            self.engine_task = self.progress.add_task("starting engine", total=None, name=label or self.name)
        self.progress.update(self.engine_task, description=f"starting engine {elapsed:4.0f}s {phase}",
                             name=label or self.name)

    def reference_wait(self, elapsed: float, phase: str) -> None:
        """The reference's engine start (reference.get_or_measure's on_wait): labelled as what it is."""
        self.engine_wait(elapsed, phase, label="reference")

    def engine_ready(self, ready) -> None:  # run.executor.Ready
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


@contextlib.contextmanager
def steps(console: Console, total: int, what: str) -> Iterator[Callable[[], None]]:
    """A bar with the time left over `total` steps of a long one-time job; yields the call that advances it.
    Nothing is drawn in a pipe or a log (the caller's own lines say how far it got)."""
    bar = Progress(TextColumn("[bold]{task.description}[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("left"), TimeRemainingColumn(), console=console, transient=True,
                   disable=not console.is_terminal)
    with bar:
        task = bar.add_task(what, total=total)
        yield lambda: bar.advance(task)
