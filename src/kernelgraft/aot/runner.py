"""The runner of a bundled candidate: ``runner(*inputs, *outputs)`` picks the first kernel whose
dtypes, ranks, layout and guards fit the call (once per distinct shape and strides), evaluates
grid and scalar arguments (strides included) from the recorded expressions, and launches the cubin
through ``kernelgraft.driver`` on torch's current stream. Calls no kernel covers go to
``fallback`` (the JIT runner, when the backend is importable) or raise ``UnsupportedError``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import BundleError, KernelgraftError, UnsupportedError
from .. import driver
from ..symbolic.expr import compile_exprs, constant_value
from .manifest import read_binary

__all__ = ["Kernel", "BundledRunner"]

log = logging.getLogger(__name__)
_Tensor = torch.Tensor


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, str(name), None)
    if not isinstance(value, torch.dtype):
        raise BundleError(f"bundle names dtype {name!r}, which torch does not have")
    return value


# CUDA's limits on every arch kernelgraft targets (sm_70 and later).
_MAX_GRID = (2**31 - 1, 65535, 65535)
_MAX_BLOCK = (1024, 1024, 64)
_MAX_THREADS = 1024
_MAX_SHARED = 228 * 1024  # the largest opt-in dynamic shared memory of any arch (sm_90/sm_100: 227 KB)


def check_launch(where: str, grid: Sequence[int], block: Sequence[int], smem: int) -> None:
    """BundleError unless grid, block and shared memory are within the device limits: a
    non-positive grid would make the launcher skip the kernel and leave its outputs unwritten."""
    if len(grid) != 3 or any(type(g) is not int or not 1 <= g <= m for g, m in zip(grid, _MAX_GRID)):
        raise BundleError(f"{where}: grid {tuple(grid)} is outside the device limits (each dimension >= 1; "
                          f"x <= {_MAX_GRID[0]}, y and z <= {_MAX_GRID[1]})")
    threads = 1
    for b in block:
        threads *= b if type(b) is int else 0
    if (len(block) != 3 or any(type(b) is not int or not 1 <= b <= m for b, m in zip(block, _MAX_BLOCK))
            or threads > _MAX_THREADS):
        raise BundleError(f"{where}: block {tuple(block)} is outside the device limits (each dimension >= 1, "
                          f"x and y <= 1024, z <= 64, at most {_MAX_THREADS} threads)")
    if type(smem) is not int or not 0 <= smem <= _MAX_SHARED:
        raise BundleError(f"{where}: shared memory {smem!r} bytes is outside 0..{_MAX_SHARED}")


# Triton's element type names (its kernel signature records them): a relabelled dtype in the manifest
# no longer matches the types the binary was compiled for.
_TRITON_TYPES = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
    torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
    torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5",
}
_C_TYPES = {"float": torch.float32, "double": torch.float64, "__half": torch.float16, "half": torch.float16,
            "__nv_bfloat16": torch.bfloat16}


def _check_types(where: str, entry: dict, sources: dict[str, torch.dtype]) -> None:
    """The dtypes the manifest claims agree with the types recorded by the kernel's compiler."""
    pointers = [sources.get(p["source"]) for p in entry["params"] if "source" in p]
    triton = entry.get("triton")
    if isinstance(triton, dict) and isinstance(triton.get("signature"), dict):
        if any(d not in _TRITON_TYPES for d in pointers):
            return
        compiled = sorted(str(t) for t in triton["signature"].values() if str(t).startswith("*"))
        claimed = sorted("*" + _TRITON_TYPES[d] for d in pointers)
        if compiled != claimed:
            raise BundleError(f"{where}: the manifest's dtypes give pointer types {claimed}, but the kernel "
                              f"was compiled for {compiled}; the manifest was modified")
    cuda = entry.get("cuda")
    if isinstance(cuda, dict) and isinstance(cuda.get("template"), dict):
        for arg, ctype in cuda["template"].items():
            want = _C_TYPES.get(str(ctype))
            if want is not None and want not in sources.values():
                raise BundleError(f"{where}: template argument {arg}={ctype} is compiled for {want}, which no "
                                  f"tensor of the manifest has ({sorted(map(str, set(sources.values())))}); "
                                  "the manifest was modified")


def _check_cubin(where: str, image: bytes, kernel: str) -> None:
    """A cubin is a 64-bit CUDA ELF that defines the kernel: other bytes under a recomputed sha256
    are refused here rather than by the driver at the first launch."""
    if image[:5] != b"\x7fELF\x02" or len(image) < 64 or int.from_bytes(image[18:20], "little") != 190:
        raise BundleError(f"{where}: the cubin is not a 64-bit CUDA ELF image")
    if kernel.encode() + b"\0" not in image:
        raise BundleError(f"{where}: the cubin does not define kernel {kernel!r}")


class Kernel:
    """One binary of a candidate with the conditions under which it runs and its launch rule."""

    def __init__(self, root: Path, names: Sequence[str], n_inputs: int, entry: dict, label: str = "",
                 binaries: Mapping[str, bytes] | None = None) -> None:
        self.entry = entry
        self.name = str(entry["kernel"])
        self.where = f"bundle {root}: {label or '?'} kernel {self.name}"
        index = {n: i for i, n in enumerate(names)}
        self.dtypes = [(index[n], _dtype(d)) for n, d in entry["dtypes"].items()]
        self.ranks = [(index[n], int(r)) for n, r in entry["ranks"].items()]
        # the inputs traced contiguous (their strides are size expressions); a manifest without the
        # list predates strided kernels, whose every input was traced contiguous
        dense = entry.get("contiguous", list(entry["dtypes"]))
        if not isinstance(dense, list) or not all(n in entry["dtypes"] for n in dense):
            raise BundleError(f"{self.where}: 'contiguous' {dense!r} is not a list of the kernel's tensor inputs")
        self.contiguous = [index[n] for n in dense]
        # string arguments the kernel was recorded with (manifest version 3): it serves only those
        self.pinned = [(index[n], str(v)) for n, v in entry.get("pinned", {}).items()]
        inputs = list(names[:n_inputs])
        # each guard on its own: kernels of one candidate share most guards, compiled once (_expr)
        self._guard = compile_exprs(inputs, list(entry["guards"]) or ["True"])
        params = entry["params"]
        if len(entry["grid"]) != 3:
            raise BundleError(f"{self.where}: grid {entry['grid']!r} does not have 3 dimensions")
        exprs = [*entry["grid"], str(entry["shared_mem"])] + [p["expr"] for p in params if "expr" in p]
        self._values = compile_exprs(inputs, exprs)
        self.kinds = [str(p["kind"]) for p in params]
        self.ptr_slots = [(i, index[p["source"]]) for i, p in enumerate(params) if "source" in p]
        self.scalar_slots = [i for i, p in enumerate(params) if "expr" in p]
        needs = set(entry.get("aligned", ()))
        self.aligned = bool(needs) and {p["source"] for p in params if "source" in p} <= needs
        self.block = tuple(b if type(b) is int else -1 for b in entry["block"])
        # what does not depend on the inputs is checked now, the rest once per shape in prepare()
        constant = [constant_value(str(e), inputs) for e in entry["grid"]]
        grid = tuple(1 if v is None else v for v in constant)
        smem = constant_value(str(entry["shared_mem"]), inputs)
        check_launch(self.where, grid, self.block, 0 if smem is None else smem)
        outs = entry["outputs"]["dtypes"]
        sources = {names[i]: dt for i, dt in self.dtypes}
        sources.update({f"out{i}": _dtype(d) for i, d in enumerate(outs)})
        _check_types(self.where, entry, sources)
        self._load(root, entry["images"], binaries)
        self.arch = str(entry.get("arch", ""))
        self._checked: set[int] = set()  # devices this binary was checked against (arch, params)
        self._foreign: dict[int, str] = {}  # devices it cannot run on, with why

    def _load(self, root: Path, images: Mapping[str, Any], binaries: Mapping[str, bytes] | None) -> None:
        """Sets ``function`` and ``launcher`` from the verified images."""
        if binaries is not None and images["cubin"].get("file") in binaries:
            cubin = binaries[images["cubin"]["file"]]  # verified (sha256 and ELF) by the loader
        else:
            for kind, image in images.items():  # every image is verified, not only the one loaded
                if kind != "cubin":
                    read_binary(root, image)
            cubin = read_binary(root, images["cubin"])
            _check_cubin(self.where, cubin, self.name)
        try:
            self.function = driver.load_module(cubin, "cubin", name=self.name).function(self.name)
            self.launcher = self.function.launcher(self.kinds)
        except KernelgraftError as exc:
            raise BundleError(f"{self.where}: {exc}") from None

    def _check_params(self, device: int) -> None:
        if driver.available() is None:
            self.function.check_params(device, self.kinds)

    def first_use(self, device: int) -> str | None:
        """Check this binary against ``device`` once: None when it may launch there, else why
        not (a process may drive GPUs of several archs; the bundle was loaded for one)."""
        if device in self._foreign:
            return self._foreign[device]
        major, minor = torch.cuda.get_device_capability(device) if device >= 0 and self.arch else (0, 0)
        if device >= 0 and self.arch and self.arch != f"sm_{major}{minor}":
            why = (f"{self.where} is built for {self.arch}, but the tensors are on cuda:{device} "
                   f"(sm_{major}{minor})")
            self._foreign[device] = why
            return why
        self._check_params(device)
        self._checked.add(device)
        return None

    def fits(self, args: Sequence[Any], n_inputs: int) -> bool:
        for i, dt in self.dtypes:
            a = args[i]
            if not isinstance(a, _Tensor) or a.dtype != dt:
                return False
        for i in self.contiguous:
            if not args[i].is_contiguous():
                return False
        for i, r in self.ranks:
            if args[i].dim() != r:
                return False
        if any(args[i] != v for i, v in self.pinned):
            return False
        try:
            return all(self._guard(*args[:n_inputs]))
        except Exception:  # a guard that cannot be evaluated does not hold
            return False

    def prepare(self, args: Sequence[Any], n_inputs: int) -> tuple:
        values = self._values(*args[:n_inputs])
        try:
            grid, smem = tuple(int(v) for v in values[:3]), int(values[3])
        except (TypeError, ValueError, OverflowError):
            raise BundleError(f"{self.where}: grid and shared memory {values[:4]} are not integers") from None
        check_launch(self.where, grid, self.block, smem)
        template: list[Any] = [0] * len(self.kinds)
        for slot, v in zip(self.scalar_slots, values[4:]):
            template[slot] = v
        return grid, smem, template


class BundledRunner:
    """``runner(*inputs, *outputs)`` for one candidate."""

    # Bundled kernels launch through kernelgraft.driver, which describes each launch to the native
    # replay whatever the candidate's backend (a JIT fallback's launch is noted, or refuses it).
    replayable = True

    def __init__(self, label: str, kernels: Sequence[Kernel], n_inputs: int,
                 fallback: Callable[[], Callable[..., Any]] | None = None) -> None:
        self.label = label
        self.kernels = list(kernels)
        self.n_inputs = n_inputs
        self._fallback_factory = fallback
        self._fallback: Callable[..., Any] | None = None
        self._plans: dict[tuple, Any] = {}
        self._first_tensor = None

    def covers(self, args: Sequence[Any]) -> str | None:
        """None when a bundled kernel fits these inputs, else why not."""
        if any(k.fits(args, self.n_inputs) for k in self.kernels):
            return None
        return f"no bundled kernel of {self.label} fits these shapes/dtypes (guards do not hold)"

    def _plan(self, args: Sequence[Any], key: tuple):
        plan = None
        tensors = [a for a in args if isinstance(a, _Tensor)]
        if self._fallback_factory is not None and tensors and not tensors[0].is_cuda:
            self._plans[key] = None  # CPU tensors (Triton's interpreter) take the JIT path
            return None
        for k in self.kernels:
            if k.fits(args, self.n_inputs):
                grid, smem, template = k.prepare(args, self.n_inputs)
                plan = (k, grid, smem, template)
                break
        self._plans[key] = plan
        return plan

    def _run_fallback(self, args: Sequence[Any], why: str) -> None:
        if self._fallback is None:
            if self._fallback_factory is None:
                raise UnsupportedError(f"{self.label}: {why}, and its backend cannot compile here")
            self._fallback = self._fallback_factory()
        self._fallback(*args)

    def __call__(self, *args: Any) -> None:
        # strides in the key: a kernel's guards and parameters may read them
        key = tuple((a.shape, a.stride(), a.dtype) if isinstance(a, _Tensor) else a for a in args)
        plan = self._plans.get(key, False)
        if plan is False:
            plan = self._plan(args, key)
        if plan is None:
            return self._run_fallback(args, "no bundled kernel fits these inputs")
        kernel, grid, smem, template = plan
        values = template[:]
        misaligned = 0
        for slot, i in kernel.ptr_slots:
            p = args[i].data_ptr()
            values[slot] = p
            misaligned |= p
        if kernel.aligned and misaligned & 15:
            return self._run_fallback(args, "a pointer is not 16-byte aligned")
        device = args[kernel.ptr_slots[0][1]].get_device() if kernel.ptr_slots else torch.cuda.current_device()
        if device not in kernel._checked:
            why = kernel.first_use(device)
            if why is not None:
                return self._run_fallback(args, why)
        kernel.launcher(device, grid, kernel.block, values, smem)
