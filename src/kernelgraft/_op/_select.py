"""Choosing among supported candidates. The autotuner installs itself through ``set_chooser``;
without it the first supported candidate runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._candidates import Candidate

__all__ = ["choose", "set_chooser", "epoch", "bump_epoch"]

Chooser = Callable[[Any, Sequence[Candidate], tuple], Candidate]


def _first(op: Any, candidates: Sequence[Candidate], args: tuple) -> Candidate:
    return candidates[0]


_chooser: Chooser = _first
# Ops cache one plan per input signature; bumping the epoch (tuning mode changed, cache cleared,
# bundle loaded) makes every op rebuild its plans on the next call.
_epoch = [0]


def choose(op: Any, candidates: Sequence[Candidate], args: tuple) -> Candidate:
    return _chooser(op, candidates, args)


def set_chooser(chooser: Chooser | None) -> None:
    global _chooser
    _chooser = chooser or _first
    bump_epoch()


def epoch() -> int:
    return _epoch[0]


def bump_epoch() -> None:
    _epoch[0] += 1
