"""``torch.vmap`` of an op: one call of the op per batch element, results stacked.

Kernels take unbatched inputs, so the op's batching rule runs it once per element of the vmapped
dimension (each call serves from its own plan, exactly as a direct call would: ``vmap(op)(x)[i]``
equals ``op(x[i])``). torch's generic fallback does the same loop, but it warns that a batching
rule is missing and asks for a PyTorch issue, and it cannot serve an op that mutates its
arguments; an op that mutates is refused here with an error that names it. The rule is registered
with the op (``FuncTorchBatched``), so it costs nothing outside vmap.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UnsupportedError


__all__ = ["install"]

try:  # torch >= 2.4: the helper under torch.library.register_vmap
    from torch._functorch.autograd_function import custom_function_call_vmap_helper as _helper
    from torch._functorch.pyfunctorch import retrieve_current_functorch_interpreter as _interpreter
except ImportError:  # pragma: no cover - older torch: its generic for-loop fallback serves vmap
    _helper = None


def _select(value: Any, dim: Any, b: int) -> Any:
    if dim is None:
        return value
    if isinstance(value, (list, tuple)):
        return [v if d is None else v.select(d, b) for v, d in zip(value, dim)]
    return value.select(dim, b)


def install(op: Any, lib: torch.library.Library, overload: Any) -> None:
    """Register the op's batching rule in its own library fragment ``lib``."""
    if _helper is None:
        return
    _, name = op.name.split("::")
    mutated = [p.name for p in op.signature.params if p.mutated]
    single = op.signature.returns == "tensor"

    def loop(info, in_dims, *args):
        if mutated:
            raise UnsupportedError(
                f"{op.name} cannot run under torch.vmap: it mutates "
                f"{', '.join(repr(m) for m in mutated)}, and a batched in-place write has no "
                "batching rule; call the op in a Python loop over the batch instead")
        if info.batch_size == 0:
            raise UnsupportedError(f"{op.name} cannot run under torch.vmap over an empty batch: the op "
                                   "runs once per batch element and there is none to run")
        outs = [overload(*(_select(a, d, b) for a, d in zip(args, in_dims)))
                for b in range(info.batch_size)]
        if single:
            return torch.stack(outs), 0
        stacked = tuple(torch.stack(parts) for parts in zip(*outs))
        return stacked, (0,) * len(stacked)

    def rule(keyset, *args, **kwargs):
        return _helper(_interpreter(), loop, overload, *args, **kwargs)

    lib.impl(name, rule, "FuncTorchBatched", with_keyset=True)
