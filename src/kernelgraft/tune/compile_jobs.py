"""One candidate compiled ahead of its first launch, in any process, into the cache its launch reads.

A ``Job`` names an op (the module that defines it, its name and fingerprint), one candidate (impl
index and config), the arguments its runner is called with (described, not copied: dtype, shape,
strides and the data pointer's offset from a 16-byte boundary) and the GPU target. ``run_job``
rebuilds the arguments as meta tensors with exactly those properties, calls the candidate's launch
function on them, and compiles what it asks for, launching nothing:

- Triton: every ``kernel[grid](...)`` the launch function makes runs Triton's own JIT path with
  ``warmup=True`` (its binder, specialisation and ``triton.compile``) against a compile-only driver
  that names the target and no device. The compiled kernel lands in Triton's on-disk cache under
  the key a launch on a GPU of that target computes, so that launch finds it (a cache hit: no
  compile). Meta tensors specialise as the real ones do: the same dtype and the same
  ``data_ptr() % 16`` (their data pointer is their storage offset in bytes).
- CUDA C++ (``kg.cuda``): the launch function's ``kg.Launch`` gives the template; the variant is
  compiled for the target's arch through the same ``CudaRunner.compile`` the launch uses, which
  writes kernelgraft's NVRTC disk cache (a miss there only when caching is off).
- cuTile: the cubin is exported for kernelgraft's own signature of the call (the one its runner
  looks up) and handed back to the parent, which adds it: the runner then launches that cubin.

CuTe DSL keeps compiled functions in the process's memory only (``cute.compile`` in another
process warms nothing here), and PyTorch's candidates compile in the gate: neither is a job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch

__all__ = ["Target", "Source", "Job", "Outcome", "BACKENDS", "describe", "stand_in", "run_job",
           "compile_only_triton"]

# Backends whose compiled code a worker can leave where the launching process finds it.
BACKENDS = ("triton", "cuda", "cutile")


@dataclasses.dataclass(frozen=True)
class Target:
    """A CUDA compile target: compute capability as Triton writes it (90 for sm_90) and warp size."""

    capability: int
    warp_size: int = 32

    @property
    def arch(self) -> str:
        return f"sm_{self.capability}"

    @classmethod
    def of_device(cls, device: torch.device) -> "Target":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return cls(major * 10 + minor, 32)


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a worker finds an op: the module defining it, by name or (a file loaded under that
    name, such as a CLI target) by path."""

    module: str
    path: str | None = None


@dataclasses.dataclass(frozen=True)
class Job:
    source: Source
    op: str
    fingerprint: str
    impl: int
    config: tuple  # the candidate's Config items
    args: tuple  # describe() of each runner argument: inputs, then outputs
    target: Target

    @property
    def label(self) -> str:
        return f"{self.op}[{self.impl}:{','.join(f'{k}={v}' for k, v in self.config)}]"


@dataclasses.dataclass
class Outcome:
    ok: bool
    seconds: float = 0.0
    detail: str = ""
    cubins: tuple = ()  # cuTile artifacts for the parent to add


class NotDescribable(ValueError):
    """An argument whose compile-relevant properties a description cannot carry."""


def describe(value: Any) -> Any:
    """What of a runner argument a compile can depend on, picklable; raises ``NotDescribable``."""
    if isinstance(value, torch.Tensor):
        try:
            misaligned = value.data_ptr() % 16
        except RuntimeError:  # a tensor without storage (fake): aligned, as the trace path assumes
            misaligned = 0
        if misaligned % value.element_size():
            raise NotDescribable(f"a {value.dtype} tensor {misaligned} bytes past a 16-byte boundary")
        return ("T", str(value.dtype).removeprefix("torch."), tuple(value.shape), tuple(value.stride()),
                misaligned // value.element_size())
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return ("L", tuple(describe(v) for v in value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("V", value)
    if isinstance(value, torch.dtype):
        return ("D", str(value).removeprefix("torch."))
    raise NotDescribable(f"an argument of type {type(value).__name__}")


def stand_in(desc: Any) -> Any:
    """The meta tensor (or value) a description stands for."""
    kind = desc[0]
    if kind == "T":
        _, dtype, shape, stride, offset = desc
        span = 0 if any(s == 0 for s in shape) else 1 + sum((s - 1) * st for s, st in zip(shape, stride))
        base = torch.empty(span + offset, dtype=getattr(torch, dtype), device="meta")
        return base.as_strided(shape, stride, offset)
    if kind == "L":
        return [stand_in(d) for d in desc[1]]
    if kind == "D":
        return getattr(torch, desc[1])
    return desc[1]


# ---------------------------------------------------------------- finding the op
def _module(source: Source) -> Any:
    found = sys.modules.get(source.module)
    if found is not None:
        return found
    if source.path is None:
        return importlib.import_module(source.module)
    spec = importlib.util.spec_from_file_location(source.module, source.path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {source.path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[source.module] = module
    spec.loader.exec_module(module)
    return module


def _find_op(job: Job) -> Any:
    from ..op import registry as _registry

    _module(job.source)
    op = _registry.lookup(job.op)
    if op is None:
        raise LookupError(f"importing {job.source.module} does not define op {job.op} (not a module-level op)")
    if op.fingerprint != job.fingerprint:
        raise LookupError(f"{job.op} imported from {job.source.module} is not the op being tuned "
                          "(its definition differs)")
    return op


# ---------------------------------------------------------------- per backend
class _CompileOnlyDriver:
    """What Triton's JIT asks of its driver while compiling without launching. The device it names
    is no real device's index, so the JIT's per-device caches made here never serve a real launch
    in the same process."""

    def __init__(self, target: Target) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", target.capability, target.warp_size)
        self.device = f"kernelgraft-compile-only:{target.arch}"

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> Any:
        return self.device

    def get_current_stream(self, device: Any = None) -> int:
        return 0


@contextlib.contextmanager
def compile_only_triton(target: Target) -> Iterator[None]:
    """Inside: ``kernel[grid](...)`` compiles for ``target`` through Triton's JIT and launches
    nothing. Process-wide while it lasts (compile workers, tools): not for a serving process."""
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction, KernelInterface

    original = KernelInterface.__getitem__
    only = _CompileOnlyDriver(target)
    used: list[Any] = []

    def getitem(kernel: Any, grid: Any) -> Any:
        def warm(*args: Any, **kwargs: Any) -> None:
            if not isinstance(kernel, JITFunction):  # autotune/heuristics wrappers would time configs
                raise TypeError(f"{type(kernel).__name__} launches are not compiled ahead")
            used.append(kernel)
            kernel.run(*args, grid=grid, warmup=True, **kwargs)

        return warm

    previous = getattr(driver, "_active", None)
    driver.set_active(only)
    KernelInterface.__getitem__ = getitem
    try:
        yield
    finally:
        KernelInterface.__getitem__ = original
        for kernel in used:  # the compiled code is on disk: a long-lived worker keeps none of it
            kernel.device_caches.pop(only.device, None)
        if previous is not None:
            driver.set_active(previous)
        else:
            driver._active = None  # lazily created again on the next real use


def _triton(spec: Any, config: Any, args: Sequence[Any], target: Target) -> tuple:
    with compile_only_triton(target):
        spec.launch(*args, **config.as_dict())
    return ()


def _cuda(spec: Any, config: Any, args: Sequence[Any], target: Target) -> tuple:
    from ..backends.cuda.jit import CudaRunner

    launch = spec.launch(*args, **config.as_dict())
    CudaRunner(spec, config).compile(target.arch, launch.template)
    return ()


def _cutile(spec: Any, config: Any, args: Sequence[Any], target: Target) -> tuple:
    from ..backends.cutile.jit import build_cubin

    return (build_cubin(spec, config, args, target.arch),)


_COMPILERS = {"triton": _triton, "cuda": _cuda, "cutile": _cutile}


def run_job(job: Job) -> Outcome:
    """Compile one job in this process; never raises (a failure is an ``Outcome``: the candidate
    then compiles in its gate run, as without the pool)."""
    from ..spec import Config

    started = time.perf_counter()
    try:
        op = _find_op(job)
        spec = op.impls[job.impl]
        compile_ = _COMPILERS.get(spec.backend)
        if compile_ is None:
            raise TypeError(f"{spec.backend} candidates are not compiled ahead")
        config = Config.of(dict(job.config), where=op.name)
        cubins = compile_(spec, config, [stand_in(d) for d in job.args], job.target)
    except BaseException as exc:  # a compiler that fails here fails again, reported, in the gate
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return Outcome(False, time.perf_counter() - started, f"{type(exc).__name__}: {str(exc)[:500]}")
    return Outcome(True, time.perf_counter() - started, cubins=cubins)
