"""One candidate compiled ahead of its first launch, in any process, into the cache its launch reads.

A ``Job`` names an op (the module that defines it, its name and fingerprint), one candidate (impl
index and config), the arguments its runner is called with (described, not copied: dtype, shape,
strides and the data pointer's offset from a 16-byte boundary) and the GPU target. ``run_job``
rebuilds the arguments as meta tensors with exactly those properties and asks the candidate's
backend to compile what its launch would, launching nothing (``compile_ahead``, see
``kernelgraft.backends.base.CompilesAhead``): Triton into its own disk cache, CUDA C++ into
kernelgraft's NVRTC cache, cuTile as a cubin handed back to the parent (``adopt``).

A backend without ``compile_ahead`` (CuTe DSL keeps compiled functions in the process's memory
only, so ``cute.compile`` in another process warms nothing here) compiles in the gate, as do
PyTorch's candidates: neither is a job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .. import backends
from ..cache import root as _root
from ..backends.triton.ahead import compile_only_triton  # here too: tools and tests import it from here

log = logging.getLogger(__name__)

__all__ = ["Target", "Source", "Job", "Outcome", "compiles_ahead", "warm_launches", "describe", "stand_in", "run_job",
           "compile_only_triton", "cache_env", "settle_inductor_triton_cache", "start_inductor_workers",
           "import_source"]


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
    caches: tuple = ()  # cache_env() of the process that made the job: where its compiles must land

    @property
    def label(self) -> str:
        return f"{self.op}[{self.impl}:{','.join(f'{k}={v}' for k, v in self.config)}]"


@dataclasses.dataclass
class Outcome:
    ok: bool
    seconds: float = 0.0
    detail: str = ""
    artifacts: tuple = ()  # what the parent's backend takes in (``adopt``): cuTile cubins
    backend: str = ""


def cache_env() -> tuple[tuple[str, str], ...]:
    """Where this process's compiles are cached, as the environment variables that say so: Triton's
    cache directory as Triton resolves it now (``knobs.cache.dir``: set in code, or by
    ``TRITON_CACHE_DIR``, which Inductor sets at its first compile when it is unset) and
    kernelgraft's cache root (NVRTC's cache). A job carries them and the worker compiles under
    them, so a worker started before either changed still fills the caches this process's launch
    reads."""
    found = _root.root()
    env = [(_root.ENV, str(found) if found is not None else "off")]
    try:
        from triton import knobs

        env.append(("TRITON_CACHE_DIR", str(knobs.cache.dir)))
    except Exception:  # no Triton, or one without knobs: it reads TRITON_CACHE_DIR, passed as is
        if os.environ.get("TRITON_CACHE_DIR"):
            env.append(("TRITON_CACHE_DIR", os.environ["TRITON_CACHE_DIR"]))
    return tuple(env)


def settle_inductor_triton_cache(device: torch.device) -> None:
    """Where ``TRITON_CACHE_DIR`` is unset, set it now as Inductor sets it at its first compile in a
    process (its own cache's ``triton/<device>`` folder), for a tuning whose ``torch:compile``
    candidate is about to compile: otherwise Inductor moves Triton's cache while the workers
    compile the kernels into the one it left, and each kernel's gate compiles it again (16 kernels,
    3 s of a softmax key on the H200). An Inductor cache hit sets nothing, so a warmed process is no
    exception. Nothing where Triton's cache is set already, in code or by the variable."""
    if device.type != "cuda" or os.environ.get("TRITON_CACHE_DIR"):
        return
    try:
        from triton import knobs

        if "dir" in vars(knobs.cache):  # set in code (Triton's own override): it wins over the variable
            return
    except ImportError:  # a Triton without knobs: the variable decides, as for Inductor
        pass
    try:
        from torch._inductor.runtime.cache_dir_utils import triton_cache_dir
    except ImportError:  # an Inductor without it: its first compile settles the directory itself
        return
    os.environ["TRITON_CACHE_DIR"] = triton_cache_dir(device.index if device.index is not None else 0)


def start_inductor_workers(device: torch.device) -> None:
    """Start Inductor's compile workers now, as its first compile in a process would
    (``torch._inductor.async_compile.maybe_warm_pool``: a sidecar process that imports torch, then
    its pool of workers), for a tuning whose ``torch:compile`` candidate is about to compile on
    ``device``. Started at the compile, they are seldom ready before Inductor compiles the
    reference's Triton kernels, which it then compiles one by one in this process, on the GIL;
    started seconds sooner, beside the tuning's own preparation, they compile them. Inductor's own
    switches hold (``TORCH_WARM_POOL=0``, one compile thread); nothing off CUDA (Inductor wakes its
    workers for GPU inputs only), nothing twice."""
    if device.type != "cuda":
        return
    try:
        from torch._inductor.async_compile import maybe_warm_pool
    except ImportError:  # an Inductor without it: its first compile starts them
        return
    try:
        maybe_warm_pool()
    except Exception as exc:  # noqa: BLE001 - an optimisation: Inductor starts them, or compiles here
        log.debug("Inductor's compile workers not started ahead: %s: %s", type(exc).__name__, exc)


@contextlib.contextmanager
def _under(env: tuple) -> Iterator[None]:
    """The block runs with ``env`` (a job's ``caches``) in ``os.environ``; restored after."""
    saved = {name: os.environ.get(name) for name, _ in env}
    try:
        for name, value in env:
            os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


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
def import_source(source: Source) -> Any:
    """The module ``source`` names, imported here if it is not yet (a file by its path)."""
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

    import_source(job.source)
    op = _registry.lookup(job.op)
    if op is None:
        raise LookupError(f"importing {job.source.module} does not define op {job.op} (not a module-level op)")
    if op.fingerprint != job.fingerprint:
        raise LookupError(f"{job.op} imported from {job.source.module} is not the op being tuned "
                          "(its definition differs)")
    return op


# ---------------------------------------------------------------- per backend
def warm_launches(candidates: Sequence[Any], device: torch.device) -> None:
    """Each backend of ``candidates`` that compiles ahead computes now what its first launch in
    this process computes once (``CompilesAhead.warm_launches``): the tuner calls it while the
    workers compile. Best effort: a failure here is the first gate's to report."""
    for name in dict.fromkeys(c.impl.backend for c in candidates):
        try:
            warm = getattr(backends.get(name), "warm_launches", None)
            if callable(warm):
                warm(device)
        except Exception as exc:  # noqa: BLE001 - an optimisation; the gate compiles and says why
            log.debug("%s launches not warmed: %s: %s", name, type(exc).__name__, exc)


def compiles_ahead(backend: str) -> bool:
    """Whether the backend of that name compiles in a worker (it has ``compile_ahead``)."""
    try:
        found = backends.get(backend)
    except KeyError:
        return False
    return callable(getattr(found, "compile_ahead", None))


def run_job(job: Job) -> Outcome:
    """Compile one job in this process; never raises (a failure is an ``Outcome``: the candidate
    then compiles in its gate run, as without the pool)."""
    from ..spec import Config

    started = time.perf_counter()
    try:
        op = _find_op(job)
        spec = op.impls[job.impl]
        backend = spec.backend
        compile_ = getattr(backends.get(backend), "compile_ahead", None)
        if compile_ is None:
            raise TypeError(f"{backend} candidates are not compiled ahead")
        config = Config.of(dict(job.config), where=op.name)
        with _under(job.caches):
            artifacts = tuple(compile_(spec, config, [stand_in(d) for d in job.args], job.target))
    except BaseException as exc:  # a compiler that fails here fails again, reported, in the gate
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return Outcome(False, time.perf_counter() - started, f"{type(exc).__name__}: {str(exc)[:500]}")
    return Outcome(True, time.perf_counter() - started, artifacts=artifacts, backend=backend)
