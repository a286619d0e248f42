"""Shared by the softmax exploration scripts: check a variant against float32 torch.softmax, then
time it with ``triton.testing.do_bench`` (an L2 flush before every call)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def check_and_time(results: dict, name: str, fn: Callable[[], object], x: torch.Tensor, out: torch.Tensor,
                   check: bool = True, rep: int = 300) -> None:
    """Run ``fn`` (which writes softmax(x) into ``out``) on poisoned ``out``; when ``check``, keep
    the max error and time only if it is <= 1e-2. A variant that fails is reported, not fatal.
    Diagnostics that are wrong on purpose pass ``check=False``."""
    from triton.testing import do_bench

    out.fill_(float("nan"))
    try:
        fn()
        torch.cuda.synchronize()
    except Exception as exc:
        results[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(name, results[name], flush=True)
        return
    entry: dict = {}
    if check:
        entry["maxerr"] = (out.float() - torch.softmax(x.float(), -1)).abs().max().item()
    if not check or entry["maxerr"] <= 1e-2:
        ms = do_bench(fn, warmup=50, rep=rep)
        entry.update(us=ms * 1e3, gbps=2 * x.numel() * x.element_size() / ms / 1e6)
    results[name] = entry
    print(name, entry, flush=True)
