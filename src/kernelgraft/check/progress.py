"""What a check run tells as it goes: ``Events`` (ignored by default) and ``Printer``, the
progress ``kernelgraft check`` prints: a line per op as it starts and as it ends, and on a terminal
a live count of finished checks between them (plain lines when piped, flushed as they come)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TaskID, TextColumn, TimeElapsedColumn

from .harness import Result

__all__ = ["Events", "Printer"]


class Events:
    """Hooks a check run calls as it goes; this base ignores them."""

    def op_started(self, name: str, index: int, total: int) -> None:
        pass

    def result(self, result: Result) -> None:
        pass

    def op_finished(self, name: str, results: Sequence[Result]) -> None:
        pass


def _counts(results: Sequence[Result]) -> str:
    status = [r.status for r in results]
    text = f"{status.count('pass')} passed, {status.count('fail')} failed"
    if status.count("compiled"):
        text += f", {status.count('compiled')} compiled only"
    if status.count("skip"):
        text += f", {status.count('skip')} skipped"
    if status.count("notrun"):
        text += f", {status.count('notrun')} not run"
    return text


class Printer(Events):
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self._started: dict[str, float] = {}
        # auto_refresh=False: no refresh thread, which a fork of this process would copy mid-write
        self._live = Progress(
            TextColumn("{task.description}"), TextColumn("{task.completed} checks, {task.fields[failed]} failed"),
            TimeElapsedColumn(), console=self.console, auto_refresh=False, transient=True,
        ) if self.console.is_terminal else None
        self._tasks: dict[str, TaskID] = {}
        self._failed: dict[str, int] = {}

    def say(self, text: str) -> None:
        """One plain line (rich markup escaped by the caller), never wrapped, flushed at once."""
        self.console.print(text, highlight=False, soft_wrap=True)
        self.console.file.flush()  # piped stdout is block-buffered: a progress line must not wait

    def op_started(self, name: str, index: int, total: int) -> None:
        self._started[name] = time.monotonic()
        self.say(f"checking {escape(name)} ({index + 1} of {total})")
        if self._live is not None:
            if not self._tasks:
                self._live.start()
            self._tasks[name] = self._live.add_task(escape(name), total=None, failed=0)
            self._live.refresh()

    def result(self, result: Result) -> None:
        task = self._tasks.get(result.op)
        if self._live is not None and task is not None:
            self._failed[result.op] = self._failed.get(result.op, 0) + (result.status == "fail")
            self._live.update(task, advance=1, failed=self._failed[result.op])
            self._live.refresh()

    def op_finished(self, name: str, results: Sequence[Result]) -> None:
        if self._live is not None and name in self._tasks:
            self._live.remove_task(self._tasks.pop(name))
            if not self._tasks:
                self._live.stop()
        took = time.monotonic() - self._started.get(name, time.monotonic())
        self.say(f"  {escape(name)}: {_counts(results)} ({took:.1f} s)")

    def close(self) -> None:
        if self._live is not None and self._tasks:
            self._live.stop()
            self._tasks.clear()
