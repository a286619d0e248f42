"""The correctness gate: before a candidate may win, its output must match the reference.

The judging is the oracle's (``kernelgraft.verify.oracle``), the one ``kernelgraft check`` uses, with the
op's ``tolerances``: a candidate ``check`` fails on these inputs is never chosen. The reference runs
once per key (``expected``); each candidate then runs on guarded copies of the tuning inputs with
poisoned outputs (``kernelgraft.verify.guard.Call``): an element it never writes cannot pass by reusing a
previous candidate's memory, and a candidate that writes past an output or into an input the op
does not declare mutated is never chosen (``judge``), nor does it touch the caller's tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..verify import guard as _guard, oracle as _verify
from ..errors import out_of_memory

__all__ = ["expected", "guarded", "judge", "classify_error"]


def expected(op: Any, args: Sequence[Any]) -> _verify.Reference:
    """The reference's outputs and mutated arguments for ``args`` (float64 where it runs)."""
    _verify.check_tolerances(op.tolerances, op.name)
    return _verify.reference(op, args)


def guarded(op: Any, args: Sequence[Any], outs: Sequence[torch.Tensor] = ()) -> _guard.Call:
    """Guarded copies of ``args`` and outputs shaped like ``outs``, for one gate run."""
    return _guard.Call(op, args, [(tuple(o.shape), o.dtype, o.device) for o in outs])


def judge(op: Any, ref: _verify.Reference, outs: Sequence[torch.Tensor], args: Sequence[Any],
          call: _guard.Call | None = None) -> str | None:
    """None when a candidate's ``outs`` and the mutated ``args`` it was run on match ``ref`` and,
    run on ``call``, it wrote nothing else; else why not (what it wrote where it may not; the
    output, the worst element, got, expected, the error and the tolerance)."""
    damage = call.damage() if call is not None else None
    if damage is not None:
        return f"writes memory that is not its own: {damage}"
    produced = list(outs)
    for index in op.signature.mutated:
        produced.extend(_verify.tensors(args[index]))
    verdict = _verify.verify(ref, produced, op.tolerances)
    return None if verdict.ok else f"wrong result: {verdict}"


def classify_error(exc: BaseException) -> str:
    """'memory' (out of memory: it may pass, and the candidate is not to blame; the trials clone
    inputs and allocate outputs beside the workload's own tensors), else 'compile' or 'launch',
    from the exception's type (Triton, NVRTC and kernelgraft names)."""
    if out_of_memory(exc):
        return "memory"
    names = " ".join(t.__name__ for t in type(exc).__mro__)
    if "Compil" in names or "PTXAS" in names.upper() or "NVRTC" in names.upper():
        return "compile"
    return "launch"
