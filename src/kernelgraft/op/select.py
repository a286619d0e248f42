"""Choosing among supported candidates. The autotuner installs itself through ``set_chooser``;
without it the first supported candidate runs."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .candidates import Candidate

__all__ = ["choose", "set_chooser", "forget", "epoch", "bump_epoch", "provisional", "take_provisional",
           "pinned", "Pending"]

Chooser = Callable[[Any, Sequence[Candidate], tuple], Candidate]


def _first(op: Any, candidates: Sequence[Candidate], args: tuple) -> Candidate:
    return candidates[0]


_chooser: Chooser = _first
# Ops cache one plan per input signature; bumping the epoch (tuning mode changed, cache cleared,
# bundle loaded) makes every op rebuild its plans on the next call.
_epoch = [0]


# A chooser that could not decide yet (the tuner, when its device is busy, a tuning failed for a
# reason that may pass, or the key is being tuned off the caller's path) marks its choice
# provisional: the op serves it without keeping the plan for good, so a later call asks again.
# Per thread: choices are made on the calling thread.
_local = threading.local()


# (op, candidate or None) pinned for this thread or task; see ``pinned``.
_pin: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("kernelgraft_pin", default=None)


class Pending:
    """A decision being made elsewhere (the tuner's background worker). A provisional choice made
    until it lands serves every call, each reading one attribute, ``landed``; the call after
    ``land()`` plans again and asks the chooser, which then has the decision. One object per
    tuning job, shared by every plan and thread that waits on that key."""

    __slots__ = ("landed", "served")

    def __init__(self) -> None:
        self.landed = False
        self.served = False  # a call waiting on it has returned (the job's heavy start waits for one)

    def land(self) -> None:
        """The decision is in place (or the job was dropped): the waiting plans make way."""
        self.landed = True


def choose(op: Any, candidates: Sequence[Candidate], args: tuple) -> Candidate | None:
    """The chooser's pick (None: the reference); read ``take_provisional()`` right after
    (nested ops choose in between)."""
    _local.until = None
    pin = _pin.get()
    if pin is None or pin[0] is not op:
        return _chooser(op, candidates, args)
    want = pin[1]
    chosen = None if want is None else next(
        (c for c in candidates if c.index == want.index and c.config == want.config), None)
    if want is not None and chosen is None:  # it does not take this call: what the op would run
        chosen = _chooser(op, candidates, args)
    _local.until = 0.0  # a pinned plan serves this call only: the op keeps none
    return chosen


@contextlib.contextmanager
def pinned(op: Any, candidate: Candidate | None) -> Iterator[None]:
    """Inside the block, on this thread or task, a call of ``op`` that plans runs ``candidate``
    (the reference when None) wherever that candidate supports the call. For checks that reach
    the op only through ``torch.ops`` (``torch.library.opcheck``, tracing) and must see each
    candidate. Plans made under the pin are not kept; a plan kept from before the block still
    serves its signature, so call ``op.dispatcher.reset()`` inside the block first."""
    token = _pin.set((op, candidate))
    try:
        yield
    finally:
        _pin.reset(token)


def provisional(until: "float | Pending" = 0.0) -> None:
    """Called by a chooser: its choice serves calls until ``time.monotonic()`` reaches ``until``
    (0: this call only), or, given a ``Pending``, until it lands; then the op plans again and
    asks the chooser again."""
    _local.until = until


def take_provisional() -> "float | Pending | None":
    """The deadline of the choice just made on this thread (None: a lasting choice); resets it."""
    until = getattr(_local, "until", None)
    _local.until = None
    return until


def set_chooser(chooser: Chooser | None) -> None:
    global _chooser
    _chooser = chooser or _first
    bump_epoch()


def epoch() -> int:
    return _epoch[0]


def bump_epoch() -> None:
    _epoch[0] += 1


def forget(fingerprint: str) -> None:
    """An op left its name (replaced or unregistered): the chooser drops what it remembers of it
    (the tuner's in-memory decisions; its disk cache keeps them for when the same op comes back)."""
    drop = getattr(_chooser, "forget", None)
    if drop is not None:
        drop(fingerprint)
