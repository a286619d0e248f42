"""Shape buckets: which sizes share one tuning decision. By default a size rounds up to the next
power of two; ``kg.op(..., buckets=...)`` changes that per op, validated once at decoration
(``normalize_buckets``). The tuning key (``kernelgraft.tune.key``) reads shapes through them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import SpecError
from .identity import callable_identity

__all__ = ["Buckets", "BucketFn", "bucket", "normalize_buckets"]

BucketFn = Callable[[int], int]


def _pow2(size: int) -> int:
    return 1 if size <= 1 else 1 << (int(size) - 1).bit_length()


def _exact(size: int) -> int:
    return int(size)


@dataclasses.dataclass(frozen=True)
class _Boundaries:
    """Round up to the first of ``points`` that fits; past the last, to the next power of two."""

    points: tuple[int, ...]

    def __call__(self, size: int) -> int:
        for p in self.points:
            if size <= p:
                return p
        return _pow2(size)


def _boundaries(points: Sequence[int]) -> BucketFn:
    return _Boundaries(tuple(sorted(set(int(p) for p in points))))


def _one_rule(spec: Any, where: str) -> BucketFn:
    if spec is None or spec == "pow2":
        return _pow2
    if spec == "exact":
        return _exact
    if callable(spec):
        return spec
    if isinstance(spec, (list, tuple)) and spec and all(
        isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in spec
    ):
        return _boundaries(spec)
    raise SpecError(
        f"{where}: bucket rule {spec!r} is not allowed; use 'pow2' (default), 'exact', a function "
        "size -> bucket, or a list of increasing sizes such as [16, 64, 256]"
    )


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Bucket rules per argument and dimension; ``rule(name, dim)`` gives the function."""

    default: BucketFn = _pow2
    per_arg: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def identity(self) -> dict[str, Any]:
        """A canonical JSON form of the rules (op fingerprints): named rules by name, lists by
        their points, functions by their source."""
        per_arg = {}
        for name in sorted(self.per_arg):
            spec = self.per_arg[name]
            per_arg[name] = ({str(d): _rule_identity(f) for d, f in sorted(spec.items())}
                             if isinstance(spec, Mapping) else _rule_identity(spec))
        return {"default": _rule_identity(self.default), "per_arg": per_arg}

    def rule(self, name: str, dim: int) -> BucketFn:
        spec = self.per_arg.get(name)
        if spec is None:
            return self.default
        if isinstance(spec, Mapping):
            return spec.get(dim, self.default)
        return spec


def _rule_identity(fn: BucketFn) -> Any:
    if fn is _pow2:
        return "pow2"
    if fn is _exact:
        return "exact"
    if isinstance(fn, _Boundaries):
        return list(fn.points)
    return {"source": callable_identity(fn)}


def normalize_buckets(buckets: Any, *, where: str, params: Sequence[str] = ()) -> Buckets:
    """Validate ``kg.op(buckets=...)`` once, at decoration time.

    Accepted: None or 'pow2' (next power of two), 'exact', a function ``size -> bucket``, a list
    of sizes (round up to the first that fits, past the last: next power of two), or a dict from
    argument name to one of those or to ``{dim: rule}``.

    >>> b = normalize_buckets({"x": {0: [16, 128]}}, where="demo")
    >>> b.rule("x", 0)(100), b.rule("x", 1)(100), b.rule("y", 0)(5)
    (128, 128, 8)
    """
    if isinstance(buckets, Buckets):
        return buckets
    if not isinstance(buckets, Mapping):
        return Buckets(_one_rule(buckets, where), {})
    per_arg: dict[str, Any] = {}
    for name, spec in buckets.items():
        if params and name not in params:
            raise SpecError(f"{where}: buckets names {name!r}, which is not a Tensor parameter; "
                            f"the op has {list(params)}")
        if isinstance(spec, Mapping):
            per_arg[name] = {int(d): _one_rule(s, where) for d, s in spec.items()}
        else:
            per_arg[name] = _one_rule(spec, where)
    return Buckets(_pow2, per_arg)


def bucket(size: int) -> int:
    """The default bucket of a dimension size: the next power of two (0 stays 0)."""
    return 0 if size == 0 else _pow2(size)
