"""Why a pattern graft replaced nothing: the pattern looked for, and where the closest sites differ.

The explanation walks each variant's graph backwards from its last node against every model node
with the same target, as the matcher does, but instead of failing at the first difference it
records it and how many pattern nodes agreed before it. The closest sites are reported with that
difference ("pattern expects aten.mean.dim with dim=[-1]; the model has dim=[0]"), together with
the variants that could not be traced (a rank the op's ``ndim`` excludes), scalars that stay fixed,
and matches refused after matching (their reason comes from ``Pattern.admit``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from . import variants as _variants

__all__ = ["explain"]

_MAX_SITES = 2
_SHAPE_ARGS = ("size", "shape", "sizes", "normalized_shape", "split_size", "split_sizes", "stride")


def _name(node: fx.Node) -> str:
    if node.op != "call_function":
        return f"%{node.name}"
    if isinstance(node.target, torch._ops.OpOverload):
        return str(node.target)
    return getattr(node.target, "__name__", str(node.target))  # operator.getitem


def _site(node: fx.Node) -> str:
    r = _variants.rank(node.meta.get("val"))
    return f"%{node.name} ({_name(node)}{f', rank {r}' if r is not None else ''})"


def _ops(graph: fx.Graph) -> str:
    return " -> ".join(_name(n) for n in graph.nodes if n.op == "call_function")


def _aligned(pn: fx.Node, gn: fx.Node) -> list[tuple[str, Any, Any]] | None:
    """(argument name, pattern value, model value) in schema order, defaults filled in."""
    target = pn.target
    if isinstance(target, torch._ops.OpOverload):
        names, values = [], ([], [])
        for i, arg in enumerate(target._schema.arguments):
            names.append(arg.name)
            for k, node in enumerate((pn, gn)):
                if arg.name in node.kwargs:
                    values[k].append(node.kwargs[arg.name])
                elif not arg.kwarg_only and i < len(node.args):
                    values[k].append(node.args[i])
                else:
                    values[k].append(arg.default_value)
        return list(zip(names, *values))
    if len(pn.args) != len(gn.args) or sorted(pn.kwargs) != sorted(gn.kwargs):
        return None
    out = [(str(i), a, b) for i, (a, b) in enumerate(zip(pn.args, gn.args))]
    return out + [(k, pn.kwargs[k], gn.kwargs[k]) for k in sorted(pn.kwargs)]


class _Walk:
    """One comparison of a variant's graph with the model from one candidate site."""

    def __init__(self, variant: _variants.Variant, pattern: Any) -> None:
        self.v, self.pattern = variant, pattern
        self.env: dict[fx.Node, Any] = {}
        self.agreed = 0
        self.shape_literal = False

    def node(self, pn: fx.Node, gn: fx.Node) -> str | None:
        if pn in self.env:
            if self.env[pn] is gn:
                return None
            if self.v.role(pn) == "tensor":
                return (f"the pattern uses its input {self._input_name(pn)} twice; the model has two "
                        f"different values there (%{self.env[pn].name} and %{gn.name})")
            return f"{_name(pn)} feeds two places in the pattern; the model has %{gn.name} at the second"
        rp, rg = _variants.rank(pn.meta.get("val")), _variants.rank(gn.meta.get("val"))
        if self.v.role(pn) == "tensor":
            self.env[pn] = gn
            if rp is not None and rg is not None and rp != rg:
                return (f"input {self._input_name(pn)} is rank {rg} in the model (%{gn.name}) and rank "
                        f"{rp} in this trace")
            return None
        if gn.op != "call_function" or gn.target != pn.target:
            return f"pattern expects {_name(pn)}; the model has {_site(gn)}"
        if rp is not None and rg is not None and rp != rg:
            return f"{_name(pn)} is rank {rg} in the model ({_site(gn)}) and rank {rp} in this trace"
        self.env[pn] = gn
        self.agreed += 1
        pairs = _aligned(pn, gn)
        if pairs is None:
            return f"pattern expects {_name(pn)} with {len(pn.args)} arguments; the model has {len(gn.args)}"
        for name, pa, ga in pairs:
            why = self.arg(pn, gn, name, pa, ga)
            if why:
                return why
        return None

    def _input_name(self, ph: fx.Node) -> str:
        slot = self.pattern.tensor_slots[self.v.inputs.index(ph)]
        return repr(self.pattern.params[slot].name)

    def arg(self, pn: fx.Node, gn: fx.Node, name: str, pa: Any, ga: Any) -> str | None:
        if isinstance(pa, fx.Node) and self.v.role(pa) == "scalar":
            slot = next(s for s, ph in self.v.scalars.items() if ph is pa)
            pname = self.pattern.params[slot].name
            if isinstance(ga, fx.Node):
                return f"{_name(pn)}'s {name} is the op's {pname}; the model computes it ({_site(ga)})"
            if pa in self.env and not _variants.same(self.env[pa], ga):
                return (f"the pattern passes {pname} at two places; the model has {self.env[pa]!r} "
                        f"and {ga!r} "
                        f"({_site(gn)})")
            self.env[pa] = ga
            return None
        if isinstance(pa, fx.Node) and self.v.role(pa) == "dim":
            want = next(d[3] for d in self.v.dims if d[0] is pa)
            rp, rg = _variants.input_rank(pn), _variants.input_rank(gn)
            if _variants.normalize_dims(want, rp) != _variants.normalize_dims(ga, rg) or \
                    _variants.normalize_dims(ga, rg) is None:
                return (f"pattern expects {_name(pn)} with {name}={want!r}; the model has "
                        f"{name}={ga!r} ({_site(gn)})")
            return None
        if isinstance(pa, fx.Node):
            if not isinstance(ga, fx.Node):
                return f"pattern expects a tensor as {_name(pn)}'s {name}; the model has {ga!r} ({_site(gn)})"
            return self.node(pa, ga)
        if isinstance(pa, (list, tuple)) and isinstance(ga, (list, tuple)) and len(pa) == len(ga) \
                and any(isinstance(x, fx.Node) for x in pa):
            for i, (a, b) in enumerate(zip(pa, ga)):
                why = self.arg(pn, gn, f"{name}[{i}]", a, b)
                if why:
                    return why
            return None
        both_lists = isinstance(pa, (list, tuple)) and isinstance(ga, (list, tuple))
        if not _variants.same(pa, ga) and not (both_lists and list(pa) == list(ga)):
            if name in _SHAPE_ARGS:
                self.shape_literal = True
            # a fixed scalar may show as itself or as a value computed from it (eps * eps)
            fixed = [f"{self.pattern.params[s].name} is fixed at {self.pattern.example[s]!r} ({why})"
                     for s, why in self.v.fixed.items()]
            text = (f"pattern expects {_name(pn)} with {name}={pa!r}; the model has {name}={ga!r} "
                    f"({_site(gn)})")
            return text + (f": {fixed[0]}" if fixed else "")
        return None


def explain(graph: fx.Graph, pattern: Any, variants: list[_variants.Variant], ir: str,
            refused: dict[str, str]) -> tuple[int, str]:
    """(closeness, text): why ``pattern`` replaced nothing in ``graph``."""
    ops = _ops(variants[0].graph) if variants else "(no trace)"
    parts = [f"the pattern {pattern.name!r} for {pattern.op.name} ({ops}) matched nothing"]
    traced = sorted({v.label for v in variants})
    if traced:
        parts.append(f"traced at {'; '.join(traced)}")
    results = []
    anchors = set()
    for v in variants:
        anchor = next(n for n in reversed(v.graph.nodes) if n.op == "output").all_input_nodes[0]
        anchors.add(_name(anchor))
        for gn in graph.nodes:
            if gn.op == "call_function" and gn.target == anchor.target:
                walk = _Walk(v, pattern)
                why = walk.node(anchor, gn)
                total = sum(1 for n in v.graph.nodes if n.op == "call_function")
                if why is None:
                    why = _containment(v, walk, graph)
                if why is None and len(_outputs(v.graph)) > 1:
                    why = "every op of the pattern's first output agrees; its other outputs did not match"
                results.append((walk.agreed, total, gn, why, walk.shape_literal))
    closeness = 0
    if refused:
        shown = list(refused.items())[:_MAX_SITES]
        parts.append("refused: " + "; ".join(f"{site}: {why}" for site, why in shown))
        closeness = 10**6
    if not results and not refused and anchors:
        parts.append(f"the model has no {' or '.join(sorted(anchors))} node, where the pattern ends")
    best: dict[fx.Node, tuple] = {}
    for r in sorted(results, key=lambda r: -r[0]):
        best.setdefault(r[2], r)
    shape_hint = False
    for agreed, total, gn, why, shape in list(best.values())[:_MAX_SITES]:
        if why is None or any(s.startswith(f"%{gn.name} ") for s in refused):
            continue
        closeness = max(closeness, agreed)
        shape_hint |= shape
        parts.append(f"closest site {_site(gn)}, the first {agreed} of {total} pattern ops agree: {why}")
    failures = pattern.failures(ir)
    if failures:
        parts.append("not traced " + "; ".join(failures[:3]))
    if shape_hint:
        parts.append(f"the pattern was traced at the shapes of {pattern.source}; pass pattern_inputs=(...) "
                     "with tensors shaped like the model's to trace it at your shapes")
    return closeness, "; ".join(parts)


def _outputs(graph: fx.Graph) -> list[fx.Node]:
    return list(next(n for n in reversed(graph.nodes) if n.op == "output").all_input_nodes)


def _containment(v: _variants.Variant, walk: _Walk, graph: fx.Graph) -> str | None:
    """Why a site where every pattern node agrees was not matched: an inner value used outside."""
    outputs = set(next(n for n in reversed(v.graph.nodes) if n.op == "output").all_input_nodes)
    inner = {pn: gn for pn, gn in walk.env.items()
             if isinstance(pn, fx.Node) and pn.op == "call_function" and isinstance(gn, fx.Node)}
    matched = set(inner.values())
    for pn, gn in inner.items():
        if pn in outputs:
            continue
        outside = [u for u in gn.users if u not in matched]
        if outside:
            return (f"every op agrees, but {_site(gn)} inside the match is also used by %{outside[0].name} "
                    "outside it (a value saved for the backward, or reused); only self-contained "
                    "matches are replaced")
    return None
