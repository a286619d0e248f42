"""The CuTe DSL spec, ``kg.cutedsl(...)``: ``launch(*inputs, *outputs, **config) -> (host_fn,
args)``, ``host_fn`` a ``@cute.jit`` function whose tensor parameters are ``cute.Pointer`` and whose
last parameter is the stream; ``args`` holds tensors (passed as pointers), Python scalars, and values
for its ``cutlass.Constexpr`` parameters (static shape parts, tile sizes). kernelgraft appends the
stream, compiles ``host_fn`` and launches it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import SpecError
from ...spec.base import ImplSpec
from ...spec.sources import kernel_sources

__all__ = ["CuteDSLImpl", "cutedsl"]


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
