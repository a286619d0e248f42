"""cuTile: the launch function returns ``(grid, kernel, args)``; ``ct.launch`` where cuTile compiles here, else cubins exported ahead of time. AOT: ``cuda.tile.compilation.export_kernel`` (optional toolchain).

This folder is the whole backend: ``spec.py`` (the ``kg.cutile`` spec), ``jit.py`` (compile and launch),
``aot.py`` (what a bundle records and compiles). ``BACKEND`` is what ``kernelgraft.wiring``
registers."""

from .jit import CuTileBackend
from .spec import CuTileImpl, cutile

__all__ = ["BACKEND", 'CuTileImpl', 'cutile']


class _Backend(CuTileBackend):
    """The registered backend: its JIT side, and its AOT path (imported when a bundle is built)."""

    aot_optional = True  # its toolchain is an optional extra: without it, bundles skip it

    def aot(self):
        from . import aot

        return aot


BACKEND = _Backend()
