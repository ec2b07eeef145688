"""Progress of every long command, in one helper: ``on_point(i, n, label)`` when step i of n starts.

On a terminal a Rich bar (steps done, elapsed, ETA) that disappears when the work ends; elsewhere (CI, nohup, a
pipe) a line on stderr for each step: ``[3/14] k1 (round 2, up to 6)  elapsed 0:41, ETA 2:30``. The ETA is the
mean time of a finished step times the steps left.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

import typer


def clock(seconds: float) -> str:
    """0:41, 12:05, 1:02:03."""
    s = int(round(seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def line(i: int, n: int, label: str, elapsed: float) -> str:
    """The line printed off a terminal when step ``i`` (0-based) of ``n`` starts, ``elapsed`` seconds in."""
    eta = f", ETA {clock(elapsed / i * (n - i))}" if 0 < i < n else ""
    return f"[{min(i + 1, n)}/{n}] {label}  elapsed {clock(elapsed)}{eta}"


class Progress:
    """``progress.on_point`` to pass to the core; ``stop()`` ends the bar (call it whatever happens)."""

    def __init__(self, what: str, tty: bool | None = None, warn_load: bool = True):
        self.what, self.warn_load = what, warn_load
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.bar = self.task = self.t0 = None

    def on_point(self, i: int, n: int, label: str) -> None:
        if self.t0 is None:
            self._start(n, measuring=i < n)  # a first step that is already the last (a rerun that measures
            # nothing: the report) times nothing, so it warns of no load
        if self.tty:
            self.bar.update(self.task, completed=i, total=n, description=f"{self.what}: {label}")
            if i >= n:
                self.stop()
        elif i < n:
            typer.echo(line(i, n, label, time.perf_counter() - self.t0), err=True)

    def _start(self, n: int, measuring: bool = True) -> None:
        from mtpbench.environment import load_warning

        self.t0 = time.perf_counter()
        warning = load_warning() if self.warn_load and measuring else None  # once, when measuring starts (bad input refused by now)
        if warning:
            typer.echo(warning, err=True)
        if self.tty:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self.bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           TextColumn("ETA"), TimeRemainingColumn(), transient=True, console=Console(stderr=True))
            self.bar.start()
            self.task = self.bar.add_task(self.what, total=n)

    def stop(self) -> None:
        if self.bar is not None:  # a bar never started prints nothing
            self.bar.stop()
            self.bar = None


def with_progress(what: str, run: Callable, *args, timed: bool = True):
    """``run(*args, on_point)`` under a progress display (stopped whatever happens); ``timed``: the work is a timing,
    so a loaded machine is warned of when it starts."""
    progress = Progress(what, warn_load=timed)
    try:
        return run(*args, progress.on_point)
    finally:
        progress.stop()
