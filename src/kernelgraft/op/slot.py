"""One C++ operator per op name, kept for the life of the process, whose kernels forward to the op
that holds the name now.

Every torch.ops object of a name (the packet, its overloads, the nodes of compiled graphs) holds a
raw handle to the operator's dispatcher entry, and torch's dispatcher reads that entry's schema and
kernels with no lock and with the GIL released while a call is on its way to the op's Python
kernel. Destroying an op's torch.library fragment frees the entry (an old handle then crashes the
process), and deregistering a kernel or a schema while another thread is calling the op frees what
that thread is reading. So nothing a call may read is freed:

- The CPU, CUDA and fake kernels of a name are registered once, in a fragment that is never
  destroyed (the anchor), and forward to the op that holds the name (``serve``: one store, read
  once per call, so every call runs the old op or the new one). The anchor also keeps the
  dispatcher entry alive, so a handle stays valid whatever happens to the schema.
- Replacing an op by one of the same schema, unregistering it (calls then raise
  ``RegistrationError``) and declaring it again change that store and nothing in the dispatcher.
- A new schema is the one change in the dispatcher: the schema (with the op's autograd kernel)
  lives in a fragment of its own, the definition, which is destroyed and made anew on the same
  entry while every call is held out (``quiet``, ``_quiesce``).

What stays for the life of the process: one dispatcher entry, one anchor fragment and one Slot per
name ever declared, and the overload objects of earlier schemas.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.fx.operator_schemas import _SCHEMA_TO_SIGNATURE_CACHE

from ..errors import RegistrationError
from . import quiesce as _quiesce


__all__ = ["Slot", "get", "claim"]

_SLOTS: dict[str, "Slot"] = {}


def get(qualname: str) -> "Slot | None":
    return _SLOTS.get(qualname)


def claim(qualname: str) -> "Slot":
    """The name's slot, made on first use (the caller holds the registry's lock)."""
    slot = _SLOTS.get(qualname)
    if slot is None:
        slot = _SLOTS[qualname] = Slot(qualname)
    return slot


class Slot:
    """The dispatcher side of one op name: its definition, its forwarding kernels, its holder."""

    def __init__(self, qualname: str) -> None:
        self.name = qualname
        self.ns, self.short = qualname.split("::")
        self.op: Any = None  # the op calls reach now; None: unregistered
        self.last: Any = None  # the op that held the definition last
        self.schema: str | None = None  # the schema defined now (KernelOp.signature.schema)
        self.definition: torch.library.Library | None = None
        self.overload: Any = None  # torch.ops.<ns>.<name>.default of the schema defined now
        self._anchor: torch.library.Library | None = None
        self._stale: list[Any] = []  # overloads of earlier schemas: callable, so gated by quiet()
        self._held: _quiesce.Held | None = None  # the gates while quiet()
        self._kernel = self._fake = self._refuse

    # The kernels the dispatcher calls: registered once, never replaced.
    def kernel(self, *args: Any) -> Any:
        return self._kernel(*args)

    def fake(self, *args: Any) -> Any:
        return self._fake(*args)

    def holder(self) -> Any:
        """The op that holds the name now, else the one that held it last (a call that raced an
        unregister is served by the op it was made for)."""
        return self.op if self.op is not None else self.last  # type: ignore[return-value]

    def _refuse(self, *args: Any) -> Any:
        raise RegistrationError(
            f"{self.name}: no op holds this name (it was unregistered); declare it again with "
            "kg.op before calling it through torch.ops")

    def serve(self, op: Any) -> None:
        """Send calls to ``op`` from now on (None: they raise RegistrationError)."""
        self.op = op
        if op is None:
            self._kernel = self._fake = self._refuse
        else:
            self.last = op
            self._kernel, self._fake = op._dispatcher_kernel, op._fake

    def defined(self, lib: torch.library.Library, schema: str) -> None:
        """``lib`` now holds the name's schema: note it, and register the forwarding kernels the
        first time. Overloads cached for an earlier schema leave the packet (torch.ops.<ns>.<name>
        .default is made anew from this schema); they stay callable, their builtin reading the
        entry's schema of the moment."""
        self.definition, self.schema = lib, schema
        packet = getattr(getattr(torch.ops, self.ns), self.short)
        if self._held is not None:  # defining refreshed the packet's builtin: keep calls out
            self._held.regate()
        now = str(torch._C._dispatch_find_schema_or_throw(self.name, "").schema())
        for key, value in list(vars(packet).items()):
            if isinstance(value, torch._ops.OpOverload) and str(value._schema) != now:
                self._stale.append(vars(packet).pop(key))
                if key in packet._dir:
                    packet._dir.remove(key)
        self.overload = packet.default
        if self._anchor is None:
            anchor = torch.library.Library(self.ns, "FRAGMENT")
            for key in ("CPU", "CUDA"):
                anchor.impl(self.short, self.kernel, key)
            torch.library.register_fake(self.name, self.fake, lib=anchor)
            self._anchor = anchor

    @contextlib.contextmanager
    def quiet(self, before: Callable[[], None], undo: Callable[[], None]) -> Iterator[None]:
        """A block in which no thread is inside a call of the name. Calls through its torch.ops
        objects wait at gates from the start; ``before()`` runs then (the registry retires the op
        that holds the name, so that calls on that object wait too), and the block starts once the
        calls in flight have returned (``_quiesce``). If that fails, or the block raises,
        ``undo()`` runs before the gates open."""
        packet = vars(getattr(torch.ops, self.ns)).get(self.short)
        objects = [] if packet is None else [packet] + [
            v for v in vars(packet).values() if isinstance(v, torch._ops.OpOverload)]
        holder = self.op
        codes = _FORWARDERS if holder is None else _FORWARDERS | {type(holder).__call__.__code__}
        held = _quiesce.Held(self.name, objects + self._stale, codes, (self, holder))
        self._held = held
        try:
            before()
            held.drain()
            yield
        except BaseException:
            undo()
            raise
        finally:
            self._held = None
            held.open()

    def settled(self) -> None:
        """Wait while the name's schema changes (a call on a retired op object, which needs the
        op that will hold the name)."""
        held = self._held
        if held is not None:
            held.wait()

    def release(self) -> None:
        """Deregister the schema and what the definition holds (the autograd kernel); the entry,
        the forwarding kernels and the torch.ops packet stay. Only inside ``quiet()``."""
        lib, self.definition, self.schema = self.definition, None, None
        if lib is None:
            return
        # torch's _destroy would also drop the name's torch.ops packet, which other threads look up
        # and call (a lookup before the new schema is defined would fail): the packet stays, its
        # builtin reads the entry's schema of the moment.
        lib._op_defs.discard(self.name)
        lib._destroy()
        _SCHEMA_TO_SIGNATURE_CACHE.pop((self.name, ""), None)  # torch.fx's signature of the old schema


_FORWARDERS = frozenset({Slot.kernel.__code__, Slot.fake.__code__})
