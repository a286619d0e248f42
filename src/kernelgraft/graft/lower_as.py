"""``@kg.lower_as(op)``: declare that a function (or a module's forward) computes what ``op`` does.

Calls then go to the op: eager calls run it, and ``torch.compile``/``torch.export`` graphs contain
``torch.ops.<ns>.<name>`` instead of the function's body. The signature is checked against the op
when decorating (arguments are matched by name, then in order; for a ``forward(self, ...)`` the op
parameters it lacks are read from the module's attributes, e.g. ``weight`` and ``eps``).
A plain function is verified on the op's ``sample_inputs`` when decorated; a method on its first
eager call. Where the op cannot serve (an argument it has no parameter for, gradients needed and
the op has no backward), the original body runs.

``with kg.lower_as(op):`` around a region is refused: a ``with`` block has no inputs or outputs that
Python exposes, so nothing can say which tensors the op should take and which value it replaces
without rewriting bytecode; a wrong guess would silently change results. Move the region into a
function and decorate it, or use ``kg.graft(model, pattern=..., replacement=op)``.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import SpecError, UnsupportedError, VerificationError, describe
from . import verify as _verify
from .modules import ATTR_ALIASES, has_backward, make_binding, make_forward

__all__ = ["lower_as"]

log = logging.getLogger(__name__)
_MAX_SAMPLES = 3


def _alias_getter(name: str) -> Callable[[Any], Any]:
    aliases = ATTR_ALIASES.get(name, (name,))

    def get(module: Any) -> Any:
        for alias in aliases:
            if hasattr(module, alias):
                return getattr(module, alias)
        raise AttributeError(f"{type(module).__name__} has none of the attributes {aliases}")

    get.__name__ = f"self.{name}"
    return get


class lower_as:  # noqa: N801 (used as a decorator, like torch.no_grad)
    """Decorator: run ``op`` in place of the decorated function or forward.

    >>> import torch, kernelgraft as kg
    >>> @kg.op("doctest::double")
    ... def double(x: torch.Tensor) -> torch.Tensor:
    ...     return x * 2
    >>> @kg.lower_as(double)
    ... def times_two(t):
    ...     return t + t
    >>> times_two(torch.ones(2)).tolist()
    [2.0, 2.0]
    """

    def __init__(
        self,
        op: Any,
        *,
        attrs: Mapping[str, Any] | None = None,
        verify: bool = True,
        tolerance: float | Mapping[torch.dtype, float] | None = None,
    ) -> None:
        from ..op.operator import KernelOp

        if not isinstance(op, KernelOp):
            raise SpecError(f"kg.lower_as: expected a kernelgraft op (made by kg.op), got {describe(op)}")
        self.op = op
        self.attrs = dict(attrs or {})
        self.verify = verify
        self.tolerance = _verify.check_override(tolerance, f"kg.lower_as({op.name})")

    def __enter__(self):
        raise UnsupportedError(
            f"kg.lower_as({self.op.name}) cannot be used as a context manager: a with-block has no "
            "inputs or outputs Python can see, so the op's arguments and the value it replaces are "
            "unknown. Put the region in a function and decorate it with @kg.lower_as(op), or use "
            "kg.graft(model, pattern=fn, replacement=op)."
        )

    def __exit__(self, *exc: Any) -> bool:  # pragma: no cover - __enter__ always raises
        return False

    def __call__(self, fn: Callable) -> Callable:
        if not callable(fn):
            raise SpecError(f"kg.lower_as({self.op.name}): decorate a function, got {describe(fn)}")
        op = self.op
        params = list(inspect.signature(fn).parameters)
        is_method = bool(params) and params[0] == "self"
        where = f"kg.lower_as({op.name}) on {getattr(fn, '__qualname__', fn)}"
        binding = make_binding(op, fn, attrs=self.attrs, skip_self=is_method, where=where,
                               attr_fallback=_alias_getter if is_method else None)
        log.debug("%s binds as %s", where, binding.describe())
        backward = has_backward(op)
        if is_method:
            inner = make_forward(binding, fn, training=backward)
        else:
            inner = make_forward(binding, lambda _self, *a, **k: fn(*a, **k), training=backward)
            if self.verify:
                self._verify_samples(fn, binding, where)
        state = {"pending": self.verify and is_method}
        tol = self.tolerance

        def first_call_check(args: tuple, kwargs: dict, out: Any) -> None:
            state["pending"] = False
            with torch.no_grad():
                expected = fn(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs))
            problem = _verify.compare(expected, out, ops=[op], override=tol)
            if problem is not None:
                raise VerificationError(f"{where}: the op's result differs from the original: {problem}")

        if is_method:
            @functools.wraps(fn)
            def wrapper(self_, *args, **kwargs):
                out = inner(self_, *args, **kwargs)
                if state["pending"] and not torch.compiler.is_compiling():
                    first_call_check((self_, *args), kwargs, out)
                return out
        else:
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                return inner(None, *args, **kwargs)

        wrapper.__kernelgraft_op__ = op  # type: ignore[attr-defined]
        return wrapper

    def _verify_samples(self, fn: Callable, binding: Any, where: str) -> None:
        op = self.op
        if op.sample_inputs is None:
            log.info("%s: the op has no sample_inputs; verified on first use only by kg.graft", where)
            return
        n = 0
        from ..op.samples import samples

        for sample in samples(op, "cpu"):
            if n >= _MAX_SAMPLES:
                break
            fn_args: list[Any] = [None] * len(binding.forward_names)
            given = set()
            for value, (kind, src) in zip(sample, binding.sources):
                if kind == "arg":
                    fn_args[src] = value
                    given.add(src)
            fn_args = fn_args[: max(given) + 1] if given else []
            try:
                expected = fn(*_verify.clone_inputs(fn_args))
            except Exception as exc:  # a sample this function does not take (shape, dtype)
                log.debug("%s: sample skipped: %s", where, exc)
                continue
            got = op(*sample)
            problem = _verify.compare(expected, got, ops=[op], override=self.tolerance, inputs=sample)
            if problem is not None:
                raise VerificationError(
                    f"{where}: on sample {[describe(a) for a in sample]} the op differs from the "
                    f"function: {problem}; the function does not compute what the op does"
                )
            n += 1
        log.debug("%s: verified on %d samples", where, n)
