"""Graft verification: a grafted computation must match the original it replaces.

The judging is the oracle's (``kernelgraft.verify.oracle.compare_trees``): the rule ``kernelgraft check``
and the tuner use, with the same meaning of tolerances (``rtol`` per output dtype), widened because
both sides are native-precision computations. Outputs may be nested (tuples, dicts, Hugging Face
``ModelOutput``). The tolerances are the library's defaults, then the grafted ops' own
``tolerances``, then the caller's ``tolerance=``: one ``rtol`` for every floating dtype wider than
8 bits, or a ``{dtype: rtol}`` dict (0 means bit-exact).

The grafted side runs under ``kernels_only()``: what is checked is a kernel, never the reference
compared with itself. An op called on its own (``call_op``) runs on guarded copies of its
arguments: a kernel that writes an input the op does not declare mutated, or past one, fails the
verification by the rule ``kernelgraft check`` and the tuner's gate apply (``kernelgraft.verify.guard``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from ..verify import guard as _guard, oracle as _verify
from ..errors import SpecError, describe

__all__ = ["check_override", "tolerances", "compare", "clone_inputs", "kernels_only", "call_op"]

_WIDE = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)


def check_override(tolerance: Any, where: str) -> dict[torch.dtype, float]:
    """The caller's ``tolerance=`` as a ``{dtype: rtol}`` dict, or a SpecError."""
    if tolerance is None:
        return {}
    if isinstance(tolerance, tuple):
        raise SpecError(
            f"{where}: tolerance={tolerance!r}: an (atol, rtol) pair is no longer accepted; pass one "
            "rtol (a float, for every floating dtype) or {dtype: rtol}, in the rule "
            "|got - want| <= rtol * (|want| + rms(want)) that kernelgraft check and the tuner use")
    if isinstance(tolerance, (int, float)) and not isinstance(tolerance, bool):
        return _verify.check_tolerances({dtype: tolerance for dtype in _WIDE}, where)
    if isinstance(tolerance, Mapping):
        return _verify.check_tolerances(tolerance, where)
    raise SpecError(f"{where}: tolerance must be an rtol (float) or {{dtype: rtol}}, got {describe(tolerance)}")


def tolerances(ops: Iterable[Any], override: Mapping[torch.dtype, float] | None = None
               ) -> dict[torch.dtype, float]:
    """The ``{dtype: rtol}`` a comparison uses: the largest of the ``ops``' own tolerances per
    dtype (a model grafted with several ops may show any of their errors), then ``override``."""
    merged: dict[torch.dtype, float] = {}
    for op in ops:
        own = _verify.check_tolerances(getattr(op, "tolerances", None), getattr(op, "name", "op"))
        for dtype, rtol in own.items():
            merged[dtype] = max(rtol, merged.get(dtype, rtol))
    merged.update(override or {})
    return merged


def compare(expected: Any, got: Any, *, ops: Iterable[Any] = (),
            override: Mapping[torch.dtype, float] | None = None, inputs: Sequence[Any] | None = None) -> str | None:
    """None when ``got`` matches ``expected``, else a one-line description of the first mismatch
    (which output, where, got, expected, the error and the tolerance). ``inputs``: given when
    ``got`` is the one op's outputs for those arguments, so its own rules (``compare=``, e.g. ties
    among indices) judge the outputs they name, as check and the tuner's gate do."""
    ops = list(ops)
    rules = None
    if inputs is not None and len(ops) == 1 and getattr(ops[0], "compare", None):
        rules = (ops[0], _verify.op_rules(ops[0], inputs))
    return _verify.compare_trees(expected, got, tolerances=tolerances(ops, override), rules=rules)


def clone_inputs(value: Any) -> Any:
    """A copy of nested inputs with tensors cloned (so an in-place op cannot skew a comparison)."""
    return _verify.clone(value)


def kernels_only() -> Any:
    """The tuning settings the graft's checks run the ops under: ``kg.tune("off", compete=False)``.

    With PyTorch competing, an op's plan for the example's shape may be ``torch:eager`` or
    ``torch:compile``, i.e. the reference, and a check would compare the pattern with itself
    while a wrong kernel went in. Off, the op runs its default kernel (the first that supports
    the inputs: what serves when tuning is off or cached without a decision; any other kernel has
    to pass the tuner's correctness gate before it serves), and a check tunes nothing into the
    user's tuning cache and compiles nothing with ``torch.compile``. With no kernel for the
    inputs (CPU tensors outside the Triton interpreter) the reference runs, as it will in use."""
    from ..op.modes import tune

    return tune("off", compete=False)


def call_op(op: Any, args: Any) -> tuple[Any, str | None]:
    """``op(*args)`` under ``kernels_only()`` on guarded copies of ``args``: what it returned, and
    None, or what it wrote outside its outputs and mutated arguments ("changed 8 of 64 elements of
    input 'k', which the op does not declare mutated (mutates_args)")."""
    call = _guard.Call(op, args)
    with kernels_only():
        got = op(*call.args)
    for device in {t.device for t in _verify.tensors(call.args)}:
        _verify.sync(device)
    return got, call.damage()
