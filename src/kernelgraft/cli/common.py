"""Helpers shared by CLI commands: loading a TARGET (a .py file or a module) and its ops."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

from ..op.operator import KernelOp
from ..check.report import table_console  # one rule for every command's tables

__all__ = ["prepare_environment", "quiet_third_party_warnings", "load_target", "ops_of", "table_console"]


def prepare_environment() -> None:
    """Without a GPU, run Triton kernels through its interpreter (must precede kernel definitions)."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


# Warnings that third-party code raises while a kernelgraft tool drives it, and that say nothing the
# user can act on: (category, module the warning is attributed to, message). Only these: warnings
# from kernelgraft and from the user's own modules (and any other from these packages) still show.
THIRD_PARTY_NOISE: tuple[tuple[type[Warning], str, str], ...] = (
    # numpy floating-point notes from Triton's CPU interpreter: outputs are poisoned with NaN before a
    # kernel runs, and masked-off lanes compute on garbage by design
    (RuntimeWarning, r"triton\.runtime\.interpreter", ""),
    # Triton 3.9's notices of defaults changing in 3.10: the knob is Triton's, not the user's kernel's
    (UserWarning, r"triton\.", r"TRITON_DEFAULT_FP_FUSION is unset|tl\.(cat|reshape)\(can_reorder=True\)"),
    # torch deprecating its own pytree class, which torch's export machinery still uses
    (FutureWarning, r"torch\.", r".*isinstance\(treespec, LeafSpec\)"),
)


def quiet_third_party_warnings() -> None:
    """Hide ``THIRD_PARTY_NOISE`` in this process (the CLI only: a library leaves filters to its
    user)."""
    for category, module, message in THIRD_PARTY_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


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
