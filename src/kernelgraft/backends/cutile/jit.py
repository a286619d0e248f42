"""cuTile: ``launch`` returns ``(grid, kernel, args)``; kernelgraft runs it on torch's current stream.

Two ways to run a kernel, chosen once per kernel signature (dtypes, ranks, layout, constants):

1. an AOT cubin (built by ``kernelgraft aot`` or ``build_cubin`` on any machine with the cuTile
   toolchain, GPU or not), launched through ``kernelgraft.driver``;
2. JIT: ``ct.launch(stream, grid, kernel, args)`` when the toolchain works here.

The cubin wins when both exist: it needs no compiler at run time. Without either, the call fails
with a ``CompileError`` naming what is missing.

Calling convention of an exported cubin (cuTile ``cutile_python_v2``; see cuda-tile's
docs/source/compilation.rst and ``cuobjdump -elf``'s ``EIATTR_KPARAM_INFO`` of a cubin): kernel
parameters in declaration order, ``ct.Constant`` ones omitted; an n-dim array becomes ``1 + 2n``
parameters (device pointer, n shape values, n strides in elements, all of the signature's
``index_dtype``: int32, or int64 for tensors of 2**31 elements or more); a Python int is an int32,
a float a float32. An add kernel over three 1-d float32 arrays has 9 parameters at offsets
0 (ptr), 8, 12 (i32 shape, stride), 16, 24, 28, 32, 40, 44: 48 bytes. The stride is passed even
when the signature fixes it (``stride_constant``). The launch uses block (1, 1, 1), as ``ct.launch``
does: the CTA size is the kernel's own (``EIATTR_REQNTID`` in the cubin), no dynamic shared memory.

Signatures kernelgraft builds assume: arrays do not alias one another (kernelgraft allocates
outputs fresh), strides are non-negative, the last stride is 1 when it is (layout is part of the
key), and a base address divisible by 16 when it is (also part of the key).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import io
import logging
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ...cache import root as _cache
from ...errors import CompileError, LaunchError, describe
from ...spec import Config, ImplSpec
from ..device import on_tensor_device, tensor_device

__all__ = [
    "CuTileBackend", "CubinArtifact", "toolchain_reason", "build_cubin", "add_cubin",
    "load_cubin_dir", "kernel_key", "describe_args", "signature_of", "export_cubin",
]

log = logging.getLogger(__name__)
_Tensor = torch.Tensor
_INT32_LIMIT = 2**31
_ENV_DIRS = "KERNELGRAFT_CUTILE_CUBINS"  # os.pathsep-separated directories of AOT cubins
_LOCK = threading.Lock()
# (kernel source hash, mangled symbol, arch) -> cubin image
_CUBINS: dict[tuple[str, str, str], bytes] = {}
_LOADED_DIRS: set[str] = set()


@dataclasses.dataclass(frozen=True)
class CubinArtifact:
    """One exported kernel: ``kernel_hash/symbol.arch.cubin`` inside a cubin directory."""

    kernel_hash: str
    symbol: str
    arch: str
    image: bytes

    @property
    def relpath(self) -> str:
        return f"{self.kernel_hash}/{self.symbol}.{self.arch}.cubin"

    def write(self, root: str | os.PathLike) -> Path:
        path = Path(root) / self.relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(self.image)
        os.replace(tmp, path)
        return path


# ---------------------------------------------------------------- toolchain and availability
@functools.cache
def _ct():
    import cuda.tile as ct

    _place_cache()
    return ct


def _place_cache() -> None:
    """cuTile keeps its own disk cache of compiled cubins, in ~/.cache/cutile-python unless
    ``CUDA_TILE_CACHE_DIR`` says otherwise. Compiles kernelgraft starts keep theirs under
    kernelgraft's cache root (``<root>/cutile``), and write nothing when ``KERNELGRAFT_CACHE_DIR=off``;
    a place the user chose with ``CUDA_TILE_CACHE_DIR`` stays theirs."""
    if "CUDA_TILE_CACHE_DIR" in os.environ:
        return
    try:
        from cuda.tile._cext import default_tile_context  # what cuda.tile's own _context.py configures
    except ImportError:
        return
    base = _cache.root()
    default_tile_context.config.cache_dir = None if base is None else str(base / "cutile")


@functools.cache
def toolchain_reason() -> str | None:
    """None when cuTile can compile here (tileiras + ptxas + libnvvm), else what is missing."""
    if importlib.util.find_spec("cuda.tile") is None:
        return "cuda-tile is not installed (pip install 'kernelgraft[cutile]')"
    bin_dir, how = None, ""
    try:
        import nvidia.cu13 as cu13

        root = Path(cu13.__path__[0])
        if (root / "bin" / "tileiras").exists():
            bin_dir, how = root / "bin", "the nvidia-cuda-tileiras pip package"
    except ImportError:
        root = None
    if bin_dir is None:
        found = shutil.which("tileiras")
        if found is None and os.environ.get("CUDA_HOME"):
            found = shutil.which("tileiras", path=os.path.join(os.environ["CUDA_HOME"], "bin"))
        if found is None:
            return ("tileiras (the cuTile compiler) was found neither in the nvidia-cuda-tileiras pip "
                    "package nor on PATH nor in $CUDA_HOME/bin; pip install 'kernelgraft[cutile]'")
        bin_dir, how = Path(found).parent, f"PATH ({found})"
        root = bin_dir.parent
    missing = []
    if not (bin_dir / "ptxas").exists() and shutil.which("ptxas") is None:
        missing.append("ptxas (pip install nvidia-cuda-nvcc of the same CUDA version)")
    nvvm = [root / "lib", root / "nvvm" / "lib64"] if root is not None else []
    if not any(p.glob("libnvvm.so*") for p in nvvm if p.exists()):
        missing.append("libnvvm (pip install nvidia-nvvm of the same CUDA version)")
    if missing:
        return f"tileiras from {how} cannot compile without " + " and ".join(missing)
    return None


class CuTileBackend:
    name = "cutile"
    replayable = True  # AOT cubins launch through kernelgraft.driver (ct.launch is not recorded)
    distributions = ("cuda-tile",)

    @functools.cache
    def available(self) -> str | None:
        if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.tile") is None:
            return "cuTile is not installed (pip install 'kernelgraft[cutile]')"
        try:
            _ct()
        except Exception as exc:  # a broken install says why
            return f"cuda.tile failed to import: {type(exc).__name__}: {exc}"
        return None

    def device_reason(self, device: torch.device) -> str | None:
        if device.type == "cuda":
            return None
        return f"cuTile kernels run on CUDA tensors, got {device.type} tensors"

    def bind(self, spec: ImplSpec, config: Config) -> Callable[..., Any]:
        return on_tensor_device(_Runner(spec, config))

    def compile_ahead(self, spec: ImplSpec, config: Config, args: Sequence[Any], target: Any) -> tuple:
        """The cubin exported for kernelgraft's own signature of the call (the one the runner looks
        up), handed back to the launching process (``adopt``): its runner then launches it."""
        return (build_cubin(spec, config, args, target.arch),)

    def adopt(self, artifact: "CubinArtifact") -> None:
        add_cubin(artifact)


# ---------------------------------------------------------------- signatures
def _dtype_map() -> dict[torch.dtype, Any]:
    ct = _ct()
    pairs = {
        torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
        torch.float64: "float64", torch.int8: "int8", torch.int16: "int16", torch.int32: "int32",
        torch.int64: "int64", torch.uint8: "uint8", torch.bool: "bool_",
        getattr(torch, "float8_e4m3fn", None): "float8_e4m3fn",
        getattr(torch, "float8_e5m2", None): "float8_e5m2",
    }
    return {k: getattr(ct, v) for k, v in pairs.items() if k is not None and hasattr(ct, v)}


@functools.lru_cache(maxsize=None)
def _constant_params(kernel: Any) -> tuple[bool, ...]:
    """Which parameters of a ``@ct.kernel`` are ``ct.Constant`` (compile-time, not passed)."""
    annotations = kernel._annotated_function.parameter_annotations
    return tuple(bool(getattr(a, "constant", False)) for a in annotations)


@functools.lru_cache(maxsize=None)
def kernel_key(kernel: Any) -> str:
    """A stable hash of a kernel's source (and of the functions it calls), for cubin lookup."""
    from ...spec import kernel_sources

    return hashlib.sha256(kernel_sources(kernel).encode()).hexdigest()[:16]


def _arg_key(args: Sequence[Any], constants: tuple[bool, ...]) -> tuple:
    """What of the arguments changes the compiled kernel; computed on every call, so kept lean."""
    parts = []
    for i, a in enumerate(args):
        if isinstance(a, _Tensor):  # nn.Parameter too (a module weight)
            stride = a.stride()
            wide = a.numel() >= _INT32_LIMIT or (bool(stride) and max(stride) >= _INT32_LIMIT)
            parts.append((a.dtype, len(stride), bool(stride) and stride[-1] == 1,
                          not a.data_ptr() & 15, wide))
        elif constants[i]:
            parts.append((type(a), a))
        else:
            parts.append(type(a))
    return tuple(parts)


def describe_args(kernel: Any, args: Sequence[Any], where: str) -> list[tuple]:
    """What of each launch argument the kernel signature depends on: ``("const", value)``,
    ``("array", dtype, ndim, wide, unit_last_stride, aligned16)``, ``("int",)`` or ``("float",)``.
    ``kernelgraft aot`` records the same description on fake tensors (``aot/_cutile_aot.py``)."""
    constants = _constant_params(kernel)
    if len(args) != len(constants):
        raise LaunchError(
            f"{where}: the kernel takes {len(constants)} arguments, launch returned {len(args)}"
        )
    out: list[tuple] = []
    for i, (a, const) in enumerate(zip(args, constants)):
        if const:
            out.append(("const", a))
        elif isinstance(a, _Tensor):
            stride = a.stride()
            wide = a.numel() >= _INT32_LIMIT or any(s >= _INT32_LIMIT for s in stride)
            out.append(("array", a.dtype, a.dim(), wide, bool(a.dim()) and stride[-1] == 1, a.data_ptr() % 16 == 0))
        elif isinstance(a, bool):
            raise LaunchError(f"{where}: argument {i} is a bool; make it a ct.Constant parameter")
        elif isinstance(a, int):
            out.append(("int",))
        elif isinstance(a, float):
            out.append(("float",))
        else:
            raise LaunchError(
                f"{where}: argument {i} is {describe(a)}; cuTile launches take tensors, ints, floats "
                "and ct.Constant values"
            )
    return out


def _signature(kernel: Any, args: Sequence[Any], where: str):
    """The cuTile ``KernelSignature`` kernelgraft compiles ``kernel`` for, given its arguments."""
    return signature_of(kernel, describe_args(kernel, args, where), where)


def signature_of(kernel: Any, described: Sequence[tuple], where: str):
    """The ``KernelSignature`` of arguments as ``describe_args`` describes them (its mangled
    symbol is the cubin's kernel name, the same at build time and at run time)."""
    ct = _ct()
    from cuda.tile.compilation import (
        ArrayConstraint, CallingConvention, ConstantConstraint, KernelSignature, ScalarConstraint,
    )

    dtypes = _dtype_map()
    params = []
    for i, d in enumerate(described):
        if d[0] == "const":
            params.append(ConstantConstraint(d[1]))
        elif d[0] == "array":
            _, dtype, ndim, wide, unit_last, aligned = d
            if dtype not in dtypes:
                raise LaunchError(f"{where}: argument {i} has dtype {dtype}, which cuTile lacks")
            params.append(ArrayConstraint(
                dtypes[dtype], ndim,
                index_dtype=ct.int64 if wide else ct.int32,
                stride_lower_bound_incl=0,
                alias_groups=(),
                may_alias_internally=False,
                stride_constant=(None,) * (ndim - 1) + (1,) if unit_last else None,
                base_addr_divisible_by=16 if aligned else 1,
            ))
        else:
            params.append(ScalarConstraint(ct.int32 if d[0] == "int" else ct.float32))
    sig = KernelSignature(params, CallingConvention.cutile_python_v2())
    return sig.with_mangled_symbol(kernel._annotated_function.pyfunc.__name__)


def _param_kinds(sig: Any) -> tuple[list[str], list[Callable[[Any], list]]]:
    """Driver parameter kinds of a signature and, per launch argument, how to turn it into values."""
    from cuda.tile.compilation import ArrayConstraint, ConstantConstraint

    kinds: list[str] = []
    for c in sig.parameters:
        if isinstance(c, ConstantConstraint):
            continue
        if isinstance(c, ArrayConstraint):
            idx = "i64" if c.index_dtype.bitwidth == 64 else "i32"
            kinds += ["ptr"] + [idx] * (2 * c.ndim)
        else:
            kinds.append("f32" if "float" in str(c.dtype) else "i32")
    return kinds, [isinstance(c, ConstantConstraint) for c in sig.parameters]  # type: ignore[return-value]


# ---------------------------------------------------------------- AOT cubins
def build_cubin(
    spec: ImplSpec, config: Config, args: Sequence[Any], arch: str = "sm_90"
) -> CubinArtifact:
    """Export the cubin ``spec`` with ``config`` needs for ``args`` (inputs then outputs; CPU or
    meta tensors are fine: only dtypes, shapes and strides are read). No GPU needed.
    """
    where = f"kg.cutile({spec.display_name})[{config.label()}]"
    reason = toolchain_reason()
    if reason:
        raise CompileError(f"{where}: cannot build a cubin here: {reason}")
    grid, kernel, kargs = _unpack(spec.launch(*args, **config.as_dict()), where)  # type: ignore[misc]
    sig = _signature(kernel, kargs, where)
    image = export_cubin(kernel, sig, arch, where)
    return CubinArtifact(kernel_key(kernel), sig.symbol, arch, image)


def export_cubin(kernel: Any, sig: Any, arch: str, where: str) -> bytes:
    """The cubin of ``kernel`` compiled for ``sig`` and ``arch`` (tileiras; no GPU needed)."""
    from cuda.tile.compilation import export_kernel

    _place_cache()  # the cache root of this call (KERNELGRAFT_CACHE_DIR may have changed since import)
    buf = io.BytesIO()
    try:
        export_kernel(kernel, [sig], buf, gpu_code=arch, output_format="cubin")
    except Exception as exc:
        raise CompileError(f"{where}: cuTile export of {sig.symbol} for {arch} failed: {exc}") from exc
    image = buf.getvalue()
    log.info("built cuTile cubin %s for %s (%d bytes)", sig.symbol, arch, len(image))
    return image


def add_cubin(artifact: CubinArtifact) -> None:
    """Make a cubin available to cuTile candidates in this process (bundles call this)."""
    with _LOCK:
        _CUBINS[(artifact.kernel_hash, artifact.symbol, artifact.arch)] = artifact.image


def load_cubin_dir(root: str | os.PathLike) -> int:
    """Register every ``<kernel_hash>/<symbol>.<arch>.cubin`` under ``root``; returns how many."""
    root = Path(root)
    count = 0
    for path in root.glob("*/*.cubin"):
        symbol, _, arch = path.stem.rpartition(".")
        if not symbol or not arch.startswith("sm_"):
            continue
        add_cubin(CubinArtifact(path.parent.name, symbol, arch, path.read_bytes()))
        count += 1
    with _LOCK:
        _LOADED_DIRS.add(str(root))
    log.debug("loaded %d cuTile cubins from %s", count, root)
    return count


def _stored_cubin(kernel_hash: str, symbol: str, arch: str) -> bytes | None:
    for d in os.environ.get(_ENV_DIRS, "").split(os.pathsep):
        if d and d not in _LOADED_DIRS and os.path.isdir(d):
            load_cubin_dir(d)
    return _CUBINS.get((kernel_hash, symbol, arch))


# ---------------------------------------------------------------- running
def _unpack(result: Any, where: str) -> tuple[Any, Any, tuple]:
    try:
        grid, kernel, args = result
    except (TypeError, ValueError):
        raise LaunchError(
            f"{where}: a cuTile launch function must return (grid, kernel, args), got {describe(result)}"
        ) from None
    if not hasattr(kernel, "_annotated_function"):
        raise LaunchError(f"{where}: the kernel it returned is not a @ct.kernel: {describe(kernel)}")
    if isinstance(grid, int):
        grid = (grid,)
    return tuple(grid), kernel, tuple(args)


class _Runner:
    """``runner(*inputs, *outputs)`` for one (spec, config); one launch entry per signature."""

    __slots__ = ("spec", "config", "kwargs", "launch", "where", "entries")

    def __init__(self, spec: ImplSpec, config: Config) -> None:
        self.spec = spec
        self.config = config
        self.kwargs = config.as_dict()
        self.launch = spec.launch
        self.where = f"kg.cutile({spec.display_name})[{config.label()}]"
        self.entries: dict[Any, Callable[[tuple, tuple], None]] = {}

    def __call__(self, *tensors: Any) -> None:
        grid, kernel, args = self.launch(*tensors, **self.kwargs)  # type: ignore[misc]
        if type(grid) is int:
            grid = (grid,)
        # per device: the cubin is chosen by the device's arch, and GPUs of one process may differ
        key = (kernel, tensor_device(tensors), _arg_key(args, _constant_params(kernel)))
        entry = self.entries.get(key)
        if entry is None:
            entry = self._resolve(grid, kernel, args, key)
        entry(grid, args)

    def _resolve(self, grid, kernel, args, key) -> Callable[[tuple, tuple], None]:
        _unpack((grid, kernel, args), self.where)
        device = next((a.device for a in args if isinstance(a, _Tensor)), None)
        if device is None or device.type != "cuda":
            raise LaunchError(f"{self.where}: cuTile kernels need CUDA tensor arguments")
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        arch = f"sm_{major}{minor}"
        sig = _signature(kernel, args, self.where)
        image = _stored_cubin(kernel_key(kernel), sig.symbol, arch)
        if image is not None:
            entry = _driver_entry(image, sig)
            log.debug("%s: %s runs from an AOT cubin for %s", self.where, sig.symbol, arch)
        else:
            reason = toolchain_reason()
            if reason:
                raise CompileError(
                    f"{self.where}: no AOT cubin for {sig.symbol} on {arch} (looked in memory and "
                    f"${_ENV_DIRS}={os.environ.get(_ENV_DIRS, '')!r}) and cuTile cannot compile here: "
                    f"{reason}. Build cubins where the toolchain works (kernelgraft aot, or "
                    "kernelgraft.backends.cutile.jit.build_cubin) and load them (kg.load_bundle or "
                    f"${_ENV_DIRS})."
                )
            entry = _jit_entry(kernel)
            log.debug("%s: %s runs through ct.launch (JIT)", self.where, sig.symbol)
        self.entries[key] = entry
        return entry


def _jit_entry(kernel: Any) -> Callable[[tuple, tuple], None]:
    launch = _ct().launch
    current = torch.cuda.current_stream

    def run(grid: tuple, args: tuple) -> None:
        launch(current(), grid, kernel, args)

    return run


def _driver_entry(image: bytes, sig: Any) -> Callable[[tuple, tuple], None]:
    from ... import driver

    kinds, constant = _param_kinds(sig)
    fn = driver.load_module(image, "cubin", name=sig.symbol).function(sig.symbol)
    launcher = fn.launcher(kinds)
    constant = tuple(constant)
    first = next((i for i, c in enumerate(sig.parameters) if hasattr(c, "ndim")), None)
    block = (1, 1, 1)

    def run(grid: tuple, args: tuple) -> None:
        values: list = []
        for a, const in zip(args, constant):
            if const:
                continue
            if isinstance(a, _Tensor):  # nn.Parameter too
                values.append(a.data_ptr())
                values += a.shape
                values += a.stride()
            else:
                values.append(a)
        dev = args[first].get_device() if first is not None else torch.cuda.current_device()
        launcher(dev, grid, block, values)

    return run
