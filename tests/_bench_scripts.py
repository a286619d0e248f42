"""Loading a script of benchmarks/ as a module, for CPU tests of its pure parts (the scripts
import their neighbours, such as _common, by path)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@contextlib.contextmanager
def bench_script(name: str) -> Iterator[ModuleType]:
    """``benchmarks/<name>.py`` loaded as a module, benchmarks/ on sys.path meanwhile."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))
