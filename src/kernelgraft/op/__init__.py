"""The operator: its definition, schema, registry, candidates, plans and the dispatcher that owns them."""

from .operator import KernelOp, op

__all__ = ["KernelOp", "op"]
