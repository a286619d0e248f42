"""Backends behind one protocol (see ``_base.Backend``); importing this registers the built-in ones."""

from ._base import Backend, get, names, register
from . import _triton  # noqa: F401  (registers itself)
from . import _cuda  # noqa: F401  (registers itself)
from . import _cutile  # noqa: F401  (registers itself; unavailable without cuda-tile)
from . import _cutedsl  # noqa: F401  (registers itself; unavailable without nvidia-cutlass-dsl)

__all__ = ["Backend", "get", "names", "register"]
