"""A TARGET of the CLI and of isolated checks: a ``.py`` file or a dotted module name, imported, and
the ops it defines."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from .operator import KernelOp

__all__ = ["prepare_environment", "load_target", "ops_of"]


def prepare_environment() -> None:
    """Without a GPU, run Triton kernels through its interpreter (must precede kernel definitions)."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def load_target(target: str) -> ModuleType:
    """Import TARGET, a path to a .py file or a dotted module name."""
    prepare_environment()
    path = Path(target)
    if target.endswith(".py") or path.is_file():
        if not path.is_file():
            raise SystemExit(f"kernelgraft: no such file: {target}")
        name = f"kernelgraft_target_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path.resolve())
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.path.insert(0, str(path.resolve().parent))
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        raise SystemExit(f"kernelgraft: cannot import {target!r}: {exc}") from exc


def ops_of(module: ModuleType) -> list[KernelOp]:
    """The ops a module defines, in definition order, each once."""
    seen: dict[str, KernelOp] = {}
    for value in vars(module).values():
        if isinstance(value, KernelOp) and value.name not in seen:
            seen[value.name] = value
    extra = getattr(module, "OPS", None)
    for value in extra or ():
        if isinstance(value, KernelOp):
            seen.setdefault(value.name, value)
    return list(seen.values())
