"""Provisional plans: a choice the tuner could not make for good yet, kept in the op's plan table
until it expires (a deadline) or its decision lands (a ``_select.Pending``), after which the call
that finds it so plans again. Neither gets a native replay: its calls must reach the check."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .plan import Plan
from .select import Pending

__all__ = ["expiring", "pending"]


def expiring(plan: Plan, table: dict[tuple, Plan], key: tuple, until: float,
             replan: Callable[[tuple, tuple], Any]) -> Plan:
    """``plan`` kept in ``table`` until ``time.monotonic()`` reaches ``until``; the call that finds
    it expired takes it out and plans again (asking the tuner again)."""

    def until_deadline(args: tuple) -> Any:
        if time.monotonic() < until:
            return plan(args)
        if table.get(key) is until_deadline:
            table.pop(key, None)
        return replan(args, key)

    until_deadline.candidate = getattr(plan, "candidate", None)  # type: ignore[attr-defined]
    until_deadline.plan = plan  # type: ignore[attr-defined]  (what plans() shows)
    return until_deadline


def pending(plan: Plan, table: dict[tuple, Plan], key: tuple, landing: Pending,
            replan: Callable[[tuple, tuple], Any]) -> Plan:
    """``plan`` kept in ``table`` until ``landing`` lands (a decision made off the caller's path):
    each call reads one flag (and, until the landing, sets ``served`` when it returns: the job
    waits for the call that queued it, ``tune.offpath``); the first call after the landing takes
    it out and plans again,
    which finds the decision in place. The landing is atomic for the op: the decision is stored
    before the flag is set, so no call can replan and miss it."""

    def waiting(args: tuple) -> Any:
        if not landing.landed:
            try:
                return plan(args)
            finally:
                landing.served = True
        if table.get(key) is waiting:
            table.pop(key, None)
        return replan(args, key)

    waiting.candidate = getattr(plan, "candidate", None)  # type: ignore[attr-defined]
    waiting.plan = plan  # type: ignore[attr-defined]  (what plans() shows)
    return waiting
