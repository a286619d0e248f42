"""The dispatcher: the runtime state of one op, with one owner.

A ``KernelOp`` is the immutable definition (reference, impls, options, fingerprint); its
``Dispatcher`` owns everything that calls create: plans (one table per tuning scope, see
``kernelgraft.op.modes``), forced plans of ``op.run``, bound runners, runners served by AOT
bundles, the native replay of the last signature and the dtype combinations the reference accepted.
tune/, aot/, check/, bench/ and _native/ use the methods below, never the attributes.

Thread safety: plans are plain closures stored in dicts (a dict store is atomic under the GIL).
A change that invalidates plans (``kg.tune.clear()``, a bundle loaded, ``register_meta``) swaps in new
dicts rather than clearing them, so a plan another thread is still making lands in a dict no caller
reads any more. A native replay is installed only if the epoch it was planned in is still current.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import admit as _admit, backends
from ..errors import FallbackWarning, InputError, LaunchError, UnsupportedError, describe
from ..native.attach import attach
from ..backends.triton.jit import interpreting
from .modes import scope as current_scope
from .modes import settings as current_settings
from . import compete as _compete, outputs as _outputs, overlap as _overlap, probe as _probe, select as _select
from .candidates import LAYOUT, Candidate, evaluate, evaluate_one
from .plan import Plan, guarded, kernel_plan, meta_plan, reference_plan, torch_plan
from .warn import caller_stacklevel
from .provisional import expiring, pending


__all__ = ["Dispatcher", "PLAIN", "ANY_TENSOR"]


log = logging.getLogger(__name__)

_Tensor = torch.Tensor
# Tensor types the fast path treats as plain data; other subclasses (fake, functional, user
# subclasses with __torch_dispatch__) go through the dispatcher.
PLAIN = (torch.Tensor, torch.nn.Parameter)
_SCALAR_TYPES = (int, float, bool, str)
_MAX_PLANS = 4096  # per scope; a workload with more signatures re-plans (cheap next to tuning)
_MAX_SCOPES = 64
_EPOCH = _select._epoch  # a one-element list; read directly on the hot path
_is_neg = torch.Tensor.is_neg
_is_conj = torch.Tensor.is_conj


class _AnyTensor:
    """Stands in for the tuple of plain tensor types: every Tensor subclass is 'in' it."""

    def __contains__(self, t: type) -> bool:
        return issubclass(t, _Tensor)


ANY_TENSOR = _AnyTensor()




class Dispatcher:
    """Plans, runners, bundles and replays of one op (``op.dispatcher``)."""

    def __init__(self, op: Any) -> None:
        self.op = op
        self.tables: dict[Any, dict[tuple, Plan]] = {}  # tuning scope -> signature key -> plan
        self.forced: dict[tuple, Plan] = {}  # op.run: (key, impl index, config) -> plan
        self.runners: dict[tuple, Callable[..., Any]] = {}  # (impl index, config) -> bound runner
        self.bundled: dict[tuple, Callable[..., Any]] = {}  # (impl index, config) -> bundle runner
        # (Replay, scope, epoch) of the signature called last, or None (read by KernelOp.__call__).
        self.replay: tuple | None = None
        self.epoch = -1
        # (device type, *tensor dtypes) -> why the reference refused zeros of those dtypes, or None
        self.accepted: dict[tuple, str | None] = {}
        self.warned: set[Any] = set()
        self._lock = threading.Lock()
        # The reference under torch.compile (the torch:compile candidate), compiled once per op.
        self.compile_state = _compete.CompileState(op.reference, op.name)
        # A supports() predicate or the tuner (which keys on it) may decide by pointer alignment,
        # so then plans are keyed on it too; a single unconditional candidate cannot care.
        impls = op.impls
        self.align = any(i.supports is not None for i in impls) or sum(len(i.configs) for i in impls) > 1
        # Whether a tensor argument can be complex (then the conjugate bit is part of the key): a
        # tensor parameter without declared dtypes, or with a complex one among them.
        self.complex = any(
            not op._dtypes.get(p.name) or any(d.is_complex for d in op._dtypes[p.name])
            for p in op.signature.params if p.kind in ("tensor", "tensor_list"))

    # ------------------------------------------------------------------ keys and plans
    def key(self, args: tuple, grad: bool, plain: Any = PLAIN) -> tuple | None:
        """A small hashable signature of the call, or None when the dispatcher must handle it
        (tensor subclasses, autograd, anything unusual).

        Per tensor: dtype, device, shape, strides, ``data_ptr() & 15`` when plans depend on
        alignment (else whether the pointer is null), the negative bit, and a complex tensor's
        conjugate bit when the op can take complex tensors: every property of the admission rule
        (``kernelgraft.admit``) that a call can change without changing the rest. A null pointer
        with elements is a ZeroTensor; sparse and mkldnn tensors have no data pointer and nested
        ones no strides: they raise here, and the None sends them to the checks that refuse them."""
        parts = []
        align = self.align
        conj = self.complex
        try:
            for a in args:
                t = type(a)
                if t in plain:
                    if grad and a.requires_grad:
                        return None
                    p = a.data_ptr()
                    dt = a.dtype
                    parts.append((dt, a.device, a.shape, a.stride(), (p & 15 if align else 16) if p else -1,
                                  _is_neg(a), conj and dt.is_complex and _is_conj(a)))
                elif t in _SCALAR_TYPES or a is None or t is torch.dtype:
                    parts.append((t, a))
                elif t is list or t is tuple:
                    sub = []
                    for item in a:
                        if type(item) not in plain or (grad and item.requires_grad):
                            return None
                        p = item.data_ptr()
                        dt = item.dtype
                        sub.append((dt, item.device, item.shape, item.stride(), (p & 15 if align else 16) if p else -1,
                                    _is_neg(item), conj and dt.is_complex and _is_conj(item)))
                    parts.append(tuple(sub))
                else:
                    return None
        except RuntimeError:  # no data pointer (sparse, mkldnn) or no strides (nested, sparse CSR)
            return None
        return tuple(parts)

    def _renew(self, epoch: int) -> None:
        # New dicts, not clear(): see the module docstring. Never back to an older epoch (a
        # thread that read the epoch before another bumped it).
        if epoch < self.epoch:
            return
        self.tables = {}
        self.forced = {}
        self.replay = None
        self.epoch = epoch

    def reset(self) -> None:
        """Forget every plan and replay (the meta function or the served runners changed). A new
        epoch, so a replay recorded from an old plan by a call still in flight is never installed."""
        _select.bump_epoch()
        self._renew(_EPOCH[0])

    def execute(self, args: tuple, key: tuple) -> Any:
        """Run the plan of ``key`` in the current tuning scope, making it on first use."""
        epoch = _EPOCH[0]
        if self.epoch != epoch:
            self._renew(epoch)
        scope = current_scope()
        tables = self.tables
        table = tables.get(scope)
        if table is None:
            if len(tables) >= _MAX_SCOPES:
                tables.clear()
            table = tables.setdefault(scope, {})
        plan = table.get(key)
        if plan is None:
            plan, until = self._make_plan(args, scope, epoch)
            if isinstance(until, _select.Pending):  # kept until the decision lands
                plan = pending(plan, table, key, until, self.execute)
            elif until is not None:  # a provisional choice: not kept, or kept until its deadline
                if until <= time.monotonic():
                    return plan(args)
                plan = expiring(plan, table, key, until, self.execute)
            if len(table) >= _MAX_PLANS:
                table.clear()
            table[key] = plan
        return plan(args)

    def _current_table(self) -> dict[tuple, Plan]:
        """The plans of the current tuning scope (empty once the epoch moved on)."""
        table = self.tables.get(current_scope()) if self.epoch == _EPOCH[0] else None
        return table or {}

    def plan_for(self, args: tuple) -> Plan | None:
        """The plan that serves these arguments in the current scope, if one was made."""
        key = self.key(args, False, ANY_TENSOR)
        return self._current_table().get(key) if key is not None else None

    def plans(self) -> dict[tuple, Plan]:
        """The plans of the current tuning scope, by signature key (a copy; a provisional plan
        shows as the plan it serves)."""
        return {key: getattr(plan, "plan", plan) for key, plan in self._current_table().items()}

    def current_replay(self) -> Any:
        """The native Replay the next call tries first, or None."""
        replay = self.replay
        return replay[0] if replay is not None else None

    def drop_replays(self) -> None:
        """Take the native replay off every plan (benchmarks time the Python path this way)."""
        self.replay = None
        for table in list(self.tables.values()):
            for plan in table.values():
                state = getattr(plan, "native", None)
                if state is not None:
                    state["replay"], state["done"] = None, True

    def drop_torch_plans(self, name: str) -> None:
        """Forget the plans that serve ``torch:<name>`` in every scope (``torch:compile`` failed
        while serving): their next call chooses again. New dicts, as ``_renew`` makes them."""
        def keep(plan: Plan) -> bool:
            c = plan.candidate
            return not (c is not None and _compete.is_torch(c) and c.impl.name == name)

        self.tables = {scope: {k: p for k, p in table.items() if keep(p)}
                       for scope, table in list(self.tables.items())}

    def install_replay(self, replay: Any, scope: Any, epoch: int) -> bool:
        """Make ``replay`` the one the next call tries first, unless plans moved on since."""
        if epoch != _EPOCH[0] or epoch != self.epoch:
            return False
        self.replay = (replay, scope, epoch)
        return True

    # ------------------------------------------------------------------ planning (once per signature)
    def check(self, args: tuple) -> list[tuple[str, torch.Tensor]]:
        """The argument checks every plan starts with; returns the named tensors."""
        op = self.op
        op.signature.check_types(op.name, args)
        tensors = list(op.signature.tensors(args))
        if tensors:
            first_name, first = tensors[0]
            for name, t in tensors[1:]:
                if t.device != first.device:
                    raise InputError(
                        f"{op.name}: argument {name!r} expected a tensor on {first.device} "
                        f"(like {first_name!r}), got {describe(t)}"
                    )
        for name, t in tensors:
            base = name.split("[")[0]
            allowed = op._dtypes.get(base)
            if allowed and t.dtype not in allowed:
                raise InputError(
                    f"{op.name}: argument {name!r} expected dtype in "
                    f"{[str(d) for d in allowed]}, got {describe(t)}"
                )
            ranks = op._ndim.get(base)
            if ranks and t.dim() not in ranks:
                want = ranks[0] if len(ranks) == 1 else list(ranks)
                raise InputError(
                    f"{op.name}: argument {name!r} expected a {want}-dimensional tensor, "
                    f"got {describe(t)}"
                )
        mutated = {op.signature.params[i].name for i in op.signature.mutated}
        for name, t in tensors:
            # A written tensor whose elements share memory (expanded, stride 0) has no defined
            # result: torch refuses to write one in place, a kernel would race on it. Its layout is
            # part of the plan's key, so this runs once per signature.
            if name.split("[")[0] in mutated and torch._debug_has_internal_overlap(t) == 1:
                raise InputError(
                    f"{op.name}: argument {name!r} is mutated but several of its elements share "
                    f"memory ({describe(t)}, e.g. from .expand()); pass a tensor that owns its "
                    "elements (.clone())"
                )
        return tensors

    def _make_plan(self, args: tuple, scope: Any, epoch: int) -> tuple[Plan, Any]:
        """The plan for these arguments, and None, or the ``time.monotonic()`` deadline (or the
        ``_select.Pending`` decision) of a provisional choice (see ``_select.provisional``) after
        which the call plans again."""
        op = self.op
        tensors = self.check(args)
        if tensors and tensors[0][1].device.type == "meta":
            return meta_plan(op), None  # no data to compute on: shapes only, as torch.ops gives them
        if any(_admit.deferred(t) for _, t in tensors):
            return self._resolving_plan(), None
        candidates = evaluate(op.impls, tensors, args)
        settings = current_settings()
        supported = _compete.offered(op, candidates, tensors, settings)
        # Output shapes (``output_specs``) refuse inputs that do not fit, or whose outputs no
        # memory could hold, before anything runs or is tuned. One call is spared them: the first
        # of a key tuned off the caller's path, served by the reference meanwhile (a process's
        # first fake tensors import torch._dynamo: one to two seconds on that call). Its
        # reference allocates its own outputs (CUDA's allocator refuses what does not fit) and a
        # failure is worded by the output shapes then (``outputs.deferred``).
        deferred = bool(supported) and _outputs.may_defer(settings, tensors)
        out_specs = None if deferred else self.output_specs(args)
        if supported:
            self._accept_dtypes(args, tensors)
            chosen = _select.choose(op, supported, args)
            until = _select.take_provisional()
            if out_specs is None and not (chosen is None and isinstance(until, _select.Pending)):
                out_specs = self.output_specs(args)  # decided, or no job (the queue refused it)
            if chosen is None:  # no candidate computes the right result, or none is verified yet
                # guarded as a kernel plan would be: a call refused once the decision lands is
                # refused while it is made, too
                plan = reference_plan(op)
                if out_specs is None:  # served while a job tunes the key: a failure worded by the shapes
                    plan = _outputs.deferred(plan, self.output_specs)
                return guarded(plan, self.overlap_guard(args)), until
            log.debug("%s: chose %s%s", op.name, chosen.label, "" if until is None else " (provisional)")
            if _compete.is_torch(chosen):  # PyTorch won this shape: the Python path, no replay
                return guarded(torch_plan(op, chosen, _compete.bind(op, chosen)), self.overlap_guard(args)), until
            runner = self.runner(chosen)
            plan = kernel_plan(op, chosen, runner, out_specs, args)
            guard = self.overlap_guard(args)
            if until is not None:  # no native replay: its calls would skip the deadline's check
                return guarded(plan, guard), until
            return attach(self, guarded(plan, guard), chosen, runner, PLAIN, scope, epoch, guard), None
        device = tensors[0][1].device if tensors else torch.device("cpu")
        if not candidates or (device.type == "cpu" and not interpreting()):
            return guarded(reference_plan(op), self.overlap_guard(args)), None
        if all(c.category == LAYOUT for c in candidates):
            raise InputError(
                f"{op.name}: every kernel {candidates[0].reason}; pass contiguous tensors "
                "(.contiguous()) or declare an impl with contiguous=False"
            )
        self._no_candidate(candidates, device)
        return guarded(reference_plan(op), self.overlap_guard(args)), None

    def _resolving_plan(self) -> Plan:
        """The plan of a signature with deferred tensors (negative or conjugate bit, ZeroTensor;
        see ``kernelgraft.admit``): they are materialized and the call runs the plan of the
        resolved arguments' own signature. ``check`` has refused mutated ones."""
        op = self.op
        name, params = op.name, op.signature.params

        def plan(args: tuple) -> Any:
            fixed = _admit.resolve(name, params, args)
            key = self.key(fixed, False, ANY_TENSOR)
            return self.execute(fixed, key) if key is not None else op.overload(*fixed)

        plan.candidate = None  # type: ignore[attr-defined]
        plan.resolving = True  # type: ignore[attr-defined]
        return plan

    def overlap_guard(self, args: tuple) -> Callable[[tuple], None] | None:
        """The per-call check that no tensor argument shares an element with one the op mutates,
        decided once per plan (``_overlap``); None when the op has nothing to check."""
        return _overlap.overlap_guard(self.op, args)

    def _accept_dtypes(self, args: tuple, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Before a kernel runs on a new signature, the reference's verdict on it, judged without
        the call's values (``_probe``), so every call with this signature gets the same treatment.

        An op that returns None has no output shapes that would run its reference on fake
        tensors (``output_specs``): its reference runs on fake tensors here, once per plan, and a
        shape it refuses is the call's ``InputError``. Without ``dtypes=``, a kernel runs only on
        dtypes the reference accepts: the first call with a new combination of tensor dtypes (per
        device type) runs the reference once on zero-filled tensors of the same layout, and its
        verdict, either way, holds for every later call with those dtypes. Not judged: a call made
        while a CUDA graph is captured (the reference must not land in the graph) and a reference
        that runs out of memory (a naive reference may not fit where the kernel does)."""
        op = self.op
        if not tensors or getattr(op.reference, "kernelgraft_stub", False):
            return
        if op.signature.returns == "none":
            _probe.fake_probe(op, args)
        if op._dtypes:
            return
        device = tensors[0][1].device
        combo = (device.type,) + tuple(t.dtype for _, t in tensors) + tuple(
            a for a in args if isinstance(a, torch.dtype))
        if combo not in self.accepted:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return  # the reference must not be recorded into the user's graph: judged on a later call
            judged, why = _probe.zeros_probe(op, args)
            if not judged:
                return
            if why is not None:  # shapes that do not fit are this call's refusal, not the dtypes'
                self.output_specs(args)
            self.accepted[combo] = why  # values play no part: the verdict holds for these dtypes
        why = self.accepted[combo]
        if why is not None:
            error = _probe.refusal(op, args, why, " (judged once for these dtypes, on zero-filled tensors)",
                                   shapes=False)
            raise InputError(f"{error}. The op declares no dtypes=, so it accepts what its reference accepts; "
                             "declare dtypes= to state what the kernels take")

    def _no_candidate(self, candidates: Sequence[Candidate], device: torch.device) -> None:
        op = self.op
        reasons = sorted({f"{c.impl.backend}:{c.impl.display_name}: {c.reason}" for c in candidates})
        detail = "; ".join(reasons) or "the op has no impls"
        if op.fallback == "error":
            raise UnsupportedError(f"{op.name}: no kernel can run these inputs on {device}: {detail}")
        marker = tuple(reasons)
        if marker not in self.warned:
            self.warned.add(marker)
            warnings.warn(
                f"{op.name}: no kernel can run these inputs on {device}, running the PyTorch "
                f"reference instead. Reasons: {detail}",
                FallbackWarning,
                stacklevel=caller_stacklevel(),
            )

    def runner(self, candidate: Candidate) -> Callable[..., Any]:
        """The bound runner of a candidate: its bundle's if a bundle serves it, else its backend's.
        A torch candidate's runs the reference and copies its outputs into the ones passed (the
        tuner and the op's plans call the reference directly instead, see ``_compete.bind``)."""
        if _compete.is_torch(candidate):
            return _compete.kernel_runner(self.op, candidate)
        key = (candidate.index, candidate.config)
        runner = self.bundled.get(key) or self.runners.get(key)
        if runner is None:
            try:
                runner = backends.get(candidate.impl.backend).bind(candidate.impl, candidate.config)
            except Exception as exc:
                raise LaunchError(f"{self.op.name}: preparing {candidate.label} failed: {exc}") from exc
            self.runners[key] = runner
        return runner

    def serve_bundled(self, index: int, config: Any, runner: Callable[..., Any] | None) -> None:
        """Serve candidate (index, config) from an AOT bundle's runner (None: stop serving it)."""
        key = (index, config)
        if runner is None:
            self.bundled.pop(key, None)
        else:
            self.bundled[key] = runner
        self.runners.pop(key, None)

    def bundled_keys(self) -> list[tuple]:
        """(impl index, config) of every candidate a bundle serves."""
        return list(self.bundled)

    def bundled_runner(self, index: int, config: Any) -> Callable[..., Any] | None:
        return self.bundled.get((index, config))

    def forget_runner(self, index: int, config: Any) -> None:
        """Drop the bound runner of a candidate (its binaries changed); the next use binds again."""
        self.runners.pop((index, config), None)

    def output_specs(self, args: tuple) -> list[tuple[tuple[int, ...], torch.dtype, torch.device]]:
        """(shape, dtype, device) of each output (``outputs.output_specs``)."""
        return _outputs.output_specs(self.op, args)

    # ------------------------------------------------------------------ op.run
    def run_forced(self, args: tuple, index: int, frozen: Any) -> Any:
        op = self.op
        key = self.key(args, False, ANY_TENSOR)
        epoch = _EPOCH[0]
        if self.epoch != epoch:
            self._renew(epoch)
        forced = self.forced
        plan = forced.get((key, index, frozen)) if key is not None else None
        if plan is None:
            tensors = self.check(args)
            if tensors and tensors[0][1].device.type == "meta":
                raise InputError(
                    f"{op.name}: argument {tensors[0][0]!r} is a meta tensor: it has no data for a kernel "
                    "to read; call the op itself for output shapes, or op.run(..., impl='reference')")
            if any(_admit.deferred(t) for _, t in tensors):  # not kept: its plan is the resolved one's
                return self.run_forced(_admit.resolve(op.name, op.signature.params, args), index, frozen)
            candidate = evaluate_one(index, op.impls[index], frozen, tensors, args)
            if candidate.reason is not None:
                raise UnsupportedError(
                    f"{op.name}: {candidate.label} cannot run these inputs: {candidate.reason}"
                )
            self._accept_dtypes(args, tensors)
            plan = kernel_plan(op, candidate, self.runner(candidate), self.output_specs(args), args)
            plan = guarded(plan, self.overlap_guard(args))
            if key is not None:
                if len(forced) >= _MAX_PLANS:
                    forced.clear()
                forced[(key, index, frozen)] = plan
        return plan(args)
