"""The device a runner runs on: every backend's runner goes through ``on_tensor_device``, which
makes the tensors' CUDA device current for the launch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["on_tensor_device", "tensor_device", "current_device", "use_device", "Runner"]

Runner = Callable[..., Any]
_Tensor = torch.Tensor
_get_device = getattr(torch._C, "_cuda_getDevice", None)


def current_device() -> int:
    """torch's current CUDA device (one ``cudaGetDevice``; CUDA is initialised once a CUDA tensor
    exists, which is the only time this is asked)."""
    return _get_device() if _get_device is not None else torch.cuda.current_device()


use_device = torch.cuda.device  # a context manager making a device current; tests swap it


def tensor_device(args: tuple) -> int:
    """The CUDA device index of the first tensor among ``args`` (tensors or lists of tensors),
    -1 when it is on the CPU or there is none."""
    for a in args:
        if isinstance(a, _Tensor):
            return a.get_device()
        if type(a) in (list, tuple) and a and isinstance(a[0], _Tensor):
            return a[0].get_device()
    return -1


def on_tensor_device(runner: Runner, *, cpu_lock: Any = None) -> Runner:
    """``runner`` made to run with its tensors' device current, whatever device the caller has
    current: ``torch.cuda.device(d)`` is entered only when the first tensor's device ``d`` differs
    from the current one, so the common case costs one ``get_device`` and one ``cudaGetDevice``.

    Why here: every backend launches on the *current* device and stream (Triton compiles, loads and
    launches on ``torch.cuda.current_device()``; ``ct.launch`` and CuTe DSL's compiled host code
    launch in the current context; user launch functions may ask for the current stream), while an
    op's plan is keyed on the tensors' device. The runner ``bind()`` returns is the one object that
    every path calling a kernel goes through (plans, tuner trials and its gate, ``check``,
    ``bench``, ``op.run(impl=..., config=...)``, bundle fallbacks), so switching here covers them
    all once, and the stream each launch picks is then the current stream of the tensors' device.
    An op's arguments are all on one device (the op checks it before planning), so the first
    tensor speaks for all of them. Inside a switched call, the native replay's recorder sees the
    launch on the tensors' device and stream, as the replay will make it.

    ``cpu_lock``: a lock held around calls whose tensors are on the CPU (Triton's interpreter,
    which is not thread-safe).
    """

    def run(*args: Any) -> Any:
        index = tensor_device(args)
        if index < 0:
            if cpu_lock is not None:
                with cpu_lock:
                    return runner(*args)
            return runner(*args)
        if index != current_device():
            with use_device(index):
                return runner(*args)
        return runner(*args)

    run.runner = runner  # type: ignore[attr-defined]
    run.__wrapped__ = runner  # type: ignore[attr-defined]
    replayable = getattr(runner, "replayable", None)
    if replayable is not None:
        run.replayable = replayable  # type: ignore[attr-defined]
    return run

