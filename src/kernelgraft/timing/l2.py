"""Evicting the GPU's L2 cache between timed calls, so each call reads its inputs from HBM as in a
real model step: write a buffer much larger than the cache (H200: 50 MB of L2)."""

from __future__ import annotations

import torch

__all__ = ["FLUSH_BYTES", "flush_buffer", "flush"]

FLUSH_BYTES = 256 << 20
_buffers: dict[torch.device, torch.Tensor] = {}


def flush_buffer(device: torch.device) -> torch.Tensor:
    """The device's flush buffer (allocated once); ``.zero_()`` it to evict the L2."""
    if device.index is None:  # "cuda" and "cuda:0" are one device and share one 256 MB buffer
        device = torch.device(device.type, torch.cuda.current_device())
    buf = _buffers.get(device)
    if buf is None:
        buf = _buffers[device] = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    return buf


def flush(device: torch.device) -> None:
    """Enqueue an L2 eviction on the current stream."""
    flush_buffer(device).zero_()
