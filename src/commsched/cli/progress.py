"""Progress of a long command: a bar on a terminal, one plain line per phase elsewhere.

A bar redraws itself in place, which a log file, a pipe or a CI console cannot
show (rich then shows nothing at all). There, each phase (a policy, a repeat,
a calibration, a search) gets one line on stderr when it ends, with the time
since the command started::

    [   12.3 s] 300mbit: dear repeat 2/3 done

Both speak the part of ``rich.progress.Progress`` the commands use:
``add_task(description, total)`` and ``update(task, description=, advance=,
completed=, total=)``, in a ``with`` block. A phase is a description: it ends
when the description changes, when the task completes, or when the block ends
without an error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["PlainProgress", "progress"]


def progress(console: Console) -> Progress | PlainProgress:
    """A transient rich bar when ``console`` is a terminal, else :class:`PlainProgress` on stderr."""
    if console.is_terminal:
        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
    return PlainProgress()


@dataclass
class _Phase:
    description: str
    total: float | None
    completed: float = 0.0
    steps: float = 0.0  # progress made under this description
    reported: bool = False


class PlainProgress:
    """One line on stderr per finished phase, with the seconds since it was made."""

    def __init__(self) -> None:
        self._start_s = time.monotonic()
        self._tasks: list[_Phase] = []

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is None:
            for task in self._tasks:
                self._done(task)

    def add_task(self, description: str, total: float | None = 100.0, **_: Any) -> TaskID:
        self._tasks.append(_Phase(description, total))
        return TaskID(len(self._tasks) - 1)

    def update(
        self,
        task_id: TaskID,
        *,
        description: str | None = None,
        advance: float | None = None,
        completed: float | None = None,
        total: float | None = None,
        **_: Any,
    ) -> None:
        task = self._tasks[task_id]
        if description is not None and description != task.description:
            self._done(task)
            task.description, task.steps, task.reported = description, 0.0, False
        if total is not None:
            task.total = total
        before = task.completed
        if completed is not None:
            task.completed = completed
        if advance is not None:
            task.completed += advance
        task.steps += task.completed - before
        if task.total is not None and task.completed >= task.total:
            self._done(task)

    def _done(self, task: _Phase) -> None:
        if task.steps > 0 and not task.reported:
            click.echo(f"[{time.monotonic() - self._start_s:7.1f} s] {task.description} done", err=True)
            task.reported = True
