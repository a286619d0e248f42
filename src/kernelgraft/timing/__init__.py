"""GPU timing helpers shared by the tuner and the bench: the L2 flush, the busy-GPU cover, and
``on_device``, which runs a timing on the device of the tensors being timed."""

from __future__ import annotations

import contextlib

import torch

__all__ = ["on_device"]


def on_device(device: torch.device | str | int | None) -> contextlib.AbstractContextManager:
    """A context in which ``device`` is torch's current CUDA device; a no-op for None, a CPU
    device, or the device already current. CUDA events, ``torch.cuda.synchronize()``, new
    streams, graph capture and the L2 flush buffer all follow the current device, so a timing of
    tensors on ``cuda:1`` runs inside ``on_device(cuda:1)`` even when the caller's device is 0."""
    if device is None:
        return contextlib.nullcontext()
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != "cuda" or device.index is None:
            return contextlib.nullcontext()
        index = device.index
    if index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(index)
