"""Pattern grafts: find subgraphs equal to ``pattern`` in a graph and replace each with one op call.

The pattern is traced into the same IR as the graph it is matched against, so spelling does not
matter (``x.pow(2)``, ``x ** 2`` and ``torch.pow(x, 2)`` trace alike), once per floating dtype
(a ``.to(float32)`` is a node in a bf16 graph and nothing in an fp32 one):

- ``torch.compile``: Inductor's post-grad IR (functional ATen after Inductor's decompositions),
  traced as Inductor traces its own patterns (``pattern_matcher.fwd_only``). The rewrite runs as
  ``torch._inductor.config.post_grad_custom_pre_pass``. Why there and not elsewhere:
  the Dynamo (pre-grad) graph holds Python-level calls (methods, modules, ``F.silu`` vs
  ``nn.SiLU``) whose spellings vary, so matching there is fragile; a custom backend would only work
  for users who pass it. After autograd the graph is functional and canonical, the forward and
  backward graphs are already split, so the op needs no backward, and a match whose inner values
  are saved for the backward is refused (its inner nodes have users outside it), which keeps
  training graphs correct. The cost: it applies to Inductor only (``backend="eager"`` or
  ``"aot_eager"`` keeps the original ops; ``kg.graft`` by module type works with every backend),
  and, as Inductor config is process-wide, an active pattern graft applies to every graph Inductor
  compiles until ``kg.ungraft``. The pass has a ``uuid`` from the active grafts, so Inductor's
  caches never mix grafted and plain graphs.
- ``torch.export``: the ``ExportedProgram``'s own ATen IR, traced with ``torch.export`` (and with
  ``run_decompositions()`` for decomposed programs); the program's graph is rewritten in place.

Scalars in the pattern's signature (an ``eps``) are fixed to the example values it is traced
with, and passed to the op as constants. The pattern returns one tensor, or a tuple of them for an
op that returns as many (an add and the norm of its result: ``(norm, sum)``); a tuple match is
replaced where one op call can stand for all of its outputs (after every input, before every
outside use), else left as is.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import operator
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

from .._errors import SpecError, describe
from .._spec import callable_source

__all__ = ["Pattern", "rewrite_graph", "install", "uninstall", "active"]

log = logging.getLogger(__name__)

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(eq=False)
class Pattern:
    """A pattern function, the op that replaces it, and example inputs to trace it with."""

    fn: Callable[..., Any]
    op: Any
    example: tuple
    replaced: dict[str, int] = field(default_factory=dict)  # per IR, counted across rewrites
    _graphs: dict[str, list[fx.Graph]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n_fn = len(inspect.signature(self.fn).parameters)
        n_op = len(self.op.signature.params)
        if n_fn != n_op or len(self.example) != n_op:
            raise SpecError(
                f"kg.graft: the pattern {getattr(self.fn, '__qualname__', self.fn)} takes {n_fn} "
                f"arguments and the example {len(self.example)}, but {self.op.name}"
                f"{self.op.signature.schema} takes {n_op}; the pattern's arguments are passed to "
                "the op in order"
            )
        self.tensor_slots = tuple(i for i, a in enumerate(self.example) if isinstance(a, torch.Tensor))
        if not self.tensor_slots:
            raise SpecError("kg.graft: the pattern's example inputs hold no tensor")
        key = repr((self.op.name, self.op.fingerprint, callable_source(self.fn),
                    [(tuple(a.shape), str(a.dtype)) if isinstance(a, torch.Tensor) else a
                     for a in self.example]))
        self.uuid = hashlib.sha256(key.encode()).hexdigest()[:16]

    def _tensor_fn(self, dtype: torch.dtype | None) -> tuple[Callable, list[torch.Tensor]]:
        example = list(self.example)
        tensors = []
        for i in self.tensor_slots:
            t = example[i].detach()
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            tensors.append(t)

        def fn(*ts):
            args = list(example)
            for i, t in zip(self.tensor_slots, ts):
                args[i] = t
            return self.fn(*args)

        return fn, tensors

    def graphs(self, ir: str) -> list[fx.Graph]:
        """The pattern traced into ``ir`` ("inductor" or "export"), one graph per distinct trace."""
        cached = self._graphs.get(ir)
        if cached is not None:
            return cached
        out: list[fx.Graph] = []
        seen: set[str] = set()
        dtypes = [None] + [d for d in _FLOATS]
        for dtype in dtypes:
            try:
                # The Inductor pass may run inside a compile's fake mode; trace with real tensors.
                with unset_fake_temporarily():
                    fn, tensors = self._tensor_fn(dtype)
                    gms = _trace(ir, fn, tensors)
            except Exception as exc:
                log.debug("pattern %s: tracing for %s in %s failed: %s", self.fn, ir, dtype, exc)
                continue
            for gm in gms:
                graph = _clean(gm.graph)
                text = _graph_key(graph)
                if text not in seen:
                    seen.add(text)
                    out.append(graph)
        if not out:
            raise SpecError(f"kg.graft: the pattern {self.fn} could not be traced for {ir}")
        want = self.op.signature.n_returns if self.op.signature.returns == "tuple" else 1
        for graph in out:
            got = len(_outputs(graph))
            if got != want:
                raise SpecError(
                    f"kg.graft: the pattern {getattr(self.fn, '__qualname__', self.fn)} returns {got} "
                    f"tensor(s) but {self.op.name}{self.op.signature.schema} returns {want}"
                )
        self._graphs[ir] = out
        return out


def _trace(ir: str, fn: Callable, tensors: list[torch.Tensor]) -> list[fx.GraphModule]:
    if ir == "inductor":
        from torch._inductor.pattern_matcher import fwd_only

        return [fwd_only(fn, tensors)]
    if ir == "export":

        class _Wrap(torch.nn.Module):
            def forward(self, *ts):
                return fn(*ts)

        ep = torch.export.export(_Wrap(), tuple(tensors), strict=False)
        gms = [ep.graph_module]
        try:
            gms.append(ep.run_decompositions().graph_module)
        except Exception as exc:  # pragma: no cover - decomposition support varies by version
            log.debug("run_decompositions of the pattern failed: %s", exc)
        return gms
    raise ValueError(ir)


def _clean(graph: fx.Graph) -> fx.Graph:
    """A copy without nodes that do not feed the output (assertions, unused sizes)."""
    gm = fx.GraphModule(torch.nn.Module(), graph)
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
    del gm
    return new


def _outputs(graph: fx.Graph) -> list[fx.Node]:
    """The nodes a traced pattern returns, in order."""
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    return list(out.all_input_nodes)


def _graph_key(graph: fx.Graph) -> str:
    return "\n".join(f"{n.op} {n.target} {n.args} {n.kwargs}" for n in graph.nodes)


def _fake_value(op: Any, args: list) -> Any:
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else a for a in args]
    if any(isinstance(a, fx.Node) and not isinstance(v, torch.Tensor) for a, v in zip(args, vals)):
        return None
    from torch._guards import detect_fake_mode

    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    try:
        mode = detect_fake_mode(tensors)
    except AssertionError:
        mode = None  # values from several fake modes (make_fx in real mode makes one per node)
    if mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode()
        with mode:
            vals = [
                torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
                if isinstance(v, torch.Tensor) else v
                for v in vals
            ]
    with mode:
        return op.overload(*vals)


def rewrite_graph(graph: fx.Graph, patterns: Sequence[Pattern], ir: str) -> tuple[int, dict[str, str]]:
    """Replace every match of each pattern in ``graph``; returns (count, {old name: new name})."""
    total = 0
    renamed: dict[str, str] = {}
    # A replaced output node -> the node that stands for it now: a later match may take it as an
    # input (the sum one block returns is the next block's residual).
    substitutes: dict[fx.Node, fx.Node] = {}
    lifted = _lift_asserts(graph) if ir == "export" else []
    for pattern in patterns:
        for pgraph in pattern.graphs(ir):
            matcher = SubgraphMatcher(pgraph, match_output=False, match_placeholder=False,
                                      remove_overlapping_matches=True)
            matches = matcher.match(graph)
            done = 0
            for match in matches:
                if _replace(graph, pattern, match, renamed, substitutes):
                    done += 1
            if done:
                pattern.replaced[ir] = pattern.replaced.get(ir, 0) + done
                total += done
    _restore_asserts(graph, lifted, substitutes)
    if total or lifted:
        graph.lint()
    return total, renamed


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


def _replace(graph: fx.Graph, pattern: Pattern, match: Any, renamed: dict[str, str],
             substitutes: dict[fx.Node, fx.Node]) -> bool:
    """Replace one match by one op call (and a getitem per output when it returns a tuple)."""
    returning = list(match.returning_nodes)
    inputs = []
    for node in match.placeholder_nodes:
        while node in substitutes:
            node = substitutes[node]
        inputs.append(node)
    if not all(_live(n, graph) for n in returning + inputs):
        return False  # part of it was consumed by an earlier replacement
    if len(inputs) != len(pattern.tensor_slots):
        return False
    single = len(returning) == 1
    where = returning[0] if single else _insertion_point(graph, match, inputs)
    if where is None:
        log.info("kg.graft: no place for one %s call in a match of %d outputs; left as is",
                 pattern.op.name, len(returning))
        return False
    with graph.inserting_before(where):
        args = _op_args(graph, pattern, inputs)
        new = graph.call_function(pattern.op.overload, tuple(args))
        outs = [new] if single else [graph.call_function(operator.getitem, (new, i))
                                     for i in range(len(returning))]
    added = [a for a in args if isinstance(a, fx.Node) and a not in inputs] + [new] + ([] if single else outs)

    def undo() -> bool:
        for node in reversed(added):
            graph.erase_node(node)
        return False

    try:
        val = _fake_value(pattern.op, args)
    except Exception as exc:
        log.warning("kg.graft: %s cannot take the matched values (%s); match left as is",
                    pattern.op.name, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return undo()
    vals = None if val is None else (val,) if single else tuple(val)
    if vals is not None:
        if len(vals) != len(returning):
            log.info("kg.graft: %s returns %d tensors where the pattern gave %d; match left as is",
                     pattern.op.name, len(vals), len(returning))
            return undo()
        for r, v in zip(returning, vals):
            if not _same_kind(r.meta.get("val"), v):
                log.info("kg.graft: %s returns %s where the pattern gave %s; match left as is",
                         pattern.op.name, describe(v), describe(r.meta.get("val")))
                return undo()
        if not single:
            new.meta = {"val": vals}
    for r, out, v in zip(returning, outs, vals or [None] * len(outs)):
        meta = dict(r.meta)
        meta.pop("tensor_meta", None)
        if v is not None:
            meta["val"] = v
        out.meta = meta
    names = [r.name for r in returning]
    for r, out in zip(returning, outs):
        r.replace_all_uses_with(out)
        substitutes[r] = out
    _erase_inner(graph, match)
    for out, name in zip(outs, names):
        out._rename(name)
        if out.name != name:
            renamed[name] = out.name
    return True


def _same_kind(original: Any, val: Any) -> bool:
    """The op's output may stand for the pattern's: same dtype and rank (where both are known)."""
    return not (isinstance(original, torch.Tensor) and isinstance(val, torch.Tensor)
                and (original.dtype != val.dtype or original.dim() != val.dim()))


def _op_args(graph: fx.Graph, pattern: Pattern, inputs: list[fx.Node]) -> list[Any]:
    """The op call's arguments: the matched inputs in the pattern's tensor slots (made dense
    where a match took a strided view), its example scalars elsewhere."""
    args: list[Any] = list(pattern.example)
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


# ---------------------------------------------------------------------------- the Inductor pass
_LOCK = threading.Lock()
_ACTIVE: list[Pattern] = []
_PREVIOUS: list[Any] = []


def active() -> list[Pattern]:
    return list(_ACTIVE)


def _make_pass_class():
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class KernelgraftPass(CustomGraphPass):
        """Applies the active pattern grafts (and any pass that was configured before)."""

        def __init__(self, previous: Any = None) -> None:
            self.previous = previous

        def __call__(self, graph: fx.Graph) -> None:
            if self.previous is not None:
                self.previous(graph)
            n, _ = rewrite_graph(graph, list(_ACTIVE), "inductor")
            log.info("kernelgraft post-grad pass: replaced %d pattern matches", n)

        def uuid(self) -> Any:
            prev = None
            if self.previous is not None:
                prev = self.previous.uuid() if hasattr(self.previous, "uuid") else None
                if prev is None:
                    return None  # an uncacheable pass was configured before us
            return ("kernelgraft", prev, tuple(p.uuid for p in _ACTIVE))

    return KernelgraftPass


_PASS_CLASS: Any = None


def install(pattern: Pattern) -> None:
    """Make ``pattern`` part of every Inductor compilation from now on."""
    global _PASS_CLASS
    import torch._inductor.config as config

    with _LOCK:
        if _PASS_CLASS is None:
            _PASS_CLASS = _make_pass_class()
        current = config.post_grad_custom_pre_pass
        if not isinstance(current, _PASS_CLASS):
            _PREVIOUS[:] = [current]
            config.post_grad_custom_pre_pass = _PASS_CLASS(current)
        _ACTIVE.append(pattern)


def uninstall(pattern: Pattern) -> None:
    import torch._inductor.config as config

    with _LOCK:
        if pattern in _ACTIVE:
            _ACTIVE.remove(pattern)
        current = config.post_grad_custom_pre_pass
        if not _ACTIVE and _PASS_CLASS is not None and isinstance(current, _PASS_CLASS):
            config.post_grad_custom_pre_pass = current.previous


# ---------------------------------------------------------------------------- ExportedProgram
def rewrite_exported(ep: Any, pattern: Pattern) -> int:
    """Rewrite ``ep``'s graph in place; returns the number of replacements."""
    gm = ep.graph_module
    n, renamed = rewrite_graph(gm.graph, [pattern], "export")
    if renamed:
        for spec in ep.graph_signature.output_specs:
            arg = getattr(spec, "arg", None)
            if arg is not None and getattr(arg, "name", None) in renamed:
                arg.name = renamed[arg.name]
    if n:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return n
