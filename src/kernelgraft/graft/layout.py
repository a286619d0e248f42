"""A replacement's outputs keep the layout the replaced code gave them.

The code a pattern graft replaces may return a tensor that is not contiguous: elementwise ops on a
transposed ``q`` (Hugging Face Llama's RoPE) return ``q``'s layout, and the model's later views
(``.transpose(1, 2).view(...)``) are written for it. An op's kernels write the outputs kernelgraft
allocates for them, contiguous unless the op says otherwise, so the graft puts the replaced
layout back in the rewritten graph, after the op call:

- a dense layout in another dim order: ``permute -> clone(contiguous) -> permute back``, one copy
  that Inductor fuses with the ops that read it where it can;
- a layout with gaps (a slice of a larger tensor): the output is written into a buffer of the
  replaced code's extent (``as_strided_scatter``) and viewed with its strides (``as_strided``);
- an overlapping layout (a broadcast, ``expand``) cannot be made from a fresh tensor: the site is
  left as is, with the reason.

Only significant strides count (those of dims longer than 1): they are what decides which views a
tensor takes. The storage offset is not kept. Kernels are never handed strided outputs, so the
eager path of an op stays as it is; the copy exists only in grafted graphs, and only where the
layouts differ.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch._prims_common import compute_elementwise_output_logical_to_physical_perm, is_non_overlapping_and_dense_or_false

from .meta import fake_value

__all__ = ["same_layout", "keep_layout"]

_aten = torch.ops.aten


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape and the same strides in every dim longer than 1 (known statically)."""
    # imported here: symbolic_shapes imports sympy (0.3-0.8 s), which a graft's trace has already
    # paid and a process that only calls ops never needs
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if a.dim() != b.dim() or not all(statically_known_true(x == y) for x, y in zip(a.shape, b.shape)):
        return False
    if statically_known_true(a.numel() <= 1):
        return True
    return all(statically_known_true(n <= 1) or statically_known_true(s == t)
               for n, s, t in zip(a.shape, a.stride(), b.stride()))


def _static(t: torch.Tensor) -> bool:
    return all(type(x) is int for x in (*t.shape, *t.stride()))


def _apart(t: torch.Tensor) -> bool:
    """Whether no two elements of ``t`` share memory, shown by ordering its dims by stride: each
    stride spans the extent of the dims inside it (sizes and strides known, ``_static``)."""
    extent = 1
    for n, s in sorted(((n, s) for n, s in zip(t.shape, t.stride()) if n > 1), key=lambda d: d[1]):
        if s < extent:
            return False
        extent += (n - 1) * s
    return True


def keep_layout(graph: fx.Graph, node: fx.Node, want: Any, index: int) -> list[fx.Node] | str | None:
    """Nodes inserted at the graph's insertion point that give ``node``'s value (an op's output)
    the layout of ``want`` (the replaced code's value of output ``index``): the last of them
    stands for it. None when the layouts agree already; the reason when no layout-keeping copy
    can be made (then nothing was inserted)."""
    got = node.meta.get("val")
    if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor) or same_layout(want, got):
        return None
    where = f"output {index} of the replaced code has strides {_strides(want)}"
    added: list[fx.Node] = []

    def call(target: Any, *args: Any, **kwargs: Any) -> fx.Node:
        new = graph.call_function(target, args, kwargs)
        added.append(new)
        new.meta = {**{k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack")},
                    "val": fake_value(target, args, kwargs)}
        return new

    try:
        if is_non_overlapping_and_dense_or_false(want):
            perm, _ = compute_elementwise_output_logical_to_physical_perm(want)
            back = [perm.index(i) for i in range(len(perm))]
            dense = call(_aten.clone.default, call(_aten.permute.default, node, list(perm)),
                         memory_format=torch.contiguous_format)
            out = call(_aten.permute.default, dense, back)
        elif not _static(want):
            # ordering symbolic strides would add guards to the compile
            return f"{where}, with gaps and symbolic sizes, which the graft does not copy into"
        elif not _apart(want):
            return f"{where}, which overlaps itself (a broadcast view); a fresh tensor cannot take that layout"
        else:
            extent = 1 + sum((n - 1) * s for n, s in zip(want.shape, want.stride()))
            buffer = call(_aten.new_empty.default, node, [extent])
            written = call(_aten.as_strided_scatter.default, buffer, node, list(want.shape),
                           list(want.stride()), 0)
            out = call(_aten.as_strided.default, written, list(want.shape), list(want.stride()), 0)
        if not same_layout(want, out.meta["val"]):
            raise ValueError(f"the copy has strides {_strides(out.meta['val'])}")
    except Exception as exc:  # a layout whose order cannot be decided (symbolic sizes), a failing fake run
        for n in reversed(added):
            graph.erase_node(n)
        return f"{where}, which the op's output could not be given: {type(exc).__name__}: {exc}"
    return added


def _strides(t: torch.Tensor) -> tuple:
    return tuple(t.stride())
