"""Giving a kernel plan a native replay: after the extension is ready, one call of the plan is
recorded, and later calls with the same signature try the replay first (the dispatcher's
``install_replay``; see record.py)."""

from __future__ import annotations

import logging
from typing import Any

from .. import backends
from . import record as _record, enabled, get

__all__ = ["attach"]

log = logging.getLogger(__name__)
_OUT_KINDS = {"none": 0, "tensor": 1}


def attach(dispatcher: Any, plan: Any, candidate: Any, runner: Any, plain: tuple,
           scope: Any, epoch: int, guard: Any = None) -> Any:
    """``plan`` wrapped to record its second call (the first may compile) into a native Replay.
    The runner says whether its launches can be recorded (``replayable``), else its backend does.
    ``scope`` and ``epoch`` are those the plan was made under: the replay serves only calls in that
    tuning scope, and is not installed once plans have moved on to a later epoch. ``guard``: the
    plan's overlap guard (already inside ``plan``); the replay runs the same check in C++, and a
    guard over list elements, which a replay cannot express, keeps the plan on the Python path."""
    replayable = getattr(runner, "replayable", None)
    if replayable is None:
        replayable = getattr(backends.get(candidate.impl.backend), "replayable", False)
    disjoint = () if guard is None else getattr(guard, "native", None)
    if not enabled() or not replayable or disjoint is None:
        return plan
    op = dispatcher.op
    out_kind = _OUT_KINDS.get(op.signature.returns, 2)
    state: dict[str, Any] = {"calls": 0, "replay": None, "done": False}

    def replaying(args: tuple) -> Any:
        replay = state["replay"]
        if replay is not None:
            # This signature is the op's active one again (its next call skips the Python key),
            # and this call replays too unless the replay hands it back (a mode, autograd...).
            dispatcher.install_replay(replay, scope, epoch)
            out = replay(args)
            return plan(args) if out is NotImplemented else out
        if state["done"]:
            return plan(args)
        state["calls"] += 1
        native = get() if state["calls"] >= 2 else None
        if native is None:
            return plan(args)
        state["done"] = True
        with _record.recording() as recorder:
            out = plan(args)
        outs = () if out_kind == 0 else (out,) if out_kind == 1 else tuple(out)
        replay = _record.replay_for(native, args, outs, out_kind, recorder, plain, disjoint)
        if isinstance(replay, str):
            state["why"] = replay
            log.debug("%s: %s stays on the Python path: %s", op.name, candidate.label, replay)
        else:
            state["replay"] = replay
            dispatcher.install_replay(replay, scope, epoch)
            log.debug("%s: %s replays natively", op.name, candidate.label)
        return out

    replaying.candidate = candidate  # type: ignore[attr-defined]
    replaying.native = state  # type: ignore[attr-defined]
    return replaying
