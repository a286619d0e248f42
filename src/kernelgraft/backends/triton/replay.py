"""Describing JIT Triton launches to the native replay's recorder.

While a call is recorded, ``JITFunction.run`` is wrapped: after Triton has launched (and compiled,
if it had to), the launch is described as a ``cuLaunchKernel`` of the compiled kernel's function
with its grid, ``num_warps * 32`` threads, its dynamic shared memory and its parameters packed
as Triton's launcher packs them:

- the non-constexpr arguments of the compiled signature, in order: tensors as device pointers,
  ints and bools at their signature width, ``fp32``/``fp64`` floats;
- then the null scratch pointers Triton appends (their number read from the kernel's PTX).

The parameter sizes are checked against the kernel's own PTX parameter list, and anything else
(global or profile scratch memory, clusters, cooperative or PDL launches, TMA descriptors, tuple
or half-precision scalar arguments) is refused. Triton's launch hook counts every Triton launch
of the recorded call, so one that did not go through ``JITFunction.run`` (a ``CompiledKernel``
launched directly) leaves the call in Python rather than being skipped by the replay.

Both the wrapper and the hook are process-wide (Triton has one of each) and installed while any
thread records; they look only at the calling thread's observer (driver/_observe.py), so another
thread's Triton launches are neither described nor counted, and cost it one thread-local read.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from ...driver.observe import active, launch_record

__all__ = ["Counts", "watch", "describe"]

_LOCK = threading.Lock()
_INSTALLED: list = [0, None, None]  # recordings in flight, the original JITFunction.run, the unhook
_INTS = {"i1": "i8", "i8": "i8", "i16": "i16", "i32": "i32", "i64": "i64",
         "u1": "u8", "u8": "u8", "u16": "u16", "u32": "u32", "u64": "u64"}
_FLOATS = {"fp32": "f32", "f32": "f32", "fp64": "f64"}


class Counts:
    """What an observer that wants Triton launches described counts (the recorder is one)."""

    triton_launches: int = 0  # counted by Triton's launch hook
    triton_described: int = 0  # described by the JITFunction.run wrapper


def params_of(kernel: Any, bound: dict[str, Any]) -> tuple[list[str], list[Any]] | str:
    """(kinds, values) of the compiled kernel's parameters for these arguments, or why not."""
    from .jit import ptx_param_sizes  # imported here: the driver imports this module
    from ...driver.params import SIZES

    md = kernel.metadata
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        return "the Triton kernel uses scratch memory, which its launcher allocates per launch"
    if getattr(md, "launch_cooperative_grid", False) or getattr(md, "launch_pdl", False):
        return "the Triton kernel needs a cooperative or PDL launch"
    cluster = tuple(getattr(md, "cluster_dims", None) or (1, 1, 1))
    if getattr(md, "num_ctas", 1) != 1 or cluster != (1, 1, 1):
        return "the Triton kernel runs in thread block clusters"
    if getattr(md, "tensordesc_meta", None):
        return "the Triton kernel takes TMA descriptors"
    signature = getattr(getattr(kernel, "src", None), "signature", None)
    if not isinstance(signature, dict):
        return "the compiled Triton kernel has no signature to describe"
    kinds: list[str] = []
    values: list[Any] = []
    for name, ty in signature.items():
        if ty == "constexpr":
            continue
        if name not in bound or not isinstance(ty, str):
            return f"Triton parameter {name!r} ({ty!r}) is not a plain argument"
        value = bound[name]
        if ty.startswith("*"):
            if not isinstance(value, torch.Tensor):
                return f"Triton pointer parameter {name!r} is a {type(value).__name__}, not a tensor"
            kinds.append("ptr")
            values.append(value.data_ptr())
        elif ty in _INTS and isinstance(value, (bool, int)):
            kinds.append(_INTS[ty])
            values.append(int(value))
        elif ty in _FLOATS and isinstance(value, (int, float)):
            kinds.append(_FLOATS[ty])
            values.append(float(value))
        else:
            return f"Triton parameter {name!r} of type {ty!r} ({type(value).__name__})"
    sizes = ptx_param_sizes(kernel.asm.get("ptx", "") if hasattr(kernel.asm, "get") else "", md.name)
    if sizes is None:
        return f"Triton kernel {md.name} is not in its PTX"
    extra = len(sizes) - len(kinds)
    if not 0 <= extra <= 2:  # the global and profile scratch pointers (fewer in older releases)
        return f"Triton kernel {md.name} has {len(sizes)} parameters for {len(kinds)} arguments"
    kinds += ["ptr"] * extra
    values += [0] * extra
    packed = [SIZES[k] for k in kinds]
    if sizes != packed:
        return f"Triton kernel {md.name}: PTX parameter sizes {sizes} differ from the packed {packed}"
    return kinds, values


def describe(jit: Any, kernel: Any, grid: Any, args: tuple, kwargs: dict) -> Any:
    """A Record of the launch Triton just made, or a str saying why it cannot be described."""
    from .jit import bind_arguments
    from ...driver import cu as _cu
    from ...driver.params import ParamBuffer

    bound = bind_arguments(jit, args, kwargs)
    described = params_of(kernel, bound)
    if isinstance(described, str):
        return described
    kinds, values = described
    raw = _cu.raw_launch()
    if raw is None:
        return "cuLaunchKernel is not reachable through ctypes here"
    if callable(grid):
        grid = grid(bound)
    grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
    if not 1 <= len(grid) <= 3 or not all(isinstance(g, int) for g in grid):
        return f"Triton grid {grid!r} is not 1 to 3 ints"
    grid = grid + (1,) * (3 - len(grid))
    md = kernel.metadata
    device = torch.cuda.current_device()
    return launch_record(
        raw, int(kernel.function), grid, (md.num_warps * getattr(md, "warp_size", 32), 1, 1),
        int(md.shared), ParamBuffer(kinds), values, torch.cuda.current_stream(device).cuda_stream,
        device, owner=kernel,
    )


def _runtime() -> Any:
    try:
        from triton import knobs  # triton >= 3.4

        return knobs.runtime
    except ImportError:
        try:
            from triton.compiler.compiler import CompiledKernel  # older releases
        except ImportError:
            return None
        return CompiledKernel


def _add_hook(runtime: Any, hook: Any):
    chain = runtime.launch_enter_hook
    if hasattr(chain, "add"):  # triton >= 3.5: a HookChain
        chain.add(hook)
        return lambda: chain.remove(hook)

    def chained(*args: Any, **kwargs: Any) -> None:  # older: one callable (or None)
        hook(*args, **kwargs)
        if chain is not None:
            chain(*args, **kwargs)

    runtime.launch_enter_hook = chained
    return lambda: setattr(runtime, "launch_enter_hook", chain)


def _count(*args: Any, **kwargs: Any) -> None:
    """Triton's launch-enter hook: count the launch for the calling thread's recorder, if any."""
    observer = active()
    if isinstance(observer, Counts):
        observer.triton_launches += 1


def _wrap_run(original: Any):
    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        kernel = original(self, *args, grid=grid, warmup=warmup, **kwargs)
        observer = active()
        if warmup or not isinstance(observer, Counts):
            return kernel
        if kernel is None:  # compiled asynchronously or skipped by a cache hook
            observer.note(None, "a Triton launch returned no compiled kernel")
        else:
            try:
                described = describe(self, kernel, grid, args, kwargs)
            except Exception as exc:  # describing must never fail the user's call
                described = f"describing the Triton launch failed: {exc}"
            if isinstance(described, str):
                observer.note(None, described)
            else:
                observer.note(described, "")
        observer.triton_described += 1
        return kernel

    return run


def watch():
    """Describe and count the Triton launches of every thread that records, from now until the
    returned undo is called (once per ``watch``)."""
    runtime = _runtime()
    if runtime is None or not hasattr(runtime, "launch_enter_hook"):  # no triton: nothing to watch
        return lambda: None
    from triton.runtime.jit import JITFunction

    with _LOCK:
        if _INSTALLED[0] == 0:
            _INSTALLED[1] = JITFunction.run
            _INSTALLED[2] = _add_hook(runtime, _count)
            JITFunction.run = _wrap_run(_INSTALLED[1])
        _INSTALLED[0] += 1

    def undo() -> None:
        with _LOCK:
            _INSTALLED[0] -= 1
            if _INSTALLED[0] == 0:
                JITFunction.run = _INSTALLED[1]
                _INSTALLED[2]()
                _INSTALLED[1] = _INSTALLED[2] = None

    return undo
