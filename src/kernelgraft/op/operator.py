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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from ..errors import InputError, KernelgraftError, RegistrationError, SpecError, UnsupportedError, describe
from ..spec import Config, ImplSpec
from ..verify.compare import normalize_compare, output_names
from ..verify.oracle import check_tolerances
from .buckets import normalize_buckets
from .modes import scope as _scope
from . import (
    declare,
    autograd as _autograd,
    compete as _compete,
    probe as _probe,
    registry as _registry,
    select as _select,
)
from .candidates import Candidate, evaluate
from .dispatcher import ANY_TENSOR, Dispatcher
from .shape_error import shape_error
from .schema import Signature, parse_signature

__all__ = ["KernelOp", "add_trace_hook"]


log = logging.getLogger(__name__)

_SCALAR_TYPES = (int, float, bool, str)
_is_compiling = torch.compiler.is_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_function_mode_on = torch._C._is_torch_function_mode_enabled
_functorch_on = torch._C._are_functorch_transforms_active
_grad_enabled = torch.is_grad_enabled
_FORWARD_AD = torch.autograd.forward_ad  # its _current_level >= 0 while a dual level is open
_EPOCH = _select._epoch  # a one-element list; read directly on the hot path
# Called as hook(op, args) whenever fake tensors reach an op (torch.compile and export tracing,
# and the op's own shape inference); kernelgraft.wiring adds Inductor's in-graph choice (graft).
TRACE_HOOKS: list[Callable[[Any, tuple], None]] = []


def add_trace_hook(hook: Callable[[Any, tuple], None]) -> None:
    """Call ``hook(op, args)`` whenever fake tensors reach an op (once per hook)."""
    if hook not in TRACE_HOOKS:
        TRACE_HOOKS.append(hook)


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
        allow_overlap: bool = False,
        compete: Any = True,
        outputs: Sequence[str] | None = None,
        compare: Any = None,
    ) -> None:
        where = f"kg.op({name or getattr(fn, '__qualname__', fn)!r})"
        if not callable(fn):
            raise SpecError(f"{where}: the reference must be a function, got {type(fn).__name__}")
        if isinstance(mutates_args, str):
            mutates_args = (mutates_args,)
        mutates_args = tuple(mutates_args)
        impls = declare.check_impls(impls, where)
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
        if not isinstance(allow_overlap, bool):
            raise SpecError(f"{where}: allow_overlap must be True or False, got {describe(allow_overlap)}")
        # Whether inputs may share memory with an argument the op mutates (see Dispatcher.overlap_guard).
        self.allow_overlap = allow_overlap
        # Which of the reference's PyTorch runs ("eager", "compile") compete in tuning (_compete).
        self.compete = _compete.normalize_compete(compete, where)
        self.reference = fn
        self.impls = impls
        self.signature: Signature = parse_signature(fn, mutates_args, where)
        self.mutates_args = mutates_args
        self.sample_inputs = sample_inputs
        self.fallback = fallback
        self.tolerances = check_tolerances(tolerances, where)
        self.cost = cost  # (*inputs) -> (bytes, flops) for benchmarks; None: from tensor sizes
        if prune is not None and not callable(prune):
            raise SpecError(f"{where}: prune must be a function (candidates, *inputs) -> candidates, "
                            f"got {describe(prune)}")
        self.prune = prune  # tuning: which candidates to measure (see kernelgraft.tune)
        self.buckets = normalize_buckets(buckets, where=where, params=[
            p.name for p in self.signature.params if p.kind in ("tensor", "tensor_list")])
        self._dtypes = declare.normalize_dtypes(self.signature, dtypes, where)
        self._ndim = declare.normalize_ndim(self.signature, ndim, where)
        params = self.signature.params
        # the names check, the gate and compare= use for what the op produces (kernelgraft.verify.compare)
        self.output_names = output_names(outputs, self.signature.n_returns, params, where)
        self._outputs_declared = outputs is not None
        self.compare = normalize_compare(
            compare, self.output_names + tuple(params[i].name for i in self.signature.mutated), params, where)
        self.identity = declare.identity(self)  # when another declaration claims the name, the registry says what differs
        self.fingerprint = hashlib.sha256(json.dumps(self.identity, sort_keys=True).encode()).hexdigest()
        self.name = name or _registry.default_name(fn, self.fingerprint)
        _registry.split_name(self.name)
        self._meta_fn: Callable[..., Any] = fn
        self._meta_shape_only = False
        self._nparams = len(self.signature.params)
        # where a single-tensor output's aliasing check looks (_fresh_outputs); None: lists too
        self._tensor_positions: tuple[int, ...] | None = (
            None if any(p.kind == "tensor_list" for p in self.signature.params)
            else tuple(i for i, p in enumerate(self.signature.params) if p.kind == "tensor"))
        self._d = Dispatcher(self)  # the runtime state: plans, runners, bundles, replays
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", "op")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__module__ = getattr(fn, "__module__", __name__)
        self._overload: Any = None
        self._lib: Any = None
        self._autograd: tuple | None = None  # (backward, setup_context) once register_autograd ran
        self._autograd_info: Any = None  # the backward its autograd Function uses (_autograd)

    def _bind_overload(self, overload: Any, lib: Any) -> None:
        self._overload = overload
        self._lib = lib

    def _retire(self, how: str) -> None:
        """This object no longer holds its name (``how``: 'replaced' or 'unregistered'): drop what
        serves it (plans, replays, runners, bundled runners, tuning decisions in memory) and turn
        it into a forwarder to whichever op holds the name now. The class is swapped rather than a
        flag tested in ``__call__``, so live ops pay nothing on the hot path."""
        d = self._d
        d.runners.clear()
        d.bundled.clear()
        d.reset()
        _select.forget(self.fingerprint)
        self._retired = how
        self._live_class = type(self)
        self.__class__ = _RetiredOp

    # ---------------------------------------------------------------- calling
    @property
    def dispatcher(self) -> Dispatcher:
        """The op's runtime state (plans, runners, bundles, replays); see ``_dispatcher``."""
        return self._d

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != self._nparams:
            args = self.signature.bind(self.name, args, dict(kwargs))
        if _is_compiling() or _FORWARD_AD._current_level >= 0:  # a tangent may ride on an argument
            return self._overload(*args)
        d = self._d
        replay = d.replay  # (Replay, scope, epoch) of the last signature; the Replay checks the rest
        if replay is not None and replay[2] == _EPOCH[0] and replay[1] is _scope():
            out = replay[0](args)
            if out is not NotImplemented:
                return out
        if _dispatch_stack_len() or _function_mode_on() or _functorch_on():
            return self._overload(*args)
        key = d.key(args, _grad_enabled())
        if key is None:
            self.signature.check_types(self.name, args)
            return self._overload(*args)  # grad wanted: the op's autograd kernel (_autograd)
        if d.epoch == _EPOCH[0]:  # the steady state, inlined: two dict lookups and the plan
            table = d.tables.get(_scope())
            if table is not None:
                plan = table.get(key)
                if plan is not None:
                    return plan(args)
        return d.execute(args, key)

    def _dispatcher_kernel(self, *args: Any) -> Any:
        # Below the dispatcher every tensor holds real data, whatever its Python type. (An op
        # without a backward is not refused here when an input requires grad: model parameters
        # require grad in plain inference and in torch.compile's traced graphs alike; its
        # autograd kernel refuses at backward time instead, see _autograd.)
        # torch.compile's graphs call the op here, through torch.ops, on every call: try the last
        # signature's native replay first, as __call__ does (it checks the whole signature itself
        # and hands back anything it does not serve), before the Python key and plan lookup.
        d = self._d
        replay = d.replay
        if replay is not None and replay[2] == _EPOCH[0] and replay[1] is _scope():
            out = replay[0](args)
            if out is not NotImplemented:
                return out
        key = d.key(args, False, ANY_TENSOR)
        if key is None:
            self.signature.check_types(self.name, args)
            raise InputError(f"{self.name}: unsupported argument types {[describe(a) for a in args]}")
        return d.execute(args, key)

    def _fake(self, *args: Any) -> Any:
        for hook in TRACE_HOOKS:
            hook(self, args)
        if self.signature.returns == "none":
            return None  # nothing to allocate: running the reference here would trace its data
        try:
            outs = _probe.meta_outputs(self, args)
        except KernelgraftError:
            raise
        except Exception as exc:  # shapes that do not fit: named here, also under torch.compile
            error = shape_error(self, args, exc)
            if error is None:
                raise
            raise error from exc
        return self._fresh_outputs(outs, empty=True, args=args)

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
        if single and not empty and type(outs) is torch.Tensor and self._tensor_positions is not None:
            # the common case on the eager path (a PyTorch plan, the reference serving a call):
            # one tensor, compared with each tensor argument's storage without building a set
            ptr = outs.untyped_storage().data_ptr()
            for i in self._tensor_positions:
                t = args[i]
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == ptr:
                    return outs.clone(memory_format=torch.contiguous_format)
            return outs.contiguous()
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
        self._d.reset()  # every plan, op.run's included, holds output shapes from the old meta
        return fn

    def meta(self, *args: Any) -> Any:
        """The output tensors the meta function gives for (fake) arguments, as the reference
        returns them; None for an op that returns None, whose meta function never runs (its
        reference may depend on data that fake tensors do not have)."""
        if self.signature.returns == "none":
            return None
        return self._meta_fn(*args)

    @property
    def has_meta(self) -> bool:
        """Whether ``register_meta`` gave the op a meta function (else the reference serves)."""
        return self._meta_fn is not self.reference

    def register_autograd(
        self, backward: Callable[..., Any], *, setup_context: Callable[..., Any] | None = None
    ) -> None:
        """Give the op a backward (see ``torch.library.register_autograd``). Until it has one, a
        backward through the op raises an ``UnsupportedError`` naming it (``_autograd``).
        Forward-mode AD differentiates the reference, with or without a backward."""
        if not callable(backward) or (setup_context is not None and not callable(setup_context)):
            raise SpecError(f"{self.name}: register_autograd needs functions, got backward="
                            f"{describe(backward)}, setup_context={describe(setup_context)}")
        if self.mutates_args:
            raise SpecError(
                f"{self.name}: register_autograd is for ops that do not mutate their arguments, and "
                f"this one mutates {', '.join(repr(m) for m in self.mutates_args)} (torch.library "
                "gives such ops no autograd formula); declare a functional op that returns its "
                "result, and give that one the backward")
        self._autograd = (backward, setup_context)  # re-applied if the registry re-defines the op
        _autograd.set_backward(self)

    def candidates(self, *args: Any, **kwargs: Any) -> list[Candidate]:
        """Every (impl, config) with whether it supports these inputs and, if not, why; then
        ``torch:eager`` and ``torch:compile``, the reference run by PyTorch, with why each does
        not compete here (off for the op or the thread, not CUDA, or the compile error)."""
        from .modes import settings

        args = self.signature.bind(self.name, args, dict(kwargs))
        tensors = self._d.check(args)
        return evaluate(self.impls, tensors, args) + _compete.torch_candidates(self, tensors, settings())

    def run(
        self,
        *args: Any,
        impl: int | str | ImplSpec | None = None,
        config: Mapping[str, Any] | int | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run one chosen candidate (or ``impl="reference"``), bypassing selection.

        ``impl``: index into ``impls``, a backend or impl name, or the spec; ``config``: a dict or an
        index into that impl's configs (default: its first). ``impl="torch:eager"`` or
        ``"torch:compile"`` (or such a candidate's ``index``) runs the reference through PyTorch as
        the tuner's candidate of that name does.
        """
        args = self.signature.bind(self.name, args, dict(kwargs))
        if impl == "reference":
            self._d.check(args)
            return self._fresh_outputs(self.reference(*args), empty=False, args=args)
        torch_name = _compete.find(impl)
        if torch_name is not None:  # 'torch:eager' / 'torch:compile', or their index in candidates()
            # What its candidate carries (an empty Config), None, 0 or {}: it has no config.
            if not (config is None or (type(config) is int and config == 0)
                    or (isinstance(config, (Mapping, Config)) and len(config) == 0)):
                raise SpecError(f"{self.name}: torch:{torch_name} takes no config, got {config!r}")
            self._d.check(args)
            call = _compete.bind(self, _compete.candidate(torch_name))
            return self._fresh_outputs(call(*args), empty=False, args=args)
        index = self._impl_index(impl)
        return self._d.run_forced(args, index, self.impls[index].config(0 if config is None else config))

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
        raise SpecError(f"{self.name}: impl {impl!r} not found; the op has {names}, 'reference', "
                        "'torch:eager' and 'torch:compile'")

    @property
    def overload(self) -> Any:
        """The ``torch.ops.<ns>.<name>.default`` overload."""
        return self._overload

    def __repr__(self) -> str:
        return f"<kernelgraft op {self.name}{self.signature.schema} impls={list(self.impls)}>"


class _RetiredOp(KernelOp):
    """A ``KernelOp`` whose name was re-declared (``kg.op(..., replace=True)``) or unregistered.

    Calls forward to the op that holds the name now. References to the old object outlive the
    cell that re-declared it (a model that stored the op, a grafted module, ``f = my_op``), and
    the user who re-ran the cell meant "use my new definition", which is also what
    ``torch.ops.<ns>.<name>`` resolves to; raising would force rebuilding every such object after
    each edit. When no op holds the name (unregistered, not declared again), calls raise.
    """

    _retired = "replaced"

    def _current(self) -> KernelOp:
        current = _registry.holder(self.name)  # waits while the name's schema changes
        if current is None or current is self:
            raise RegistrationError(
                f"{self.name}: this op was {self._retired} and no op holds the name now; declare "
                "it again with kg.op, then call the new op")
        return current

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._current()(*args, **kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self._current().run(*args, **kwargs)

    def candidates(self, *args: Any, **kwargs: Any) -> list[Candidate]:
        return self._current().candidates(*args, **kwargs)

    @property
    def overload(self) -> Any:
        return self._current().overload

    @property
    def dispatcher(self) -> Dispatcher:
        return self._current().dispatcher

    def register_meta(self, fn: Any = None, /, *, shape_only: bool = False) -> Any:
        raise self._stale("register_meta")

    def register_autograd(self, backward: Any, *, setup_context: Any = None) -> None:
        raise self._stale("register_autograd")

    def _revive(self) -> None:
        """Undo ``_retire`` (the declaration that replaced this op failed, and it holds the name
        again); its plans are made anew."""
        self.__class__ = self._live_class

    def _stale(self, what: str) -> RegistrationError:
        return RegistrationError(
            f"{self.name}: {what} on an op object that was {self._retired}; call it on the op "
            "that kg.op returned for the new declaration")

    def __repr__(self) -> str:
        return f"<kernelgraft op {self.name} ({self._retired}; calls go to the op of that name)>"
