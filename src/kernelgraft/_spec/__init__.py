"""Kernel specs, one small class per backend: frozen, hashable, validated when created."""

from ._base import Config, ImplSpec, TritonImpl, callable_source, normalize_capability, triton
from ._cuda import CudaImpl, Launch, ctype, cuda
from ._cute import CuTileImpl, CuteDSLImpl, cutedsl, cutile, kernel_sources

__all__ = [
    "Config", "ImplSpec", "TritonImpl", "callable_source", "normalize_capability", "triton",
    "CudaImpl", "Launch", "ctype", "cuda", "CuTileImpl", "CuteDSLImpl", "cutedsl", "cutile",
    "kernel_sources",
]
