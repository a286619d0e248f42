"""The operator: its definition, schema, registry, candidates, plans and the dispatcher that owns them.

Other packages use the op's public surface (``KernelOp``'s methods and properties, ``op.dispatcher``)
and the modules here by name; nothing in this package imports a package above it."""

from .api import op, unregister
from .operator import KernelOp

__all__ = ["KernelOp", "op", "unregister"]
