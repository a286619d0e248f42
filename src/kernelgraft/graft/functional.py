"""Patterns and models are matched in functional form: an in-place step (``w /= s``, ``x.mul_(2)``,
``h.add_(r)``) is the same computation as its out-of-place spelling, and matches the same code.

- Inductor's IR: the model's graph is functional already (AOTAutograd functionalizes it before the
  pattern pass runs). A pattern is traced through ``torch.func.functionalize``, which rewrites its
  in-place steps as AOTAutograd rewrites the model's (writes through views included).
- torch.export's IR keeps in-place steps, in the program and in a pattern traced with it. Both are
  made functional where that changes nothing observable (``deinplace``): an in-place ATen op becomes
  its out-of-place overload when the tensor it writes is a fresh value (an op's result that is no
  view), no view of it exists, nothing reads it after the write, and the out-of-place result has
  its dtype, shape and layout. The program's writes that end up outside every replacement are put
  back (``reinplace``), so a graft changes only the sites it replaces.

What a pattern writes into its own arguments is not part of what it computes: the op stands for
the values the pattern returns. Where the model reads a value written in place afterwards, that
value is used outside the match, and the site is left as is. A pattern that still writes a
tensor in place after this (through a view of another tensor, or one read again after the write)
cannot be matched as data flow and is refused (``check_writes``), naming the step.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from .layout import same_layout
from .meta import fake_value

__all__ = ["functionalized", "deinplace", "reinplace", "check_writes"]


def functionalized(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its in-place steps rewritten out of place (views stay views), as AOTAutograd
    rewrites a model's before Inductor's passes see it."""
    return torch.func.functionalize(fn, remove="mutations")


def _schema(target: Any) -> Any:
    return target._schema if isinstance(target, torch._ops.OpOverload) else None


def _writes(target: Any) -> bool:
    schema = _schema(target)
    return schema is not None and schema.is_mutable


def _out_of_place(target: Any) -> Any:
    """The out-of-place overload of an in-place ATen op that writes only its first argument
    (``aten.div_.Tensor`` -> ``aten.div.Tensor``), with the same arguments; None if there is none."""
    schema = _schema(target)
    if schema is None or len(schema.returns) != 1 or not schema.arguments:
        return None
    written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if written != [schema.arguments[0]]:
        return None
    namespace, _, name = schema.name.partition("::")
    if not name.endswith("_") or name.endswith("__"):
        return None
    packet = getattr(getattr(torch.ops, namespace, None), name[:-1], None)
    other = getattr(packet, target._overloadname, None) if packet is not None else None
    theirs = _schema(other)
    if theirs is None or theirs.is_mutable or len(theirs.returns) != 1:
        return None
    if [a.name for a in theirs.arguments] != [a.name for a in schema.arguments]:
        return None
    return other


def _fresh(node: fx.Node, arguments: bool) -> bool:
    """Whether ``node``'s value is a tensor nothing else shares: an op's result that is no view
    (or, with ``arguments``, a graph input)."""
    if node.op == "placeholder":
        return arguments
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:  # one result of a multi-output op (topk's values)
        source = node.args[0]
        return isinstance(source, fx.Node) and source.op == "call_function" and _no_alias(source.target)
    return _no_alias(node.target)


def _no_alias(target: Any) -> bool:
    schema = _schema(target)
    return schema is not None and all(r.alias_info is None for r in schema.returns)


def _unobserved(node: fx.Node, written: fx.Node, order: dict[fx.Node, int]) -> bool:
    """Whether writing ``written`` in place at ``node`` is seen only through ``node``'s result: no
    view of it exists, and every other reader comes before the write."""
    for user in written.users:
        if user is node:
            continue
        if user.op != "call_function" or not _no_alias(user.target) or order[user] > order[node]:
            return False
    return True


def deinplace(graph: fx.Graph, *, arguments: bool) -> list[tuple[fx.Node, Any]]:
    """Make each in-place step of ``graph`` whose write nothing else observes out of place (see the
    module's docstring); with ``arguments`` (a pattern's graph), writes into graph inputs too.
    Returns ``[(node, its in-place target)]`` for ``reinplace``."""
    changed: list[tuple[fx.Node, Any]] = []
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        functional = _out_of_place(node.target)
        written = node.args[0]
        if functional is None or not _fresh(written, arguments) or not _unobserved(node, written, order):
            continue
        before = node.meta.get("val")
        try:
            after = fake_value(functional, node.args, node.kwargs)
        except Exception:  # arguments the out-of-place op does not take the same way
            continue
        if not (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)
                and before.dtype == after.dtype and same_layout(before, after)):
            continue  # type promotion or broadcasting: the in-place step computes something else
        changed.append((node, node.target))
        node.target = functional
    return changed


def reinplace(graph: fx.Graph, changed: list[tuple[fx.Node, Any]]) -> None:
    """Give the steps ``deinplace`` changed and no rewrite consumed their in-place targets back."""
    for node, target in changed:
        if node.graph is graph and not getattr(node, "_erased", False) and node.op == "call_function":
            node.target = target


def check_writes(graph: fx.Graph) -> None:
    """Raise ValueError naming the first in-place write left in a pattern's traced graph, other
    than the copies back into its own arguments that functionalization adds."""
    for node in graph.nodes:
        if node.op != "call_function" or not _writes(node.target):
            continue
        dest = node.args[0] if node.args else None
        if node.target is torch.ops.aten.copy_.default and isinstance(dest, fx.Node) and dest.op == "placeholder":
            continue  # the write-back of an argument the pattern wrote: not part of what it returns
        what = f"%{dest.name}" if isinstance(dest, fx.Node) else "a tensor"
        raise ValueError(
            f"the pattern writes {what} in place ({str(node.target).replace('torch.ops.', '')}) where "
            "the write is seen other than through its result (a view of another tensor, or a value "
            "read again after the write); a graft replaces values, so write that step out of place")
