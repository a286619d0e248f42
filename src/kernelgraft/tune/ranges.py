"""Shape ranges to tune ahead: decode batches and prefill lengths, and op call sites that follow them.

``Ranges(decode=64, prefill=[512, 2048])`` names the forward passes a model will serve: decode
steps of 1..64 sequences (one new token each) and prefills of one sequence of 512 and 2048 tokens;
``points()`` gives them as ``(batch, seq)`` pairs. A ``Site`` is one op call of a model (or a call
given by hand) whose sizes follow the pass: each dimension, stride and int argument is a
``Formula``, ``a * g + b`` with ``g`` the batch, the sequence length, their product (the tokens) or
1. ``fit`` finds the formulas from calls recorded at a few ``(batch, seq)`` points; ``expand`` gives
a site's arguments at any point, as ``Arg`` descriptions that ``materialize`` allocates.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ..errors import SpecError

__all__ = ["Ranges", "Formula", "Arg", "Site", "fit_site", "materialize", "describe_arg", "dedupe", "RECORD_POINTS"]

# (batch, seq) of the recording passes: sizes unlike a model's own (odd primes), so a dimension
# that follows the batch, the sequence or the tokens cannot be taken for a constant or for another.
RECORD_POINTS = ((1, 13), (1, 17), (3, 13), (2, 19))
_SAMPLE = 4096  # values kept per recorded tensor, cycled to fill the tuning inputs
_GROUPS = {"tokens": lambda b, s: b * s, "seq": lambda b, s: s, "batch": lambda b, s: b}


def _positive_ints(value: Any, what: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise SpecError(f"kg.tune.Ranges: {what}={value} must be at least 1")
        return tuple(range(1, value + 1))
    try:
        out = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise SpecError(f"kg.tune.Ranges: {what} must be an int N (1..N) or a list of ints, got {value!r}") from None
    if any(v < 1 for v in out) or any(isinstance(v, bool) for v in value):
        raise SpecError(f"kg.tune.Ranges: {what} sizes must be positive ints, got {value!r}")
    return tuple(sorted(set(out)))


@dataclasses.dataclass(frozen=True)
class Ranges:
    """``decode``: an int N (batches of 1..N sequences, one token each) or the batch sizes;
    ``prefill``: the prompt lengths of one sequence (the buckets a server pads prompts to).

    >>> Ranges(decode=3, prefill=[512]).points()
    [(1, 1), (2, 1), (3, 1), (1, 512)]
    """

    decode: Any = None
    prefill: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "decode", _positive_ints(self.decode, "decode"))
        object.__setattr__(self, "prefill", _positive_ints(self.prefill, "prefill"))
        if not self.decode and not self.prefill:
            raise SpecError("kg.tune.Ranges: give decode=N (1..N sequences) and/or prefill=[lengths]")

    def points(self) -> list[tuple[int, int]]:
        return [(b, 1) for b in self.decode] + [(1, s) for s in self.prefill]

    @classmethod
    def parse(cls, decode: str | None, prefill: str | None) -> "Ranges":
        """From command-line text: ``decode`` '64' (1..64) or '1,2,4,8'; ``prefill`` '512,2048'."""
        def ints(text: str | None, what: str) -> Any:
            if not text:
                return None
            parts = [p for p in text.replace(" ", "").split(",") if p]
            try:
                values = [int(p) for p in parts]
            except ValueError:
                raise SpecError(f"--{what} takes ints separated by commas, got {text!r}") from None
            return values[0] if what == "decode" and len(values) == 1 else values

        return cls(ints(decode, "decode"), ints(prefill, "prefill"))


@dataclasses.dataclass(frozen=True)
class Formula:
    """``a * g + b``, ``g`` one of 'tokens', 'seq', 'batch' or '1' (a constant ``b``)."""

    g: str
    a: int
    b: int

    def at(self, batch: int, seq: int) -> int:
        return self.b if self.g == "1" else self.a * _GROUPS[self.g](batch, seq) + self.b


def _fit(values: Sequence[int], points: Sequence[tuple[int, int]]) -> Formula | None:
    if all(v == values[0] for v in values):
        return Formula("1", 0, int(values[0]))
    for g, of in _GROUPS.items():
        xs = [of(b, s) for b, s in points]
        pair = next(((i, j) for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[i] != xs[j]), None)
        if pair is None:
            continue
        i, j = pair
        a, rem = divmod(values[j] - values[i], xs[j] - xs[i])
        if rem or a == 0:
            continue
        b = values[i] - a * xs[i]
        if all(a * x + b == v for x, v in zip(xs, values)):
            return Formula(g, a, b)
    return None


@dataclasses.dataclass(frozen=True)
class Arg:
    """A site argument: a tensor (dtype, size and stride formulas, storage offset in elements) or
    a value (a ``Formula`` for an int that follows the pass)."""

    kind: str  # "tensor" | "value"
    dtype: str = ""
    sizes: tuple = ()
    strides: tuple = ()
    offset: int = 0
    value: Any = None


@dataclasses.dataclass(frozen=True)
class Site:
    """One op call whose arguments follow the pass; ``samples`` (not part of its identity): values
    of the recorded tensors, cycled to fill the tuning inputs (None: random)."""

    op: Any
    args: tuple  # of Arg
    samples: tuple = dataclasses.field(default=(), compare=False, hash=False)

    def identity(self) -> tuple:
        return (self.op.name, self.args)

    def at(self, batch: int, seq: int) -> list[tuple]:
        """Each argument at ``(batch, seq)``: ``("T", dtype, shape, stride, offset)`` or ``("V", value)``."""
        out = []
        for arg in self.args:
            if arg.kind == "tensor":
                out.append(("T", arg.dtype, tuple(f.at(batch, seq) for f in arg.sizes),
                            tuple(f.at(batch, seq) for f in arg.strides), arg.offset))
            else:
                out.append(("V", arg.value.at(batch, seq) if isinstance(arg.value, Formula) else arg.value))
        return out

    def grows(self) -> bool:
        """Whether any size follows the pass (a site that does not is one key whatever the pass)."""
        return any(f.g != "1" for a in self.args if a.kind == "tensor" for f in a.sizes) or any(
            isinstance(a.value, Formula) and a.value.g != "1" for a in self.args)


def describe_arg(value: Any) -> tuple:
    """A recorded argument: ``("T", dtype, shape, stride, offset, samples)`` or ``("V", value)``."""
    if isinstance(value, torch.Tensor):
        size = value.element_size()
        try:
            offset = (value.data_ptr() % 16) // size
        except RuntimeError:
            offset = 0
        samples = None
        if value.device.type != "meta" and value.numel():
            samples = value.detach().reshape(-1)[:_SAMPLE].to("cpu", copy=True)
        return ("T", str(value.dtype).removeprefix("torch."), tuple(value.shape), tuple(value.stride()),
                offset, samples)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        raise ValueError("a list of tensors")
    return ("V", value)


def fit_site(op: Any, calls: Sequence[Sequence[tuple]], points: Sequence[tuple[int, int]]) -> Site | str:
    """The site of ``op`` whose recorded arguments at ``points`` are ``calls`` (one ``describe_arg``
    list per point), or why its sizes do not follow the pass."""
    first = calls[0]
    args, samples = [], []
    for i, desc in enumerate(first):
        seen = [c[i] for c in calls]
        if any(s[0] != desc[0] for s in seen):
            return f"argument {i} is a tensor in one pass and not in another"
        if desc[0] == "V":
            values = [s[1] for s in seen]
            if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                f = _fit(values, points)
                if f is None:
                    return f"int argument {i} ({values}) follows neither the batch nor the sequence length"
                args.append(Arg("value", value=f if f.g != "1" else f.b))
            elif all(v == values[0] and type(v) is type(values[0]) for v in values):
                args.append(Arg("value", value=values[0]))
            else:
                return f"argument {i} changes with the pass ({values[:2]})"
            samples.append(None)
            continue
        _, dtype, shape, stride, offset, sample = desc
        if any(s[1] != dtype or len(s[2]) != len(shape) or s[4] != offset for s in seen):
            return f"tensor argument {i} changes dtype, rank or alignment with the pass"
        sizes, strides = [], []
        for d in range(len(shape)):
            f = _fit([s[2][d] for s in seen], points)
            if f is None:
                return (f"dimension {d} of argument {i} ({[s[2][d] for s in seen]}) follows neither the batch "
                        "nor the sequence length")
            sizes.append(f)
            f = _fit([s[3][d] for s in seen], points)
            if f is None:
                return (f"stride {d} of argument {i} ({[s[3][d] for s in seen]}) follows neither the batch "
                        "nor the sequence length")
            strides.append(f)
        args.append(Arg("tensor", dtype, tuple(sizes), tuple(strides), offset))
        samples.append(sample)
    return Site(op, tuple(args), tuple(samples))


def materialize(desc: Sequence[tuple], samples: Sequence[Any], device: Any, seed: int) -> tuple:
    """Arguments for ``site.at(...)``: tensors of exactly those sizes, strides and storage offsets
    on ``device``, filled from the recorded values (cycled) or, without them, random."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for d, sample in zip(desc, list(samples) + [None] * (len(desc) - len(samples))):
        if d[0] == "V":
            out.append(d[1])
            continue
        _, dtype, shape, stride, offset = d
        dt = getattr(torch, dtype)
        span = 0 if any(s == 0 for s in shape) else 1 + sum((s - 1) * st for s, st in zip(shape, stride))
        n = span + offset
        if sample is not None and sample.numel():
            flat = sample.repeat(math.ceil(n / sample.numel()))[:n].to(dt)
        elif dt.is_floating_point or dt.is_complex:
            flat = torch.randn(n, generator=g).to(dt)
        elif dt == torch.bool:
            flat = torch.rand(n, generator=g) < 0.5
        else:
            flat = torch.zeros(n, dtype=dt)  # indices and counts: 0 is valid wherever any is
        out.append(flat.to(device).as_strided(shape, stride, offset))
    return tuple(out)


def dedupe(sites: Iterable[Site]) -> list[Site]:
    """Sites in first-seen order, each identity once (a layer repeated 80 times is one site)."""
    seen: dict[tuple, Site] = {}
    for s in sites:
        seen.setdefault(s.identity(), s)
    return list(seen.values())
