"""Triton: the user's launch function issues ``kernel[grid](...)``; Triton picks the current
torch stream itself and caches compiled kernels per signature and constexprs. A plan's recorded
call describes its launch to the native replay, which then launches the compiled kernel itself."""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from .._spec import Config, ImplSpec
from ._base import register

__all__ = ["TritonBackend", "interpreting"]


def interpreting() -> bool:
    """True when Triton kernels run on the CPU through Triton's interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"


class TritonBackend:
    name = "triton"
    replayable = True  # JIT launches are described to the native replay (kernelgraft/_native/_triton.py)

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
        return functools.partial(spec.launch, **config.as_dict())


register(TritonBackend())
