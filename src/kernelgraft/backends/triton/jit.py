"""Triton: the user's launch function issues ``kernel[grid](...)``; Triton picks the current
torch device and stream itself and caches compiled kernels per device, signature and constexprs.
The runner makes the tensors' device current first (``on_tensor_device``), so a kernel for tensors
on ``cuda:1`` compiles, loads and launches on device 1 while the caller's current device is 0.
A plan's recorded call describes its launch to the native replay, which then launches the compiled
kernel itself.

Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors) is not thread-safe: concurrent raw
``kernel[grid]`` calls on the CPU fail (5 to 11 of 24 in one run), so interpreted launches are
serialized by one lock per process; GPU launches are not.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import threading
from typing import Any

import torch

from ...spec import Config, ImplSpec
from ..device import on_tensor_device

__all__ = ["TritonBackend", "interpreting", "bind_arguments", "ptx_param_sizes"]

INTERPRETER_LOCK = threading.RLock()  # reentrant: a launch function may call another Triton op
# PTX parameter type -> bytes (anything else, e.g. an ``.align`` struct, counts as 0: no match)
_PTX_BYTES = {".u64": 8, ".b64": 8, ".s64": 8, ".f64": 8, ".u32": 4, ".b32": 4, ".s32": 4, ".f32": 4,
              ".u16": 2, ".b16": 2, ".s16": 2, ".f16": 2, ".u8": 1, ".b8": 1, ".s8": 1}


def interpreting() -> bool:
    """True when Triton kernels run on the CPU through Triton's interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def bind_arguments(jit: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Each parameter of a ``@triton.jit`` function that this call gives a value, positionally,
    by keyword or by default (launch options such as ``num_warps`` are not parameters)."""
    bound = dict(zip(jit.arg_names, args))
    for p in jit.params:
        if p.name not in bound:
            if p.name in kwargs:
                bound[p.name] = kwargs[p.name]
            elif p.default is not p._param.empty:
                bound[p.name] = p.default
    return bound


def ptx_param_sizes(ptx: str, name: str) -> list[int] | None:
    """The byte size of each parameter of kernel ``name`` in its PTX, or None if it is not there."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        return None
    return [_PTX_BYTES.get(k, 0) for k in re.findall(r"\.param\s+(\.\w+)", m.group(1))]


class TritonBackend:
    name = "triton"
    replayable = True  # JIT launches are described to the native replay (kernelgraft/backends/triton/replay.py)
    distributions = ("triton",)

    @functools.cache
    def available(self) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed (pip install triton)"
        return None

    def device_reason(self, device: torch.device) -> str | None:
        if device.type == "cuda":
            return None
        if device.type == "cpu" and interpreting():
            return None
        if device.type == "cpu":
            return "Triton runs on CUDA tensors (set TRITON_INTERPRET=1 to run it on the CPU)"
        return f"Triton does not run on {device.type} tensors"

    def bind(self, spec: ImplSpec, config: Config):
        assert spec.launch is not None
        return on_tensor_device(functools.partial(spec.launch, **config.as_dict()),
                                cpu_lock=INTERPRETER_LOCK)

    def compile_ahead(self, spec: ImplSpec, config: Config, args, target) -> tuple:
        from .ahead import compile_ahead

        return compile_ahead(spec, config, args, target)

    def warm_launches(self, device: torch.device) -> None:
        from .ahead import warm_launches

        warm_launches(device)

