"""Trials: run each candidate once through the correctness gate, then time it.

The caller's tensors are never written: mutating ops get private copies, restored from a pristine
copy before every launch. Outputs are preallocated (poisoned for the gate run), so timing sees
the kernel, not the allocator.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._gate import classify_error, compare, make_oracle, poisoned
from ._timing import Trial, cuda_timer

__all__ = ["Result", "run_trials"]

log = logging.getLogger(__name__)
_MAX_COLD_SETS = 16


@dataclasses.dataclass
class Result:
    """One candidate's outcome: ``ms`` when it passed, else ``kind`` and ``reason``."""

    candidate: Any
    ms: float | None = None
    kind: str | None = None  # compile | launch | wrong | budget | crash | timing
    reason: str | None = None


def _clone_arg(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return a.detach().clone()
    if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
        return type(a)(t.detach().clone() for t in a)
    return a


def _copy_into(dst: Any, src: Any) -> None:
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    else:
        for d, s in zip(dst, src):
            d.copy_(s)


def _nbytes(args: Sequence[Any]) -> int:
    total = 0
    for a in args:
        if isinstance(a, torch.Tensor):
            total += a.numel() * a.element_size()
        elif isinstance(a, (list, tuple)):
            total += sum(t.numel() * t.element_size() for t in a if isinstance(t, torch.Tensor))
    return total


def _cold_sets(args: Sequence[Any], device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20) or (50 << 20)
    size = max(1, _nbytes(args))
    free = torch.cuda.mem_get_info(device)[0]
    want = math.ceil(2 * l2 / size) + 1
    fit = max(1, int(free * 0.25 // size))
    return max(1, min(_MAX_COLD_SETS, want, fit))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_trials(
    op: Any,
    candidates: Sequence[Any],
    args: Sequence[Any],
    settings: Any,
    on_progress: Callable[[int, Any], None] | None = None,
) -> list[Result]:
    """Gate and time every candidate; a failure excludes that candidate, never the run."""
    args = tuple(args)
    tensors = [a for a in args if isinstance(a, torch.Tensor)] + [
        t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)
    ]
    device = tensors[0].device if tensors else torch.device("cpu")
    timer = settings.timer or cuda_timer
    mutated = [i for i, p in enumerate(op.signature.params) if p.mutated]
    oracle = make_oracle(op, args)
    out_specs = op._output_specs(args) if op.signature.returns != "none" else []
    n_sets = _cold_sets(args, device) if settings.cold_l2 else 1
    pristine = {i: _clone_arg(args[i]) for i in mutated}
    sets = []
    for k in range(n_sets):
        own = [(_clone_arg(a) if (k > 0 or i in mutated) else a) for i, a in enumerate(args)]
        outs = [torch.empty(s, dtype=d, device=dev) for s, d, dev in out_specs]
        sets.append((own, outs))

    def restore(k: int) -> None:
        for i in mutated:
            _copy_into(sets[k][0][i], pristine[i])

    results: list[Result] = []
    started = time.perf_counter()
    for n, cand in enumerate(candidates):
        if on_progress is not None:
            on_progress(n, cand)
        spent = time.perf_counter() - started
        if n > 0 and spent > settings.budget_s:
            results.append(Result(cand, kind="budget", reason=(
                f"not measured: the tuning budget of {settings.budget_s:g}s per key was spent")))
            continue
        results.append(_one(op, cand, sets, restore if mutated else None, oracle, mutated, device,
                            timer, settings, (settings.budget_s - spent) / max(1, len(candidates) - n)))
    if on_progress is not None:
        on_progress(len(candidates), None)
    return results


def _one(op, cand, sets, restore, oracle, mutated, device, timer, settings, share_s) -> Result:
    try:
        runner = op._runner(cand)
    except Exception as exc:
        return Result(cand, kind=classify_error(exc.__cause__ or exc), reason=f"{type(exc).__name__}: {exc}")
    own, outs = sets[0]
    if restore is not None:
        restore(0)
    gate_outs = [poisoned(o.shape, o.dtype, o.device) for o in outs]
    try:
        runner(*own, *gate_outs)
        _sync(device)
    except Exception as exc:
        kind = classify_error(exc)
        return Result(cand, kind=kind, reason=f"{kind} error: {type(exc).__name__}: {str(exc)[:500]}")
    tol = getattr(op, "tolerances", None)
    for j, (got, want) in enumerate(zip(gate_outs, oracle.outputs)):
        why = compare(got, want, what=f"output {j}", overrides=tol)
        if why:
            return Result(cand, kind="wrong", reason=f"wrong result: {why}")
    for i, want in oracle.mutated:
        why = compare(own[i], want, what=f"mutated argument {op.signature.params[i].name!r}", overrides=tol)
        if why:
            return Result(cand, kind="wrong", reason=f"wrong result: {why}")

    def run(k: int) -> None:
        a, o = sets[k]
        runner(*a, *o)

    trial = Trial(cand, run, n_sets=len(sets), restore=restore, budget_s=max(0.05, share_s))
    try:
        ms = float(timer(trial, settings))
    except Exception as exc:
        return Result(cand, kind="timing", reason=f"timing failed: {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        if restore is not None:
            for k in range(len(sets)):
                restore(k)
    if not math.isfinite(ms) or ms < 0:
        return Result(cand, kind="timing", reason=f"timing gave {ms!r}")
    return Result(cand, ms=ms)
