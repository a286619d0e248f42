"""Fake values for the nodes a graft puts into a graph.

Every node a rewrite adds carries ``meta["val"]``, as the nodes around it do: Inductor lowers from
those values, the next rewrite matches by them, and layouts are compared on them. A value is
computed by running the node's target on the fake values of its arguments, in the fake mode those
come from (a compile's, an exported program's); a graph traced in real mode has one fake mode per
node, and its values are copied into a fresh mode of their own.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

__all__ = ["fake_value", "val"]


def val(arg: Any) -> Any:
    """The value a graph argument stands for: a node's ``meta["val"]``, else the literal."""
    return arg.meta.get("val") if isinstance(arg, fx.Node) else arg


def fake_value(target: Any, args: tuple | list, kwargs: dict | None = None) -> Any:
    """``target(*args, **kwargs)`` on the fake values of ``args``; None when a node argument has
    no tensor value to run it on."""
    kwargs = kwargs or {}
    nodes = [a for a in pytree.tree_leaves((list(args), kwargs)) if isinstance(a, fx.Node)]
    if any(not isinstance(val(n), (torch.Tensor, torch.SymInt, int, float, bool)) for n in nodes):
        return None
    vals, kvals = pytree.tree_map(val, (list(args), kwargs))
    from torch._guards import detect_fake_mode

    tensors = [v for v in pytree.tree_leaves((vals, kvals)) if isinstance(v, torch.Tensor)]
    try:
        mode = detect_fake_mode(tensors)
    except AssertionError:
        mode = None  # values from several fake modes (make_fx in real mode makes one per node)
    if mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode()
        with mode:
            vals, kvals = pytree.tree_map_only(
                torch.Tensor,
                lambda v: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device),
                (vals, kvals))
    with mode:
        return target(*vals, **kvals)
