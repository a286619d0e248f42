"""The Triton spec, ``kg.triton(launch, configs)``: the user's launch function issues
``kernel[grid](...)`` itself; Triton picks the current device and stream."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import SpecError
from ...spec.base import ImplSpec

__all__ = ["TritonImpl", "triton"]


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class TritonImpl(ImplSpec):
    """A Triton kernel behind a launch function ``launch(*inputs, *outputs, **config)``."""

    backend = "triton"

    def _validate(self) -> None:
        if self.launch is None:
            raise SpecError("kg.triton: launch is required")


def triton(
    launch: Callable[..., Any],
    configs: Sequence[Mapping[str, Any]] = ({},),
    *,
    supports: Callable[..., bool | str] | None = None,
    min_capability: Any = None,
    contiguous: bool | Sequence[str] = True,
    name: str | None = None,
) -> TritonImpl:
    """Describe a Triton kernel: ``launch(*inputs, *outputs, **config)`` issues the launch.

    Examples:
        >>> import kernelgraft as kg
        >>> def launch(x, out, *, BLOCK): ...
        >>> spec = kg.triton(launch, configs=[{"BLOCK": 256}, {"BLOCK": 1024}])
        >>> [c.as_dict() for c in spec.configs]
        [{'BLOCK': 256}, {'BLOCK': 1024}]
    """
    return TritonImpl(
        launch=launch,
        configs=configs,  # type: ignore[arg-type]
        supports=supports,
        min_capability=min_capability,
        contiguous=contiguous,  # type: ignore[arg-type]
        name=name,
    )
