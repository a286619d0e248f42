"""The runner of a bundled candidate: ``runner(*inputs, *outputs)`` picks the first kernel whose
dtypes, ranks and guards fit the call (once per distinct shape), evaluates grid and scalar
arguments from the recorded expressions, and launches the cubin through ``kernelgraft.driver``
on torch's current stream. Calls no kernel covers go to ``fallback`` (the JIT runner, when the
backend is importable) or raise ``UnsupportedError``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .._errors import BundleError, UnsupportedError
from .. import driver
from ._expr import compile_exprs
from ._manifest import read_binary

__all__ = ["Kernel", "BundledRunner"]

log = logging.getLogger(__name__)
_Tensor = torch.Tensor


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, str(name), None)
    if not isinstance(value, torch.dtype):
        raise BundleError(f"bundle names dtype {name!r}, which torch does not have")
    return value


class Kernel:
    """One binary of a candidate with the conditions under which it runs and its launch rule."""

    def __init__(self, root: Path, names: Sequence[str], n_inputs: int, entry: dict) -> None:
        self.entry = entry
        self.name = str(entry["kernel"])
        index = {n: i for i, n in enumerate(names)}
        self.dtypes = [(index[n], _dtype(d)) for n, d in entry["dtypes"].items()]
        self.ranks = [(index[n], int(r)) for n, r in entry["ranks"].items()]
        inputs = list(names[:n_inputs])
        self._guard = compile_exprs(inputs, [" and ".join(entry["guards"]) or "True"])
        params = entry["params"]
        exprs = [*entry["grid"], str(entry["shared_mem"])] + [p["expr"] for p in params if "expr" in p]
        self._values = compile_exprs(inputs, exprs)
        self.kinds = [str(p["kind"]) for p in params]
        self.ptr_slots = [(i, index[p["source"]]) for i, p in enumerate(params) if "source" in p]
        self.scalar_slots = [i for i, p in enumerate(params) if "expr" in p]
        needs = set(entry.get("aligned", ()))
        self.aligned = bool(needs) and {p["source"] for p in params if "source" in p} <= needs
        self.block = tuple(int(b) for b in entry["block"])
        image = read_binary(root, entry["images"]["cubin"])
        self.function = driver.load_module(image, "cubin", name=self.name).function(self.name)
        self.launcher = self.function.launcher(self.kinds)
        self._checked: set[int] = set()

    def fits(self, args: Sequence[Any], n_inputs: int) -> bool:
        for i, dt in self.dtypes:
            a = args[i]
            if not isinstance(a, _Tensor) or a.dtype != dt or not a.is_contiguous():
                return False
        for i, r in self.ranks:
            if args[i].dim() != r:
                return False
        try:
            return bool(self._guard(*args[:n_inputs])[0])
        except Exception:  # a guard that cannot be evaluated does not hold
            return False

    def prepare(self, args: Sequence[Any], n_inputs: int) -> tuple:
        values = self._values(*args[:n_inputs])
        grid, smem = tuple(int(v) for v in values[:3]), int(values[3])
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
        key = tuple((a.shape, a.dtype, a.is_contiguous()) if isinstance(a, _Tensor) else a for a in args)
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
        if device not in kernel._checked and driver.available() is None:
            kernel.function.check_params(device, kernel.kinds)
            kernel._checked.add(device)
        kernel.launcher(device, grid, kernel.block, values, smem)
