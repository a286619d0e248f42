"""The Inductor pass of pattern grafts: the active patterns, rewritten into every graph Inductor
compiles (``torch._inductor.config.post_grad_custom_pre_pass``, beside the user's passes).

As Inductor config is process-wide, an active pattern graft applies to every graph Inductor
compiles until ``kg.ungraft`` (or until its model is collected). The pass's ``uuid`` comes from the
active patterns, so Inductor's caches never mix grafted and plain graphs.
"""

from __future__ import annotations


import logging
import threading
from typing import Any
import warnings

import torch.fx as fx

from ..errors import GraftWarning
from ..op import compete as _compete, registry as _registry
from .passes import Slot
from .rewrite import rewrite_graph


__all__ = ["active", "install", "uninstall", "retire_later"]

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_ACTIVE: list[Any] = []
_DEAD: list[Any] = []  # patterns whose models were collected, uninstalled at the next chance


def active() -> list[Any]:
    with _LOCK:
        _drain()
        return list(_ACTIVE)


def _run(graph: fx.Graph) -> None:
    n, _ = rewrite_graph(graph, _applicable(), "inductor")
    log.info("kernelgraft post-grad pass: replaced %d pattern matches", n)


# Part of the pass's cache identity: bump it when the rewrite makes other graphs from the same
# patterns (a graph Inductor cached under an earlier rewrite is not served then).
_REWRITE_VERSION = 2


def _identity() -> tuple:
    return (_REWRITE_VERSION, *(p.uuid for p in _applicable()))


def retire_later(pattern: Any) -> None:
    """Uninstall ``pattern`` at the next install, uninstall or compile: called by the finalizer
    of its model, which garbage collection may run anywhere, even where this thread holds _LOCK."""
    _DEAD.append(pattern)  # atomic: takes no lock


def _drain() -> None:
    """Drop the patterns whose models are gone (the caller holds _LOCK). Inductor's pass slot
    stays until the next uninstall: a compile may be reading it."""
    while _DEAD:
        pattern = _DEAD.pop()
        if pattern in _ACTIVE:
            _ACTIVE.remove(pattern)


def _applicable() -> list[Any]:
    """The active patterns less those whose op's own reference is being compiled in this thread
    (its torch:compile candidate): that graph is the pattern, and must stay the reference; and
    less those whose op no longer holds its name (unregistered, or replaced by a declaration
    with ``replace=True``): the graft was verified against that op, not its successor."""
    own = _compete.compiling_references()
    with _LOCK:
        _drain()
        active = list(_ACTIVE)
    return [p for p in active if p.op.name not in own and _current(p)]


def _current(pattern: Any) -> bool:
    holder = _registry.lookup(pattern.op.name)
    if holder is pattern.op or (holder is not None and holder.fingerprint == pattern.op.fingerprint):
        return True  # the same op (a bundle's stand-in taken over by the module's own)
    if not pattern.stale_said:
        pattern.stale_said = True
        warnings.warn(f"kg.graft: the pattern graft onto {pattern.op.name} no longer acts: that op was "
                      "unregistered or declared again since; graft the model again to use the op "
                      "that holds the name now", GraftWarning, stacklevel=2)
    return False


_SLOT = Slot("post_grad_custom_pre_pass", "kernelgraft", _run, _identity)


def install(pattern: Any) -> None:
    """Make ``pattern`` part of every Inductor compilation from now on."""
    with _LOCK:
        _drain()
        _ACTIVE.append(pattern)
        _SLOT.install()


def uninstall(pattern: Any) -> None:
    with _LOCK:
        if pattern in _ACTIVE:
            _ACTIVE.remove(pattern)
        _drain()
        if not _ACTIVE:
            _SLOT.uninstall()


