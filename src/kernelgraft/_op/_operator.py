"""The operator: a reference function plus kernel specs, registered as ``torch.ops.<ns>.<name>``.

Registration uses ``torch.library.Library.define`` + ``impl`` + ``register_fake``, the machinery
under ``torch.library.custom_op``, rather than ``custom_op`` or ``triton_op`` themselves:
- ``triton_op`` lets Inductor trace into one Triton kernel, which fixes a single config at compile
  time and cannot hold NVRTC, CuTe DSL or cuTile candidates; the op must stay opaque so the
  autotuner can choose per shape at run time.
- ``custom_op`` wraps every call in a Python autograd shim; ``benchmarks/bench_host_overhead.py``
  measures its eager host cost against ours (the numbers are in benchmarks/results/).
Eager calls on plain tensors skip the dispatcher entirely (``__call__`` below) and reach a cached
plan in a few dict lookups, or, for a one-launch plan, the native replay of its signature
(kernelgraft/_native) in one C++ call; everything else (torch.compile, export, fake/functional
tensors, autograd, user dispatch modes) goes through ``torch.ops`` and the same plans.
"""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from . import _registry
from . import _select
from ._candidates import LAYOUT, Candidate, evaluate, evaluate_one
from .._native._attach import attach
from .._errors import FallbackWarning, InputError, LaunchError, SpecError, UnsupportedError, describe
from ._plan import Plan, reference_plan, kernel_plan
from ._schema import Signature, parse_signature
from .._spec import ImplSpec, callable_source
from ..backends._triton import interpreting

__all__ = ["KernelOp", "op"]


class _AnyTensor:
    """Stands in for the tuple of plain tensor types: every Tensor subclass is 'in' it."""

    def __contains__(self, t: type) -> bool:
        return issubclass(t, _Tensor)


_ANY_TENSOR = _AnyTensor()

log = logging.getLogger(__name__)

_Tensor = torch.Tensor
# Tensor types the fast path treats as plain data; other subclasses (fake, functional, user
# subclasses with __torch_dispatch__) go through the dispatcher.
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_SCALAR_TYPES = (int, float, bool, str)
_is_compiling = torch.compiler.is_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_function_mode_on = torch._C._is_torch_function_mode_enabled
_functorch_on = torch._C._are_functorch_transforms_active
_grad_enabled = torch.is_grad_enabled
_MAX_PLANS = 4096
_EPOCH = _select._epoch  # a one-element list; read directly on the hot path


class KernelOp:
    """An operator built from a PyTorch reference and kernel specs. Create it with ``kg.op``."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None,
        impls: Sequence[ImplSpec],
        mutates_args: Iterable[str] = (),
        sample_inputs: Callable[..., Iterable[tuple]] | None = None,
        dtypes: Sequence[torch.dtype] | Mapping[str, Sequence[torch.dtype]] | None = None,
        ndim: Mapping[str, int | Sequence[int]] | None = None,
        fallback: str = "reference",
        tolerances: Mapping[torch.dtype, float] | None = None,
        cost: Callable[..., tuple[float, float]] | None = None,
        prune: Callable[..., Any] | None = None,
        buckets: Any = None,
    ) -> None:
        where = f"kg.op({name or getattr(fn, '__qualname__', fn)!r})"
        if not callable(fn):
            raise SpecError(f"{where}: the reference must be a function, got {type(fn).__name__}")
        if isinstance(mutates_args, str):
            mutates_args = (mutates_args,)
        mutates_args = tuple(mutates_args)
        impls = tuple(impls)
        for impl in impls:
            if not isinstance(impl, ImplSpec):
                raise SpecError(
                    f"{where}: impls must hold kernel specs made by kg.triton/kg.cuda/kg.cutedsl/"
                    f"kg.cutile, got {describe(impl)}"
                )
        if cost is not None and not callable(cost):
            raise SpecError(f"{where}: cost must be a function (*inputs) -> (bytes, flops), got {describe(cost)}")
        if fallback not in ("reference", "error"):
            raise SpecError(f"{where}: fallback must be 'reference' or 'error', got {fallback!r}")
        self.reference = fn
        self.impls = impls
        self.signature: Signature = parse_signature(fn, mutates_args, where)
        self.mutates_args = mutates_args
        self.sample_inputs = sample_inputs
        self.fallback = fallback
        self.tolerances = dict(tolerances or {})
        self.cost = cost  # (*inputs) -> (bytes, flops) for benchmarks; None: from tensor sizes
        if prune is not None and not callable(prune):
            raise SpecError(f"{where}: prune must be a function (candidates, *inputs) -> candidates, "
                            f"got {describe(prune)}")
        self.prune = prune  # tuning: which candidates to measure (see kernelgraft.tune)
        from ..tune._key import normalize_buckets

        self.buckets = normalize_buckets(buckets, where=where, params=[
            p.name for p in self.signature.params if p.kind in ("tensor", "tensor_list")])
        self._dtypes = self._normalize_dtypes(dtypes, where)
        self._ndim = self._normalize_ndim(ndim, where)
        self.fingerprint = self._compute_fingerprint()
        self.name = name or _registry.default_name(fn, self.fingerprint)
        _registry.split_name(self.name)
        self._meta_fn: Callable[..., Any] = fn
        self._meta_shape_only = False
        self._plans: dict[Any, Plan] = {}
        self._forced: dict[Any, Plan] = {}
        self._runners: dict[Any, Callable[..., Any]] = {}
        self._bundled: dict[Any, Callable[..., Any]] = {}  # (impl index, config) -> AOT bundle runner
        self._epoch = -1
        self._replay: Any = None  # kernelgraft._native Replay of the last signature, or None
        self._warned: set[Any] = set()
        self._nparams = len(self.signature.params)
        # A supports() predicate or the tuner (which keys on it) may decide by pointer alignment,
        # so then plans are keyed on it too; a single unconditional candidate cannot care.
        self._align = any(i.supports is not None for i in impls) or sum(len(i.configs) for i in impls) > 1
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", "op")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__module__ = getattr(fn, "__module__", __name__)
        self._overload: Any = None
        self._lib: Any = None

    # ---------------------------------------------------------------- construction helpers
    def _normalize_dtypes(self, dtypes, where):
        names = {p.name for p in self.signature.params if p.kind in ("tensor", "tensor_list")}
        if dtypes is None:
            return {}
        if isinstance(dtypes, Mapping):
            out = {}
            for key, allowed in dtypes.items():
                if key not in names:
                    raise SpecError(f"{where}: dtypes names {key!r}, which is not a Tensor parameter")
                out[key] = tuple(allowed)
            return out
        allowed = tuple(dtypes)
        if not all(isinstance(d, torch.dtype) for d in allowed):
            raise SpecError(f"{where}: dtypes must hold torch dtypes, got {allowed!r}")
        return {n: allowed for n in names}

    def _normalize_ndim(self, ndim, where):
        out = {}
        for key, value in (ndim or {}).items():
            if key not in {p.name for p in self.signature.params if p.kind == "tensor"}:
                raise SpecError(f"{where}: ndim names {key!r}, which is not a Tensor parameter")
            out[key] = (value,) if isinstance(value, int) else tuple(value)
        return out

    def _compute_fingerprint(self) -> str:
        """sha256 of the op's identity (``_identity``). The identity itself is kept as
        ``self.identity``: when another declaration claims the name, the registry says which
        option differs."""
        self.identity = self._identity()
        return hashlib.sha256(json.dumps(self.identity, sort_keys=True).encode()).hexdigest()

    def _identity(self) -> dict[str, Any]:
        """Every option that changes what the op does, in one canonical JSON form that is the same
        in every process: callables by their source (as the reference), dtypes by name, mappings
        sorted, equivalent spellings (``dtypes=[...]`` vs one list per parameter) normalised."""
        from ..tune._key import callable_identity as source, dtype_name, tolerances_identity

        return {
            "reference": source(self.reference),
            "schema": self.signature.schema,
            "mutates": sorted(self.mutates_args),
            "impls": [impl.fingerprint for impl in self.impls],
            "fallback": self.fallback,
            "dtypes": {p: sorted({dtype_name(d) for d in allowed}) for p, allowed in sorted(self._dtypes.items())},
            "ndim": {p: sorted(set(dims)) for p, dims in sorted(self._ndim.items())},
            "tolerances": {name: value for name, value in tolerances_identity(self.tolerances)},
            "sample_inputs": source(self.sample_inputs),
            "cost": source(self.cost),
            "prune": source(self.prune),
            "buckets": self.buckets.identity(),
        }

    def _bind_overload(self, overload: Any, lib: Any) -> None:
        self._overload = overload
        self._lib = lib

    # ---------------------------------------------------------------- calling
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != self._nparams:
            args = self.signature.bind(self.name, args, dict(kwargs))
        if _is_compiling():
            return self._overload(*args)
        replay = self._replay  # the native replay of the last signature (checks the rest itself)
        if replay is not None and self._epoch == _EPOCH[0]:
            out = replay(args)
            if out is not NotImplemented:
                return out
        if _dispatch_stack_len() or _function_mode_on() or _functorch_on():
            return self._overload(*args)
        key = self._key(args, _grad_enabled())
        if key is None:
            self.signature.check_types(self.name, args)
            return self._overload(*args)
        if self._epoch == _EPOCH[0]:  # the steady state, inlined: one dict lookup and the plan
            plan = self._plans.get(key)
            if plan is not None:
                return plan(args)
        return self._execute(args, key)

    def _key(self, args: tuple, grad: bool, plain: tuple = _PLAIN) -> tuple | None:
        """A small hashable signature of the call, or None when the dispatcher must handle it
        (tensor subclasses, autograd, anything unusual)."""
        parts = []
        align = self._align
        for a in args:
            t = type(a)
            if t in plain:
                if grad and a.requires_grad:
                    return None
                parts.append((a.dtype, a.device, a.shape, a.stride(), a.data_ptr() & 15 if align else 0))
            elif t in _SCALAR_TYPES or a is None or t is torch.dtype:
                parts.append((t, a))
            elif t is list or t is tuple:
                sub = []
                for item in a:
                    if type(item) not in plain or (grad and item.requires_grad):
                        return None
                    sub.append((item.dtype, item.device, item.shape, item.stride(),
                                item.data_ptr() & 15 if align else 0))
                parts.append(tuple(sub))
            else:
                return None
        return tuple(parts)

    def _dispatcher_kernel(self, *args: Any) -> Any:
        # Below the dispatcher every tensor holds real data, whatever its Python type.
        key = self._key(args, False, _ANY_TENSOR)
        if key is None:
            self.signature.check_types(self.name, args)
            raise InputError(f"{self.name}: unsupported argument types {[describe(a) for a in args]}")
        return self._execute(args, key)

    def _fake(self, *args: Any) -> Any:
        outs = self._meta_fn(*args)
        return self._fresh_outputs(outs, empty=True, args=args)

    def _new_epoch(self) -> None:
        # New dicts, not clear(): a plan another thread is still making under the old settings
        # lands in the dict it started with, which no caller sees any more.
        self._plans = {}
        self._forced = {}
        self._replay = None
        self._epoch = _select.epoch()

    def _execute(self, args: tuple, key: tuple) -> Any:
        if self._epoch != _select.epoch():
            self._new_epoch()
        plans = self._plans
        plan = plans.get(key)
        if plan is None:
            plan = self._make_plan(args)
            if len(plans) >= _MAX_PLANS:
                plans.clear()
            plans[key] = plan
        return plan(args)

    # ---------------------------------------------------------------- planning (once per signature)
    def _check(self, args: tuple) -> list[tuple[str, torch.Tensor]]:
        self.signature.check_types(self.name, args)
        tensors = list(self.signature.tensors(args))
        if tensors:
            first_name, first = tensors[0]
            for name, t in tensors[1:]:
                if t.device != first.device:
                    raise InputError(
                        f"{self.name}: argument {name!r} expected a tensor on {first.device} "
                        f"(like {first_name!r}), got {describe(t)}"
                    )
        for name, t in tensors:
            base = name.split("[")[0]
            allowed = self._dtypes.get(base)
            if allowed and t.dtype not in allowed:
                raise InputError(
                    f"{self.name}: argument {name!r} expected dtype in "
                    f"{[str(d) for d in allowed]}, got {describe(t)}"
                )
            ranks = self._ndim.get(base)
            if ranks and t.dim() not in ranks:
                want = ranks[0] if len(ranks) == 1 else list(ranks)
                raise InputError(
                    f"{self.name}: argument {name!r} expected a {want}-dimensional tensor, "
                    f"got {describe(t)}"
                )
        return tensors

    def _make_plan(self, args: tuple) -> Plan:
        tensors = self._check(args)
        candidates = evaluate(self.impls, tensors, args)
        supported = [c for c in candidates if c.supported]
        out_specs = self._output_specs(args)
        if supported:
            chosen = _select.choose(self, supported, args)
            if chosen is None:  # the tuner found no candidate that computes the right result
                return reference_plan(self)
            log.debug("%s: chose %s", self.name, chosen.label)
            runner = self._runner(chosen)
            return attach(self, kernel_plan(self, chosen, runner, out_specs, args), chosen, runner, _PLAIN)
        device = tensors[0][1].device if tensors else torch.device("cpu")
        if not candidates or (device.type == "cpu" and not interpreting()):
            return reference_plan(self)
        if candidates and all(c.category == LAYOUT for c in candidates):
            raise InputError(
                f"{self.name}: every kernel {candidates[0].reason}; pass contiguous tensors "
                "(.contiguous()) or declare an impl with contiguous=False"
            )
        self._no_candidate(candidates, device)
        return reference_plan(self)

    def _no_candidate(self, candidates: Sequence[Candidate], device: torch.device) -> None:
        reasons = sorted({f"{c.impl.backend}:{c.impl.display_name}: {c.reason}" for c in candidates})
        detail = "; ".join(reasons) or "the op has no impls"
        if self.fallback == "error":
            raise UnsupportedError(f"{self.name}: no kernel can run these inputs on {device}: {detail}")
        marker = tuple(reasons)
        if marker not in self._warned:
            self._warned.add(marker)
            warnings.warn(
                f"{self.name}: no kernel can run these inputs on {device}, running the PyTorch "
                f"reference instead. Reasons: {detail}",
                FallbackWarning,
                stacklevel=4,
            )

    def _runner(self, candidate: Candidate) -> Callable[..., Any]:
        key = (candidate.index, candidate.config)
        runner = self._runners.get(key) or self._bundled.get(key)
        if runner is None:
            from .. import backends

            try:
                runner = backends.get(candidate.impl.backend).bind(candidate.impl, candidate.config)
            except Exception as exc:
                raise LaunchError(f"{self.name}: preparing {candidate.label} failed: {exc}") from exc
            self._runners[key] = runner
        return runner

    def _output_specs(self, args: tuple) -> list[tuple[tuple[int, ...], torch.dtype, torch.device]]:
        if self.signature.returns == "none":
            return []
        if self._meta_shape_only:
            outs = self._meta_fn(*args)
            outs = (outs,) if isinstance(outs, torch.Tensor) else outs
            return [(tuple(int(s) for s in o.shape), o.dtype, o.device) for o in outs]
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fake_args = tuple(
                mode.from_tensor(a) if isinstance(a, torch.Tensor)
                else [mode.from_tensor(t) for t in a] if isinstance(a, (list, tuple))
                and a and isinstance(a[0], torch.Tensor) else a
                for a in args
            )
            outs = self._fake(*fake_args)
        outs = (outs,) if isinstance(outs, torch.Tensor) else outs
        return [(tuple(int(s) for s in o.shape), o.dtype, o.device) for o in outs]

    def _fresh_outputs(self, outs: Any, *, empty: bool, args: tuple) -> Any:
        """Outputs as the op promises them: new, contiguous tensors (None for mutate-only ops)."""
        kind = self.signature.returns
        if kind == "none":
            if outs is not None:
                raise SpecError(
                    f"{self.name}: the reference is annotated -> None but returned {describe(outs)}"
                )
            return None
        single = kind == "tensor"
        items = (outs,) if single else outs
        if not isinstance(items, (tuple, list)) or len(items) != self.signature.n_returns or not all(
            isinstance(o, torch.Tensor) for o in items
        ):
            raise SpecError(
                f"{self.name}: the reference (or meta function) must return "
                f"{'a Tensor' if single else f'{self.signature.n_returns} Tensors'}, got {describe(outs)}"
            )
        if empty:
            fresh = tuple(torch.empty(o.shape, dtype=o.dtype, device=o.device) for o in items)
        else:
            # An output may alias an input or an earlier output (``return y, y[:1]``): copy it.
            storages = {t.untyped_storage().data_ptr() for _, t in self.signature.tensors(args)}
            copies = []
            for o in items:
                o = (o.clone(memory_format=torch.contiguous_format)
                     if o.untyped_storage().data_ptr() in storages else o.contiguous())
                storages.add(o.untyped_storage().data_ptr())
                copies.append(o)
            fresh = tuple(copies)
        return fresh[0] if single else fresh

    # ---------------------------------------------------------------- public API
    def register_meta(self, fn: Callable[..., Any] | None = None, /, *, shape_only: bool = False) -> Any:
        """Use ``fn`` instead of the reference to compute output shapes and dtypes (fake tensors).

        Needed when the reference cannot run on fake tensors (data-dependent shapes, ``.item()``).
        ``shape_only=True`` promises that ``fn`` reads only shapes, dtypes and devices, so
        kernelgraft may call it on the real arguments to plan a call, skipping fake tensors (whose
        first use costs torch about a second of lazy imports). Usable as a decorator.
        """
        if fn is None:
            return lambda f: self.register_meta(f, shape_only=shape_only)
        if not callable(fn):
            raise SpecError(f"{self.name}: register_meta needs a function, got {describe(fn)}")
        self._meta_shape_only = shape_only
        self._meta_fn = fn
        self._replay = None
        self._plans = {}  # new dicts rather than clear(): a plan being made now must not land here
        self._forced = {}  # op.run plans hold output shapes from the old meta too
        return fn

    def register_autograd(
        self, backward: Callable[..., Any], *, setup_context: Callable[..., Any] | None = None
    ) -> None:
        """Give the op a backward (see ``torch.library.register_autograd``)."""
        self._autograd = (backward, setup_context)  # re-applied if the registry re-defines the op
        torch.library.register_autograd(self.name, backward, setup_context=setup_context, lib=self._lib)

    def candidates(self, *args: Any, **kwargs: Any) -> list[Candidate]:
        """Every (impl, config) with whether it supports these inputs and, if not, why."""
        args = self.signature.bind(self.name, args, dict(kwargs))
        tensors = self._check(args)
        return evaluate(self.impls, tensors, args)

    def run(
        self,
        *args: Any,
        impl: int | str | ImplSpec | None = None,
        config: Mapping[str, Any] | int | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run one chosen candidate (or ``impl="reference"``), bypassing selection.

        ``impl``: index into ``impls``, a backend or impl name, or the spec; ``config``: a dict or an
        index into that impl's configs (default: its first).
        """
        args = self.signature.bind(self.name, args, dict(kwargs))
        if impl == "reference":
            self._check(args)
            return self._fresh_outputs(self.reference(*args), empty=False, args=args)
        index = self._impl_index(impl)
        spec = self.impls[index]
        frozen = spec.config(0 if config is None else config)
        key = self._key(args, False, _ANY_TENSOR)
        if self._epoch != _select.epoch():
            self._new_epoch()
        forced = self._forced
        plan = forced.get((key, index, frozen)) if key is not None else None
        if plan is None:
            tensors = self._check(args)
            candidate = evaluate_one(index, spec, frozen, tensors, args)
            if candidate.reason is not None:
                raise UnsupportedError(
                    f"{self.name}: {candidate.label} cannot run these inputs: {candidate.reason}"
                )
            plan = kernel_plan(self, candidate, self._runner(candidate), self._output_specs(args), args)
            if key is not None:
                if len(forced) >= _MAX_PLANS:
                    forced.clear()
                forced[(key, index, frozen)] = plan
        return plan(args)

    def _impl_index(self, impl: int | str | ImplSpec | None) -> int:
        if not self.impls:
            raise UnsupportedError(f"{self.name}: the op has no impls; use impl='reference'")
        if impl is None:
            return 0
        if isinstance(impl, int) and not isinstance(impl, bool):
            if 0 <= impl < len(self.impls):
                return impl
        elif isinstance(impl, ImplSpec):
            for i, spec in enumerate(self.impls):
                if spec == impl:
                    return i
        elif isinstance(impl, str):
            for i, spec in enumerate(self.impls):
                if impl in (spec.backend, spec.display_name):
                    return i
        names = [f"{i}: {s.backend}:{s.display_name}" for i, s in enumerate(self.impls)]
        raise SpecError(f"{self.name}: impl {impl!r} not found; the op has {names} and 'reference'")

    @property
    def overload(self) -> Any:
        """The ``torch.ops.<ns>.<name>.default`` overload."""
        return self._overload

    def __repr__(self) -> str:
        return f"<kernelgraft op {self.name}{self.signature.schema} impls={list(self.impls)}>"


def op(
    name_or_fn: str | Callable[..., Any] | None = None,
    /,
    *,
    impls: Sequence[ImplSpec] = (),
    mutates_args: Iterable[str] = (),
    sample_inputs: Callable[..., Iterable[tuple]] | None = None,
    dtypes: Sequence[torch.dtype] | Mapping[str, Sequence[torch.dtype]] | None = None,
    ndim: Mapping[str, int | Sequence[int]] | None = None,
    fallback: str = "reference",
    tolerances: Mapping[torch.dtype, float] | None = None,
    name: str | None = None,
    cost: Callable[..., tuple[float, float]] | None = None,
    prune: Callable[..., Any] | None = None,
    buckets: Any = None,
) -> Any:
    """Turn a PyTorch reference function into an operator backed by kernels.

    ``@kg.op("ns::name", impls=[...])`` decorates the reference; ``kg.op(fn, impls=[...])`` works
    as a call. Without a name the op gets ``kernelgraft::<qualname>_<hash>``, the same in every
    process. ``cost(*inputs) -> (bytes, flops)`` tells ``kernelgraft bench`` what one call moves
    and computes (default: every input read once, every output written once, no flops).
    ``prune(candidates, *inputs)`` and ``buckets`` shape autotuning (see ``kernelgraft.tune``).

    >>> import torch, kernelgraft as kg
    >>> @kg.op("doctest::scale2")
    ... def scale2(x: torch.Tensor) -> torch.Tensor:
    ...     return x * 2
    >>> scale2(torch.ones(3)).tolist()
    [2.0, 2.0, 2.0]
    >>> torch.ops.doctest.scale2(torch.ones(2)).tolist()
    [2.0, 2.0]
    """
    options = dict(
        impls=impls, mutates_args=mutates_args, sample_inputs=sample_inputs, dtypes=dtypes,
        ndim=ndim, fallback=fallback, tolerances=tolerances, cost=cost, prune=prune,
        buckets=buckets,
    )

    def wrap(fn: Callable[..., Any], qualname: str | None) -> KernelOp:
        return _registry.register(KernelOp(fn, name=qualname, **options))  # type: ignore[arg-type]

    if callable(name_or_fn):
        return wrap(name_or_fn, name)
    if name_or_fn is not None and name is not None:
        raise SpecError("kg.op: give the name once, positionally or as name=")
    qualname = name_or_fn if name_or_fn is not None else name
    if qualname is not None and not isinstance(qualname, str):
        raise SpecError(f"kg.op: the name must be a string like 'ns::name', got {describe(qualname)}")
    return lambda fn: wrap(fn, qualname)
