"""The cuTile spec, ``kg.cutile(...)``: the launch function *returns* what to launch,
``launch(*inputs, *outputs, **config) -> (grid, kernel, args)``, ``kernel`` a ``@ct.kernel`` and
``args`` its arguments (tensors, Python scalars, constants for ``ct.Constant`` parameters), exactly
what ``ct.launch(stream, grid, kernel, args)`` takes; kernelgraft issues it, so it can key its compile
caches, pick the current stream, and swap JIT for an AOT cubin without the user's code changing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import SpecError
from ...spec.base import ImplSpec
from ...spec.sources import kernel_sources

__all__ = ["CuTileImpl", "cutile"]


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
