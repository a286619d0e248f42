"""Functions on ``kernelgraft.tune``: tune given inputs now, look decisions up, wait for the tunings
running off the caller's path, report, clear, count."""

from __future__ import annotations

from typing import Any

from .._op import _select
from .._op._candidates import evaluate
from .._op._compete import key_backends, offered
from ._key import build_key
from ._modes import settings, tune
from ._report import Report, build_report
from ._tuner import TIE_MARGIN, TUNER, Decision

__all__ = ["pretune", "decision", "clear", "stats", "wait", "pending", "report"]


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
    """Counters: tuned keys, memory/disk hits, rank leader/follower decisions, and the background
    queue's (``background_queued``, ``_done``, ``_dropped``, ``_skipped``)."""
    out = dict(TUNER.stats)
    for name, count in TUNER.background.stats.items():
        out[f"background_{name}"] = out.get(f"background_{name}", 0) + count
    return out


def wait(timeout: float | None = None) -> bool:
    """Wait until no tuning is queued or running off the caller's path (``timeout`` seconds at
    most; None: as long as it takes). True when none is left. The next call of each op then
    serves its decision.

    >>> import kernelgraft as kg
    >>> kg.tune.wait(timeout=1.0)
    True
    """
    return TUNER.background.wait(timeout)


def pending() -> int:
    """How many keys are being tuned off the caller's path (queued or running)."""
    return TUNER.background.pending()


def report(op: Any) -> Report:
    """What the tuner tried for each key of ``op`` it knows (decided in this process, or in the
    disk cache), the seconds it spent compiling and gating against measuring, and why each
    candidate lost or was excluded; keys still being tuned are listed as pending. ``str()`` of it
    reads as a table (``kernelgraft tune`` prints it)."""
    found: dict[str, Decision] = {}
    for digest, entry in TUNER.disk.entries().items():
        key = entry.get("key") if isinstance(entry, dict) else None
        if isinstance(key, dict) and key.get("fingerprint") == op.fingerprint:
            try:
                found[digest] = Decision.from_json(entry, "disk")
            except ValueError:  # an entry no call would use either
                continue
    for digest, d in list(TUNER.memory.items()):
        if d.key.get("fingerprint") == op.fingerprint:
            found[digest] = d
    return build_report(op.name, found.items(), TUNER.background.labels(op.fingerprint), TIE_MARGIN)
