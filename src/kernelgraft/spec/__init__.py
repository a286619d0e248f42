"""Kernel specs, one small class per backend: frozen, hashable, validated when created."""

from .base import Config, ImplSpec, TritonImpl, callable_source, normalize_capability, triton
from ..backends.cuda.spec import CudaImpl, Launch, ctype, cuda
from ..backends.cute_specs import CuTileImpl, CuteDSLImpl, cutedsl, cutile, kernel_sources

__all__ = [
    "Config", "ImplSpec", "TritonImpl", "callable_source", "normalize_capability", "triton",
    "CudaImpl", "Launch", "ctype", "cuda", "CuTileImpl", "CuteDSLImpl", "cutedsl", "cutile",
    "kernel_sources",
]
