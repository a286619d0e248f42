"""Choosing among supported candidates. The autotuner installs itself through ``set_chooser``;
without it the first supported candidate runs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ._candidates import Candidate

__all__ = ["choose", "set_chooser", "epoch", "bump_epoch", "provisional", "take_provisional", "Pending"]

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


class Pending:
    """A decision being made elsewhere (the tuner's background worker). A provisional choice made
    until it lands serves every call, each reading one attribute, ``landed``; the call after
    ``land()`` plans again and asks the chooser, which then has the decision. One object per
    tuning job, shared by every plan and thread that waits on that key."""

    __slots__ = ("landed",)

    def __init__(self) -> None:
        self.landed = False

    def land(self) -> None:
        """The decision is in place (or the job was dropped): the waiting plans make way."""
        self.landed = True


def choose(op: Any, candidates: Sequence[Candidate], args: tuple) -> Candidate:
    """The chooser's pick; read ``take_provisional()`` right after (nested ops choose in between)."""
    _local.until = None
    return _chooser(op, candidates, args)


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
