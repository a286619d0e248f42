"""What a call's outputs will be, before anything runs: (shape, dtype, device) of each, from the
op's meta function (the reference unless ``register_meta`` gave one) on fake tensors. Planning a
signature works them out first, so inputs that do not fit, or whose outputs no memory could hold,
are refused before anything runs or is tuned.

One call is spared them: the first of a key tuned off the caller's path while the reference
serves it and a job tunes the key (``may_defer`` before choosing, a ``Pending`` after; the job
works them out first, and a call that finds no job for its shapes works them out itself). A
process's first ``FakeTensorMode`` imports ``torch._dynamo``, one to two seconds that would land
on that call. The reference allocates its own outputs there, CUDA's
allocator refuses what does not fit, and a failure is worded by the output shapes then
(``deferred``); the kernel plan made once the decision lands works them out as every plan does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..errors import InputError, KernelgraftError, SpecError
from . import probe as _probe
from .limits import check_allocatable, quiet_fake_tensor_errors
from .shape_error import named, shape_error

__all__ = ["output_specs", "may_defer", "deferred"]

Spec = tuple[tuple[int, ...], torch.dtype, torch.device]


def output_specs(op: Any, args: tuple) -> list[Spec]:
    """(shape, dtype, device) of each output, from the meta function (fake tensors)."""
    if op.signature.returns == "none":
        return []
    try:
        if op._meta_shape_only:
            outs = op._meta_fn(*args)
        else:
            with quiet_fake_tensor_errors(), FakeTensorMode(allow_non_fake_inputs=False) as mode:
                outs = op._fake(*_probe._fake_args(mode, args))
    except (InputError, SpecError):
        raise
    except Exception as exc:
        if _probe.data_dependent(exc):
            raise _probe.meta_error(op, exc, "has data-dependent shapes") from exc
        shapes = named(op, args)
        error = shape_error(op, args, exc)
        if error is not None:
            raise error from exc
        raise InputError(
            f"{op.name}: the {'meta function' if op._meta_fn is not op.reference else 'reference'} "
            f"cannot compute output shapes for these inputs ({shapes}): {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}. If the inputs are right, the reference "
            "may not run on fake tensors (data-dependent shapes, .item(), numpy): give the op a meta "
            "function with op.register_meta(fn)"
        ) from exc
    outs = (outs,) if isinstance(outs, torch.Tensor) else outs
    specs = [(tuple(int(s) for s in o.shape), o.dtype, o.device) for o in outs]
    for i, (shape, dtype, device) in enumerate(specs):
        check_allocatable(op.name, f"output {i}", shape, dtype, device, args)
    return specs


def may_defer(settings: Any, tensors: Sequence[tuple[str, torch.Tensor]]) -> bool:
    """Whether a new key of this call may be tuned off the caller's path (the tuner decides; see
    ``kernelgraft.tune.offpath``): tuning on and not blocking, on CUDA tensors. A call on CPU
    tensors is always refused first: an allocation past memory there swaps rather than fails."""
    if settings.mode != "on" or settings.blocking is True or not tensors:
        return False
    return tensors[0][1].device.type == "cuda"


def deferred(plan: Callable[[tuple], Any], specs: Callable[[tuple], Any]) -> Callable[[tuple], Any]:
    """``plan`` (the reference's, serving a key tuned off the path) whose failure is worded by
    ``specs`` (the output shapes): an ``InputError`` where the inputs do not fit or an output could
    not be allocated, else the failure itself."""

    def worded(args: tuple) -> Any:
        try:
            return plan(args)
        except KernelgraftError:
            raise
        except Exception:
            specs(args)
            raise

    worded.candidate = None  # type: ignore[attr-defined]
    return worded
