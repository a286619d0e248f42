"""Which tensors may reach a kernel: the one admission rule that every path applies.

A kernel sees a tensor as a data pointer, a dtype, a shape and strides. Those describe the tensor's
values only when the tensor is

- dense and strided: ``layout == torch.strided``, not nested, not quantized. Sparse (COO, CSR, CSC,
  BSR, BSC), mkldnn, nested and quantized tensors keep their values elsewhere or encoded: they are
  **refused** with an ``InputError`` naming the op and the argument, on every path;
- *read as stored*: no negative bit (``torch._neg_view(x)``, ``z.conj().imag``), no conjugate bit
  (``z.conj()``), not a ZeroTensor (autograd's all-zero tensor without memory). These are views whose
  values are a function of their memory. An argument the op only **reads** is **resolved**: replaced
  by a materialized copy (``.resolve_conj().resolve_neg()``, zeros for a ZeroTensor), which is what
  torch's own dispatcher does for operators without math-bit kernels, so ``op(z.conj())`` equals the
  reference at the cost of one copy. An argument the op **mutates** is **refused**: the kernel would
  write the view's memory, not its values, and writing a resolved copy would lose the write;
- of a dtype the op declares, on the device of the other tensors (``Dispatcher.check``), with data: a
  meta tensor has none, so a call on meta tensors runs no kernel (nor the reference) and returns the
  meta function's outputs, as ``torch.ops.<ns>.<name>`` does; ``op.run(impl=<kernel>)`` refuses it.

Where the rule is applied (each path at the cost it can afford):

- the eager call (``KernelOp.__call__``): the plan key (``Dispatcher.key``) holds each tensor's
  negative bit, its conjugate bit when the op can take complex tensors, and whether its data pointer
  is null (a ZeroTensor); sparse and mkldnn tensors (no data pointer) and nested ones (no strides)
  raise while the key is read, which sends the call to the checks below. Keys are per signature, so
  everything else is checked once, when the signature's plan is made (``check``); the plan of a
  signature with a deferred tensor resolves it and runs the plan of the resolved arguments;
- ``torch.ops.<ns>.<name>``, ``torch.compile``'s graphs and ``op.run``: the dispatcher kernels from
  ``dispatcher_kernels`` (registered with the op) resolve at the Negative, Conjugate and ZeroTensor
  keys and refuse at the sparse, mkldnn, nested and quantized ones, so the op's CPU/CUDA kernel
  sees admitted tensors only;
- the native replay (``_native/replay.cpp``) hands any tensor with one of these properties back to
  the Python path, which decides as above; a replay is only ever recorded from admitted tensors;
- the C++ runtime that serves bundles (``runtime/csrc/admit.cpp``) registers the same kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .errors import InputError, describe

__all__ = ["refusal", "deferred", "check", "resolve", "dispatcher_kernels"]

# torch's layouts other than strided, as users know them
_LAYOUTS = {
    torch.sparse_coo: "a sparse COO tensor", torch.sparse_csr: "a sparse CSR tensor",
    torch.sparse_csc: "a sparse CSC tensor", torch.sparse_bsr: "a sparse BSR tensor",
    torch.sparse_bsc: "a sparse BSC tensor", torch._mkldnn: "an mkldnn tensor",  # type: ignore[attr-defined]
    torch.jagged: "a nested (jagged) tensor",
}
_FIX = {
    "a nested": "pass its components (t.unbind()) or a padded dense tensor (t.to_padded_tensor(0.0))",
    "a quantized": "pass t.dequantize()",
    "an mkldnn": "pass t.to_dense()",
    "a sparse": "pass t.to_dense()",
}


def refusal(t: torch.Tensor) -> str | None:
    """What makes ``t`` unreadable by any kernel (its kind), or None: sparse, mkldnn, nested and
    quantized tensors."""
    layout = t.layout
    if layout is not torch.strided:
        return _LAYOUTS.get(layout, f"a tensor of layout {layout}")
    if t.is_nested:
        return "a nested tensor"
    if t.is_quantized:
        return "a quantized tensor"
    return None


def deferred(t: torch.Tensor) -> str | None:
    """Why ``t``'s values are not what its memory holds (resolved on read), or None."""
    if t.is_neg():
        return "a view with the negative bit (from z.conj().imag or torch._neg_view)"
    if t.is_conj():
        return "a view with the conjugate bit (from .conj())"
    if t._is_zerotensor():
        return "a ZeroTensor (no memory)"
    return None


def check(op_name: str, name: str, t: torch.Tensor, mutated: bool) -> bool:
    """Refuse ``t`` (argument ``name`` of op ``op_name``) with an ``InputError`` if no kernel may
    read it, or if the op mutates it and its values are deferred; return whether it must be
    resolved before a kernel reads it."""
    kind = refusal(t)
    if kind is not None:
        fix = next((f for prefix, f in _FIX.items() if kind.startswith(prefix)), "pass a dense tensor")
        raise InputError(
            f"{op_name}: argument {name!r} expected a dense strided tensor, got {kind}, {describe(t)}; "
            f"kernels read a tensor through its data pointer and strides: {fix}"
        )
    why = deferred(t)
    if why is None:
        return False
    if mutated:
        raise InputError(
            f"{op_name}: argument {name!r} is mutated by the op but is {why}, "
            f"{describe(t)}: a kernel would write its memory, not its values. Call the op on a plain "
            "tensor (t.resolve_conj().resolve_neg() or t.clone()) and copy the result back into the view"
        )
    return True


def _materialized(t: torch.Tensor) -> torch.Tensor:
    if t._is_zerotensor():
        return torch.zeros(t.shape, dtype=t.dtype, device=t.device)
    return t.resolve_conj().resolve_neg()


def resolve(op_name: str, params: Sequence[Any], args: Sequence[Any]) -> tuple:
    """``args`` with every deferred tensor the op only reads materialized (list elements too);
    an ``InputError`` for one it mutates or one no kernel may read (``check``). ``params``: the
    op's ``Signature.params`` (name, kind and whether mutated, by position)."""
    out = list(args)
    for i, (param, value) in enumerate(zip(params, args)):
        if value is None:
            continue
        if param.kind == "tensor" and isinstance(value, torch.Tensor):
            if check(op_name, param.name, value, param.mutated):
                out[i] = _materialized(value)
        elif param.kind == "tensor_list" and isinstance(value, (list, tuple)):
            items = list(value)
            changed = False
            for j, item in enumerate(items):
                if isinstance(item, torch.Tensor) and check(op_name, f"{param.name}[{j}]", item, param.mutated):
                    items[j] = _materialized(item)
                    changed = True
            if changed:
                out[i] = items
    return tuple(out)


# Dispatch keys whose tensors are refused, and those whose deferred values are resolved. A tensor
# of these kinds reaches the op's kernel for one of them instead of its CPU/CUDA kernel.
REFUSE_KEYS = ("SparseCPU", "SparseCUDA", "SparseCsrCPU", "SparseCsrCUDA", "MkldnnCPU", "QuantizedCPU",
               "QuantizedCUDA", "NestedTensorCPU", "NestedTensorCUDA", "AutogradNestedTensor")
RESOLVE_KEYS = ("ZeroTensor", "Negative", "Conjugate")


def dispatcher_kernels(op_name: str, params: Sequence[Any],
                       overload: Callable[[], Any]) -> list[tuple[str, Callable[..., Any], bool]]:
    """(dispatch key, kernel, with_keyset) to register with an op, so calls through the
    dispatcher apply the rule before the op's CPU/CUDA kernel: at ``REFUSE_KEYS`` an ``InputError``,
    at ``RESOLVE_KEYS`` the deferred tensors resolved (mutated ones refused) and the call sent on
    past the three keys (``overload()``: the op's torch.ops overload, read at call time)."""
    after = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.Conjugate)

    def refuse(*args: Any) -> Any:
        resolve(op_name, params, args)  # raises for the first tensor it refuses
        raise InputError(f"{op_name}: expected dense strided tensors, got "
                         f"{[describe(a) for a in args]}")

    def resolving(keyset: Any, *args: Any) -> Any:
        # The keys below (Python for fake tensors and modes, then the backend) still apply:
        # redispatch rather than calling the op's kernel directly.
        return overload().redispatch(keyset & after, *resolve(op_name, params, args))

    return ([(key, refuse, False) for key in REFUSE_KEYS]
            + [(key, resolving, True) for key in RESOLVE_KEYS])
