"""``kg.op`` and ``kg.unregister``: declaring an op (or declaring it again), and removing one."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from ..errors import SpecError, describe
from ..spec import ImplSpec
from . import registry as _registry
from .operator import KernelOp

__all__ = ["op", "unregister"]


def unregister(name: str | KernelOp) -> bool:
    """Remove an op from kernelgraft (a notebook that drops or renames an op).

    Returns whether an op was removed. Given an op object, it is removed only while it holds its
    name: an op since replaced (``kg.op(..., replace=True)``) or unregistered returns False and
    leaves the name's current op alone. The removed op object stops serving: calling it, or
    ``torch.ops.<ns>.<name>``, raises ``kg.RegistrationError`` until an op of that name is
    declared again, and then reaches that op. The name itself stays in ``torch.ops``: its operator
    is never freed, as other code (another thread, a compiled graph) may still hold it.

    >>> import torch, kernelgraft as kg
    >>> @kg.op("doctest::gone")
    ... def gone(x: torch.Tensor) -> torch.Tensor:
    ...     return x + 1
    >>> kg.unregister("doctest::gone")
    True
    >>> try:
    ...     torch.ops.doctest.gone(torch.ones(1))
    ... except kg.RegistrationError as error:
    ...     print("unregistered" in str(error))
    True
    """
    only = None
    if isinstance(name, KernelOp):
        name, only = name.name, name
    if not isinstance(name, str):
        raise SpecError(f"kg.unregister: give an op name like 'ns::name' or the op, got {describe(name)}")
    removed = _registry.unregister(name, only)
    if removed is None:
        return False
    _registry.retire(removed, "unregistered")
    return True


def op(
    name_or_fn: str | Callable[..., Any] | None = None,
    /,
    *,
    impls: Sequence[ImplSpec] = (),
    mutates_args: Iterable[str] = (),
    sample_inputs: Callable[..., Iterable[tuple]] | None = None,
    dtypes: Sequence[torch.dtype] | Mapping[str, Sequence[torch.dtype]] | None = None,
    ndim: Mapping[str, int | Sequence[int]] | None = None,
    fallback: str = "reference",
    tolerances: Mapping[torch.dtype, float] | None = None,
    name: str | None = None,
    cost: Callable[..., tuple[float, float]] | None = None,
    prune: Callable[..., Any] | None = None,
    buckets: Any = None,
    allow_overlap: bool = False,
    replace: bool = False,
    compete: Any = True,
    outputs: Sequence[str] | None = None,
    compare: Any = None,
    **unknown: Any,
) -> Any:
    """Turn a PyTorch reference function into an operator backed by kernels.

    ``@kg.op("ns::name", impls=[...])`` decorates the reference; ``kg.op(fn, impls=[...])`` works
    as a call. Without a name the op gets ``kernelgraft::<qualname>_<hash>``, the same in every
    process. ``cost(*inputs) -> (bytes, flops)`` tells ``kernelgraft bench`` what one call moves
    and computes (default: every input read once, every output written once, no flops).
    ``prune(candidates, *inputs)`` and ``buckets`` shape autotuning (see ``kernelgraft.tune``).
    ``tolerances={dtype: rtol}`` sets, for outputs of that dtype, the ``rtol`` of the one rule that
    ``kernelgraft check``, the tuner's gate and graft verification apply: elementwise
    ``|got - want| <= rtol * (|want| + rms(want))`` against the float64 reference, and 0 means
    bit-exact (the default for integer, bool and 8-bit float outputs; see ``kernelgraft.verify.oracle``).
    An op that mutates an argument refuses, with an ``InputError``, a call where another tensor
    argument shares memory with the mutated one; ``allow_overlap=True`` declares that its kernels
    handle that (they read each element before writing it, or the overlap is intended).
    Kernels get dense strided tensors read as stored (``kernelgraft.admit``, on every route: eager,
    ``torch.ops``, ``op.run``, ``torch.compile``): a view with the negative or conjugate bit
    (``z.conj()``, ``z.conj().imag``) that the op only reads is materialized first, at the cost of one
    copy, so the result is the reference's; one it mutates is an ``InputError``, as are sparse, mkldnn,
    nested and quantized tensors. On meta tensors the op returns its meta function's outputs.
    ``compete`` (default True): the reference itself, eager (``torch:eager``) and under
    ``torch.compile`` (``torch:compile``), competes with the kernels in tuning on CUDA, so a shape
    where PyTorch is faster runs PyTorch (never a PyTorch run that cannot be captured in a CUDA
    graph); False turns that off, ``("eager",)`` or ``("compile",)`` keeps one (None is refused:
    ``kg.tune(compete=False)`` / ``KERNELGRAFT_COMPETE=0`` turn it off for all ops).
    ``outputs=("weights", "indices")`` names the returned tensors (default ``out0``, ``out1``, ...;
    a mutated argument is named by its parameter); ``compare={name: rule}`` replaces the rule the
    oracle judges that output by: ``kg.ties_by("logits")`` for indices that may pick any of tied
    values, or a hook ``fn(got, want, inputs) -> None | str``; ``compare=fn`` judges the whole op
    (see ``kernelgraft.verify.compare``).

    Declaring the same op again (the same fingerprint: reference, impls, options) returns the op
    already registered, so re-importing a module or re-running a notebook cell is harmless. A
    *different* op under a taken name is a ``kg.RegistrationError`` unless ``replace=True``: then
    the new declaration takes the name (a notebook cell edited and run again), the old op's plans
    and tuning decisions go, and calls through the old op object forward to the new one; other
    threads may be calling the op meanwhile (each call runs the old op or the new one).

    >>> import torch, kernelgraft as kg
    >>> @kg.op("doctest::scale2")
    ... def scale2(x: torch.Tensor) -> torch.Tensor:
    ...     return x * 2
    >>> scale2(torch.ones(3)).tolist()
    [2.0, 2.0, 2.0]
    >>> torch.ops.doctest.scale2(torch.ones(2)).tolist()
    [2.0, 2.0]
    """
    if unknown:
        _unknown_options(unknown)
    if not isinstance(replace, bool):
        raise SpecError(f"kg.op: replace must be True or False, got {describe(replace)}")
    options = dict(
        impls=impls, mutates_args=mutates_args, sample_inputs=sample_inputs, dtypes=dtypes,
        ndim=ndim, fallback=fallback, tolerances=tolerances, cost=cost, prune=prune,
        buckets=buckets, allow_overlap=allow_overlap, compete=compete, outputs=outputs, compare=compare,
    )

    def wrap(fn: Callable[..., Any], qualname: str | None) -> KernelOp:
        new = KernelOp(fn, name=qualname, **options)  # type: ignore[arg-type]
        return _registry.register(new, replace=replace)

    if callable(name_or_fn):
        return wrap(name_or_fn, name)
    if name_or_fn is not None and name is not None:
        raise SpecError("kg.op: give the name once, positionally or as name=")
    qualname = name_or_fn if name_or_fn is not None else name
    if qualname is not None and not isinstance(qualname, str):
        raise SpecError(f"kg.op: the name must be a string like 'ns::name', got {describe(qualname)}")
    return lambda fn: wrap(fn, qualname)


def _unknown_options(unknown: Mapping[str, Any]) -> None:
    import difflib
    import inspect

    known = [n for n, p in inspect.signature(op).parameters.items() if p.kind is p.KEYWORD_ONLY]
    name = sorted(unknown)[0]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]}=?" if close else ""
    raise SpecError(f"kg.op: unknown option {name}={unknown[name]!r}{hint} (kg.op takes {', '.join(known)})")
