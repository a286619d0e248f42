"""Candidates: every (impl, config) of an op, and why each can or cannot run given inputs.

Everything is judged against the device of the op's tensors, not torch's current device: the
capability check reads that device's compute capability (and names the device in its reason), and
``supports`` predicates run with that device current, so one that asks
``torch.cuda.get_device_capability()`` gets the tensors' GPU in a process driving several.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .. import backends
from ..backends import device as backend_device
from ..errors import KernelgraftWarning
from ..spec import Config, ImplSpec

__all__ = ["Candidate", "LAYOUT", "evaluate", "capability"]

LAYOUT = "layout"  # the reason category that turns into an InputError instead of a fallback
# Fingerprints of impls an AOT bundle serves: available even where their backend cannot compile.
BUNDLED: set[str] = set()


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One way to run an op: an impl with one of its configs, and whether it accepts the inputs."""

    index: int  # position of the impl in the op's impls
    impl: ImplSpec
    config: Config
    reason: str | None = None  # None: supported
    category: str | None = None

    @property
    def supported(self) -> bool:
        return self.reason is None

    @property
    def label(self) -> str:
        if self.impl.backend == "torch":  # PyTorch competing (see _compete): no config to show
            return f"torch:{self.impl.display_name}"
        return f"{self.impl.backend}:{self.impl.display_name}[{self.config.label()}]"

    def __str__(self) -> str:
        return self.label if self.supported else f"{self.label} (unsupported: {self.reason})"


@functools.cache
def capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability of a CUDA device; None for devices that have none."""
    if device.type != "cuda":
        return None
    return capability(device.index if device.index is not None else torch.cuda.current_device())


def _device_of(tensors: Sequence[tuple[str, torch.Tensor]]) -> torch.device:
    return tensors[0][1].device if tensors else torch.device("cpu")


def _on(device: torch.device) -> contextlib.AbstractContextManager:
    """``device`` current inside the block when it is a CUDA device other than the current one."""
    if device.type == "cuda" and device.index is not None:
        if device.index != backend_device.current_device():
            return backend_device.use_device(device.index)
    return contextlib.nullcontext()


def evaluate(
    impls: Sequence[ImplSpec],
    tensors: Sequence[tuple[str, torch.Tensor]],
    args: Sequence[Any],
) -> list[Candidate]:
    """Every candidate with the first reason it cannot run, checked from cheap to expensive."""
    device = _device_of(tensors)
    out = []
    with _on(device):
        for index, impl in enumerate(impls):
            reason, category = _impl_reason(impl, device, tensors)
            for config in impl.configs:
                r, c = reason, category
                if r is None and impl.supports is not None:
                    r, c = _predicate(impl, config, args), "predicate"
                out.append(Candidate(index, impl, config, r, c if r else None))
    return out


def _impl_reason(impl: ImplSpec, device: torch.device, tensors) -> tuple[str | None, str | None]:
    try:
        backend = backends.get(impl.backend)
    except KeyError as exc:  # a spec of a backend nothing registered (a plugin not installed here)
        return str(exc.args[0]), "backend"
    reason = backend.available()
    if reason and impl.fingerprint not in BUNDLED:
        return reason, "backend"
    reason = backend.device_reason(device)
    if reason:
        return reason, "device"
    have = device_capability(device) if impl.min_capability is not None else None
    if have is not None and impl.min_capability is not None:
        if have < impl.min_capability:
            need = "sm_{}{}".format(*impl.min_capability)
            return f"needs {need} or newer, {device} is sm_{have[0]}{have[1]}", "capability"
    if impl.contiguous:
        names = None if impl.contiguous is True else set(impl.contiguous)
        for name, t in tensors:
            if (names is None or name.split("[")[0] in names) and not t.is_contiguous():
                return (
                    f"needs {name} contiguous, got strides {tuple(t.stride())} for shape "
                    f"{tuple(t.shape)}",
                    LAYOUT,
                )
    return None, None


_RAISED: set[tuple[str, str]] = set()  # (impl fingerprint, exception type) warned about


def _predicate(impl: ImplSpec, config: Config, args: Sequence[Any]) -> str | None:
    try:
        verdict = impl.supports(*args, **config.as_dict())  # type: ignore[misc]
    except Exception as exc:  # a predicate that raises rejects, with its message as the reason
        text = (str(exc).splitlines() or [""])[0][:300]
        reason = f"supports() raised {type(exc).__name__}: {text}"
        # once per impl and exception type: a bug in a predicate retires its kernel without a
        # word otherwise (the GEMM's WMMA kernel read a config key it is not given, on CUDA only)
        key = (impl.fingerprint, type(exc).__name__)
        if key not in _RAISED:
            warnings.warn(f"kg.{impl.backend}({impl.display_name}): its supports() predicate raised "
                          f"{type(exc).__name__}: {text} (config {config.as_dict()}); the candidates it "
                          "raises for are skipped. A predicate returns True, or a string that says why "
                          "not", KernelgraftWarning, stacklevel=2)
            _RAISED.add(key)  # after the warning: under -W error it raises, and warns again next time
        return reason
    if verdict is True:
        return None
    if isinstance(verdict, str):
        return verdict or "supports() returned an empty reason"
    if verdict:
        return None
    return "supports() returned False"


def evaluate_one(
    index: int,
    impl: ImplSpec,
    config: Config,
    tensors: Sequence[tuple[str, torch.Tensor]],
    args: Sequence[Any],
) -> Candidate:
    """One candidate, possibly with a config outside the impl's list (``op.run(config=...)``)."""
    device = _device_of(tensors)
    with _on(device):
        reason, category = _impl_reason(impl, device, tensors)
        if reason is None and impl.supports is not None:
            reason, category = _predicate(impl, config, args), "predicate"
    return Candidate(index, impl, config, reason, category if reason else None)
