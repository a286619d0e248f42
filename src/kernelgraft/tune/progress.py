"""A rich progress bar for a tuning on the caller's thread that takes more than a moment."""

from __future__ import annotations

import logging
import time
from typing import Any

from .key import TuneKey

__all__ = ["Progress"]

log = logging.getLogger(__name__)
_PROGRESS_AFTER_S = 1.0


class Progress:
    """A rich progress bar that appears only once tuning has taken more than a moment."""

    def __init__(self, op_name: str, key: TuneKey, total: int, enabled: bool) -> None:
        self.label = f"tuning {op_name} ({key.summary()})"
        self.total, self.enabled = total, enabled and total > 1
        self.started = time.perf_counter()
        self.bar: Any = None
        self.task: Any = None

    def __call__(self, done: int, cand: Any) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            if time.perf_counter() - self.started < _PROGRESS_AFTER_S or cand is None:
                return
            try:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
                from rich.progress import Progress as RichProgress

                console = Console(stderr=True)
                if not console.is_terminal:
                    log.warning("%s: %d candidates, this may take a while", self.label, self.total)
                    self.enabled = False
                    return
                self.bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                        TimeElapsedColumn(), console=console, transient=True)
                self.bar.start()
                self.task = self.bar.add_task(self.label, total=self.total)
            except Exception:  # progress display is a nicety; never fail tuning for it
                self.enabled = False
                return
        self.bar.update(self.task, completed=done)
        if cand is None:
            self.bar.stop()
