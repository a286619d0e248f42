"""The tuning key: everything that can change which candidate is fastest, built on purpose.

A key holds the op fingerprint (reference, schema, impls with their configs, options), the op's
tolerances (a decision gated under one tolerance is not valid under another), one descriptor per
argument (dtype, bucketed shape, layout class for tensors; bucketed ints, exact bools and
strings, the type only for floats), the device (name, compute capability, driver) and the
versions of torch, the backend compilers and kernelgraft. ``digest`` is a sha256 over a canonical
JSON form, the same in every process; bump ``_KEY_SCHEMA_VERSION`` when the form changes.

Shapes are bucketed so one decision serves nearby sizes: by default a size rounds up to the next
power of two; ``kg.op(..., buckets=...)`` changes that per op (see ``normalize_buckets``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..errors import SpecError
from ..spec import callable_source

__all__ = ["TuneKey", "build_key", "bucket", "normalize_buckets", "environment", "tolerances_identity",
           "dtype_name", "callable_identity", "_KEY_SCHEMA_VERSION"]

# 2: the op's tolerances are part of the key.
_KEY_SCHEMA_VERSION = 2

# backend name -> the distribution whose version changes the code it generates
_COMPILERS = {
    "triton": ("triton",),
    "cuda": ("cuda-core", "cuda-python", "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-nvrtc"),
    "cutedsl": ("nvidia-cutlass-dsl",),
    "cutile": ("cuda-tile",),
    # PyTorch competing (kernelgraft.op.compete): the reference as torch runs it
    "torch:eager": ("torch",),
    "torch:compile": ("torch",),
}

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


def callable_identity(fn: Callable | None) -> str | None:
    """A function as op fingerprints see it: its source (and that of the kernels it names), the
    same in every process; None stays None.

    A lambda's source is its whole line, which two lambdas can share, so what tells them apart is
    added: the column it starts at, its names, arguments and constants (never its bytecode, which
    differs between Python versions and would rename unnamed ops); a callable object without source
    text is named by its type.
    """
    if fn is None:
        return None
    try:
        text = callable_source(fn)
    except Exception:
        return f"{type(fn).__module__}.{type(fn).__qualname__}"
    code = getattr(fn, "__code__", None)
    if code is not None and code.co_name == "<lambda>":
        consts = [c for c in code.co_consts if isinstance(c, (int, float, str, bytes, bool))]
        positions = getattr(code, "co_positions", None)  # Python 3.11+
        # the span of the body within its line (the first instruction, RESUME, has no real place)
        spans = [(p[2], p[3]) for p in positions() if p[2] is not None and p[3]] if positions else []
        span = (min(a for a, _ in spans), max(b for _, b in spans)) if spans else None
        text += f"\n{span}:{code.co_varnames}:{code.co_names}:{consts!r}"
    return text


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


def layout_class(t: torch.Tensor) -> str:
    """'c' contiguous, 't' last two dims transposed, 's' other strides; 'a16'/'u' for whether the
    data pointer is 16-byte aligned (Triton and vectorised loads specialise on it)."""
    if t.is_contiguous():
        kind = "c"
    elif t.dim() >= 2 and t.transpose(-1, -2).is_contiguous():
        kind = "t"
    else:
        kind = "s"
    try:
        aligned = t.data_ptr() % 16 == 0
    except RuntimeError:  # fake or meta tensors
        aligned = True
    return f"{kind}{'a16' if aligned else 'u'}"


@functools.cache
def _dist_version(names: tuple[str, ...]) -> str:
    for name in names:
        try:
            return f"{name}=={importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"{names[0]}==absent"


@functools.cache
def _driver_version() -> str:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        out = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(out)) == 0:
            return str(out.value)
    except OSError:
        pass
    return "none"


@functools.cache
def _device_info(device_type: str, index: int) -> tuple[str, str, str]:
    if device_type != "cuda":
        return (device_type, "none", "none")
    props = torch.cuda.get_device_properties(index)
    return (props.name, f"{props.major}.{props.minor}", _driver_version())


def environment(device: torch.device, backends: Sequence[str] = ()) -> dict[str, str]:
    """Device and toolchain facts a decision is only valid for."""
    index = device.index if device.index is not None else (
        torch.cuda.current_device() if device.type == "cuda" else 0
    )
    name, capability, driver = _device_info(device.type, index)
    from .. import __version__

    env = {
        "device": name,
        "capability": capability,
        "driver": driver,
        "torch": torch.__version__,
        "kernelgraft": __version__,
    }
    for backend in sorted(set(backends)):
        env[f"compiler:{backend}"] = _dist_version(_COMPILERS.get(backend, (backend,)))
    return env


@dataclasses.dataclass(frozen=True)
class TuneKey:
    """One tuning problem. ``digest`` names it in caches and across ranks."""

    op: str
    fingerprint: str
    args: tuple
    env: tuple  # sorted (name, value) pairs from ``environment``
    # sorted (dtype name, tolerance) pairs: the correctness gate a decision passed is only
    # valid under the tolerances it was judged with
    tolerances: tuple = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "schema": _KEY_SCHEMA_VERSION,
            "op": self.op,
            "fingerprint": self.fingerprint,
            "args": _jsonable(self.args),
            "env": dict(self.env),
            "tolerances": dict(self.tolerances),
        }

    @functools.cached_property
    def digest(self) -> str:
        blob = json.dumps(self.as_json(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()

    def summary(self) -> str:
        """A short human form of the argument part, e.g. ``bf16[128,4096]c, bf16[4096,4096]c``."""
        return ", ".join(_short(a) for a in self.args)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def _short(desc: Any) -> str:
    if isinstance(desc, tuple) and desc and desc[0] == "T":
        _, dtype, shape, layout = desc
        return f"{dtype.replace('torch.', '')}[{','.join(map(str, shape))}]{layout}"
    if isinstance(desc, tuple) and desc and desc[0] == "L":
        return "[" + ", ".join(_short(d) for d in desc[1]) + "]"
    return str(desc[-1]) if isinstance(desc, tuple) else str(desc)


def _tensor_desc(name: str, t: torch.Tensor, buckets: Buckets) -> tuple:
    shape = tuple(int(buckets.rule(name, d)(int(s))) if s else 0 for d, s in enumerate(t.shape))
    return ("T", str(t.dtype), shape, layout_class(t))


def build_key(op: Any, args: Sequence[Any], backends: Sequence[str] = ()) -> TuneKey:
    """The key of calling ``op`` with ``args`` (bound positionally, in schema order)."""
    buckets: Buckets = getattr(op, "buckets", None) or Buckets()
    descs = []
    device = None
    for param, a in zip(op.signature.params, args):
        if isinstance(a, torch.Tensor):
            device = device or a.device
            descs.append(_tensor_desc(param.name, a, buckets))
        elif isinstance(a, (list, tuple)) and a and all(isinstance(t, torch.Tensor) for t in a):
            device = device or a[0].device
            descs.append(("L", tuple(_tensor_desc(param.name, t, buckets) for t in a)))
        elif isinstance(a, bool) or a is None or isinstance(a, str):
            descs.append(("V", a))
        elif isinstance(a, int):
            descs.append(("I", bucket(abs(a)) * (1 if a >= 0 else -1)))
        elif isinstance(a, float):
            descs.append(("F", "float"))
        elif isinstance(a, torch.dtype):
            descs.append(("V", str(a)))
        else:
            descs.append(("V", type(a).__name__))
    env = environment(device or torch.device("cpu"), backends)
    return TuneKey(op.name, op.fingerprint, tuple(descs), tuple(sorted(env.items())),
                   tolerances_identity(getattr(op, "tolerances", None)))


def tolerances_identity(tolerances: Mapping[Any, Any] | None) -> tuple[tuple[str, float], ...]:
    """``{torch.float16: 1e-2}`` as sorted ``(("float16", 0.01),)``: the same in every process.

    >>> tolerances_identity({torch.bfloat16: 0.02, torch.float16: 1e-3})
    (('bfloat16', 0.02), ('float16', 0.001))
    """
    return tuple(sorted((dtype_name(d), _plain(v)) for d, v in (tolerances or {}).items()))


def _plain(value: Any) -> Any:
    """A tolerance value in a JSON-stable form: numbers as floats, sequences as tuples of them."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _plain(v)) for k, v in value.items()))
    return repr(value)


def dtype_name(dtype: Any) -> str:
    """``torch.float16`` -> ``'float16'`` (a string stays as it is)."""
    return str(dtype).removeprefix("torch.")
