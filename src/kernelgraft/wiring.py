"""Where kernelgraft's parts are connected, in one place, when ``import kernelgraft`` runs.

No module of kernelgraft registers or installs anything when it is imported; ``wire()`` does it all:
- the backends: the built-in folders under ``kernelgraft/backends/``, the stand-in backend that
  serves ops rebuilt from a bundle's manifest, and any package's backend declared under the
  ``kernelgraft.backends`` entry point group;
- the chooser every op asks once per new input signature: the autotuner;
- the hook fake tensors reach when a compile traces an op: Inductor's in-graph choice (graft).

``wire()`` is idempotent (a re-import, ``importlib.reload``)."""

from __future__ import annotations

from . import backends
from .aot import bundled_op
from .backends import cuda, cutedsl, cutile, triton
from .graft import inline
from .op import operator, select
from .tune import tuner

__all__ = ["wire", "BUILTIN_BACKENDS"]

BUILTIN_BACKENDS = (triton.BACKEND, cuda.BACKEND, cutile.BACKEND, cutedsl.BACKEND, bundled_op.BACKEND)


def wire() -> None:
    for backend in BUILTIN_BACKENDS:
        backends.register(backend)
    backends.load_entry_points()
    select.set_chooser(tuner.TUNER)
    operator.add_trace_hook(inline.on_trace)
