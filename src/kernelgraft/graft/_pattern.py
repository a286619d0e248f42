"""Pattern grafts: find subgraphs equal to ``pattern`` in a graph and replace each with one op call.

The pattern is traced into the same IR as the graph it is matched against, so spelling does not
matter (``x.pow(2)``, ``x ** 2`` and ``torch.pow(x, 2)`` trace alike), per dtype and rank the
model uses, with the op's scalar arguments as wildcards (see ``_variants``):

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

A match is admitted (``Pattern.admit``) only when it computes what the op computes: its nodes have
the ranks of the variant that matched, its dims are the pattern's, the pattern traced at the
model's scalar values is the graph that matched, and (``verify``) the op equals the pattern on the
example tensors at those ranks, dtypes and scalars. The pattern returns one tensor, or a tuple of
them for an op that returns as many (an add and the norm of its result: ``(norm, sum)``); a tuple
match is replaced where one op call can stand for all of its outputs (after every input, before
every outside use), else left as is. When a pattern replaces nothing, ``_explain`` says why.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import operator
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

from .._errors import GraftWarning, SpecError, describe
from .._op import _compete, _registry
from .._spec import callable_source
from . import _admit, _explain, _variants
from ._admit import Binding
from ._passes import Slot

__all__ = ["Pattern", "Binding", "Misses", "rewrite_graph", "install", "uninstall", "active"]

log = logging.getLogger(__name__)

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(eq=False)
class Pattern:
    """A pattern function, the op that replaces it, and example inputs to trace it with."""

    fn: Callable[..., Any]
    op: Any
    example: tuple
    replaced: dict[str, int] = field(default_factory=dict)  # per IR, counted across rewrites
    verify: bool = True  # admit a match only where the op equals the pattern numerically
    tolerance: dict = field(default_factory=dict)  # the caller's {dtype: rtol} override
    source: str = "pattern_inputs"  # where the example came from (for messages)
    stale_said: bool = False  # warned that its op no longer holds its name (_current)
    finalizer: Any = None  # weakref.finalize on its model (kg.graft), detached by kg.ungraft
    _variants: dict[tuple, Any] = field(default_factory=dict)  # (ir, key) -> [Variant] or why not
    _checked: dict[tuple, str | None] = field(default_factory=dict)  # numeric checks done
    _confirmed: dict[tuple, str | None] = field(default_factory=dict)  # retraces at model scalars

    def __post_init__(self) -> None:
        n_fn = len(inspect.signature(self.fn).parameters)
        n_op = len(self.op.signature.params)
        if n_fn != n_op or len(self.example) != n_op:
            raise SpecError(
                f"kg.graft: the pattern {self.name} takes {n_fn} "
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
        ranks = [self.example[i].dim() for i in self.tensor_slots]
        # The "activations": the highest-rank tensors get leading dims added for other ranks;
        # the rest (a weight, a bias) keep theirs.
        self._lifted = tuple(i for i in self.tensor_slots if self.example[i].dim() == max(ranks))
        self._lock = threading.RLock()

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", None) or repr(self.fn)

    @property
    def params(self) -> tuple:
        return self.op.signature.params

    def call(self, tensors: list[torch.Tensor], scalars: dict[int, Any]) -> Any:
        args = list(self.example)
        for i, t in zip(self.tensor_slots, tensors):
            args[i] = t
        for i, v in scalars.items():
            args[i] = v
        return self.fn(*args)

    # ------------------------------------------------------------------ variants
    def _tensors(self, key: _variants.VariantKey) -> list[torch.Tensor]:
        out = []
        for i in self.tensor_slots:
            t = self.example[i].detach()
            want = key.ranks[i]
            if want is not None and want != t.dim():
                if want > t.dim():
                    shape = (3,) * (want - t.dim()) + tuple(t.shape)
                    t = (torch.randn(shape, dtype=t.dtype, device=t.device) if t.is_floating_point()
                         else t.expand(shape).clone())
                else:
                    t = t[(0,) * (t.dim() - want)].clone()
            if key.dtype is not None and t.is_floating_point():
                t = t.to(key.dtype)
            out.append(t)
        return out

    def _key(self, dtype: torch.dtype | None, delta: int) -> _variants.VariantKey:
        ranks = tuple((a.dim() + (delta if i in self._lifted else 0)) if isinstance(a, torch.Tensor) else None
                      for i, a in enumerate(self.example))
        return _variants.VariantKey(dtype, ranks)

    def _rank_refusal(self, key: _variants.VariantKey) -> str | None:
        for i in self._lifted:
            r, p = key.ranks[i], self.params[i]
            allowed = self.op._ndim.get(p.name)
            if r < 1 or r > 8:
                return f"{p.name} would be rank {r}"
            if allowed and r not in allowed:
                return f"{self.op.name} takes {p.name} only at rank {'/'.join(map(str, allowed))} (its ndim)"
        return None

    def variant(self, ir: str, key: _variants.VariantKey) -> list[_variants.Variant] | str:
        """The variants traced for ``key``, or why there are none."""
        with self._lock:
            cached = self._variants.get((ir, key))
            if cached is None:
                cached = self._rank_refusal(key)
                if cached is None:
                    try:
                        # The Inductor pass runs inside a compile's fake mode; trace real tensors.
                        with unset_fake_temporarily():
                            tensors = self._tensors(key)
                        cached = _variants.build(ir, key, tensors, self.call, self.example,
                                                 self.params, self.tensor_slots)
                    except Exception as exc:
                        log.debug("pattern %s: tracing %s for %s failed: %s", self.name, key, ir, exc)
                        cached = f"the pattern could not be traced: {_variants.first_line(exc)}"
                self._variants[(ir, key)] = cached
            return cached

    def _dtypes(self, graph: fx.Graph | None) -> list[torch.dtype | None]:
        if graph is None:
            return [None]
        seen = {n.meta["val"].dtype for n in graph.nodes
                if isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dtype in _FLOATS}
        own = {self.example[i].dtype for i in self.tensor_slots if self.example[i].is_floating_point()}
        # The example's own dtypes are traced unless one dtype listed does the same.
        out: list[torch.dtype | None] = [] if len(own) == 1 and own <= seen else [None]
        return out + [d for d in _FLOATS if d in seen]

    def variants(self, ir: str, graph: fx.Graph | None = None) -> list[_variants.Variant]:
        """The variants to match ``graph`` with: per dtype it uses, at the example's ranks and at
        the ranks of its candidate sites (nodes like the pattern's last one). For an exported
        program, also in core ATen when the program's graph lacks an op of the pattern as exported
        (it was run through ``run_decompositions()``)."""
        out = self._variants_in(ir, graph)
        if ir == "export" and graph is not None:
            present = {n.target for n in graph.nodes if n.op == "call_function"}
            if any(n.target not in present for v in out for n in v.graph.nodes if n.op == "call_function"):
                out = out + self._variants_in("export_core", graph)
        return out

    def _variants_in(self, ir: str, graph: fx.Graph | None) -> list[_variants.Variant]:
        out: list[_variants.Variant] = []
        for dtype in self._dtypes(graph):
            base = self.variant(ir, self._key(dtype, 0))
            if isinstance(base, str):
                continue
            out += base
            deltas = set()
            for v in base if graph is not None else []:
                anchor = _outputs(v.graph)[0]
                ra = _variants.rank(anchor.meta.get("val"))
                if ra is None:
                    continue
                for n in graph.nodes:
                    like = n.op == "call_function" and n.target == anchor.target
                    rg = _variants.rank(n.meta.get("val")) if like else None
                    if rg is not None and rg != ra:
                        deltas.add(rg - ra)
            for delta in sorted(deltas):
                more = self.variant(ir, self._key(dtype, delta))
                out += more if not isinstance(more, str) else []
        return out

    def failures(self, ir: str) -> list[str]:
        """Why variants were not traced (a rank the op does not take, a failed trace)."""
        return [f"at {_admit.describe_key(key)}: {why}" for (i, key), why in self._variants.items()
                if i.startswith(ir) and isinstance(why, str)]

    def graphs(self, ir: str) -> list[fx.Graph]:
        """The pattern traced into ``ir`` ("inductor" or "export") at the example's dtypes and
        ranks; a SpecError when it cannot be traced or returns the wrong number of tensors."""
        got = self.variant(ir, self._key(None, 0))
        if isinstance(got, str):
            raise SpecError(f"kg.graft: the pattern {self.name} could not be traced for {ir}: {got}")
        want = self.op.signature.n_returns if self.op.signature.returns == "tuple" else 1
        for v in got:
            n = len(_outputs(v.graph))
            if n != want:
                raise SpecError(
                    f"kg.graft: the pattern {self.name} returns {n} "
                    f"tensor(s) but {self.op.name}{self.op.signature.schema} returns {want}"
                )
        return [v.graph for v in got]

    # ------------------------------------------------------------------ admission
    def admit(self, v: _variants.Variant, match: Any) -> Binding | str:
        """The binding of a structural match, or why it does not compute what the op computes."""
        return _admit.admit(self, v, match)

def _outputs(graph: fx.Graph) -> list[fx.Node]:
    """The nodes a traced pattern returns, in order."""
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    return list(out.all_input_nodes)


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


@dataclass
class Misses:
    """What a rewrite left: sites that matched but were refused, and why a pattern replaced nothing."""

    kept: dict[str, str] = field(default_factory=dict)  # "%node (target)" -> why it stays
    reasons: list[tuple[int, str]] = field(default_factory=list)  # (closeness, text) per graph

    def reason(self) -> str | None:
        """The explanation from the graph whose closest site came closest."""
        return max(self.reasons, key=lambda r: r[0])[1] if self.reasons else None


def rewrite_graph(graph: fx.Graph, patterns: Sequence[Pattern], ir: str,
                  misses: Misses | None = None) -> tuple[int, dict[str, str]]:
    """Replace every admitted match of each pattern in ``graph``; returns (count, {old name: new
    name}). With ``misses``, records refused sites and, for a pattern that replaced nothing, why."""
    total = 0
    renamed: dict[str, str] = {}
    # A replaced output node -> the node that stands for it now: a later match may take it as an
    # input (the sum one block returns is the next block's residual).
    substitutes: dict[fx.Node, fx.Node] = {}
    lifted = _lift_asserts(graph) if ir == "export" else []
    for pattern in patterns:
        variants = pattern.variants(ir, graph)
        done = 0
        refused: dict[str, str] = {}
        for v in variants:
            # Overlaps are removed after admission: a refused match must not hide an admitted one.
            matcher = SubgraphMatcher(v.graph, match_output=False, match_placeholder=False,
                                      remove_overlapping_matches=False)
            taken: set[fx.Node] = set()
            for match in matcher.match(graph):
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
    _restore_asserts(graph, lifted, substitutes)
    if total or lifted:
        graph.lint()
    return total, renamed


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


def _replace(graph: fx.Graph, pattern: Pattern, match: Any, binding: Binding, renamed: dict[str, str],
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
        val = _fake_value(pattern.op, args)
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
    return None


def _same_kind(original: Any, val: Any) -> bool:
    """The op's output may stand for the pattern's: same dtype and rank (where both are known)."""
    return not (isinstance(original, torch.Tensor) and isinstance(val, torch.Tensor)
                and (original.dtype != val.dtype or original.dim() != val.dim()))


def _op_args(graph: fx.Graph, pattern: Pattern, inputs: list[fx.Node], scalars: dict[int, Any]) -> list[Any]:
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


# ---------------------------------------------------------------------------- the Inductor pass
_LOCK = threading.Lock()
_ACTIVE: list[Pattern] = []
_DEAD: list[Pattern] = []  # patterns whose models were collected, uninstalled at the next chance


def active() -> list[Pattern]:
    with _LOCK:
        _drain()
        return list(_ACTIVE)


def _run(graph: fx.Graph) -> None:
    n, _ = rewrite_graph(graph, _applicable(), "inductor")
    log.info("kernelgraft post-grad pass: replaced %d pattern matches", n)


def _identity() -> tuple:
    return tuple(p.uuid for p in _applicable())


def retire_later(pattern: Pattern) -> None:
    """Uninstall ``pattern`` at the next install, uninstall or compile: called by the finalizer
    of its model, which garbage collection may run anywhere, even where this thread holds _LOCK."""
    _DEAD.append(pattern)  # atomic: takes no lock


def _drain() -> None:
    """Drop the patterns whose models are gone (the caller holds _LOCK). Inductor's pass slot
    stays until the next uninstall: a compile may be reading it."""
    while _DEAD:
        pattern = _DEAD.pop()
        if pattern in _ACTIVE:
            _ACTIVE.remove(pattern)


def _applicable() -> list[Pattern]:
    """The active patterns less those whose op's own reference is being compiled in this thread
    (its torch:compile candidate): that graph is the pattern, and must stay the reference; and
    less those whose op no longer holds its name (unregistered, or replaced by a declaration
    with ``replace=True``): the graft was verified against that op, not its successor."""
    own = _compete.compiling_references()
    with _LOCK:
        _drain()
        active = list(_ACTIVE)
    return [p for p in active if p.op.name not in own and _current(p)]


def _current(pattern: Pattern) -> bool:
    holder = _registry.lookup(pattern.op.name)
    if holder is pattern.op or (holder is not None and holder.fingerprint == pattern.op.fingerprint):
        return True  # the same op (a bundle's stand-in taken over by the module's own)
    if not pattern.stale_said:
        pattern.stale_said = True
        warnings.warn(f"kg.graft: the pattern graft onto {pattern.op.name} no longer acts: that op was "
                      "unregistered or declared again since; graft the model again to use the op "
                      "that holds the name now", GraftWarning, stacklevel=2)
    return False


_SLOT = Slot("post_grad_custom_pre_pass", "kernelgraft", _run, _identity)


def install(pattern: Pattern) -> None:
    """Make ``pattern`` part of every Inductor compilation from now on."""
    with _LOCK:
        _drain()
        _ACTIVE.append(pattern)
        _SLOT.install()


def uninstall(pattern: Pattern) -> None:
    with _LOCK:
        if pattern in _ACTIVE:
            _ACTIVE.remove(pattern)
        _drain()
        if not _ACTIVE:
            _SLOT.uninstall()


# ---------------------------------------------------------------------------- ExportedProgram
def rewrite_exported(ep: Any, pattern: Pattern, misses: Misses | None = None) -> int:
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
