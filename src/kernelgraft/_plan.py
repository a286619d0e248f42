"""Plans: what one call with a given input signature does, decided once and cached by the op.

A plan is a plain closure ``plan(args) -> outputs`` (allocate outputs, launch, return) so the hot
path is one dict lookup plus the closure; ``plan.candidate`` says what it runs (None: reference).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ._candidates import Candidate
from ._errors import KernelgraftError, LaunchError

if TYPE_CHECKING:
    from ._op import KernelOp

__all__ = ["Plan", "kernel_plan", "reference_plan"]

Plan = Callable[[tuple], Any]
_empty = torch.empty


def _fail(op: "KernelOp", candidate: Candidate, exc: Exception) -> LaunchError:
    return LaunchError(f"{op.name}: {candidate.label} failed: {type(exc).__name__}: {exc}")


def kernel_plan(op: "KernelOp", candidate: Candidate, runner: Callable[..., Any], out_specs) -> Plan:
    kind = op.signature.returns
    if kind == "tensor":
        ((shape, dtype, device),) = out_specs

        def plan(args: tuple) -> Any:
            out = _empty(shape, dtype=dtype, device=device)
            try:
                runner(*args, out)
            except KernelgraftError:
                raise
            except Exception as exc:
                raise _fail(op, candidate, exc) from exc
            return out

    elif kind == "none":

        def plan(args: tuple) -> Any:
            try:
                runner(*args)
            except KernelgraftError:
                raise
            except Exception as exc:
                raise _fail(op, candidate, exc) from exc
            return None

    else:
        specs = tuple(out_specs)

        def plan(args: tuple) -> Any:
            outs = tuple(_empty(s, dtype=d, device=dev) for s, d, dev in specs)
            try:
                runner(*args, *outs)
            except KernelgraftError:
                raise
            except Exception as exc:
                raise _fail(op, candidate, exc) from exc
            return outs

    plan.candidate = candidate  # type: ignore[attr-defined]
    return plan


def reference_plan(op: "KernelOp") -> Plan:
    reference, fresh = op.reference, op._fresh_outputs

    def plan(args: tuple) -> Any:
        return fresh(reference(*args), empty=False, args=args)

    plan.candidate = None  # type: ignore[attr-defined]
    return plan
