"""The source a DSL kernel's identity is made of: a launch function's source and that of the
kernels and helpers it names, a few levels down (a change in a ``@ct.kernel`` or ``@cute.kernel``
called through a host function changes the spec's fingerprint), and the release of an installed
kernel library whose class it uses."""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from .base import source_of

__all__ = ["inner_function", "kernel_sources"]


def inner_function(obj: Any) -> Callable | None:
    """The Python function behind a DSL kernel object (cuTile kernel, CuTe jit/kernel, Triton)."""
    annotated = getattr(obj, "_annotated_function", None)  # cuda.tile kernel
    if annotated is not None and callable(getattr(annotated, "pyfunc", None)):
        return annotated.pyfunc
    for attr in ("__wrapped__", "fn", "func", "_func"):
        inner = getattr(obj, attr, None)
        if inner is not None and inspect.isfunction(inner):
            return inner
    return obj if inspect.isfunction(obj) else None


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _library_version(cls: type) -> str | None:
    """``"quack-kernels 0.6.5"`` for a class of an installed distribution other than the DSLs,
    torch and the standard library (their versions are in the compile keys already), else None."""
    top = str(getattr(cls, "__module__", "")).split(".")[0]
    if not top or top in ("builtins", "cutlass", "cuda", "torch", "triton", "kernelgraft"):
        return None
    dists = _distributions().get(top)
    if not dists:
        return None
    try:
        return f"{dists[0]} {importlib.metadata.version(dists[0])}"
    except importlib.metadata.PackageNotFoundError:
        return None


def kernel_sources(fn: Callable, depth: int = 3) -> str:
    """Source of ``fn`` and of the functions/kernels it names, ``depth`` levels down, so a change in
    a ``@ct.kernel`` or ``@cute.kernel`` called through a host function changes the fingerprint;
    a kernel class from an installed library (quack's ``RMSNorm``) counts by its release."""
    seen: set[int] = set()
    parts: list[str] = []

    def visit(obj: Any, name: str, level: int) -> None:
        inner = inner_function(obj)
        if inner is None or id(inner) in seen:
            return
        seen.add(id(inner))
        parts.append(f"{name}:{source_of(inner)}")
        if level >= depth:
            return
        code = getattr(inner, "__code__", None)
        if code is None:
            return
        namespace = getattr(inner, "__globals__", {})
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in inner.__closure__ or ())))
        for ref in sorted(set(code.co_names) | set(cells)):
            target = cells.get(ref, namespace.get(ref))
            if isinstance(target, type):
                library = _library_version(target)
                if library:  # a kernel class of an installed library (quack's RMSNorm): its release
                    parts.append(f"{ref}:{target.__module__}.{target.__qualname__} from {library}")
                continue
            if target is None or inspect.ismodule(target):
                continue
            inner_target = inner_function(target)
            if inner_target is None or str(getattr(inner_target, "__module__", "")).startswith(
                ("cutlass", "cuda.", "torch", "triton", "builtins")
            ):
                continue  # library code: its version is part of the compile keys instead
            visit(target, ref, level + 1)

    visit(fn, getattr(fn, "__qualname__", "launch"), 0)
    return "\n".join(parts)
