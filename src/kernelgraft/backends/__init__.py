"""Backends behind one protocol (see ``_base.Backend``); importing this registers the built-in ones."""

from .base import Backend, get, names, register
from .triton import jit as _triton  # noqa: F401  (registers itself)
from .cuda import jit as _cuda  # noqa: F401  (registers itself)
from .cutile import jit as _cutile  # noqa: F401  (registers itself; unavailable without cuda-tile)
from .cutedsl import jit as _cutedsl  # noqa: F401  (registers itself; unavailable without nvidia-cutlass-dsl)

__all__ = ["Backend", "get", "names", "register"]
