"""The autograd kernel of every functional op: the op's backward when it declares one, else a
backward that raises.

Without an autograd kernel, torch's fallback lets an op's output take part in a graph and then
drops the gradient (``g.grad`` stays None, one deprecation warning). Refusing at forward time is
wrong too: model parameters require grad in plain inference and in torch.compile's traced graphs.
So every functional op gets ``torch.library``'s generated autograd kernel, whose ``Info`` this
module owns: ``register_autograd`` later fills in the op's backward without registering again.
An op without one gets a backward that calls ``kernelgraft_autograd::no_backward``, an operator
whose kernel raises: in eager mode the error comes when ``.backward()`` runs; under
torch.compile AOTAutograd traces it into the backward graph (its fake kernel only shapes the
gradient) so compiling inference code still works and a real backward still raises.

The eager hot path never comes here: ``KernelOp.__call__`` goes through the dispatcher only when
grad mode is on and an input requires grad, and that is where the kernel is registered (lazily:
a Python autograd kernel would cost every ``torch.ops`` call of the op, see ``install``). Until
then a ``torch.ops`` call with grad falls to torch's own autograd fallback, which warns at
backward time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch._library import autograd as _torch_autograd
from torch._library import utils as _torch_utils

from .._errors import UnsupportedError

if TYPE_CHECKING:
    from ._operator import KernelOp

__all__ = ["install", "ensure", "set_backward"]

_LOCK = threading.Lock()

_NS = "kernelgraft_autograd"
_lib = torch.library.Library(_NS, "FRAGMENT")
_lib.define("no_backward(Tensor grad, str op, str inputs, SymInt[] size) -> Tensor")


def _refuse(grad: torch.Tensor, op: str, inputs: str, size: list[int]) -> torch.Tensor:
    raise UnsupportedError(
        f"{op} has no backward, and its argument{'s' if ',' in inputs else ''} {inputs} "
        f"require{'' if ',' in inputs else 's'} grad: declare one with "
        f"op.register_autograd(backward, setup_context=...), or call it under torch.no_grad() "
        "or torch.inference_mode() (or .detach() the inputs) if no gradient should flow through it"
    )


for _key in ("CPU", "CUDA"):
    _lib.impl("no_backward", _refuse, _key)


@torch.library.register_fake(f"{_NS}::no_backward", lib=_lib)
def _no_backward_fake(grad, op, inputs, size):
    return grad.new_empty(size)


def _shape(t: Any) -> Any:
    """A tensor's shape; for a ``Tensor[]`` argument, one per element (None for a non-tensor)."""
    if isinstance(t, torch.Tensor):
        return list(t.shape)
    if isinstance(t, (list, tuple)):
        return [_shape(e) for e in t]
    return None


def _no_backward_info(op: "KernelOp") -> tuple[Callable[..., Any], Callable[..., Any]]:
    names = [p.name for p in op.signature.params]

    def setup_context(ctx, inputs, output):
        ctx.kg_sizes = [_shape(t) for t in inputs]

    def backward(ctx, *grads):
        # needs_input_grad holds a bool per argument, and a list of bools for a Tensor[] argument,
        # whose gradient must be a list of the same length (torch checks the structure)
        need = list(ctx.needs_input_grad)
        out: list[Any] = [[None] * len(n) if isinstance(n, (list, tuple)) else None for n in need]
        wanted = [(i, None) if not isinstance(n, (list, tuple)) else (i, k)
                  for i, n in enumerate(need) for k in (range(len(n)) if isinstance(n, (list, tuple)) else [None])
                  if (n[k] if k is not None else n)]
        if not wanted:
            return tuple(out)
        grad = next((g for g in grads if g is not None), None)
        inputs = ", ".join(repr(names[i] if k is None else f"{names[i]}[{k}]") for i, k in wanted)
        # one refusing gradient is enough: it raises when the backward runs (eagerly) or when the
        # compiled backward graph runs
        i, k = wanted[0]
        size = ctx.kg_sizes[i] if k is None else ctx.kg_sizes[i][k]
        refusal = torch.ops.kernelgraft_autograd.no_backward(grad, op.name, inputs, size)
        if k is None:
            out[i] = refusal
        else:
            out[i][k] = refusal
        return tuple(out)

    return backward, setup_context


def install(op: "KernelOp", lib: torch.library.Library) -> None:
    """At definition (and again when the op is defined anew): note the op's library. The autograd
    kernel itself is registered lazily (``ensure``): a Python autograd kernel costs every
    ``torch.ops`` call (compiled graphs, exported programs) several microseconds even when no
    gradient is wanted, so an op gets one only when it declares a backward or when an eager call
    first meets grad mode with an input that requires grad. Ops that mutate an argument keep
    torch's fallback: torch.library gives them no autograd formula."""
    op._autograd_lib = lib
    op._autograd_info = None
    overload = torch._library.utils.lookup_op(op.name)
    op._autograd_functional = _torch_utils.is_functional_schema(overload._schema)
    if op._autograd is not None:
        ensure(op)


def ensure(op: "KernelOp") -> None:
    """Register the op's autograd kernel now if it has none yet: its declared backward, or the
    refusal. Called on the eager slow path (grad on, an input requiring grad), so cheap there."""
    if op._autograd_info is not None or not getattr(op, "_autograd_functional", False):
        return
    with _LOCK:
        if op._autograd_info is not None:
            return
        overload = torch._library.utils.lookup_op(op.name)
        info = _torch_autograd.Info(None, None)
        op._autograd_info = info
        set_backward(op)
        _, name = op.name.split("::")
        op._autograd_lib.impl(name, _torch_autograd.make_autograd_impl(overload, info), "Autograd",
                              with_keyset=True)


def set_backward(op: "KernelOp") -> None:
    """Point the op's autograd kernel at its declared backward, or at the refusing one."""
    info = op._autograd_info
    backward, setup_context = op._autograd if op._autograd is not None else _no_backward_info(op)
    info._backward_fn, info._setup_context_fn = backward, setup_context
