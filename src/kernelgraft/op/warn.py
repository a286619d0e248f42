"""Where a warning points: past kernelgraft's and torch's own frames, at the user's line."""

from __future__ import annotations

import os
import sys

import torch

__all__ = ["caller_stacklevel"]

# Frames in these directories are the library's own: a warning points past them at the user's line.
_INTERNAL = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                  for m in (sys.modules["kernelgraft"], torch))


def caller_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` in the caller that names the first frame outside
    kernelgraft and torch: an op called eagerly (``op(x)``: ``__call__``, ``execute``, planning), as
    ``torch.ops.ns.name`` (the dispatcher's frames) or from a compiled graph all point at user code."""
    frame = sys._getframe(1)  # the function calling warnings.warn: stacklevel 1
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame = frame.f_back
        level += 1
    return level
