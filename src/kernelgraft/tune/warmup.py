"""``kg.tune.warm()``: pay a process's one-time tuning costs at start-up, not at its first new shape.

The first key a process tunes pays, once, for more than that key: the first fake tensors import
``torch._dynamo`` (the output shapes are worked out on them), the first Triton launch hashes
Triton's sources for its cache key, ``torch:compile``'s gate imports
Inductor and starts its compile workers, kernelgraft's compile workers import torch and Triton,
and the native replay may still have to be built. Last, on a GPU, it waits until the compile
workers' zygote can fork them (``compile_zygote``). On the H200 those imports were most of the
seconds until a first decision landed (a fresh process, cold disk: 8-9 s of 13.8 s for rmsnorm).
A server calls ``warm()`` while it loads its model; the tuning of its first new shape then pays
only that shape's own compiles and timings.

Each step is optional and none raises: a step that cannot run here (no CUDA device, no compiler)
is recorded with the reason, and the process tunes as it would have. ``wait=False`` runs the steps
on a daemon thread and returns at once (``Warm.wait()`` joins it).

>>> import kernelgraft as kg
>>> done = kg.tune.warm("cpu", compile_reference=False, native=False)
>>> "fake_tensors" in done.seconds
True
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode  # its class: what imports is its first use

from .. import native as _native
from ..op import registry as _registry
from ..backends.triton.ahead import warm_launches, warm_process
from . import compile_jobs as _compile_jobs, compile_pool as _compile_pool

__all__ = ["Warm", "warm"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Warm:
    """What ``warm`` did: seconds by step, and why a step was skipped or failed."""

    device: str
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    _thread: threading.Thread | None = dataclasses.field(default=None, repr=False)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the steps (``wait=False``); False if ``timeout`` passed first."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def __str__(self) -> str:
        done = ", ".join(f"{k} {v:.2f} s" for k, v in self.seconds.items()) or "nothing"
        left = "; ".join(f"{k}: {v}" for k, v in self.skipped.items())
        return f"kernelgraft warm on {self.device}: {done}" + (f"; skipped {left}" if left else "")


def warm(device: Any = None, *, compile_reference: bool = True, native: bool = True,
         wait: bool = True) -> Warm:
    """Start the compile workers, import what the first tuning imports (fake tensors, Triton's cache
    key), compile one tiny function
    with ``torch.compile`` on ``device`` (Inductor's imports and its workers; ``compile_reference``)
    and build or load the native replay (``native``). ``device``: default the current CUDA device,
    else the CPU (where only the imports apply). Returns a ``Warm`` (done, unless ``wait=False``)."""
    where = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    record = Warm(str(where))
    if compile_reference:  # Triton's cache, where Inductor's first real compile would move it
        _compile_jobs.settle_inductor_triton_cache(where)
    steps: list[tuple[str, Callable[[], str | None]]] = [
        ("compile_workers", lambda: _workers(where)),
        ("fake_tensors", _fake_tensors),
        ("triton", lambda: _triton(where)),
    ]
    if compile_reference:
        steps.append(("torch_compile", lambda: _torch_compile(where)))
    if native:
        steps.append(("native_replay", _native_replay))
    if where.type == "cuda":
        steps.append(("compile_zygote", _zygote))  # last: it imported meanwhile

    def run() -> None:
        for name, step in steps:
            started = time.perf_counter()
            try:
                why = step()
            except Exception as exc:  # warming is an optimisation: the tuning does it later anyway
                why = f"{type(exc).__name__}: {exc}"
                log.info("kernelgraft warm: %s failed: %s", name, why)
            if why is None:
                record.seconds[name] = round(time.perf_counter() - started, 3)
            else:
                record.skipped[name] = why
        log.info("%s", record)

    if wait:
        run()
    else:
        record._thread = threading.Thread(target=run, name="kernelgraft-warm", daemon=True)
        record._thread.start()
    return record


def _workers(where: torch.device) -> str | None:
    if where.type != "cuda":
        return "compile workers serve CUDA devices only"
    if _compile_pool.workers() < 2:
        return "fewer than two compile workers here (KERNELGRAFT_COMPILE_WORKERS, or cores)"
    # returns at once: the workers start in the background, with the modules of the ops defined so far
    _compile_pool.prestart(_registry.all_ops())
    return None


def _zygote() -> str | None:
    """Wait for the compile workers' zygote to be ready to fork them (its imports, the op modules
    it was named included), so the first key's jobs do not wait for it."""
    if _compile_pool.workers() < 2:
        return "fewer than two compile workers here"
    if not _compile_pool.zygote_ready():
        return "the compile workers start on their own (no zygote can fork them here; the log says why)"
    return None


def _fake_tensors() -> str | None:
    """The first ``FakeTensorMode`` of a process imports ``torch._dynamo`` (seconds)."""
    with FakeTensorMode():
        torch.empty(2, 3).sum(0)
    return None


def _triton(where: torch.device) -> str | None:
    """What a process's first Triton launch computes once: Triton's cache key (a hash of its sources
    and library, about half a second) and the modules its JIT imports on first use; on a GPU also
    the backend's and default options' hashes (``ptxas --version``, libdevice)."""
    if where.type == "cuda":
        warm_launches(where)  # warm_process, then the backend's hashes
    else:
        warm_process()
    return None


def _torch_compile(where: torch.device) -> str | None:
    """Inductor's imports, its compile workers and Triton's, on a throwaway function."""
    if where.type != "cuda":
        return "torch.compile is warmed on CUDA devices only (Inductor for the CPU compiles C++)"

    def tiny(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2.0 + 1.0

    x = torch.randn(16, device=where)
    torch.compile(tiny, dynamic=False)(x)
    torch.cuda.synchronize(where)
    return None


def _native_replay() -> str | None:
    if not _native.enabled():
        return _native.reason()
    module = _native.load()  # built in a child process when missing (10-15 s, once per install)
    return None if module is not None else _native.reason()
