"""Every op's autograd, registered when the op is defined: no route drops a gradient.

Without an autograd kernel, torch's fallback lets an op's output take part in a graph and then
drops the gradient (``x.grad`` stays None, one deprecation warning); a compiled graph traced in a
fresh process, a first call through ``torch.ops``, or a forward-mode tangent would lose it
silently. So ``install`` registers, with the op's definition (``_registry._define``), one
``Autograd`` kernel and one batching rule (``_vmap``). The kernel decides, per call:

- **forward-mode AD** (``torch.func.jvp``, ``jacfwd``, ``torch.autograd.forward_ad``: an input
  carries a tangent): the op runs its *reference* at this point, as a composite of PyTorch ops,
  so the tangent is exactly the reference's (and the value the reference's, within the op's
  tolerance of the kernels'). A user gives no forward-mode formula, and a backward cannot be turned
  into one without differentiating it twice, which a backward written with kernels cannot do; the
  reference is the op's definition and is plain PyTorch, so its jvp is the right one for every op,
  with or without a backward, and composes with every functorch transform.
- **reverse mode** (grad on and an input requires grad): the op's ``torch.autograd.Function``
  (``_function``), whose backward is the one declared with ``op.register_autograd`` or else the
  refusal (``_refusal``), which raises, naming the op, when a backward reaches it: in eager mode,
  under ``torch.func.grad`` / ``vjp`` / ``jacrev`` / ``vmap(grad)``, and in a compiled backward
  graph. The Function is applied here, inside the dispatcher, the way PyTorch's own autograd
  kernels work: it records its node on this functorch level's tensors and its forward redispatches
  to the levels below, which is what makes it compose with functorch's transforms.
- otherwise the call goes on below autograd to the op's kernels.

An op that mutates an argument has no backward (torch.library gives such ops no autograd formula)
and no Function: a call in grad mode whose inputs require grad and whose written tensors could
carry a gradient (a floating mutated argument, or any returned tensor) is refused, naming the op,
before it writes. Refusing at backward time instead would need the written tensor to join the
graph in place, which compiled graphs cannot keep for a graph input (the gradient would be lost
there). An integer tensor written from such inputs (a quantized cache) carries no gradient.

Cost: every ``torch.ops`` call of an op (compiled graphs, exported programs) enters this Python
kernel once; one that needs no gradient goes from here straight to the op's kernel when nothing
sits between autograd and the backend (``_plain``), instead of a second trip from C++ into Python.
Measured on CPU (thread time, a reference-served op on a 16-element tensor): a ``torch.ops`` call
costs about 1.3 us more than with no autograd kernel (6.3 -> 7.6 us, grad mode on or off;
inference mode skips autograd and is unchanged), most of it torch passing the dispatch keyset to a
Python kernel; an op with a backward is 4 us cheaper than under torch.library's generated kernel
(11.6 -> 7.6 us). ``KernelOp.__call__``'s eager path never comes here: it checks grad mode and the
forward-AD level itself and takes the dispatcher only when one of them asks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._functorch.utils import enable_single_level_autograd_function as _single_level
from torch._library import utils as _torch_utils
from torch.autograd import forward_ad as _fwad

from ..errors import KernelgraftError, UnsupportedError
from . import refusal as _refusal, vmap as _vmap
from .function import make_function


__all__ = ["install", "set_backward"]

_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_grad_enabled = torch._C.is_grad_enabled
_fwd_grad_enabled = torch._C._is_fwd_grad_enabled


def _any_requires_grad_py(*args: Any) -> bool:  # torch builds without the C helper
    return any(a.requires_grad if isinstance(a, torch.Tensor) else
               isinstance(a, list) and any(isinstance(t, torch.Tensor) and t.requires_grad for t in a)
               for a in args)


_any_requires_grad = getattr(torch._C, "_any_requires_grad", _any_requires_grad_py)
_unpack_dual = torch._VF._unpack_dual
_functorch_on = torch._C._are_functorch_transforms_active


def _has_tangent(args: tuple) -> bool:
    level = _fwad._current_level
    if level < 0 or not _fwd_grad_enabled():
        return False
    for a in args:
        if isinstance(a, torch.Tensor):
            if _unpack_dual(a, level=level)[1] is not None:
                return True
        elif isinstance(a, (list, tuple)):
            for t in a:
                if isinstance(t, torch.Tensor) and _unpack_dual(t, level=level)[1] is not None:
                    return True
    return False


def _forward_ad(op: Any, args: tuple) -> Any:
    """Forward-mode AD: the op's reference, run here as a composite of PyTorch ops. The op's
    argument checks (types, devices, declared dtypes and ranks) apply first, as on every call."""
    op.dispatcher.check(args)
    try:
        outs = op.reference(*args)
    except KernelgraftError:
        raise
    except Exception as exc:
        raise UnsupportedError(
            f"{op.name}: forward-mode AD (torch.func.jvp, jacfwd, torch.autograd.forward_ad) "
            f"differentiates the op's reference, and running it on tensors with tangents failed: "
            f"{type(exc).__name__}: {exc}") from exc
    # Fresh, contiguous outputs, as the op promises (a clone keeps the tangent). Not through
    # KernelOp._fresh_outputs: under functorch these are wrappers, which have no storage to compare.
    if isinstance(outs, torch.Tensor):
        return outs.clone(memory_format=torch.contiguous_format)
    if isinstance(outs, (tuple, list)):
        return tuple(o.clone(memory_format=torch.contiguous_format) if isinstance(o, torch.Tensor) else o
                     for o in outs)
    return outs


def _apply_function(apply: Any, args: tuple) -> Any:
    if _functorch_on():
        # Under a functorch transform the Function is applied at this level only (as PyTorch's
        # own autograd kernels are): its forward reaches the levels below through the dispatcher.
        with _single_level():
            return apply(*args)
    return apply(*args)


_INPLACE_OR_VIEW = torch._C.DispatchKey.ADInplaceOrView  # a fallthrough for the op
_BACKENDS = (torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA)  # where the op's kernel is registered
_PLAIN: dict[int, bool] = {}  # a dispatch keyset's raw value -> whether below autograd is the backend alone


def _plain(keyset: Any) -> bool:
    """Whether nothing sits between autograd and the backend in ``keyset`` (no Python mode or
    subclass, functionalization, functorch level, neg or conj bit: all come as dispatch keys),
    and the backend is one where the op's kernel is ``KernelOp._dispatcher_kernel``."""
    below = (keyset & _AFTER_AUTOGRAD).remove(_INPLACE_OR_VIEW)
    plain = _PLAIN[keyset.raw_repr()] = below.highestPriorityTypeId() in _BACKENDS
    return plain


def _functional_kernel(holder: Any, kernel: Any, overload: Any, fn: Any) -> Any:
    # Below autograd, a call goes straight to the op's kernel when the keyset is plain (_plain),
    # else it is redispatched: skipping the redispatch saves every torch.ops call that needs no
    # gradient a second trip from C++ into Python.
    redispatch, known = overload.redispatch, _PLAIN
    # autograd.Function.apply checks for functorch transforms and would send the Function to a
    # HigherOrderOperator that the dispatcher cannot serve from inside this kernel: the C++ apply
    # underneath it is the one that records the node.
    apply = super(torch.autograd.function._SingleLevelFunction, fn).apply
    flatten = fn.kg_flatten  # None: the op's arguments are the Function's inputs as they are

    def autograd_kernel(keyset, *args):
        if _fwad._current_level >= 0 and _has_tangent(args):
            return _forward_ad(holder(), args)
        if _grad_enabled() and _any_requires_grad(*args):
            return _apply_function(apply, args if flatten is None else flatten(args))
        plain = known.get(keyset.raw_repr())
        if plain or (plain is None and _plain(keyset)):
            return kernel(*args)
        return redispatch(keyset & _AFTER_AUTOGRAD, *args)

    return autograd_kernel


def _differentiable(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())


def _mutating_kernel(op: Any, holder: Any, kernel: Any, overload: Any) -> Any:
    redispatch, known = overload.redispatch, _PLAIN
    names = [p.name for p in op.signature.params]
    mutated_idx = [i for i, p in enumerate(op.signature.params) if p.mutated]
    mutated = [names[i] for i in mutated_idx]
    returns = op.signature.n_returns > 0

    def receives_gradient(args: tuple) -> bool:
        """Whether a tensor that could carry a gradient gets values from the call: a returned
        tensor, or a mutated one of a floating or complex dtype (an integer cache cannot)."""
        if returns:
            return True
        for i in mutated_idx:
            a = args[i]
            if _differentiable(a) or (isinstance(a, (list, tuple)) and any(map(_differentiable, a))):
                return True
        return False

    def autograd_kernel(keyset, *args):
        if _fwad._current_level >= 0 and _has_tangent(args):
            return _forward_ad(holder(), args)
        if _grad_enabled() and _any_requires_grad(*args) and receives_gradient(args):
            # No formula can carry the gradient into what the call writes: refuse before it
            # writes (after it, the written tensor would look differentiable, or, as torch's
            # fallback leaves it, silently not depend on the inputs).
            need = [[t.requires_grad for t in a] if isinstance(a, (list, tuple)) else
                    (isinstance(a, torch.Tensor) and a.requires_grad) for a in args]
            inputs = _refusal.describe_inputs(names, _refusal.wanted(names, need))
            raise _refusal.mutation_refused(op.name, mutated, inputs)
        plain = known.get(keyset.raw_repr())
        if plain or (plain is None and _plain(keyset)):
            return kernel(*args)
        return redispatch(keyset & _AFTER_AUTOGRAD, *args)

    return autograd_kernel


def install(op: Any, lib: torch.library.Library, route: Any = None) -> None:
    """At definition (and again whenever the op is defined anew): register the op's autograd
    kernel and batching rule in its own library fragment ``lib``. ``route`` (the name's slot in the
    registry) is where calls go: its ``kernel`` forwards to the op that holds the name and its
    ``holder()`` returns that op, so an op that takes the name later with the same schema is served
    by this autograd kernel without registering another one."""
    overload = _torch_utils.lookup_op(op.name)
    _, name = op.name.split("::")
    functional = _torch_utils.is_functional_schema(overload._schema)
    op._autograd_functional = functional
    kernel = route.kernel if route is not None else op._dispatcher_kernel
    holder = route.holder if route is not None else (lambda: op)
    if functional:
        fn = make_function(op, overload)
        op._autograd_info = fn.kg_state
        set_backward(op)
        autograd_kernel = _functional_kernel(holder, kernel, overload, fn)
    else:
        op._autograd_info = None
        autograd_kernel = _mutating_kernel(op, holder, kernel, overload)
    lib.impl(name, autograd_kernel, "Autograd", with_keyset=True)
    _vmap.install(op, lib, overload)


def adopt(op: Any, previous: Any) -> None:
    """``op`` takes a name whose definition (of the same schema) ``previous`` held: the definition's
    autograd kernel serves it, running its backward from now on."""
    op._autograd_functional = previous._autograd_functional
    op._autograd_info = previous._autograd_info
    set_backward(op)


def set_backward(op: Any) -> None:
    """Point the op's Function at its declared backward, or at the refusing one."""
    state = op._autograd_info
    if state is None:
        return
    if op._autograd is not None:
        state.backward, state.setup_context = op._autograd
    else:
        state.backward, state.setup_context = _refusal.no_backward(
            op.name, [p.name for p in op.signature.params])
