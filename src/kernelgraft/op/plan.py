"""Plans: what one call with a given input signature does, decided once and cached by the op.

A plan is a plain closure ``plan(args) -> outputs`` (allocate outputs, launch, return) so the hot
path is one dict lookup plus the closure; ``plan.candidate`` says what it runs (None: reference).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import probe as _probe
from .candidates import Candidate
from ..errors import KernelgraftError, LaunchError, LaunchOutOfMemoryError, out_of_memory


__all__ = ["Plan", "guarded", "kernel_plan", "meta_plan", "reference_plan", "torch_plan"]

Plan = Callable[[tuple], Any]
_empty = torch.empty


def _fail(op: Any, candidate: Candidate, exc: Exception) -> LaunchError:
    error = LaunchOutOfMemoryError if out_of_memory(exc) else LaunchError
    return error(f"{op.name}: {candidate.label} failed: {type(exc).__name__}: {exc}{_unpack_hint(op, exc)}")


def _unpack_hint(op: Any, exc: Exception) -> str:
    """A launch function that unpacks a shape (``n, e = x.shape``) fails this way on a tensor of
    another rank: say how to refuse such calls before any kernel sees them."""
    if not (isinstance(exc, ValueError) and "values to unpack" in str(exc)):
        return ""
    tensors = [p.name for p in op.signature.params if p.kind == "tensor"]
    example = tensors[0] if tensors else "x"
    return (f". A launch function that unpacks a tensor's shape takes one rank: declare it with "
            f"kg.op(..., ndim={{{example!r}: 2}}), and a call with another rank becomes an InputError naming "
            "the argument")


def _named(op: Any, exc: KernelgraftError) -> KernelgraftError:
    """The error with the op's name in front (a compile error deep in a backend cannot know it)."""
    if str(exc).startswith(op.name):
        return exc
    return type(exc)(f"{op.name}: {exc}")


def _like(args: tuple, spec) -> int | None:
    """Index of a contiguous tensor argument with the output's shape, dtype and device:
    ``empty_like`` of it is about half the host cost of ``empty`` with keywords."""
    shape, dtype, device = spec
    for i, a in enumerate(args):
        if (
            isinstance(a, torch.Tensor) and tuple(a.shape) == tuple(shape) and a.dtype == dtype
            and a.device == device and a.is_contiguous()
        ):
            return i
    return None


def kernel_plan(
    op: Any, candidate: Candidate, runner: Callable[..., Any], out_specs, args: tuple = ()
) -> Plan:
    kind = op.signature.returns
    like = _like(args, out_specs[0]) if kind == "tensor" and args else None
    if like is not None:
        # The plan is keyed on strides, so args[like] is contiguous on every call that reaches it
        # and empty_like's default (preserve_format) gives a contiguous output.
        empty_like = torch.empty_like

        def plan(args: tuple) -> Any:
            out = empty_like(args[like])
            try:
                runner(*args, out)
            except KernelgraftError as exc:
                raise _named(op, exc) from exc
            except Exception as exc:
                raise _fail(op, candidate, exc) from exc
            return out

    elif kind == "tensor":
        ((shape, dtype, device),) = out_specs

        def plan(args: tuple) -> Any:
            out = _empty(shape, dtype=dtype, device=device)
            try:
                runner(*args, out)
            except KernelgraftError as exc:
                raise _named(op, exc) from exc
            except Exception as exc:
                raise _fail(op, candidate, exc) from exc
            return out

    elif kind == "none":

        def plan(args: tuple) -> Any:
            try:
                runner(*args)
            except KernelgraftError as exc:
                raise _named(op, exc) from exc
            except Exception as exc:
                raise _fail(op, candidate, exc) from exc
            return None

    else:
        specs = tuple(out_specs)

        def plan(args: tuple) -> Any:
            outs = tuple(_empty(s, dtype=d, device=dev) for s, d, dev in specs)
            try:
                runner(*args, *outs)
            except KernelgraftError as exc:
                raise _named(op, exc) from exc
            except Exception as exc:
                raise _fail(op, candidate, exc) from exc
            return outs

    plan.candidate = candidate  # type: ignore[attr-defined]
    return plan


def reference_plan(op: Any) -> Plan:
    reference, fresh = op.reference, op._fresh_outputs

    def plan(args: tuple) -> Any:
        try:
            out = reference(*args)
        except KernelgraftError:
            raise
        except (RuntimeError, IndexError, ValueError) as exc:
            # torch's own shape and index checks inside the reference: the inputs do not fit
            # together, which the call should say in kernelgraft's words (the cause is chained)
            if out_of_memory(exc) or not _probe.shape_error(exc):
                raise
            raise _probe.refusal(op, args, _probe.reason(exc)) from exc
        return fresh(out, empty=False, args=args)

    plan.candidate = None  # type: ignore[attr-defined]
    return plan


def meta_plan(op: Any) -> Plan:
    """The plan of a call on meta tensors: the meta function's outputs (new, empty, on meta), as
    ``torch.ops.<ns>.<name>`` gives them; no kernel and no reference runs (there is no data).
    Through ``op.meta``, the one rule of the fake path too: an op that returns None runs no meta
    function (its reference may index by its data, which meta tensors do not have)."""
    fresh, meta = op._fresh_outputs, op.meta

    def plan(args: tuple) -> Any:
        return fresh(meta(*args), empty=True, args=args)

    plan.candidate = None  # type: ignore[attr-defined]
    return plan


def torch_plan(op: Any, candidate: Candidate, call: Callable[..., Any]) -> Plan:
    """The plan of a PyTorch candidate that won the tuning (``torch:eager``/``torch:compile``):
    the reference's outputs made fresh as the op promises them. Never given a native replay (a
    replay re-launches recorded kernels; a torch function is not one).

    Failures are named as a kernel plan's are. ``torch:compile`` can fail while serving: decisions
    are per bucket, plans per exact shape, so a new shape of a bucket it won recompiles inside the
    user's call. Then the eager reference serves that call; if it succeeds the compile was at
    fault: recorded (``CompileState.refused``, after which ``torch:compile`` is never served
    again) and the op's ``torch:compile`` plans dropped, so the next call chooses again."""
    fresh = op._fresh_outputs
    compiled = candidate.impl.name == "compile"

    def plan(args: tuple) -> Any:
        try:
            return fresh(call(*args), empty=False, args=args)
        except KernelgraftError as exc:
            raise _named(op, exc) from exc
        except Exception as exc:
            if not compiled or isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
                raise _fail(op, candidate, exc) from exc
            return _compile_failed(op, candidate, args, exc)

    plan.candidate = candidate  # type: ignore[attr-defined]
    return plan


def _compile_failed(op: Any, candidate: Candidate, args: tuple, exc: Exception) -> Any:
    """``torch:compile`` raised on ``args``: the eager reference serves the call instead."""
    try:
        out = op._fresh_outputs(op.reference(*args), empty=False, args=args)
    except Exception as eager_exc:  # the reference itself fails here: its error, not the compile's
        raise _fail(op, candidate, eager_exc) from eager_exc
    op.dispatcher.compile_state.refused(exc)
    op.dispatcher.drop_torch_plans("compile")
    return out


def guarded(plan: Plan, guard: Callable[[tuple], None] | None) -> Plan:
    """``plan`` that runs ``guard(args)`` first (None: ``plan`` itself)."""
    if guard is None:
        return plan

    def checked(args: tuple) -> Any:
        guard(args)
        return plan(args)

    checked.candidate = plan.candidate  # type: ignore[attr-defined]
    return checked
