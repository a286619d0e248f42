"""Process-global op registry: deterministic names, one registration per name, thread safe.

Registering the same op twice (the same fingerprint: reference, schema, impls and every option that
changes behaviour) is a no-op that returns the first op, so re-imports, re-run notebook cells and
pytest-xdist workers are safe; a different op under a taken name is an error that names what
differs, unless the new declaration says ``replace=True`` (notebooks: the old op is retired, see
``KernelOp._retire``) or the holder is an op rebuilt from an AOT bundle (a stand-in), which yields
the name to the module that defines it (``aot/_load.py`` says how). Double-checked locking keeps
the common path lock-free.

A name's torch.ops operator is made once and never freed (``_slot``): its kernels forward to the
op that holds the name, so re-declaring (``replace=True``) and unregistering while other threads
call the op swap one reference and crash nothing; only a new schema changes the dispatcher, with
every call held out meanwhile. An unregistered name stays in torch.ops, and calls raise
``RegistrationError`` until an op of that name is declared again.
"""

from __future__ import annotations

from typing import Any

import json
import logging
import re
import threading

import torch

from .. import admit as _admit
from ..errors import RegistrationError
from . import autograd as _autograd, slot as _slot


__all__ = ["default_name", "split_name", "register", "unregister", "retire", "lookup", "holder",
           "all_ops", "differences"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OPS: dict[str, Any] = {}
_LOCK = threading.RLock()


def default_name(fn, fingerprint: str) -> str:
    """``kernelgraft::<module>_<qualname>_<hash>``: the same in every process for the same op."""
    stem = f"{fn.__module__}.{fn.__qualname__}".replace("<locals>", "locals")
    stem = re.sub(r"[^A-Za-z0-9_]", "_", stem).strip("_")
    return f"kernelgraft::{stem}_{fingerprint[:12]}"


def split_name(qualname: str) -> tuple[str, str]:
    ns, sep, name = qualname.partition("::")
    if not sep or not _NAME.match(ns) or not _NAME.match(name) or "." in name:
        raise RegistrationError(
            f"op name {qualname!r} is not of the form 'namespace::name' with identifier parts, "
            "e.g. 'mylib::add_relu'"
        )
    if ns in ("aten", "prim", "prims", "torch"):
        raise RegistrationError(f"op name {qualname!r}: namespace {ns!r} belongs to PyTorch")
    return ns, name


def lookup(qualname: str) -> Any:
    return _OPS.get(qualname)


def holder(qualname: str) -> Any:
    """The op that holds the name, once a change of its schema in progress is done."""
    slot = _slot.get(qualname)
    if slot is not None:
        slot.settled()
    return _OPS.get(qualname)


def all_ops() -> list[Any]:
    return list(_OPS.values())


def register(op: Any, *, replace: bool = False) -> Any:
    """Register ``op`` under its name and return the op that serves the name: ``op``, or the op
    already registered with the same fingerprint. ``replace=True`` retires a different op of the
    same name (its plans go; references to it forward)."""
    existing = _OPS.get(op.name)
    if existing is None:
        with _LOCK:
            existing = _OPS.get(op.name)
            if existing is None:
                _serve(op)
                return op
    if existing.fingerprint == op.fingerprint:
        return existing
    take_over = getattr(existing, "_bundle_stand_in", None)
    if take_over is not None:  # rebuilt from an AOT bundle: the op's own module wins the name
        return take_over(op, replace)
    if replace:
        return _replace(existing, op)
    changes = differences(getattr(existing, "identity", None), getattr(op, "identity", None))
    raise RegistrationError(
        f"op name {op.name!r} is already registered by {_source(existing)}, and this declaration "
        f"({_source(op)}) differs: {'; '.join(changes) or 'code or impls'}. Give the changed op "
        "another name, leave the name out to get a unique one, or, to re-declare it (a notebook "
        "cell run again after an edit), pass replace=True to kg.op"
    )


def _source(op: Any) -> str:
    ref = op.reference
    return f"{getattr(ref, '__module__', '?')}.{getattr(ref, '__qualname__', ref)}"


def _replace(old: Any, new: Any) -> Any:
    with _LOCK:
        if _OPS.get(old.name) is not old:  # another thread replaced it first: try again
            return register(new, replace=True)
        _serve(new, old)  # the name goes from old to new in one step: no call finds it free
    log.info("op %s: %s replaced %s", new.name, _source(new), _source(old))
    return new


def _serve(op: Any, old: Any = None) -> None:
    """Make ``op`` the holder of its name, retiring ``old`` (the holder it replaces), with the
    registry's lock held. The name's slot forwards to ``op``; the dispatcher changes only for a
    first definition or a new schema (``_slot``)."""
    slot = _slot.get(op.name)
    if slot is not None and slot.schema == op.signature.schema:
        _adopt(slot, op)
        _OPS[op.name] = op
    elif slot is None or slot.schema is None:
        _define(op)
        _OPS[op.name] = op
    else:
        # Calls on old bind their arguments to its schema: it is retired first (its calls wait for
        # the change, then go to op), and the calls it had started finish before the change.
        def before() -> None:
            if old is not None:
                retire(old, "replaced")

        def undo() -> None:  # the change failed: the name stays with the op that had it
            revive = getattr(old, "_revive", None)  # only a retired op has it
            if revive is not None:
                revive()

        with slot.quiet(before, undo):
            previous = slot.op
            slot.release()
            try:
                _define(op)
            except BaseException:
                if previous is not None:
                    _define(previous)
                raise
            _OPS[op.name] = op
        return
    if old is not None:
        retire(old, "replaced")


def _adopt(slot: "_slot.Slot", op: Any) -> None:
    """``op`` takes a name whose definition has its schema already: the definition's autograd
    kernel (which reaches the holder through the slot) now runs its backward, and the slot's
    kernels forward to it. Nothing in the dispatcher changes."""
    op._bind_overload(slot.overload, slot.definition)
    _autograd.adopt(op, slot.last)
    slot.serve(op)


def retire(op: Any, how: str) -> None:
    """Make a removed op unusable as itself: its plans, runners and in-memory tuning decisions go,
    and the object forwards every call to whichever op holds its name now (``how`` says why, for
    the error when none does)."""
    op._retire(how)


_SHORT = 80  # values longer than this (sources, long lists) are summarised, not printed


def differences(old: dict | None, new: dict | None) -> list[str]:
    """What differs between two op identities (``KernelOp.identity``), one phrase per option, e.g.
    ``"fallback: 'reference' -> 'error'"``.

    >>> differences({"fallback": "reference", "ndim": {}}, {"fallback": "error", "ndim": {}})
    ["fallback: 'reference' -> 'error'"]
    >>> differences({"impls": ["a", "b"]}, {"impls": ["a", "c"]})
    ['impls: impl 1 differs (kernel, launch, configs or options)']
    """
    if not isinstance(old, dict) or not isinstance(new, dict):
        return []
    out = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        if name == "impls" and isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                out.append(f"impls: {len(a)} impls -> {len(b)}")
            else:
                which = [str(i) for i, (x, y) in enumerate(zip(a, b)) if x != y]
                out.append(f"impls: impl {', '.join(which)} differ{'s' if len(which) == 1 else ''} "
                           "(kernel, launch, configs or options)")
        elif _has_source(a) or _has_source(b):
            out.append(f"{name}: " + ("the source differs" if a is not None and b is not None
                                      else f"{_show(a)} -> {_show(b)}"))
        else:
            out.append(f"{name}: {_show(a)} -> {_show(b)}")
    return out


def _has_source(value) -> bool:
    """Whether an identity value is or holds a function's source text (many lines)."""
    if isinstance(value, str):
        return "\n" in value or len(value) > _SHORT
    return isinstance(value, (dict, list)) and "\\n" in json.dumps(value)


def _show(value) -> str:
    if _has_source(value):
        return "a function" if isinstance(value, str) else "rules with a function"
    text = repr(value)
    return text if len(text) <= _SHORT else text[: _SHORT - 3] + "..."


def _define(op: Any) -> None:
    """Define the op's schema on its name's operator (new, or whose schema was just released) and
    send the name's calls to it."""
    ns, name = split_name(op.name)
    if _slot.get(op.name) is None and _has_schema(op.name):
        raise RegistrationError(
            f"op name {op.name!r} is already defined in torch.ops by code outside kernelgraft"
        )
    slot = _slot.claim(op.name)
    previous, last = slot.op, slot.last
    slot.serve(op)  # before the schema exists: a call that finds it must reach this op
    lib = torch.library.Library(ns, "FRAGMENT")  # the op's definition: destroyed only for a new schema
    try:
        lib.define(f"{name}{op.signature.schema}")
        # tensors no kernel may read as they are (sparse, nested, negative bit...): refused or
        # resolved before the name's kernels see them
        for key, kernel, with_keyset in _admit.dispatcher_kernels(op.name, op.signature.params,
                                                                  lambda: slot.overload):
            lib.impl(name, kernel, key, with_keyset=with_keyset)
    except BaseException:
        slot.serve(previous)
        slot.last = last
        raise
    slot.defined(lib, op.signature.schema)
    _autograd.install(op, lib, slot)  # the op's backward, or a refusal; calls reach the holder
    op._bind_overload(slot.overload, lib)


class _Unregistered:
    """Stands in for the torch.ops overload of an op that was unregistered: every use raises."""

    __slots__ = ("qualname",)

    def __init__(self, qualname: str) -> None:
        self.qualname = qualname

    def _fail(self) -> RegistrationError:
        return RegistrationError(
            f"{self.qualname}: the op was unregistered from torch.ops; register it again "
            "(kernelgraft.op.registry.register(op)) before calling it through the dispatcher"
        )

    def __call__(self, *args, **kwargs):
        raise self._fail()

    def __getattr__(self, name: str):
        raise self._fail()


def _has_schema(qualname: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(qualname, "")
        return True
    except RuntimeError:
        return False


def unregister(qualname: str, only: Any = None) -> Any:
    """Forget an op; returns it (None if the name was free, or held by another op than ``only``
    when given). The name stays in torch.ops (code may hold its operator; freeing it would crash
    that code's next call), and its calls raise RegistrationError until an op of that name is
    registered again. The op object still runs eagerly and can be registered again; ``retire``
    makes it forward instead."""
    with _LOCK:
        op = _OPS.get(qualname)
        if op is None or (only is not None and op is not only):
            return None
        del _OPS[qualname]
        _slot.get(qualname).serve(None)
        op._bind_overload(_Unregistered(qualname), None)
        return op
