"""The CUDA C++ (NVRTC) kernel spec, ``kg.cuda``, and ``kg.Launch``, what its launch returns.

Configs reach the code one of two ways: a key that appears as a ``{KEY}`` placeholder in
``kernel_name`` fills it (a template kernel is named ``"add_relu<{T}, {BLOCK}>"``); every other key
becomes a macro (``-DBLOCK=256``). Values that depend on the inputs (an element type) come from
the launch function through ``Launch(template={"T": kg.ctype(x.dtype)})`` and are used the same
way; each distinct (config, template) compiles once and is cached.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ...errors import SpecError
from ...spec.base import Config, ImplSpec, callable_source

__all__ = ["CudaImpl", "Launch", "cuda", "ctype"]

_CTYPES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "__half",
    torch.bfloat16: "__nv_bfloat16", torch.int8: "signed char", torch.uint8: "unsigned char",
    torch.int16: "short", torch.int32: "int", torch.int64: "long long", torch.bool: "bool",
}


def ctype(dtype: torch.dtype) -> str:
    """The CUDA C++ type of a torch dtype (``__half`` and ``__nv_bfloat16`` need cuda_fp16.h /
    cuda_bf16.h).

    >>> ctype(torch.float16)
    '__half'
    """
    try:
        return _CTYPES[dtype]
    except KeyError:
        raise SpecError(f"kg.ctype: no CUDA C++ type for {dtype}; supported: {list(_CTYPES)}") from None


@dataclasses.dataclass(frozen=True)
class Launch:
    """What a ``kg.cuda`` launch function returns: grid and block (ints or 1-3 tuples), the
    kernel arguments (tensors, ``kernelgraft.driver.i32(n)``-style typed scalars), dynamic shared
    memory in bytes, and template values that depend on the inputs (see the module docstring)."""

    grid: Any
    block: Any
    args: Sequence[Any]
    shared_mem: Any = 0
    template: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class CudaImpl(ImplSpec):
    """CUDA C++ compiled by NVRTC; ``launch(*inputs, *outputs, **config) -> kg.Launch``."""

    backend = "cuda"

    source: str = ""
    kernel_name: str = ""
    options: tuple[str, ...] = ()

    def _validate(self) -> None:
        where = f"kg.cuda({self.kernel_name!r})"
        if self.launch is None:
            raise SpecError(f"{where}: launch is required; it returns kg.Launch(grid, block, args)")
        if not isinstance(self.source, str) or not self.source.strip():
            raise SpecError(f"{where}: source must be the CUDA C++ text, got {type(self.source).__name__}")
        if not isinstance(self.kernel_name, str) or not self.kernel_name.strip():
            raise SpecError(f"{where}: kernel_name must name the __global__ function, e.g. 'my_kernel'")
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(self.kernel_name) if f]
        except ValueError as exc:
            raise SpecError(f"{where}: kernel_name is not a valid template: {exc}") from None
        object.__setattr__(self, "_placeholders", tuple(fields))
        options = (self.options,) if isinstance(self.options, str) else tuple(self.options)
        for opt in options:
            if not isinstance(opt, str):
                raise SpecError(f"{where}: options must be strings like '-use_fast_math', got {opt!r}")
            if opt.startswith(("-arch", "--gpu-architecture")):
                raise SpecError(f"{where}: option {opt!r}: the arch is chosen per device (or by "
                                "`kernelgraft aot --arch`); leave it out")
        object.__setattr__(self, "options", options)
        for config in self.configs:
            for key, value in config:
                if isinstance(value, tuple):
                    raise SpecError(f"{where}: config {config.as_dict()}: {key!r} is a tuple; "
                                    "CUDA configs become -D macros and must be scalars")

    @property
    def display_name(self) -> str:
        if self.name:
            return self.name
        return self.kernel_name.split("<")[0].strip()

    def code_identity(self) -> str:
        return "\n".join([self.source, self.kernel_name, repr(self.options), callable_source(self.launch)])

    def expression(self, config: Config, template: Mapping[str, Any] | None) -> str:
        values = {**config.as_dict(), **(template or {})}
        missing = [f for f in self._placeholders if f not in values]  # type: ignore[attr-defined]
        if missing:
            raise SpecError(
                f"kg.cuda({self.kernel_name!r}): placeholder {{{missing[0]}}} has no value; give it "
                f"in the config or in kg.Launch(template={{{missing[0]!r}: ...}}); have {sorted(values)}"
            )
        return self.kernel_name.format(**values)

    def compile_options(self, config: Config, template: Mapping[str, Any] | None) -> tuple[str, ...]:
        used = set(self._placeholders)  # type: ignore[attr-defined]
        values = {**config.as_dict(), **(template or {})}
        macros = [f"-D{k}={_macro(v)}" for k, v in values.items() if k not in used]
        return (*self.options, *macros)


def _macro(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def cuda(
    source: str,
    kernel_name: str,
    *,
    launch: Callable[..., Launch],
    configs: Sequence[Mapping[str, Any]] = ({},),
    options: Sequence[str] = (),
    supports: Callable[..., bool | str] | None = None,
    min_capability: Any = None,
    contiguous: bool | Sequence[str] = True,
    name: str | None = None,
) -> CudaImpl:
    """Describe a CUDA C++ kernel compiled with NVRTC and launched through the driver.

    ``launch(*inputs, *outputs, **config)`` returns ``kg.Launch(grid, block, args, shared_mem=0,
    template=None)``; config keys fill ``{KEY}`` in ``kernel_name``, the others become ``-D`` macros.

    >>> import kernelgraft as kg
    >>> from kernelgraft import driver
    >>> SRC = '''template <int BLOCK> __global__ void scale(const float* x, float* y, int n) {
    ...     int i = blockIdx.x * BLOCK + threadIdx.x; if (i < n) y[i] = 2 * x[i]; }'''
    >>> def launch(x, out, *, BLOCK):
    ...     return kg.Launch(grid=(x.numel() + BLOCK - 1) // BLOCK, block=BLOCK,
    ...                      args=(x, out, driver.i32(x.numel())))
    >>> spec = kg.cuda(SRC, "scale<{BLOCK}>", launch=launch, configs=[{"BLOCK": 128}])
    >>> spec.expression(spec.configs[0], None), spec.compile_options(spec.configs[0], None)
    ('scale<128>', ())
    """
    return CudaImpl(
        launch=launch, configs=configs, supports=supports,  # type: ignore[arg-type]
        min_capability=min_capability, contiguous=contiguous, name=name,  # type: ignore[arg-type]
        source=source, kernel_name=kernel_name, options=tuple(options),
    )
