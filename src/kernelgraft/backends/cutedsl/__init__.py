"""CuTe DSL: the launch function returns ``(host_fn, args)``; kernelgraft compiles ``host_fn`` with ``cute.compile`` and calls it with packed arguments. AOT: a shared library per kernel (optional toolchain).

This folder is the whole backend: ``spec.py`` (the ``kg.cutedsl`` spec), ``jit.py`` (compile and launch),
``aot.py`` (what a bundle records and compiles). ``BACKEND`` is what ``kernelgraft.wiring``
registers."""

from .jit import CuteDSLBackend
from .spec import CuteDSLImpl, cutedsl

__all__ = ["BACKEND", 'CuteDSLImpl', 'cutedsl']


class _Backend(CuteDSLBackend):
    """The registered backend: its JIT side, and its AOT path (imported when a bundle is built)."""

    aot_optional = True  # its toolchain is an optional extra: without it, bundles skip it

    def aot(self):
        from . import aot

        return aot


BACKEND = _Backend()
