"""Functions on ``kernelgraft.tune``: tune given inputs now, look decisions up, clear, count."""

from __future__ import annotations

from typing import Any

from ..op import select as _select
from ..op.candidates import evaluate
from ..op.compete import key_backends, offered
from .key import build_key
from ..op.modes import settings, tune
from .tuner import TUNER, Decision

__all__ = ["pretune", "decision", "clear", "stats"]


def _prepare(op: Any, args: tuple, kwargs: dict):
    args = op.signature.bind(op.name, args, dict(kwargs))
    tensors = op.dispatcher.check(args)
    supported = offered(op, evaluate(op.impls, tensors, args), tensors, settings())
    key = build_key(op, args, key_backends(supported))
    return args, supported, key


def pretune(op: Any, *args: Any, force: bool = False, **kwargs: Any) -> Decision | None:
    """Tune ``op`` for these inputs now (mode 'on' for the call) and return the decision.

    Uses the cache unless ``force``. None when no candidate supports the inputs.
    """
    args, supported, key = _prepare(op, args, kwargs)
    if not supported:
        return None
    if force:
        TUNER.memory.pop(key.digest, None)
    with tune("on"):
        s = settings()
        if force:
            result = TUNER.measure(op, supported, args, key, s) if TUNER._may_measure(op, args, s) else None
            if result is not None and result.source != "default":
                TUNER.memory[key.digest] = result
        else:
            result = TUNER.memory.get(key.digest) or TUNER._resolve(op, supported, args, key, s)
    _select.bump_epoch()
    return result


def decision(op: Any, *args: Any, **kwargs: Any) -> Decision | None:
    """The decision in memory or on disk for these inputs, without measuring; None if none."""
    args, supported, key = _prepare(op, args, kwargs)
    found = TUNER.memory.get(key.digest)
    if found is not None:
        return found
    entry = TUNER.disk.get(key.digest, dict(key.env))
    if not entry:
        return None
    try:
        return Decision.from_json(entry, "disk")
    except ValueError:  # an entry an op call would not use either: none
        return None


def clear(*, disk: bool = False) -> None:
    """Forget decisions in memory (and on disk with ``disk=True``); ops choose again."""
    TUNER.clear(disk=disk)


def stats() -> dict[str, int]:
    """Counters: tuned keys, memory/disk hits, rank leader/follower decisions."""
    return dict(TUNER.stats)
