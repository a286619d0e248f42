"""Autotuning: per-shape choice among an op's candidates, correctness-gated, cached, rank-agreed.

Every op with more than one supported candidate is tuned on first use of a new key (see
``_key``): each candidate is checked against the reference (``_gate``) and timed (``_timing``),
the fastest correct one wins, and the decision is kept in memory, on disk (``_cache``) and, with
torch.distributed, agreed across ranks (``_dist``). Before timing, a key's candidates compile in
parallel worker processes (``_compile_pool``). On CUDA the first call does not wait for tuning: it
is served at once while a background worker tunes the key (``_background``); ``kg.tune(blocking=True)``
tunes inside the call instead, ``kg.tune.wait()`` waits for the workers, ``kg.tune.report(op)`` says
what was tried and where the time went, ``kg.tune.warm()`` pays a process's one-time costs (imports,
compile workers, the native replay) at start-up. ``pretune`` tunes ahead: one call, a model's op sites over
decode and prefill ``Ranges`` (``_record``, ``_ranges``), or a list of calls; resumable, and split
across ranks under torch.distributed (``_shard``). ``kernelgraft.tune`` is this module and is
also callable: ``kg.tune("cached")`` / ``kg.tune(prune=True)`` give a context manager and
decorator that set the mode and options (``_modes``).

>>> import kernelgraft as kg
>>> with kg.tune("off"):
...     kg.tune.settings().mode
'off'
>>> kg.tune.settings().mode in ("on", "cached", "off")
True
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .cache import DiskCache, cache_dir, cache_path
from .key import TuneKey, build_key, normalize_buckets
from ..op.modes import MODES, Settings, settings, tune
from .prune import matmul_heuristics
from .decision import Decision
from .tuner import TUNER, Tuner
from .api import clear, decision, pending, pretune, report, stats, wait
from .pretune import KeyResult, Report as PretuneReport
from .ranges import Ranges
from .report import Report
from .warmup import Warm, warm

__all__ = [
    "tune", "settings", "Settings", "MODES", "Decision", "Tuner", "TuneKey", "build_key",
    "normalize_buckets", "matmul_heuristics", "cache_dir", "cache_path", "DiskCache",
    "pretune", "decision", "clear", "stats", "wait", "pending", "report", "Report", "TUNER", "Ranges",
    "PretuneReport", "KeyResult", "warm", "Warm",
]


class _CallableModule(types.ModuleType):
    """Lets ``kg.tune(...)`` be called while ``kernelgraft.tune`` stays the package."""

    def __call__(self, mode: str | None = None, /, **options: Any) -> tune:
        return tune(mode, **options)


sys.modules[__name__].__class__ = _CallableModule
