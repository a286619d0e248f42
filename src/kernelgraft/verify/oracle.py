"""The correctness oracle: does a kernel's output match its reference?

One module answers this for ``kernelgraft check``, the tuner's gate (a candidate that fails here is
never chosen) and graft verification, so the three cannot disagree.

The expected values. The reference runs twice on copies of the inputs: once as given ("native")
and once with every floating input wider than 8 bits upcast to float64 (complex to complex128).
Outputs of integer, bool and 8-bit float dtypes are compared with the native run; wider floats with
the float64 run, whose own rounding error is negligible next to the kernel's. A reference that
raises in float64 (or gives other shapes) is compared at native precision instead, and the rule
below then widens ``rtol`` by ``NATIVE_WIDEN`` = 4 and says so: both sides now carry rounding
error of the output dtype, the reference often more (it rounds after every torch op). Graft
verification compares a grafted model with the original, both native, so it widens the same way.

The rule, per output dtype. ``rtol = kg.op(tolerances={dtype: rtol})`` for that dtype when given,
else ``RTOL[dtype]``; integer, bool and 8-bit float outputs default to 0.

- ``rtol == 0``: bit-equal with the native reference (an integer, a quantised byte or an fp8 code
  is either right or wrong; the native run also rounds the way the kernel is meant to).
- ``rtol > 0``: elementwise ``|got - want| <= rtol * (|want| + rms(want))`` where ``rms`` is the
  root mean square of the finite expected values of that output. The ``|want|`` term is a relative
  tolerance; the ``rms`` term is an absolute one at the output's own scale. A reduction's rounding
  error follows the magnitude of its terms, not of its result: an element of a long sum that
  cancels to near zero (a GEMM or softmax-normalised output) carries the error of the large partial
  sums, so a purely relative rule fails correct kernels on rounding alone, and a fixed ``atol``
  means nothing for outputs of unknown scale. One wrong element fails the output (a norm over the
  whole tensor would hide it).
- Non-finite values: where the expected value, rounded to the output dtype, is NaN the output must
  be NaN; where it is +-Inf (including float64 values that overflow the output dtype) the output
  must be the same infinity; a NaN or Inf anywhere else fails. Outputs are poisoned with NaN (or a
  byte pattern) before a kernel runs, so an element it never writes fails.

Defaults (``RTOL``), in units of the dtype's roundoff ``u`` (2^-11 float16, 2^-8 bfloat16):
float16 and bfloat16 allow 8u, a few roundings in the output dtype on top of float32 math;
float32 allows 1e-4, float32 accumulation in any order over reductions of 10^4-10^5 terms and
approximate transcendentals (about 1e-6 to 1e-5 in practice), but not TF32 tensor-core math:
TF32 rounds every GEMM input to 10 mantissa bits (u = 2^-11), which puts the largest elementwise
error of a large product near 2e-3 of rms; an op whose float32 kernels use TF32 declares it with
``tolerances={torch.float32: 5e-3}`` (torch's own float32 matmul does not use TF32 by default).
float64 allows 1e-9, float64 reductions in any order.

Output semantics. An op may replace the rule for some outputs (``kg.op(..., compare=...)``, see
``kernelgraft.verify.compare``): index outputs with ties judged by the values they select
(``kg.ties_by``), or a hook of its own. The rules are bound to the inputs when the reference runs
(``reference``) and applied by ``verify`` and ``compare_trees``, so check, the gate and graft
verification apply the same ones.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .compare import Rules, bind_rules
from ..errors import SpecError, describe

__all__ = [
    "RTOL", "NATIVE_WIDEN", "is_exact", "rtol_for", "check_tolerances",
    "poison", "poisoned", "clone", "upcast", "sync", "tensors",
    "Outcome", "Expected", "Reference", "Verdict",
    "compare", "reference", "verify", "compare_trees", "op_rules", "produced_names",
]

RTOL: dict[torch.dtype, float] = {
    torch.float64: 1e-9,
    torch.float32: 1e-4,
    torch.float16: 8 * 2.0**-11,
    torch.bfloat16: 8 * 2.0**-8,
    torch.complex128: 1e-9,
    torch.complex64: 1e-4,
    torch.complex32: 8 * 2.0**-11,
}
NATIVE_WIDEN = 4.0
_RULE = "|got - want| <= rtol * (|want| + rms(want))"


# ------------------------------------------------------------------------------ tolerances
def is_exact(dtype: torch.dtype) -> bool:
    """Integer, bool and 8-bit float dtypes: compared bit for bit unless an op says otherwise."""
    return not (dtype.is_floating_point or dtype.is_complex) or dtype.itemsize == 1


def check_tolerances(tolerances: Any, where: str) -> dict[torch.dtype, float]:
    """``tolerances`` as a ``{dtype: rtol}`` dict, or a SpecError naming what is wrong."""
    if tolerances is None:
        return {}
    if not isinstance(tolerances, Mapping):
        raise SpecError(f"{where}: tolerances must be a dict {{torch.dtype: rtol}}, got {describe(tolerances)}")
    out = {}
    for dtype, value in tolerances.items():
        if not isinstance(dtype, torch.dtype):
            raise SpecError(f"{where}: tolerances keys must be torch dtypes, got {describe(dtype)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value >= 0):
            raise SpecError(f"{where}: tolerances[{dtype}] must be a finite rtol >= 0 (0: bit-exact), "
                            f"got {value!r}")
        out[dtype] = float(value)
    return out


def rtol_for(dtype: torch.dtype, tolerances: Mapping[torch.dtype, float] | None = None) -> float:
    """The ``rtol`` of the rule for outputs of ``dtype``; 0.0 means bit-exact."""
    if tolerances and dtype in tolerances:
        return float(tolerances[dtype])
    if is_exact(dtype):
        return 0.0
    # Every wider float dtype torch has is in RTOL; a new one is judged like its own width.
    return RTOL.get(dtype, 1e-9 if dtype.itemsize >= 8 else 1e-4 if dtype.itemsize >= 4 else 8 * 2.0**-8)


# ------------------------------------------------------------------------ shared tensor helpers
def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` in place with values no correct kernel leaves behind: NaN for floats wider than
    8 bits, True for bool, the byte 0xA5 repeated for integers and 8-bit floats."""
    if not t.numel():
        return t
    if (t.dtype.is_floating_point or t.dtype.is_complex) and t.dtype.itemsize > 1:
        return t.fill_(float("nan"))
    if t.dtype == torch.bool:
        return t.fill_(True)
    t.view(torch.uint8).fill_(0xA5)
    return t


def poisoned(shape: Sequence[int], dtype: torch.dtype, device: Any) -> torch.Tensor:
    """A new contiguous tensor, poisoned."""
    return poison(torch.empty(tuple(shape), dtype=dtype, device=device))


def _clone_tensor(t: torch.Tensor) -> torch.Tensor:
    if not t.numel():
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    # Copy the storage span the view covers and view it the same way: strides survive (a
    # non-contiguous sample stays non-contiguous), and overlapping layouts (expanded, stride 0),
    # which copy_ into empty_strided refuses, are copied too.
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    flat = t.detach().as_strided((span,), (1,), t.storage_offset()).clone()
    return flat.as_strided(t.shape, t.stride(), 0)


def clone(value: Any) -> Any:
    """A copy of ``value`` (tensors, nested in tuples, lists and dicts) that a kernel or reference
    may write without touching the original; tensors keep their strides."""
    return pytree.tree_map(lambda v: _clone_tensor(v) if isinstance(v, torch.Tensor) else v, value)


def _wide_dtype(dtype: torch.dtype) -> torch.dtype | None:
    if dtype.is_complex:
        return torch.complex128
    if dtype.is_floating_point and dtype.itemsize > 1:
        return torch.float64
    return None


def upcast(value: Any) -> Any:
    """``value`` with every floating tensor wider than 8 bits converted to float64 (complex to
    complex128); 8-bit floats, integers and non-tensors are unchanged (not copied)."""

    def up(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and (wide := _wide_dtype(v.dtype)) is not None:
            return v.detach().to(wide)
        return v

    return pytree.tree_map(up, value)


def sync(device: Any) -> None:
    """Wait for ``device``'s work; names the device, which need not be the current one."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in ``value`` (a tensor, or a list/tuple of them), in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors(v)


# ------------------------------------------------------------------------------ one tensor
@dataclasses.dataclass(frozen=True)
class Outcome:
    """One output judged: the worst element's error and what the rule allowed there. ``problem``
    is None when the output passes, else a one-line report of the mismatch."""

    what: str
    error: float = 0.0
    allowed: float = 0.0
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def ratio(self) -> float:
        """error / allowed (>= 1 fails; inf for a mismatch where nothing was allowed)."""
        if self.allowed > 0:
            return self.error / self.allowed
        return 0.0 if self.ok else math.inf


def _item(t: torch.Tensor) -> Any:
    v = t.item()
    return v if not isinstance(v, float) else float(f"{v:.7g}")


def _index(flat: int, shape: Sequence[int]) -> list[int]:
    out = []
    for size in reversed(shape):
        out.append(flat % size if size else 0)
        flat //= size if size else 1
    return out[::-1]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Elements as integers of the same width (bit patterns); complex as (real, imag) pairs."""
    if t.dtype.is_complex:
        return _bits(torch.view_as_real(t.resolve_conj()))
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.dtype.itemsize]
        return t.contiguous().view(width)
    return t


def _compare_exact(got: torch.Tensor, want: torch.Tensor, what: str) -> Outcome:
    g, w = _bits(got), _bits(want)
    bad = (g != w).reshape(got.numel(), -1).any(-1) if got.dtype.is_complex else (g != w).flatten()
    count = int(bad.sum())
    if not count:
        return Outcome(what)
    first = int(bad.nonzero()[0])
    gf, wf = got.reshape(-1)[first], want.reshape(-1)[first]
    try:
        error = abs(float(gf.double()) - float(wf.double())) if not got.dtype.is_complex else math.inf
    except (RuntimeError, TypeError):
        error = math.inf
    return Outcome(what, error if math.isfinite(error) else math.inf, 0.0, (
        f"{what}: {count} of {got.numel()} elements differ (bit-exact rule for {_name(got.dtype)}); "
        f"first at {_index(first, got.shape)}: got {_item(gf)}, expected {_item(wf)}"))


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _rms(want: torch.Tensor) -> float:
    finite = want[torch.isfinite(want)]
    if not finite.numel():
        return 0.0
    return float(finite.abs().double().pow(2).mean().sqrt())


def compare(got: torch.Tensor, want: torch.Tensor, *, what: str, rtol: float) -> Outcome:
    """Judge one output against its expected value with the rule above (``rtol == 0``: bit-equal;
    then ``want`` must have ``got``'s dtype)."""
    if tuple(got.shape) != tuple(want.shape):
        return Outcome(what, math.inf, 0.0, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    want = want.detach().to(got.device)
    got = got.detach()
    if rtol == 0.0:
        if got.dtype != want.dtype:
            return Outcome(what, math.inf, 0.0, f"{what}: dtype {_name(got.dtype)}, expected {_name(want.dtype)}")
        return _compare_exact(got, want, what)
    if got.numel() == 0:
        return Outcome(what)
    wide = torch.complex128 if (got.dtype.is_complex or want.dtype.is_complex) else torch.float64
    g, w = got.to(wide).flatten(), want.to(wide).flatten()
    # Non-finite expectations are judged after rounding to the output dtype: a float64 value that
    # overflows float16 is expected as inf, as the kernel must store it.
    rounded = want.flatten().to(got.dtype) if (got.dtype.is_floating_point or got.dtype.is_complex) else w
    want_nan, want_inf = torch.isnan(rounded), torch.isinf(rounded)
    finite = ~(want_nan | want_inf)
    scale = _rms(w[finite])
    err = torch.where(finite, (g - w).abs(), torch.zeros((), dtype=torch.float64, device=g.device))
    allowed = rtol * (w.abs() + scale)
    bad = (finite & ~(err <= allowed)) | (want_nan & ~torch.isnan(g)) | (want_inf & (g != rounded.to(wide)))
    ratio = torch.where(finite, err / allowed.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    ratio = torch.where(bad, torch.inf, ratio)
    worst = int(ratio.argmax())
    if bool(finite[worst]):
        w_err, w_allowed, w_want = float(err[worst]), float(allowed[worst]), w[worst]
        w_err = w_err if w_err == w_err else math.inf  # NaN: a NaN output where a number was expected
    else:  # a NaN or Inf was expected here (after rounding to the output dtype)
        w_err, w_allowed, w_want = (math.inf if bool(bad[worst]) else 0.0), 0.0, rounded[worst]
    count = int(bad.sum())
    if not count:
        return Outcome(what, w_err, w_allowed)
    nans = int((finite & torch.isnan(g)).sum())
    return Outcome(what, w_err, w_allowed, (
        f"{what}: {count} of {got.numel()} elements off by more than rtol={rtol:.3g} of (|want| + rms "
        f"{scale:.3g}); worst at {_index(worst, got.shape)}: got {_item(g[worst])}, expected "
        f"{_item(w_want)}, error {w_err:.3g} > allowed {w_allowed:.3g}"
        + (f"; {nans} NaN where the reference has a number (unwritten elements?)" if nans else "")))


# ------------------------------------------------------------------------- an op's reference
@dataclasses.dataclass(frozen=True)
class Expected:
    """One thing an op produces: a returned tensor or a mutated argument after the call."""

    what: str  # "output 0", "mutated argument 'cache'"
    native: torch.Tensor  # the reference at the inputs' precision
    wide: torch.Tensor | None  # the float64 reference; None when it did not run
    name: str = ""  # the op's name for it (``out0``, a declared output name, the parameter's name)


@dataclasses.dataclass(frozen=True)
class Reference:
    expected: tuple[Expected, ...]
    note: str = ""  # why the float64 reference did not run, when it did not
    rules: Rules | None = None  # the op's own rules for some outputs (``kernelgraft.verify.compare``)

    @property
    def precise(self) -> bool:
        return not self.note


def _returned_names(op: Any, n_returned: int) -> list[str]:
    declared = tuple(getattr(op, "output_names", ()) or ())
    return [declared[i] if i < len(declared) else f"out{i}" for i in range(n_returned)]


def produced_names(op: Any, n_returned: int, args: Sequence[Any]) -> list[str]:
    """The op's names for what it produces (returned tensors, then mutated arguments; list
    elements ``name[k]``), in the order ``verify`` takes them."""
    names = _returned_names(op, n_returned)
    for index in op.signature.mutated:
        name = op.signature.params[index].name
        if isinstance(args[index], torch.Tensor):
            names.append(name)
        else:
            names.extend(f"{name}[{k}]" for k, _ in enumerate(tensors(args[index])))
    return names


def _produced_named(op: Any, result: Any, args: Sequence[Any]) -> list[tuple[str, str, torch.Tensor]]:
    """Everything an op produces, described and named: returned tensors, then mutated arguments."""
    if result is None:
        returned: list[torch.Tensor] = []
    elif isinstance(result, torch.Tensor):
        returned = [result]
    else:
        returned = list(result)
    names = produced_names(op, len(returned), args)
    # a declared output name says more than its position
    named = [(f"output {i}" if names[i] == f"out{i}" else f"output {names[i]!r}", t) for i, t in enumerate(returned)]
    for index in op.signature.mutated:
        name = op.signature.params[index].name
        if isinstance(args[index], torch.Tensor):
            named.append((f"mutated argument {name!r}", args[index]))
        else:
            named.extend((f"mutated argument {name!r}[{k}]", t) for k, t in enumerate(tensors(args[index])))
    return [(what, name, t) for (what, t), name in zip(named, names)]


def _produced(op: Any, result: Any, args: Sequence[Any]) -> list[tuple[str, torch.Tensor]]:
    """Everything an op produces, described: returned tensors, then mutated arguments."""
    return [(what, t) for what, _, t in _produced_named(op, result, args)]


def reference(op: Any, args: Sequence[Any]) -> Reference:
    """Run ``op.reference`` at native precision and in float64 (see the module docstring). The
    caller's arguments are never written. A reference that fails at native precision raises."""
    rules = bind_rules(op, args, clone)  # before any run: hooks see the arguments as given
    native_args = clone(tuple(args))
    with torch.no_grad():
        native = _produced_named(op, op.reference(*native_args), native_args)
    wide_args = upcast(clone(tuple(args)))
    note = ""
    try:
        with torch.no_grad():
            wide = _produced_named(op, op.reference(*wide_args), wide_args)
    except Exception as exc:
        wide, note = None, f"the float64 reference failed ({type(exc).__name__}: {str(exc)[:120]})"
    if wide is not None and [tuple(t.shape) for *_, t in wide] != [tuple(t.shape) for *_, t in native]:
        wide, note = None, "the float64 reference gave other shapes"
    if note:
        note += f"; compared at native precision with rtol x{NATIVE_WIDEN:g}"
    expected = tuple(Expected(what, t.detach(), None if wide is None else wide[i][2].detach(), name)
                     for i, (what, name, t) in enumerate(native))
    return Reference(expected, note, rules)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Every output judged. ``worst`` is the first failing output, else the closest to failing."""

    outcomes: tuple[Outcome, ...]
    note: str = ""

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    @property
    def worst(self) -> Outcome | None:
        failed = [o for o in self.outcomes if not o.ok]
        if failed:
            return failed[0]
        return max(self.outcomes, key=lambda o: o.ratio, default=None)

    def __str__(self) -> str:
        worst = self.worst
        text = worst.problem if worst is not None and worst.problem else "match"
        return f"{text} ({self.note})" if self.note else text


def verify(ref: Reference, produced: Sequence[torch.Tensor],
           tolerances: Mapping[torch.dtype, float] | None = None) -> Verdict:
    """Judge what a kernel produced (returned tensors, then mutated arguments, in the order of
    ``ref.expected``) against the reference, with ``tolerances`` (an op's ``{dtype: rtol}``)."""
    if len(produced) != len(ref.expected):
        return Verdict((Outcome("outputs", math.inf, 0.0,
                                f"outputs: {len(produced)} tensors, the reference gives {len(ref.expected)}"),),
                       ref.note)
    outcomes = []
    rules = ref.rules
    if rules is not None:  # the op's own rules judge their outputs; the default rule the rest
        got_by = {exp.name: got for got, exp in zip(produced, ref.expected)}
        want_by = {exp.name: exp.native for exp in ref.expected}
        outcomes.extend(Outcome(what, 0.0 if problem is None else math.inf, 0.0, problem)
                        for what, problem in rules.judge(got_by, want_by))
    for got, exp in zip(produced, ref.expected):
        if rules is not None and rules.judges(exp.name):
            continue
        if got.dtype != exp.native.dtype:
            outcomes.append(Outcome(exp.what, math.inf, 0.0, f"{exp.what}: dtype {_name(got.dtype)}, "
                                    f"expected {_name(exp.native.dtype)}"))
            continue
        rtol = rtol_for(got.dtype, tolerances)
        if rtol == 0.0:
            outcomes.append(compare(got, exp.native, what=exp.what, rtol=0.0))
        elif exp.wide is not None:
            outcomes.append(compare(got, exp.wide, what=exp.what, rtol=rtol))
        else:
            outcomes.append(compare(got, exp.native, what=exp.what, rtol=rtol * NATIVE_WIDEN))
    return Verdict(tuple(outcomes), ref.note)


# --------------------------------------------------------------- two native computations
def op_rules(op: Any, args: Sequence[Any]) -> Rules | None:
    """The op's own rules (``compare=``) bound to ``args``, for ``compare_trees`` of the op's
    outputs computed two ways (graft verification); None when it has none."""
    return bind_rules(op, args, clone)


def compare_trees(expected: Any, got: Any, *, tolerances: Mapping[torch.dtype, float] | None = None,
                  what: str = "output", rules: tuple[Any, Rules] | None = None) -> str | None:
    """None when ``got`` matches ``expected`` leaf by leaf (nested tuples, dicts, model outputs),
    else the first mismatch. Both sides are native-precision computations (a model and its grafted
    copy), so non-exact dtypes get ``rtol * NATIVE_WIDEN``, as a reference that refuses float64.
    ``rules``: ``(op, op_rules(op, inputs))`` when the two sides are that op's outputs: its own
    rules then judge the outputs they name."""
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    got_leaves, got_spec = pytree.tree_flatten(got)
    if len(exp_leaves) != len(got_leaves):
        return f"{what} structure differs: expected {exp_spec}, got {got_spec}"
    skip: set[int] = set()
    if rules is not None and rules[1] is not None and all(isinstance(t, torch.Tensor) for t in exp_leaves + got_leaves):
        names = _returned_names(rules[0], len(exp_leaves))
        for _, problem in rules[1].judge(dict(zip(names, got_leaves)), dict(zip(names, exp_leaves))):
            if problem is not None:
                return problem
        skip = {i for i, name in enumerate(names) if rules[1].judges(name)}
    for i, (e, g) in enumerate(zip(exp_leaves, got_leaves)):
        if i in skip:
            continue
        where = f"{what} leaf {i}" if len(exp_leaves) > 1 else what
        if isinstance(e, torch.Tensor) != isinstance(g, torch.Tensor):
            return f"{where}: expected {type(e).__name__}, got {type(g).__name__}"
        if not isinstance(e, torch.Tensor):
            if isinstance(e, (int, float, bool, str, type(None))) and e != g and not (
                    isinstance(e, float) and e != e and isinstance(g, float) and g != g):
                return f"{where}: expected {e!r}, got {g!r}"
            continue  # opaque objects (a model's cache): their tensors are not outputs we judge
        if e.dtype != g.dtype:
            return f"{where}: dtype {_name(g.dtype)}, expected {_name(e.dtype)}"
        rtol = rtol_for(g.dtype, tolerances)
        outcome = compare(g, e, what=where, rtol=rtol * NATIVE_WIDEN)
        if not outcome.ok:
            return outcome.problem
    return None
