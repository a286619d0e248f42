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

Both sides are matched in functional form (``_functional``), so a pattern written with ``/=``,
``mul_`` or ``add_`` matches what it matches written out of place. The rewrite itself, and the
layouts it keeps, are ``_rewrite``'s; the Inductor pass that holds the active patterns is
``_install``'s.

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
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..errors import SpecError
from ..spec import callable_source
from . import admit as _admit, variants as _variants
from .admit import Binding
# The pattern graft's other parts, named here for callers of this module.
from .install import _SLOT, active, install, retire_later, uninstall  # noqa: F401
from .rewrite import Misses, rewrite_exported, rewrite_graph  # noqa: F401

__all__ = ["Pattern", "Binding", "Misses", "rewrite_graph", "rewrite_exported", "install", "uninstall",
           "active", "retire_later"]

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
