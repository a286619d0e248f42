"""Triton: the user's launch function issues ``kernel[grid](...)``; Triton compiles for the current device and launches on its current stream (on the CPU through ``TRITON_INTERPRET=1``). AOT: the one recorded launch, cross-compiled to a cubin.

This folder is the whole backend: ``spec.py`` (the ``kg.triton`` spec), ``jit.py`` (compile and launch),
``aot.py`` (what a bundle records and compiles). ``BACKEND`` is what ``kernelgraft.wiring``
registers."""

from .jit import TritonBackend
from .spec import TritonImpl, triton

__all__ = ["BACKEND", 'TritonImpl', 'triton']


class _Backend(TritonBackend):
    """The registered backend: its JIT side, and its AOT path (imported when a bundle is built)."""

    aot_optional = False  # a bundle that needs its toolchain and lacks it drops the candidates

    def aot(self):
        from . import aot

        return aot


BACKEND = _Backend()
