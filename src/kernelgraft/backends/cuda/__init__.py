"""CUDA C++ through NVRTC: the launch function returns ``kg.Launch``; kernelgraft compiles the source (cached by a deliberate key) and launches through ``kernelgraft.driver``. AOT: the same compile, for each arch.

This folder is the whole backend: ``spec.py`` (the ``kg.cuda`` spec), ``jit.py`` (compile and launch),
``aot.py`` (what a bundle records and compiles). ``BACKEND`` is what ``kernelgraft.wiring``
registers."""

from .jit import CudaBackend
from .spec import CudaImpl, cuda, Launch, ctype

__all__ = ["BACKEND", 'CudaImpl', 'cuda', 'Launch', 'ctype']


class _Backend(CudaBackend):
    """The registered backend: its JIT side, and its AOT path (imported when a bundle is built)."""

    aot_optional = False  # a bundle that needs its toolchain and lacks it drops the candidates

    def aot(self):
        from . import aot

        return aot


BACKEND = _Backend()
