"""Ranks agree: with torch.distributed initialized, every rank uses the same decision per key.

Why no collective: a rank asks for a decision only when it meets a key it has no plan for, and
ranks do not meet keys in lockstep (one has a disk-cache hit, one has a different batch shape,
one warmed up earlier). A broadcast or all-reduce there would hang as soon as one rank does not
reach it. Agreement goes through the process group's key-value store instead, which needs no
partner: the first rank to claim a key (an atomic ``store.add``) decides it (its cache hit, or it
measures) and publishes the decision; every other rank waits for that value and adopts it. A
leader never waits while leading, so there is no cycle, and nothing is sent on a rank's hit path
once it has the key in memory. Published decisions live as long as the process group.

``gather`` is for callers that are collective by contract (tuning ahead: every rank calls
``pretune`` with the same calls): each rank publishes a value and waits for everyone's.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

from ..errors import TuneWarning

__all__ = ["active", "agree", "rank", "world", "gather"]

log = logging.getLogger(__name__)
_PREFIX = "kernelgraft/tune/v1"
_warned: set[str] = set()


def active() -> bool:
    """True when torch.distributed is initialized with more than one rank."""
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    except Exception:
        return False


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if active() else 0


def world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if active() else 1


def _store() -> Any:
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception as exc:
        if "store" not in _warned:
            _warned.add("store")
            warnings.warn(f"kernelgraft: torch.distributed has no default store ({exc}); ranks tune "
                          "independently and may choose differently", TuneWarning, stacklevel=4)
        return None


def _timeout_s() -> float:
    try:
        return float(os.environ.get("KERNELGRAFT_TUNE_RANK_TIMEOUT", "") or 1800.0)
    except ValueError:
        return 1800.0


def _get(store: Any, key: str) -> dict[str, Any] | None:
    if not store.check([key]):
        return None
    return json.loads(bytes(store.get(key)).decode())


def agree(digest: str, namespace: str, decide: Callable[[], dict[str, Any]],
          peek: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    """The decision every rank uses for ``digest``, and where it came from ('leader'/'follower').

    ``decide()`` runs on exactly one rank (the first to ask) and returns a JSON-able dict.
    ``peek`` names other namespaces whose published decision is taken before claiming (a tuned
    decision is better than a 'cached'-mode default).
    """
    store = _store()
    if store is None:
        return decide(), "local"
    for ns in (*peek, namespace):
        found = _get(store, f"{_PREFIX}/{ns}/{digest}/decision")
        if found is not None:
            return found, "follower"
    base = f"{_PREFIX}/{namespace}/{digest}"
    if store.add(f"{base}/claim", 1) == 1:
        try:
            value = decide()
        except BaseException as exc:
            store.set(f"{base}/decision", json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
            raise
        store.set(f"{base}/decision", json.dumps(value))
        return value, "leader"
    deadline = time.monotonic() + _timeout_s()
    delay = 0.002
    while True:
        found = _get(store, f"{base}/decision")
        if found is not None:
            return found, "follower"
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"kernelgraft: waited {_timeout_s():.0f}s for another rank to tune key {digest[:12]}; "
                "set KERNELGRAFT_TUNE_RANK_TIMEOUT to wait longer"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def gather(tag: str, value: Any, timeout_s: float | None = None) -> list[Any]:
    """Every rank's JSON-able ``value`` for ``tag``, in rank order; a collective (every rank calls
    it with the same ``tag``, once), through the store as ``agree`` is: it needs no backend that can
    move Python objects, and the values stay readable for as long as the process group lives."""
    from datetime import timedelta

    store = _store()
    if store is None:
        raise RuntimeError("torch.distributed has no default store to gather through")
    base = f"{_PREFIX}/gather/{tag}"
    store.set(f"{base}/{rank()}", json.dumps(value))
    names = [f"{base}/{r}" for r in range(world())]
    store.wait(names, timedelta(seconds=timeout_s if timeout_s is not None else _timeout_s()))
    return [json.loads(bytes(store.get(name)).decode()) for name in names]
