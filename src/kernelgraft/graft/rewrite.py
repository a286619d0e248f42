"""Rewriting a graph with pattern grafts: every admitted match of a pattern becomes one op call.

The graph is matched in functional form (``_functional``): Inductor's post-grad graph is
functional already; an exported program's in-place steps are made out of place where nothing
else sees the write, and put back where no replacement took them. A match is admitted by
``Pattern.admit``; then one op call takes its place, after every input, before every outside
use (``_insertion_point`` for a pattern with several outputs). The op's outputs are fresh,
contiguous tensors: where the replaced code gave an output another layout, the graft copies it
into that layout (``_layout``), so the rest of the graph sees the strides it was traced with. A
site that cannot be replaced this way stays as it is, with the reason (``Misses``).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

from ..errors import describe
from . import (
    admit as _admit,
    explain as _explain,
    functional as _functional,
    layout as _layout,
    variants as _variants,
)
from .admit import Binding
from . import meta as _meta
from .meta import fake_value


__all__ = ["Misses", "rewrite_graph", "rewrite_exported"]

log = logging.getLogger(__name__)


@dataclass
class Misses:
    """What a rewrite left: sites that matched but were refused, and why a pattern replaced nothing."""

    kept: dict[str, str] = field(default_factory=dict)  # "%node (target)" -> why it stays
    reasons: list[tuple[int, str]] = field(default_factory=list)  # (closeness, text) per graph

    def reason(self) -> str | None:
        """The explanation from the graph whose closest site came closest."""
        return max(self.reasons, key=lambda r: r[0])[1] if self.reasons else None


def rewrite_graph(graph: fx.Graph, patterns: Sequence[Any], ir: str,
                  misses: Misses | None = None) -> tuple[int, dict[str, str]]:
    """Replace every admitted match of each pattern in ``graph``; returns (count, {old name: new
    name}). With ``misses``, records refused sites and, for a pattern that replaced nothing, why."""
    total = 0
    renamed: dict[str, str] = {}
    # A replaced output node -> the node that stands for it now: a later match may take it as an
    # input (the sum one block returns is the next block's residual).
    substitutes: dict[fx.Node, fx.Node] = {}
    lifted = _lift_asserts(graph) if ir == "export" else []
    # An exported program keeps its in-place steps; Inductor's graph is functional already.
    written = _functional.deinplace(graph, arguments=False) if ir == "export" else []
    for pattern in patterns:
        variants = pattern.variants(ir, graph)
        done = 0
        refused: dict[str, str] = {}
        for v in variants:
            # Overlaps are removed after admission: a refused match must not hide an admitted one.
            matcher = SubgraphMatcher(v.graph, match_output=False, match_placeholder=False,
                                      remove_overlapping_matches=False)
            taken: set[fx.Node] = set()
            for match in _matches(matcher, v.graph, graph):
                inner = {n for pn, n in match.nodes_map.items()
                         if pn.op not in ("placeholder", "output") and isinstance(n, fx.Node)}
                if inner & taken:
                    continue
                site = _site(match)
                binding = pattern.admit(v, match)
                if isinstance(binding, str):
                    if site not in refused or refused[site].endswith(_admit.OTHER_RANK):
                        refused[site] = binding  # another variant's reason says more than a rank
                    continue
                why = _replace(graph, pattern, match, binding, renamed, substitutes)
                if why is None:
                    done += 1
                    taken |= inner
                    refused.pop(site, None)
                elif why:
                    refused.setdefault(site, why)
        if done:
            pattern.replaced[ir] = pattern.replaced.get(ir, 0) + done
            total += done
        for site, why in refused.items():
            log.info("kg.graft: %s left as is at %s: %s", pattern.op.name, site, why)
        if misses is not None:
            misses.kept.update(refused)
        if not done and (misses is not None or log.isEnabledFor(logging.INFO)):
            closeness, text = _explain.explain(graph, pattern, variants, ir, refused)
            if misses is not None:
                misses.reasons.append((closeness, text))
            log.info("kg.graft: %s", text)
    _functional.reinplace(graph, written)
    _restore_asserts(graph, lifted, substitutes)
    if total or lifted:
        graph.lint()
    return total, renamed


def _matches(matcher: SubgraphMatcher, pattern: fx.Graph, graph: fx.Graph) -> list:
    """The matcher's matches, none where an op of the pattern is absent from the graph: the
    matcher starts from the pattern's last nodes, drops one that has no candidate instead of
    failing, and then assembles a match without the part behind it."""
    present = {n.target for n in graph.nodes if n.op == "call_function"}
    if any(n.target not in present for n in pattern.nodes if n.op == "call_function"):
        return []
    return matcher.match(graph)


def _site(match: Any) -> str:
    node = match.returning_nodes[0] if match.returning_nodes else match.anchors[0]
    return f"%{node.name} ({_admit.target(node)})"


def _lift_asserts(graph: fx.Graph) -> list[tuple]:
    """Take out the tensor-metadata assertions ``torch.export`` adds for ``.to()`` calls: they
    are users of the values they check, so a matched value they check would count as used
    outside its match. Returns what ``_restore_asserts`` puts back."""
    op = getattr(torch.ops.aten, "_assert_tensor_metadata", None)
    if op is None:
        return []
    lifted = []
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is op.default and not node.users:
            lifted.append((node.target, node.args, dict(node.kwargs), node.meta, node.next))
            graph.erase_node(node)
    return lifted


def _restore_asserts(graph: fx.Graph, lifted: list[tuple], substitutes: dict[fx.Node, fx.Node]) -> None:
    """Put the assertions back where they were, checking what stands for their value now; one
    whose value went inside a replacement (an intermediate of the kernel) is dropped."""
    for target, args, kwargs, meta, where in lifted:
        checked = args[0]
        while checked in substitutes:
            checked = substitutes[checked]
        if not isinstance(checked, fx.Node) or not _live(checked, graph):
            continue
        if _live(where, graph) and checked is args[0]:
            context = graph.inserting_before(where)
        else:
            context = graph.inserting_after(checked)
        with context:
            node = graph.call_function(target, (checked, *args[1:]), kwargs)
        node.meta = meta


def _insertion_point(graph: fx.Graph, match: Any, inputs: list[fx.Node]) -> fx.Node | None:
    """The node to insert a tuple op's call before: after every input, before the first use of
    an output outside the match; None when no such place exists (the match stays)."""
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    inner = {n for pn, n in match.nodes_map.items() if pn.op not in ("placeholder", "output")}
    returning = list(match.returning_nodes)
    after = max((order[n] for n in inputs), default=-1)
    outside = [u for r in returning for u in r.users if u not in inner]
    first_use = min((order[u] for u in outside), default=len(order))
    first_ret = min(order[r] for r in returning)
    if after >= first_use:
        return None
    # Inside the match's own span the call can go before its first output; else after the last input.
    return nodes[first_ret] if after < first_ret else nodes[after + 1]


def _live(node: fx.Node, graph: fx.Graph) -> bool:
    return node.graph is graph and not getattr(node, "_erased", False)


def _replace(graph: fx.Graph, pattern: Any, match: Any, binding: Binding, renamed: dict[str, str],
             substitutes: dict[fx.Node, fx.Node]) -> str | None:
    """Replace one match by one op call (and a getitem per output when it returns a tuple).
    None when replaced, else why not ("" when an earlier replacement took part of it)."""
    returning = list(match.returning_nodes)
    inputs = []
    for node in binding.inputs:
        while node in substitutes:
            node = substitutes[node]
        inputs.append(node)
    if not all(_live(n, graph) for n in returning + inputs):
        return ""  # part of it was consumed by an earlier replacement
    single = len(returning) == 1
    where = returning[0] if single else _insertion_point(graph, match, inputs)
    if where is None:
        return (f"no place for one {pattern.op.name} call: an output is used before another "
                "output's inputs are computed")
    with graph.inserting_before(where):
        args = _op_args(graph, pattern, inputs, binding.scalars)
        new = graph.call_function(pattern.op.overload, tuple(args))
        outs = [new] if single else [graph.call_function(operator.getitem, (new, i))
                                     for i in range(len(returning))]
    added = [a for a in args if isinstance(a, fx.Node) and a not in inputs] + [new] + ([] if single else outs)

    def undo(why: str) -> str:
        for node in reversed(added):
            graph.erase_node(node)
        return why

    try:
        val = fake_value(pattern.op.overload, args)
    except Exception as exc:
        return undo(f"{pattern.op.name} cannot take the matched values: {_variants.first_line(exc)}")
    vals = None if val is None else (val,) if single else tuple(val)
    if vals is not None:
        if len(vals) != len(returning):
            return undo(f"{pattern.op.name} returns {len(vals)} tensors where the pattern gave "
                        f"{len(returning)}")
        for r, v in zip(returning, vals):
            if not _same_kind(r.meta.get("val"), v):
                return undo(f"{pattern.op.name} returns {describe(v)} where the pattern gave "
                            f"{describe(r.meta.get('val'))}")
        if not single:
            new.meta = {"val": vals}
    finals = []
    for i, (r, out, v) in enumerate(zip(returning, outs, vals or [None] * len(outs))):
        out.meta = {"val": v} if v is not None else {}
        with graph.inserting_before(where):
            kept = _layout.keep_layout(graph, out, r.meta.get("val"), i)
        if isinstance(kept, str):
            return undo(f"{pattern.op.name} returns a fresh tensor and {kept}")
        added += kept or []
        final = kept[-1] if kept else out
        meta = dict(r.meta)
        meta.pop("tensor_meta", None)
        if final.meta.get("val") is not None:
            meta["val"] = final.meta["val"]
        final.meta = meta
        finals.append(final)
    # Inductor holds an op's inputs to these layouts (dense ones, see _op_args) only where the
    # node says what its eager inputs were; a node without them gets whatever layout is at hand.
    new.meta["eager_input_vals"] = (tuple(_meta.val(a) for a in args), {})
    names = [r.name for r in returning]
    for r, final in zip(returning, finals):
        r.replace_all_uses_with(final)
        substitutes[r] = final
    _erase_inner(graph, match)
    for final, name in zip(finals, names):
        final._rename(name)
        if final.name != name:
            renamed[name] = final.name
    return None


def _same_kind(original: Any, val: Any) -> bool:
    """The op's output may stand for the pattern's: same dtype and rank (where both are known)."""
    return not (isinstance(original, torch.Tensor) and isinstance(val, torch.Tensor)
                and (original.dtype != val.dtype or original.dim() != val.dim()))


def _op_args(graph: fx.Graph, pattern: Any, inputs: list[fx.Node], scalars: dict[int, Any]) -> list[Any]:
    """The op call's arguments: the matched inputs in the pattern's tensor slots (made dense
    where a match took a strided view), the model's scalars where the pattern reads them, the
    example's elsewhere."""
    args: list[Any] = list(pattern.example)
    for slot, value in scalars.items():
        args[slot] = value
    for slot, node in zip(pattern.tensor_slots, inputs):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and not val.is_contiguous():
            # the matched ops took any layout; kernels may need a dense one
            dense = graph.call_function(torch.ops.aten.clone.default, (node,),
                                        {"memory_format": torch.contiguous_format})
            dense.meta = {**node.meta, "val": val.clone(memory_format=torch.contiguous_format)}
            node = dense
        args[slot] = node
    return args


def _erase_inner(graph: fx.Graph, match: Any) -> None:
    inner = {n for pn, n in match.nodes_map.items() if pn.op not in ("placeholder", "output")}
    for node in reversed(list(graph.nodes)):
        if node in inner and not node.users:
            graph.erase_node(node)


# ---------------------------------------------------------------------------- ExportedProgram
def rewrite_exported(ep: Any, pattern: Any, misses: Misses | None = None) -> int:
    """Rewrite ``ep``'s graph in place; returns the number of replacements."""
    gm = ep.graph_module
    n, renamed = rewrite_graph(gm.graph, [pattern], "export", misses)
    if renamed:
        for spec in ep.graph_signature.output_specs:
            arg = getattr(spec, "arg", None)
            if arg is not None and getattr(arg, "name", None) in renamed:
                arg.name = renamed[arg.name]
    if n:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return n
