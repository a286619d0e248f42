"""Triton compiled ahead of its first launch (``kernelgraft.tune.compile_pool``'s workers): every
``kernel[grid](...)`` the launch function makes runs Triton's own JIT path with ``warmup=True`` (its
binder, specialisation and ``triton.compile``) against a compile-only driver that names the target
and no device. The compiled kernel lands in Triton's on-disk cache under the key a launch on a GPU
of that target computes, so that launch finds it (a cache hit: no compile). Meta tensors specialise
as the real ones do: the same dtype and the same ``data_ptr() % 16`` (their data pointer is their
storage offset in bytes).

Triton before 3.7 also builds a C launcher per compiled kernel (its constexprs are in the source)
with the host's C compiler at the kernel's first launch: 0.2-0.3 s each on the H200's host, most of
a gate that found its kernel compiled. The worker builds those too (``_build_launchers``), into the
same cache, where that launch finds them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)

__all__ = ["compile_only_triton", "compile_ahead", "warm_process", "warm_launches"]


class _CompileOnlyDriver:
    """What Triton's JIT asks of its driver while compiling without launching. The device it names
    is no real device's index, so the JIT's per-device caches made here never serve a real launch
    in the same process."""

    def __init__(self, target: Any) -> None:
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
def compile_only_triton(target: Any) -> Iterator[list[Any]]:
    """Inside: ``kernel[grid](...)`` compiles for ``target`` (``.capability``, ``.warp_size``,
    ``.arch``) through Triton's JIT and launches nothing; the block gets the list of the kernels
    compiled so far (Triton's ``CompiledKernel``). Process-wide while it lasts (compile workers,
    tools): not for a serving process."""
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction, KernelInterface

    original = KernelInterface.__getitem__
    only = _CompileOnlyDriver(target)
    used: list[Any] = []
    compiled: list[Any] = []

    def getitem(kernel: Any, grid: Any) -> Any:
        def warm(*args: Any, **kwargs: Any) -> None:
            if not isinstance(kernel, JITFunction):  # autotune/heuristics wrappers would time configs
                raise TypeError(f"{type(kernel).__name__} launches are not compiled ahead")
            used.append(kernel)
            built = kernel.run(*args, grid=grid, warmup=True, **kwargs)
            if built is not None:
                compiled.append(built)

        return warm

    previous = getattr(driver, "_active", None)
    driver.set_active(only)
    KernelInterface.__getitem__ = getitem
    try:
        yield compiled
    finally:
        KernelInterface.__getitem__ = original
        for kernel in used:  # the compiled code is on disk: a long-lived worker keeps none of it
            kernel.device_caches.pop(only.device, None)
        if previous is not None:
            driver.set_active(previous)
        else:
            driver._active = None  # lazily created again on the next real use


def compile_ahead(spec: Any, config: Any, args: Sequence[Any], target: Any) -> tuple:
    with compile_only_triton(target) as compiled:
        spec.launch(*args, **config.as_dict())
    _build_launchers(compiled)
    return ()


def _build_launchers(kernels: Sequence[Any]) -> None:
    """Build the C launcher of each compiled kernel into Triton's cache, where a Triton that
    compiles one per kernel (``make_launcher``, before 3.7) looks at the kernel's first launch.
    Nothing to do in a Triton whose launcher is generic; a launcher that fails to build here is
    built at that launch, as without this (logged)."""
    try:
        from triton.backends.nvidia import driver as nvidia
    except ImportError:
        return
    if not hasattr(nvidia, "make_launcher"):
        return
    for kernel in kernels:
        try:
            nvidia.CudaLauncher(kernel.src, kernel.metadata)
        except Exception as exc:  # noqa: BLE001 - an optimisation: the launch builds it
            log.debug("Triton launcher of %s not built ahead: %s: %s", getattr(kernel, "name", "?"),
                      type(exc).__name__, exc)


def warm_process() -> None:
    """Compute now what a process's first Triton compile computes once: Triton's own cache key (a
    hash of its sources and its library, half a second of CPU), the modules its JIT imports on
    first use and where libcuda is (``ldconfig -p``, run by the first launcher Triton builds or
    loads). A process that forks compile workers calls it, so each worker starts with them."""
    import importlib

    from triton.runtime.cache import triton_key

    triton_key()
    try:
        importlib.import_module("triton.experimental.gluon")
    except ImportError:  # a Triton without Gluon imports nothing more at its first compile
        pass
    try:
        from triton.backends.nvidia.driver import libcuda_dirs

        libcuda_dirs()  # cached for the process (and the workers it forks)
    except Exception as exc:  # noqa: BLE001 - no libcuda here (a CPU machine): the first launch says so
        log.debug("libcuda not located ahead: %s: %s", type(exc).__name__, exc)


def warm_launches(device: torch.device) -> None:
    """In the process that launches on ``device`` (CUDA initialised there), what its first Triton
    kernel computes once even where the kernel was compiled ahead and comes from the cache:
    ``warm_process``, plus the backend's hash (``ptxas --version``, a subprocess) and the default
    options' (a hash of libdevice). The first gate of a cold process paid about a second of that on
    the H200 while the compile workers were still compiling."""
    if device.type != "cuda":
        return  # the interpreter compiles nothing
    warm_process()
    try:
        from triton.compiler.compiler import make_backend
        from triton.runtime.driver import driver

        with torch.cuda.device(device):
            backend = make_backend(driver.active.get_current_target())
        backend.hash()
        backend.parse_options({}).hash()
    except Exception as exc:  # noqa: BLE001 - an optimisation: the first compile computes them
        log.debug("Triton's backend hash not computed ahead: %s: %s", type(exc).__name__, exc)
