"""Derived inputs: from a sample, the calls a user may make that the samples do not show.

For a sample, ``kernelgraft check`` also builds (at most ``LIMIT``; two broadcast inputs come
before the layouts and sizes, the other broadcasts after them):
- *broadcast*: each input with its leading dims of size 1 (``cos`` of [1, 32] where the sample
  has [16, 32]; a 1-d input of size 1), where the reference broadcasts it to the same outputs;
- *transposed*: every input of rank >= 2 in column-major layout (same shape and values);
- *storage offset*: every input one element into its storage (a misaligned data pointer);
- *odd sizes*: the sizes the floating-point inputs carry (not those an integer or bool input
  carries: indices must stay valid) made odd, 16 -> 17 and 7 -> 9, in every input at once,
  each only where the reference still accepts it;
- *fewer dims*: each broadcast input without its leading dims of size 1 ([32] for [16, 32]).
A variant exists only where the reference accepts it (on fake tensors; on real copies where it
cannot run on fake ones) and the op's argument checks (``dtypes=``, ``ndim=``) do not refuse it.
Each candidate must then match the reference on it, or refuse it through its ``supports``
predicate or ``contiguous=``, as it refuses a real call.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..verify import oracle as _verify
from ..op.limits import quiet_fake_tensor_errors

__all__ = ["LIMIT", "variants"]

log = logging.getLogger(__name__)
LIMIT = 6  # variants per sample: each is a run of every candidate (seconds under the interpreter)
_ODD_TRIES = 4  # sizes tried for the odd-sizes variant (one reference run on fake tensors each)


def _outputs(op: Any, args: tuple) -> list[tuple[int, ...]] | None:
    """The shapes of what the reference returns for ``args``, or None when the op's argument
    checks or the reference refuse them."""
    try:
        op.dispatcher.check(args)
    except Exception:
        return None
    try:
        with quiet_fake_tensor_errors(), FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fake = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor)
                         else [mode.from_tensor(t) for t in a] if isinstance(a, (list, tuple)) and a
                         and all(isinstance(t, torch.Tensor) for t in a) else a for a in args)
            out = op.reference(*fake)
    except Exception:  # data-dependent shapes, .item(), numpy: ask the reference itself
        try:
            with torch.no_grad():
                out = op.reference(*_verify.clone(args))
        except Exception:
            return None
    return [tuple(t.shape) for t in _verify.tensors(out if out is not None else ())]


def _with(args: tuple, changes: dict[int, torch.Tensor]) -> tuple:
    return tuple(changes.get(i, a) for i, a in enumerate(args))


def _block(t: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """The leading block of ``t`` of ``shape`` (same rank), as a new contiguous tensor."""
    return t[tuple(slice(0, s) for s in shape)].clone(memory_format=torch.contiguous_format)


def _broadcasts(op: Any, args: tuple, want: list) -> tuple[list, list]:
    """(size-1 variants, fewer-dims variants), one each per input the reference broadcasts."""
    mutated = set(op.signature.mutated)
    ones, fewer = [], []
    for i, (param, t) in enumerate(zip(op.signature.params, args)):
        if i in mutated or not isinstance(t, torch.Tensor) or t.dim() == 0 or t.layout != torch.strided:
            continue
        shape = list(t.shape)
        new = list(shape)
        for d in range(max(t.dim() - 1, 1)):
            if new[d] > 1:
                trial = new[:d] + [1] + new[d + 1:]
                if _outputs(op, _with(args, {i: _block(t, trial)})) == want:
                    new = trial
        if new != shape:
            ones.append((f"{param.name} broadcast from {new} to {shape}", _with(args, {i: _block(t, new)})))
        lead = 0
        while lead < len(new) - 1 and new[lead] == 1:
            lead += 1
        if lead:
            short = _block(t, new).reshape(new[lead:])
            trial_args = _with(args, {i: short})
            if _outputs(op, trial_args) == want:
                fewer.append((f"{param.name} broadcast from {new[lead:]} to {shape}", trial_args))
    return ones, fewer


def _transposed(op: Any, args: tuple) -> tuple[str, tuple] | None:
    changes, names = {}, []
    for i, (param, t) in enumerate(zip(op.signature.params, args)):
        if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] > 1 and t.shape[-2] > 1:
            changes[i] = t.detach().transpose(-1, -2).contiguous().transpose(-1, -2)
            names.append(param.name)
    if not changes:
        return None
    return f"{', '.join(names)} transposed (column-major)", _with(args, changes)


def _at_offset(t: torch.Tensor) -> torch.Tensor:
    """``t`` (same strides and values) one element into a new storage."""
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    flat = torch.empty(span + 1, dtype=t.dtype, device=t.device)
    flat[1:].copy_(t.detach().resolve_neg().resolve_conj().as_strided((span,), (1,), t.storage_offset()))
    return flat.as_strided(t.shape, t.stride(), 1)


def _offset(op: Any, args: tuple) -> tuple[str, tuple] | None:
    changes = {i: _at_offset(t) for i, t in enumerate(args)
               if isinstance(t, torch.Tensor) and t.numel() and t.layout == torch.strided}
    if not changes:
        return None
    return "storage offset of one element (misaligned data pointers)", _with(args, changes)


def _grown(t: torch.Tensor, sizes: dict[int, int]) -> torch.Tensor:
    shape = [sizes.get(s, s) for s in t.shape]
    if shape == list(t.shape):
        return t
    new = torch.randn(shape, dtype=torch.float64, device=t.device).to(t.dtype)
    new[tuple(slice(0, s) for s in t.shape)] = t  # the sample's values, fresh ones around them
    return new


def _odd(op: Any, args: tuple) -> tuple[str, tuple] | None:
    floats = [t for t in args if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]
    others = [t for t in _verify.tensors(args) if not (t.is_floating_point() or t.is_complex())]
    frozen = {s for t in others for s in t.shape}
    sizes = sorted({s for t in floats for s in t.shape} - frozen - {0, 1}, reverse=True)[:_ODD_TRIES]
    chosen: dict[int, int] = {}

    def resized(mapping: dict[int, int]) -> tuple:
        return tuple(_grown(a, mapping) if isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex())
                     else a for a in args)

    for size in sizes:
        trial = {**chosen, size: size + 1 if size % 2 == 0 else size + 2}
        if _outputs(op, resized(trial)) is not None:
            chosen = trial
    if not chosen:
        return None
    changes = ", ".join(f"{a} -> {b}" for a, b in chosen.items())
    return f"odd sizes ({changes})", resized(chosen)


def variants(op: Any, args: tuple, limit: int = LIMIT) -> list[tuple[str, tuple]]:
    """Up to ``limit`` (name, arguments) derived from the sample ``args`` (see the module docstring)."""
    want = _outputs(op, args)
    if want is None:  # the sample itself is refused: its own rows say so
        return []
    found: list[tuple[str, tuple]] = []
    try:
        ones, fewer = _broadcasts(op, args, want)
        found.extend(ones[:2])  # two inputs' broadcasts, then the layouts and sizes, then the rest
        for make in (_transposed, _offset, _odd):
            made = make(op, args)
            if made is not None and (make is _odd or _outputs(op, made[1]) == want):
                found.append(made)
        found.extend(ones[2:] + fewer)
    except Exception:  # a variant that cannot be built is one fewer check, never the op's failure
        log.debug("%s: deriving variants failed", op.name, exc_info=True)
    return found[:limit]
