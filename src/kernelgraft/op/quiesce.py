"""Holding one torch operator still: no thread inside a call of it, new calls waiting at a gate.

Needed before the one registry change that is unsafe while a call is in flight: deregistering an
operator's schema (a re-declaration with another schema, ``_slot``). Torch's dispatcher reads the
schema with no lock and with the GIL released, from the moment a call leaves Python until the
op's Python kernel takes the GIL back; a schema freed or changed in between is a use-after-free,
or a stack pushed by one schema and read by another (SIGSEGV).

How a call in flight is seen: Python enters the dispatcher for an operator through the torch.ops
objects of its name (``OpOverloadPacket``, ``OpOverload``: methods in torch/_ops.py), and the frame
of that method stays on the calling thread's stack, with ``self`` bound to the object, for as long
as the call runs, its C++ part included. Frames of a few more functions (``codes``) count when
their ``self`` is one of ``owners``: the op's forwarding kernels (reached from C++ callers too),
and the op object whose calls bind their arguments to the old schema. ``Held.drain`` reads every
thread's stack (``sys._current_frames``) until none is inside a call: a grace period in the sense
of RCU, with the stacks as the readers' quiescent states.

How new calls wait: those torch.ops objects reach C++ through their ``_op`` and ``_op_dk``
attributes. While the operator changes, a ``_Gate`` stands there: it waits for the change to end,
then calls the builtin it stands for (whose hash and attributes it shows: torch hashes an overload
by its ``_op``). A call made from inside a call in flight (a nested call, or the op object's own)
passes, as that outer call must finish before the change can start.

Not seen: code that holds the operator's C++ handle itself (TorchScript, AOTInductor's C++
runner); such code must not call the op while its schema changes.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..errors import RegistrationError

__all__ = ["Held", "qualname_of", "DRAIN_SECONDS"]

_OPS_FILE = torch._ops.__file__
_ATTRS = ("_op", "_op_dk")  # where a torch.ops object keeps the builtin that enters C++
DRAIN_SECONDS = 30.0  # how long a schema change waits for calls in flight (a first call may tune)


def qualname_of(obj: Any) -> str | None:
    """The operator name (``ns::name``) a torch.ops packet or overload object calls, else None."""
    if isinstance(obj, torch._ops.OpOverloadPacket):
        return obj._qualified_op_name
    if isinstance(obj, torch._ops.OpOverload):
        return obj._schema.name
    return None


class _Gate:
    """Stands in for a torch.ops object's builtin while its operator changes."""

    __slots__ = ("raw", "held")

    def __init__(self, raw: Callable[..., Any], held: "Held") -> None:
        self.raw = raw
        self.held = held

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        held = self.held
        if not held.opened.is_set() and not held.passes(sys._getframe(1)):
            held.opened.wait()
        return self.raw(*args, **kwargs)

    def __hash__(self) -> int:
        return hash(self.raw)

    def __eq__(self, other: object) -> bool:
        return self.raw == (other.raw if isinstance(other, _Gate) else other)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


_GATE_CODE = _Gate.__call__.__code__


class Held:
    """The gates of one change of the operator ``qualname`` (see the module docstring)."""

    def __init__(self, qualname: str, objects: Iterable[Any], codes: frozenset, owners: Iterable[Any]) -> None:
        self.qualname = qualname
        self.codes = codes
        self.owners = tuple(owners)
        self.opened = threading.Event()
        self.thread = threading.get_ident()  # the one making the change: it never waits
        self.gated: list[tuple[Any, str, Any]] = []
        for obj in objects:
            for attr in _ATTRS:
                self._gate(obj, attr)

    def _gate(self, obj: Any, attr: str) -> None:
        raw = vars(obj).get(attr)
        if raw is not None and not isinstance(raw, _Gate):
            setattr(obj, attr, _Gate(raw, self))
            self.gated.append((obj, attr, raw))

    def regate(self) -> None:
        """Gate again what torch refreshed meanwhile (a packet gets a new builtin when a schema is
        defined under its name)."""
        for obj, attr, _ in list(self.gated):
            self._gate(obj, attr)

    def open(self) -> None:
        """Put the newest builtin of each gated attribute back and let the waiting calls go."""
        newest = {(id(obj), attr): (obj, raw) for obj, attr, raw in self.gated}
        for (_, attr), (obj, raw) in newest.items():
            if isinstance(vars(obj).get(attr), _Gate):
                setattr(obj, attr, raw)
        self.opened.set()

    # ------------------------------------------------------------------ calls in flight
    def _ours(self, frame: Any) -> bool:
        code = frame.f_code
        if code in self.codes:
            obj = frame.f_locals.get("self")
            return any(obj is owner for owner in self.owners)
        return code.co_filename == _OPS_FILE and qualname_of(frame.f_locals.get("self")) == self.qualname

    def wait(self) -> None:
        """Wait until the change is done (at once in the thread making it)."""
        if threading.get_ident() != self.thread:
            self.opened.wait()

    def passes(self, frame: Any) -> bool:
        """Whether a call that reached a gate from ``frame`` goes on: it is made by the thread
        making the change, or from inside a call in flight (found past the torch.ops machinery of
        the call itself)."""
        if threading.get_ident() == self.thread:
            return True
        while frame is not None and frame.f_code.co_filename == _OPS_FILE:
            frame = frame.f_back
        while frame is not None:
            if frame.f_code is not _GATE_CODE and self._ours(frame):
                return True
            frame = frame.f_back
        return False

    def in_flight(self) -> list[int]:
        """Ids of the threads inside a call of the operator (the calling thread too). A call
        waiting at a closed gate has not entered C++ and does not count."""
        busy = []
        for tid, frame in sys._current_frames().items():
            parked = False  # the frames of the call that reached a closed gate do not count
            while frame is not None:
                if frame.f_code is _GATE_CODE:
                    gate = frame.f_locals.get("self")
                    parked = isinstance(gate, _Gate) and not gate.held.opened.is_set()
                elif parked and frame.f_code.co_filename == _OPS_FILE:
                    pass
                elif self._ours(frame):
                    busy.append(tid)
                    break
                else:
                    parked = False
                frame = frame.f_back
        return busy

    def drain(self, timeout: float | None = None) -> None:
        """Return once no thread is inside a call (RegistrationError after ``timeout``)."""
        timeout = DRAIN_SECONDS if timeout is None else timeout
        deadline = time.monotonic() + timeout
        delay = 0.0002
        while True:
            busy = self.in_flight()
            if not busy:
                return
            if threading.get_ident() in busy:
                raise RegistrationError(
                    f"{self.qualname}: its schema cannot change from inside a call of it (this "
                    "thread is running the op); declare the new version outside the op's own code")
            if time.monotonic() >= deadline:
                raise RegistrationError(
                    f"{self.qualname}: its schema cannot change while {len(busy)} other thread(s) "
                    f"are inside a call of it, and they did not return within {timeout:g} s (the "
                    "old op keeps serving); declare it again once those calls return")
            time.sleep(delay)
            delay = min(delay * 2, 0.01)
