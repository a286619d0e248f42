"""Pruning: measure fewer candidates. Opt-in, and it fails open to the full list.

- ``kg.op(..., prune=fn)``: ``fn(candidates, *inputs) -> candidates`` returns the ones worth
  timing, best guess first.
- ``matmul_heuristics(mnk)``: a ready hook for GEMM-like ops that ranks candidates by how close
  their tiles are to what NVIDIA's nvMatmulHeuristics suggests (``pip install
  nvidia-matmul-heuristics``); without the package it keeps the list as it is.
- ``KERNELGRAFT_PRUNE=1`` (or ``kg.tune(prune=True)``) turns pruning on;
  ``KERNELGRAFT_MAX_CANDIDATES=N`` (or ``kg.tune(max_candidates=N)``) keeps the first N after it.

A hook that raises, returns nothing usable, or returns candidates that were not offered is
ignored with one warning: tuning then measures every candidate.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import TuneWarning

__all__ = ["apply_prune", "matmul_heuristics"]

log = logging.getLogger(__name__)
_warned: set[str] = set()


def _warn_once(tag: str, message: str) -> None:
    if tag not in _warned:
        _warned.add(tag)
        warnings.warn(message, TuneWarning, stacklevel=5)


def apply_prune(op: Any, candidates: Sequence[Any], args: Sequence[Any], *, enabled: bool,
                max_candidates: int | None) -> list[Any]:
    """The candidates to measure. Never empty when ``candidates`` is not."""
    full = list(candidates)
    kept = full
    hook = getattr(op, "prune", None)
    if enabled and hook is not None and len(full) > 1:
        try:
            result = hook(list(full), *args)
            result = list(result) if result is not None else []
        except Exception as exc:
            _warn_once(f"raise:{op.name}", f"{op.name}: the prune hook raised {type(exc).__name__}: "
                       f"{exc}; measuring all {len(full)} candidates")
            result = full
        offered = set(full)
        if not result:
            _warn_once(f"empty:{op.name}", f"{op.name}: the prune hook kept no candidate; measuring "
                       f"all {len(full)}")
            result = full
        elif any(c not in offered for c in result):
            _warn_once(f"alien:{op.name}", f"{op.name}: the prune hook returned candidates it was not "
                       "given; return a subset of its first argument. Measuring all candidates")
            result = full
        kept = list(dict.fromkeys(result))
    if max_candidates is not None and max_candidates > 0:
        kept = kept[:max_candidates]
    if len(kept) < len(full):
        log.info("%s: pruned %d candidates to %d", op.name, len(full), len(kept))
    return kept


@functools.cache
def _nvmmh() -> Any:
    try:
        import nvMatmulHeuristics as m  # type: ignore[import-not-found]
    except Exception:  # not installed, or its shared library does not load
        return None
    return m


_GPUS = {"H200": "H200_SXM", "H100 PCIe": "H100_PCIE", "H100 NVL": "H100_NVL", "H100": "H100_SXM",
         "H20": "H20_SXM", "A100": "A100_SXM_80GB", "L40S": "L40S", "L4": "L4", "B200": "B200",
         "GB200": "GB200_NVL"}
_PRECISION = {torch.bfloat16: "B", torch.float16: "H", torch.float32: "S", torch.float64: "D"}


@functools.cache
def _interface(device_name: str) -> Any:
    m = _nvmmh()
    gpu = None
    for marker, name in _GPUS.items():
        if marker in device_name:
            gpu = getattr(m.NvMatmulHeuristicsNvidiaGpu, name, None)
            break
    return m.NvMatmulHeuristicsInterfaceEx(backend=m.NvMatmulHeuristicsTarget.TRITON, gpu=gpu)


def _suggestions(m_: int, n_: int, k_: int, dtype: torch.dtype, device_name: str, count: int):
    m = _nvmmh()
    iface = _interface(device_name)
    problem = iface.makeNvMatmulHeuristicsProblem(
        int(m_), int(n_), int(k_), m.NvMatmulHeuristicsMatmulLayout.NN_ROW_MAJOR
    )
    letter = _PRECISION.get(dtype, "H")
    found = iface.get(problem, count, precision=f"{letter}S{letter}")
    return [(r["kernel"].cta_tile_m, r["kernel"].cta_tile_n, r["kernel"].cta_tile_k, r["kernel"].stages)
            for r in found]


def _distance(tile: tuple, want: tuple) -> float:
    d = 0.0
    for have, target, weight in zip(tile, want, (1.0, 1.0, 0.5)):
        if have and target:
            d += weight * abs(math.log2(have / target))
    if tile[3] and want[3]:
        d += 0.1 * abs(tile[3] - want[3])
    return d


def matmul_heuristics(
    mnk: Callable[..., tuple[int, int, int]],
    *,
    keys: tuple[str, str, str, str] = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages"),
    keep: int = 4,
    fallback: Callable[..., list] | None = None,
) -> Callable[..., list]:
    """A prune hook for GEMM-like ops from nvMatmulHeuristics' suggestions.

    ``mnk(*inputs) -> (M, N, K)``; ``keys`` name the config entries holding the tile sizes and
    pipeline stages. Keeps the ``keep`` candidates closest to the suggestions, and every candidate
    whose config lacks those entries (another kernel's, which the suggestions cannot judge: read
    as absent they would match every suggestion). Without the package (or if it fails)
    ``fallback`` prunes instead, or the list stays as it is.
    """

    def prune(candidates: list, *inputs: Any) -> list:
        if _nvmmh() is None:
            return fallback(candidates, *inputs) if fallback else candidates
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        device = tensors[0].device if tensors else torch.device("cpu")
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "H200"
        try:
            m_, n_, k_ = mnk(*inputs)
            wants = _suggestions(m_, n_, k_, tensors[0].dtype if tensors else torch.float16, name, 16)
        except Exception as exc:
            log.info("nvMatmulHeuristics failed (%s); not pruning with it", exc)
            return fallback(candidates, *inputs) if fallback else candidates
        if not wants:
            return fallback(candidates, *inputs) if fallback else candidates

        def score(c: Any) -> float:
            cfg = c.config.as_dict()
            tile = tuple(cfg.get(k) for k in keys)
            return min(rank * 0.25 + _distance(tile, want) for rank, want in enumerate(wants))

        def tiled(c: Any) -> bool:
            return all(k in c.config.as_dict() for k in keys[:3])

        return sorted(filter(tiled, candidates), key=score)[:keep] + [c for c in candidates if not tiled(c)]

    prune.__name__ = "matmul_heuristics"
    return prune
