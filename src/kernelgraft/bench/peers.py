"""Peers: other implementations of an op, timed beside it by ``kernelgraft bench``.

A peer is a callable with the op's own signature (same arguments, same outputs), such as an
adapter around Liger-Kernel's RMSNorm. It is timed the way the op is, its output is compared with
the op's, and the report gives op time / peer time. On the command line a peer is
``[OP=]module:function`` (``module`` a dotted name or a ``.py`` path; ``OP=`` limits it to the op of
that name, full or short: ``rmsnorm`` or ``kgexamples::rmsnorm``); in Python, ``bench_op(..., peers=...)`` and ``run_benchmarks(..., peers=...)``
take callables, ``(name, callable)`` pairs, :class:`Peer` objects or such strings, and
``run_benchmarks`` also a mapping from op names to those.

>>> import torch
>>> from kernelgraft.bench import as_peers
>>> [p.name for p in as_peers([torch.relu, ("mine", torch.abs)])]
['relu', 'mine']
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Union

__all__ = ["Peer", "PeerLike", "as_peers", "parse_peer", "peers_for"]


@dataclasses.dataclass(frozen=True)
class Peer:
    """``fn(*op_args)`` computes what the op computes; ``ops`` (op names, full or short) limits
    which ops it is timed beside (empty: every op)."""

    name: str
    fn: Callable[..., Any]
    ops: tuple[str, ...] = ()

    def applies_to(self, op_name: str) -> bool:
        return not self.ops or _named(op_name, self.ops)


def _named(op_name: str, names: Iterable[str]) -> bool:
    """Whether ``op_name`` ('ns::name') is one of ``names``, given in full or by its short name."""
    return any(n == op_name or n == op_name.split("::")[-1] for n in names)


PeerLike = Union[Peer, str, Callable[..., Any], tuple]


def _load_module(where: str, spec: str):
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ValueError(f"peer {spec!r}: no such file {where!r}")
        name = f"kernelgraft_peer_{path.stem}"
        if name not in sys.modules:
            loader = importlib.util.spec_from_file_location(name, path.resolve())
            module = importlib.util.module_from_spec(loader)
            sys.modules[name] = module
            loader.loader.exec_module(module)
        return sys.modules[name]
    try:
        return importlib.import_module(where)
    except ImportError as exc:
        raise ValueError(f"peer {spec!r}: cannot import module {where!r}: {exc}") from exc


def parse_peer(spec: str) -> Peer:
    """``[OP=]module:function`` -> Peer; the module is imported now, so a typo fails early."""
    ops: tuple[str, ...] = ()
    target = spec
    if "=" in spec:
        only, target = spec.split("=", 1)
        ops = tuple(s for s in only.split(",") if s)
    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr:
        raise ValueError(f"peer {spec!r}: expected [OP=]module:function (e.g. benchmarks/peers.py:liger_rmsnorm)")
    module = _load_module(where, spec)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"peer {spec!r}: {where} has no function {attr!r}")
    return Peer(getattr(fn, "peer_name", attr), fn, ops)


def _one(value: Any) -> Peer:
    if isinstance(value, Peer):
        return value
    if isinstance(value, str):
        return parse_peer(value)
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and callable(value[1]):
        return Peer(value[0], value[1])
    if callable(value):
        return Peer(getattr(value, "peer_name", getattr(value, "__name__", type(value).__name__)), value)
    raise TypeError(f"peers: expected a callable, a (name, callable) pair, a Peer or 'module:function', "
                    f"got {type(value).__name__}: {value!r}")


def as_peers(peers: PeerLike | Iterable[PeerLike] | None) -> list[Peer]:
    """Normalise one peer or a list of them (see the module docstring) to ``Peer`` objects."""
    if peers is None:
        return []
    if isinstance(peers, (Peer, str)) or callable(peers) or (
            isinstance(peers, tuple) and len(peers) == 2 and isinstance(peers[0], str) and callable(peers[1])):
        return [_one(peers)]
    return [_one(p) for p in peers]


def peers_for(op_name: str, peers: Mapping[str, Any] | PeerLike | Iterable[PeerLike] | None) -> list[Peer]:
    """The peers that apply to ``op_name``: from a mapping, those under the op's name (full or
    short); from a list, those without an ``OP=`` limit or whose limit names the op."""
    if isinstance(peers, Mapping):
        return [p for k, value in peers.items() if _named(op_name, [k]) for p in as_peers(value)]
    return [p for p in as_peers(peers) if p.applies_to(op_name)]
