"""Layouts in bundles: which tensor arguments a candidate's kernels need contiguous.

An impl declares it (``contiguous=True``: every tensor argument; ``False``: none; names: those),
and eager dispatch refuses a candidate whose required argument is not contiguous. A bundle keeps
that rule: the manifest records the declaration per candidate (``"contiguous"``: true, false or
the names) and, per kernel, the tensor inputs it was traced contiguous (``"contiguous"``: names).
Those inputs' strides were written as expressions of their sizes, so a loader selects the kernel
only for calls where they are contiguous. Every other tensor input was traced with strides of
its own (``x.stride(d)`` in the expressions), so its kernels take the caller's strides.

>>> import kernelgraft as kg
>>> impl = kg.triton(lambda x, y, out, *, B: None, configs=[{"B": 1}], contiguous=["y"])
>>> declared(impl), contiguous_names(impl, ["x", "y"])
(['y'], ('y',))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["declared", "contiguous_names", "refusal"]


def declared(impl: Any) -> bool | list[str]:
    """The impl's declaration as the manifest records it."""
    return impl.contiguous if isinstance(impl.contiguous, bool) else list(impl.contiguous)


def contiguous_names(impl: Any, names: Sequence[str]) -> tuple[str, ...]:
    """The parameters among ``names`` that the impl needs contiguous."""
    if impl.contiguous is True:
        return tuple(names)
    if impl.contiguous is False:
        return ()
    wanted = set(impl.contiguous)
    return tuple(n for n in names if n in wanted)


def refusal(impl: Any, params: Sequence[Any], sample: Sequence[Any]) -> str | None:
    """Why eager dispatch refuses this candidate for ``sample`` on layout (its words), or None."""
    required = set(contiguous_names(impl, [p.name for p in params]))
    for p, a in zip(params, sample):
        if p.name in required and isinstance(a, torch.Tensor) and not a.is_contiguous():
            return f"needs {p.name} contiguous, got strides {tuple(a.stride())} for shape {tuple(a.shape)}"
    return None
