"""Grafting ops into existing models: ``kg.lower_as``, ``kg.graft``, ``kg.ungraft``.

- ``@kg.lower_as(op)`` on a function or a module's ``forward``: calls go to the op.
- ``kg.graft(model, {ModuleType: op})``: replace the forward of matching modules.
- ``kg.graft(model, pattern=fn, replacement=op)``: replace subgraphs equal to ``fn`` under
  ``torch.compile`` (Inductor) and in an ``ExportedProgram``.
- ``kg.ungraft(model)``: undo.

Under Inductor, an op call gives way to its reference where the tuner found Inductor's code no
slower than a call of the kernel, max(its GPU time, its host time) (``_inline``; installed with
this package, active once a compile traces an op).
"""

from . import inline as _inline  # noqa: F401  (installs the trace hook)
from .apply import GraftReport, graft, ungraft
from .lower_as import lower_as

__all__ = ["lower_as", "graft", "ungraft", "GraftReport"]
