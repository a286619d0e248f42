"""Specs for the two NVIDIA tile/CuTe DSLs: ``kg.cutile(...)`` and ``kg.cutedsl(...)``.

Unlike Triton, where the launch function issues the launch itself, these launch functions *return*
what to launch and kernelgraft issues it, so it can key its compile caches, pick the current
stream, and swap JIT for an AOT cubin without the user's code changing:

- cuTile: ``launch(*inputs, *outputs, **config) -> (grid, kernel, args)``, ``kernel`` a
  ``@ct.kernel`` and ``args`` its arguments (tensors, Python scalars, constants for
  ``ct.Constant`` parameters), exactly what ``ct.launch(stream, grid, kernel, args)`` takes.
- CuTe DSL: ``launch(*inputs, *outputs, **config) -> (host_fn, args)``, ``host_fn`` a ``@cute.jit``
  function whose tensor parameters are ``cute.Pointer`` and whose last parameter is the stream;
  ``args`` holds tensors (passed as pointers), Python scalars, and values for its
  ``cutlass.Constexpr`` parameters (static shape parts, tile sizes). kernelgraft appends the stream.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import SpecError
from ..spec.base import ImplSpec, _source_of

__all__ = ["CuTileImpl", "CuteDSLImpl", "cutile", "cutedsl", "kernel_sources"]


def _inner_function(obj: Any) -> Callable | None:
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
        inner = _inner_function(obj)
        if inner is None or id(inner) in seen:
            return
        seen.add(id(inner))
        parts.append(f"{name}:{_source_of(inner)}")
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
            inner_target = _inner_function(target)
            if inner_target is None or str(getattr(inner_target, "__module__", "")).startswith(
                ("cutlass", "cuda.", "torch", "triton", "builtins")
            ):
                continue  # library code: its version is part of the compile keys instead
            visit(target, ref, level + 1)

    visit(fn, getattr(fn, "__qualname__", "launch"), 0)
    return "\n".join(parts)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class CuTileImpl(ImplSpec):
    """A cuTile kernel: ``launch(*inputs, *outputs, **config) -> (grid, kernel, args)``.

    ``arch``: the targets AOT builds cubins for (``"sm_90"``, ``"sm_100"``...); JIT compiles for the
    device at hand.
    """

    backend = "cutile"

    arch: tuple[str, ...] = ("sm_90",)

    def _validate(self) -> None:
        if self.launch is None:
            raise SpecError("kg.cutile: launch is required")
        arch = (self.arch,) if isinstance(self.arch, str) else tuple(self.arch)
        for a in arch:
            if not isinstance(a, str) or not a.startswith("sm_") or not a[3:].rstrip("af").isdigit():
                raise SpecError(f"kg.cutile({self.display_name}): arch {a!r} is not like 'sm_90'")
        object.__setattr__(self, "arch", arch)

    def code_identity(self) -> str:
        return kernel_sources(self.launch)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class CuteDSLImpl(ImplSpec):
    """A CuTe DSL kernel: ``launch(*inputs, *outputs, **config) -> (host_fn, args)``.

    ``arch``: the ``cute.compile`` target; None derives it from the device (``sm_90a`` on an H100/
    H200: Hopper-only instructions such as WGMMA and TMA need the ``a`` variant). ``opt_level`` and
    ``ptxas_options`` pass through to ``cute.compile``.
    """

    backend = "cutedsl"

    arch: str | None = None
    opt_level: int = 3
    ptxas_options: str = ""

    def _validate(self) -> None:
        where = f"kg.cutedsl({self.display_name})"
        if self.launch is None:
            raise SpecError("kg.cutedsl: launch is required")
        if self.arch is not None and (
            not isinstance(self.arch, str) or not self.arch.startswith("sm_")
        ):
            raise SpecError(f"{where}: arch {self.arch!r} is not like 'sm_90a'")
        if not isinstance(self.opt_level, int) or not 0 <= self.opt_level <= 3:
            raise SpecError(f"{where}: opt_level must be 0..3, got {self.opt_level!r}")
        if not isinstance(self.ptxas_options, str):
            raise SpecError(f"{where}: ptxas_options must be a string, got {self.ptxas_options!r}")

    def code_identity(self) -> str:
        return "\n".join(
            [kernel_sources(self.launch), f"arch={self.arch}", f"O{self.opt_level}",  # type: ignore[arg-type]
             f"ptxas={self.ptxas_options}"]
        )


def cutile(
    launch: Callable[..., Any],
    configs: Sequence[Mapping[str, Any]] = ({},),
    *,
    supports: Callable[..., bool | str] | None = None,
    min_capability: Any = None,
    contiguous: bool | Sequence[str] = True,
    arch: str | Sequence[str] = ("sm_90",),
    name: str | None = None,
) -> CuTileImpl:
    """Describe a cuTile kernel. ``launch(*inputs, *outputs, **config)`` returns
    ``(grid, kernel, args)``; kernelgraft launches it on torch's current stream (``ct.launch`` when
    cuTile can compile here, else a cubin built ahead of time by ``kernelgraft aot``).

    >>> import kernelgraft as kg
    >>> def launch(x, out, *, TILE):
    ...     return (x.numel() + TILE - 1) // TILE, my_kernel, (x, out, TILE)
    >>> spec = kg.cutile(launch, configs=[{"TILE": 1024}])
    >>> spec.backend, spec.arch
    ('cutile', ('sm_90',))
    """
    return CuTileImpl(
        launch=launch, configs=configs, supports=supports,  # type: ignore[arg-type]
        min_capability=min_capability, contiguous=contiguous, name=name, arch=arch,  # type: ignore[arg-type]
    )


def cutedsl(
    launch: Callable[..., Any],
    configs: Sequence[Mapping[str, Any]] = ({},),
    *,
    supports: Callable[..., bool | str] | None = None,
    min_capability: Any = None,
    contiguous: bool | Sequence[str] = True,
    arch: str | None = None,
    opt_level: int = 3,
    ptxas_options: str = "",
    name: str | None = None,
) -> CuteDSLImpl:
    """Describe a CuTe DSL kernel. ``launch(*inputs, *outputs, **config)`` returns
    ``(host_fn, args)`` for a ``@cute.jit`` ``host_fn(*args, stream)``; tensors reach it as
    ``cute.Pointer``. Compiled once per dtypes/alignment/constexpr values/arch/cutlass version.

    >>> import kernelgraft as kg
    >>> def launch(x, out, *, BLOCK):
    ...     return my_host_fn, (x, out, x.numel(), BLOCK)
    >>> spec = kg.cutedsl(launch, configs=[{"BLOCK": 256}], min_capability=90)
    >>> spec.backend, spec.min_capability
    ('cutedsl', (9, 0))
    """
    return CuteDSLImpl(
        launch=launch, configs=configs, supports=supports,  # type: ignore[arg-type]
        min_capability=min_capability, contiguous=contiguous, name=name, arch=arch,
        opt_level=opt_level, ptxas_options=ptxas_options,
    )
