"""The tuning key: everything that can change which candidate is fastest, built on purpose.

A key holds the op fingerprint (reference, schema, impls with their configs, options), the op's
tolerances (a decision gated under one tolerance is not valid under another), one descriptor per
argument (dtype, bucketed shape, layout class for tensors; bucketed ints, exact bools and
strings, the type only for floats), the device (name, compute capability, driver) and the
versions of torch, the backend compilers and kernelgraft. ``digest`` is a sha256 over a canonical
JSON form, the same in every process; bump ``KEY_SCHEMA_VERSION`` when the form changes.

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
from collections.abc import Sequence
from typing import Any

import torch

from .. import backends as backend_registry
from ..op.buckets import Buckets, bucket, normalize_buckets
from ..op.identity import callable_identity, dtype_name, tolerances_identity
from ..version import __version__

__all__ = ["TuneKey", "build_key", "bucket", "normalize_buckets", "environment", "tolerances_identity",
           "dtype_name", "callable_identity", "KEY_SCHEMA_VERSION"]

# 2: the op's tolerances are part of the key.
KEY_SCHEMA_VERSION = 2

# PyTorch competing (kernelgraft.op.compete), no backend: the reference as torch runs it
_TORCH = {"torch:eager": ("torch",), "torch:compile": ("torch",)}


def _distributions(backend: str) -> tuple[str, ...]:
    """The distributions whose versions change the code ``backend`` generates: what it declares
    (``Backend.distributions``), else its name looked up as one."""
    if backend in _TORCH:
        return _TORCH[backend]
    try:
        declared = getattr(backend_registry.get(backend), "distributions", ())
    except KeyError:
        declared = ()
    return tuple(declared) or (backend,)


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

    env = {
        "device": name,
        "capability": capability,
        "driver": driver,
        "torch": torch.__version__,
        "kernelgraft": __version__,
    }
    for backend in sorted(set(backends)):
        env[f"compiler:{backend}"] = _dist_version(_distributions(backend))
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
            "schema": KEY_SCHEMA_VERSION,
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
