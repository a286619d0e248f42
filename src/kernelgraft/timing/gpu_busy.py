"""Keep the GPU busy while the host enqueues a timed launch.

Per-launch CUDA-event timing (start event, launch, end event) measures the kernel only if the
launch reaches the stream before the GPU reaches the start event. When the host takes longer to
enqueue a launch than the GPU has queued work (a few-microsecond kernel behind a launch path of
20-40 us on a slow host), the GPU idles between the events and the host's time is counted as the
kernel's. On the H200 this made the same kernel time 6 us in one measurement and 42 us in the
next (benchmarks/results/2026-11-30-h200-3/). ``cover(host_us, slack_us)`` enqueues a spin
kernel (``torch.cuda._sleep``) that keeps the stream busy for twice the launch's host cost plus
slack; put it before the start event and the timed launch is already queued when the GPU gets
there.
"""

from __future__ import annotations

import torch

__all__ = ["cover"]

_CALIBRATE_CYCLES = 200_000
_cycles_per_us: dict[int, float] = {}


def _rate(device: int) -> float:
    """Spin-kernel cycles per microsecond on ``device``, measured once."""
    rate = _cycles_per_us.get(device)
    if rate is None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)  # load the kernel before timing it
        start.record()
        torch.cuda._sleep(_CALIBRATE_CYCLES)
        end.record()
        end.synchronize()
        us = start.elapsed_time(end) * 1e3
        rate = _cycles_per_us[device] = _CALIBRATE_CYCLES / us if us > 0 else 2000.0
    return rate


def cover(host_us: float, slack_us: float) -> None:
    """Keep the current stream busy for twice ``host_us`` (the host's cost of enqueuing the timed
    call) plus ``slack_us`` (what else the host enqueues before it); a no-op without the spin
    kernel."""
    sleep = getattr(torch.cuda, "_sleep", None)
    us = 2.0 * host_us + slack_us
    if sleep is None or us <= 0:
        return
    sleep(max(1, int(us * _rate(torch.cuda.current_device()))))
