"""The graphs a pattern is matched with: traced per (IR, dtype, rank), scalars and dims as wildcards.

A trace bakes in what its example inputs were; each of these is generalised where that is sound:

- dtype: a ``.to(float32)`` is a node in a bf16 graph and nothing in an fp32 one, so the pattern is
  traced once per floating dtype the model uses (and once with the example's own dtypes).
- rank: the IR spells dims as decompositions leave them (``layer_norm`` at rank 2 reduces over
  ``[1]``, at rank 3 over ``[2]``), so the pattern is traced again at each rank the model's
  candidate sites have, by adding (or dropping) leading dims of the example's highest-rank tensors.
  A variant matches only sites of its own ranks, node for node (see ``Pattern.admit``): a dim that
  means "last" at rank 2 is never read at rank 3.
- scalars (``eps``, a slope, a flag): each float/int/bool argument of the op is traced once more at
  another value; when only literals equal to it change, they become one placeholder that the
  matcher binds to the model's value (equal at every use) and that is passed to the op. A scalar
  that changes anything else (a computed constant, the graph's structure) stays fixed at the
  example's value, with the reason kept for the no-match report.
- dims: a ``dim`` argument becomes a placeholder checked after the match, so ``mean`` over ``2``
  at rank 3 matches a pattern's ``mean`` over ``-1``.
- in-place steps: the pattern is traced in functional form (``_functional``), so ``w /= s`` traces
  as ``w / s`` does.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from . import functional as _functional

__all__ = ["Variant", "VariantKey", "trace", "build", "diff", "same", "rank", "input_rank",
           "normalize_dims", "first_line", "DIM_ARGS"]

log = logging.getLogger(__name__)

# Schema argument names that hold dims (normalised by the input's rank when compared).
DIM_ARGS = frozenset({"dim", "dims", "dim0", "dim1", "start_dim", "end_dim"})
_SCALAR_KINDS = ("float", "int", "bool")


@dataclass(frozen=True)
class VariantKey:
    dtype: torch.dtype | None  # None: the example's own dtypes
    ranks: tuple[int | None, ...]  # per op argument: the tensor's rank, None for non-tensors


@dataclass(eq=False)
class Variant:
    """One traced graph of a pattern and what its placeholders stand for."""

    key: VariantKey
    graph: fx.Graph  # what the matcher sees: scalar and dim literals replaced by placeholders
    base: fx.Graph  # as traced at the example's scalars (confirmation diffs are against it)
    tensors: list[torch.Tensor]  # the example tensors of this variant, in tensor-slot order
    inputs: list[fx.Node]  # the tensor placeholders, in tensor-slot order
    scalars: dict[int, fx.Node] = field(default_factory=dict)  # op argument index -> placeholder
    positions: dict[int, list[tuple[int, tuple]]] = field(default_factory=dict)  # slot -> leaves
    dims: list[tuple[fx.Node, fx.Node, str, Any]] = field(default_factory=list)  # (ph, node, arg, value)
    fixed: dict[int, str] = field(default_factory=dict)  # scalar slot -> why it stays fixed
    ir: str = "inductor"  # "inductor", "export" or "export_core" (after run_decompositions)

    def role(self, node: fx.Node) -> str:
        if node in self.inputs:
            return "tensor"
        if node in self.scalars.values():
            return "scalar"
        if any(node is d[0] for d in self.dims):
            return "dim"
        return "node"

    @property
    def label(self) -> str:
        ranks = sorted({r for r in self.key.ranks if r is not None})
        dtype = ("the example's dtypes" if self.key.dtype is None
                 else str(self.key.dtype).replace("torch.", ""))
        return f"rank {'/'.join(map(str, ranks))}, {dtype}"


def rank(value: Any) -> int | None:
    return value.dim() if isinstance(value, torch.Tensor) else None


# ---------------------------------------------------------------------------- tracing
def trace(ir: str, fn: Callable, tensors: list[torch.Tensor]) -> list[fx.Graph]:
    """``fn`` traced into ``ir`` ("inductor" or "export"), without dead nodes."""
    # The Inductor pass may run inside a compile's fake mode; trace with real tensors. torch's
    # pytree deprecation warnings from export say nothing to the user.
    with unset_fake_temporarily(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*LeafSpec.*")
        return [_clean(gm.graph) for gm in _trace_modules(ir, fn, tensors)]


def _trace_modules(ir: str, fn: Callable, tensors: list[torch.Tensor]) -> list[fx.GraphModule]:
    """``fn`` traced into ``ir`` in functional form (``_functional``): a ValueError names an
    in-place step that cannot be made out of place."""
    if ir == "inductor":
        from torch._inductor.pattern_matcher import fwd_only

        gm = fwd_only(_functional.functionalized(fn), tensors)
        _functional.check_writes(gm.graph)
        return [gm]
    if ir in ("export", "export_core"):

        class _Wrap(torch.nn.Module):
            def forward(self, *ts):
                return fn(*ts)

        ep = torch.export.export(_Wrap(), tuple(tensors), strict=False)
        _functional.deinplace(ep.graph_module.graph, arguments=True)
        _functional.check_writes(ep.graph_module.graph)
        ep.graph_module.recompile()
        # "export_core": for programs the user ran run_decompositions() on (seconds per call, so
        # only traced when the program's graph is not in the as-exported form)
        return [ep.run_decompositions().graph_module if ir == "export_core" else ep.graph_module]
    raise ValueError(ir)


def _clean(graph: fx.Graph) -> fx.Graph:
    """A copy without nodes that do not feed the output (assertions, unused sizes)."""
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    live: set[fx.Node] = set()
    stack = [output]
    while stack:
        node = stack.pop()
        if node in live:
            continue
        live.add(node)
        stack.extend(node.all_input_nodes)
    for node in graph.nodes:
        if node.op == "placeholder" or node in live:
            env[node] = new.node_copy(node, lambda n: env[n])
    return new


# ---------------------------------------------------------------------------- literal leaves
def _leaves(value: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    if isinstance(value, (list, tuple)):
        out = [(path, type(value))]  # the container's kind and length are part of the structure
        for i, v in enumerate(value):
            out += _leaves(v, path + (i,))
        out.append((path + ("len",), len(value)))
        return out
    return [(path, value)]


def _node_leaves(node: fx.Node, index: dict[fx.Node, int]) -> list[tuple[tuple, Any]]:
    def leaf(v):
        return ("node", index[v]) if isinstance(v, fx.Node) else v

    out = []
    for path, v in _leaves(list(node.args), ("args",)) + _leaves(
            [node.kwargs[k] for k in sorted(node.kwargs)], ("kwargs", tuple(sorted(node.kwargs)))):
        out.append((path, leaf(v) if isinstance(v, fx.Node) else v))
    return out


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def diff(g0: fx.Graph, g1: fx.Graph) -> list[tuple[int, tuple, Any, Any]] | None:
    """Where two traces of one function differ: ``[(node index, leaf path, value0, value1)]``
    over literal leaves; None when they differ in anything but literals (structure, targets)."""
    n0, n1 = list(g0.nodes), list(g1.nodes)
    if len(n0) != len(n1):
        return None
    i0 = {n: i for i, n in enumerate(n0)}
    i1 = {n: i for i, n in enumerate(n1)}
    out = []
    for k, (a, b) in enumerate(zip(n0, n1)):
        if a.op != b.op or a.target != b.target:
            return None
        la, lb = _node_leaves(a, i0), _node_leaves(b, i1)
        if len(la) != len(lb):
            return None
        for (pa, va), (pb, vb) in zip(la, lb):
            if pa != pb:
                return None
            if isinstance(va, tuple) and va[:1] == ("node",) or isinstance(vb, tuple) and vb[:1] == ("node",):
                if va != vb:
                    return None
                continue
            if isinstance(va, type) or isinstance(vb, type) or pa[-1:] == ("len",):
                if va != vb:
                    return None
                continue
            if not same(va, vb):
                out.append((k, pa, va, vb))
    return out


def _set_leaf(node: fx.Node, path: tuple, value: Any) -> None:
    """Replace the literal at ``path`` (from ``_node_leaves``) in ``node``'s arguments."""
    def put(container, rest):
        items = list(container)
        if len(rest) == 1:
            items[rest[0]] = value
        else:
            items[rest[0]] = put(items[rest[0]], rest[1:])
        return type(container)(items) if not isinstance(container, list) else items

    if path[0] == "args":
        node.args = tuple(put(list(node.args), path[1:]))
    else:
        names = path[1]
        name = names[path[2]]
        if len(path) == 3:
            node.update_kwarg(name, value)
        else:
            node.update_kwarg(name, put(node.kwargs[name], path[3:]))


# ---------------------------------------------------------------------------- building variants
def _perturbed(value: Any) -> Any:
    """Another value of the same kind, in the same range as far as possible (a positive eps stays
    positive, a probability stays in [0, 1])."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    return value / 2 if value else 0.125


def build(ir: str, key: VariantKey, tensors: list[torch.Tensor], call: Callable[[list, dict], Any],
          example: tuple, params: tuple, tensor_slots: tuple[int, ...]) -> list[Variant]:
    """The variants of one (dtype, ranks) trace: ``call(tensors, {slot: scalar})`` runs the
    pattern. ``params`` are the op's ``Param``s (names and kinds of its arguments)."""
    bases = trace(ir, lambda *ts: call(list(ts), {}), tensors)
    scalar_slots = [i for i, p in enumerate(params)
                    if i not in tensor_slots and p.kind in _SCALAR_KINDS
                    and isinstance(example[i], (bool, int, float))]
    # Per scalar: trace once more at another value; the leaves that change (per base graph).
    found: dict[int, list[list | None | str]] = {}
    for slot in scalar_slots:
        other = _perturbed(example[slot])
        try:
            again = trace(ir, lambda *ts, s=slot, v=other: call(list(ts), {s: v}), tensors)
        except Exception as exc:
            why = f"tracing it with {params[slot].name}={other!r} failed: {first_line(exc)}"
            found[slot] = [why] * len(bases)
            continue
        per = []
        for g0, g1 in zip(bases, again):
            d = diff(g0, g1)
            if d is None or len(again) != len(bases):
                per.append(f"the pattern traced with {params[slot].name}={other!r} is a different graph")
                continue
            direct = [(k, p) for k, p, v0, v1 in d
                      if same(v0, example[slot]) and same(v1, other)]
            if len(direct) != len(d):
                per.append(f"{params[slot].name} enters the pattern through a computed value")
                continue
            per.append(direct)
        found[slot] = per
    out = []
    for gi, base in enumerate(bases):
        graph = fx.Graph()
        out_node = graph.graph_copy(base, {})
        graph.output(out_node)
        nodes = list(graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        variant = Variant(key=key, graph=graph, base=base, tensors=tensors,
                          inputs=placeholders[:len(tensor_slots)], ir=ir)
        first = next(n for n in nodes if n.op != "placeholder")
        replaced: set[tuple[int, tuple]] = set()
        for slot in scalar_slots:
            where = found[slot][gi]
            if isinstance(where, str):
                variant.fixed[slot] = where
                continue
            if not where:
                continue  # the pattern does not use it
            with graph.inserting_before(first):
                ph = graph.placeholder(f"kg_scalar_{params[slot].name}")
            for k, path in where:
                _set_leaf(nodes[k], path, ph)
                replaced.add((k, path))
            variant.scalars[slot] = ph
            variant.positions[slot] = list(where)
        for k, node in enumerate(nodes):
            _dim_placeholders(graph, node, first, variant, replaced, k)
        graph.lint()
        out.append(variant)
    return out


def _dim_placeholders(graph: fx.Graph, node: fx.Node, first: fx.Node, variant: Variant,
                      replaced: set, k: int) -> None:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return
    for i, arg in enumerate(target._schema.arguments):
        if arg.name not in DIM_ARGS or "int" not in str(arg.type):
            continue
        if i < len(node.args) and not arg.kwarg_only:
            value, path = node.args[i], ("args", i)
        elif arg.name in node.kwargs:
            value, path = node.kwargs[arg.name], ("kwargs", tuple(sorted(node.kwargs)),
                                                  sorted(node.kwargs).index(arg.name))
        else:
            continue
        ok = isinstance(value, int) or (isinstance(value, (list, tuple)) and value
                                        and all(isinstance(v, int) for v in value))
        if not ok or isinstance(value, bool) or (k, path) in replaced:
            continue
        with graph.inserting_before(first):
            ph = graph.placeholder(f"kg_dim_{node.name}_{arg.name}")
        _set_leaf(node, path, ph)
        variant.dims.append((ph, node, arg.name, value))


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def normalize_dims(value: Any, ndim: int | None) -> Any:
    """``value`` (an int or list of ints) with negative dims made non-negative at rank ``ndim``."""
    if ndim is None:
        return value
    n = max(ndim, 1)
    if isinstance(value, int) and not isinstance(value, bool):
        return value % n if -n <= value < n else None
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool)
                                                for v in value):
        return [normalize_dims(v, ndim) for v in value]
    return None


def input_rank(node: fx.Node) -> int | None:
    """The rank of a node's first tensor argument (what its dims index)."""
    for a in node.args:
        if isinstance(a, fx.Node):
            return rank(a.meta.get("val"))
    return None
