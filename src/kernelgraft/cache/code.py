"""Compiled-code caches: a process-wide memory layer over a directory of atomic files.

An entry is one file ``<key>.kgc``: a magic, a JSON header (the key, the sha256 of the payload,
whatever metadata the caller stores) and the payload bytes. Writes go to a temporary file in the
same directory and ``os.replace`` it, so readers see a whole entry or none. An entry that does not
parse, belongs to another key or whose payload does not match its sha256 is a miss (and is
overwritten by the next put), never a crash.

The directory is ``<cache root>/<kind>`` (``kernelgraft.cache.root.root``: ``KERNELGRAFT_CACHE_DIR``,
else ``$XDG_CACHE_HOME/kernelgraft`` or ``~/.cache/kernelgraft``), created private (0700);
``KERNELGRAFT_CACHE_DIR=off`` keeps the cache in memory only. What this process runs, and what
``kernelgraft aot`` ships, comes from here, so the cache trusts only its owner (``kernelgraft.cache.trust``,
the rule the native build follows): a directory that is not this user's alone (another owner, group
or other write, a symlink) is neither read nor written, and an entry that is not a regular file of
this user's alone, or is over ``MAX_ENTRY_BYTES``, is a miss. Each such directory gives one
``KernelgraftWarning`` per process. An entry is stat'ed before it is read, and read with at most
``MAX_ENTRY_BYTES`` + 1 bytes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import struct
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

from . import root as _cache
from ..errors import KernelgraftWarning
from .trust import owned_privately, untrusted

__all__ = ["CodeCache", "cache_root", "MAX_ENTRY_BYTES"]

log = logging.getLogger(__name__)
_MAGIC = b"KGCC0001"
# A cubin or PTX is kilobytes to a few megabytes; a bigger entry is not one of ours.
MAX_ENTRY_BYTES = 64 << 20
_WARNED: set[str] = set()  # cache directories already warned about in this process
_WARN_LOCK = threading.Lock()


def cache_root() -> Path | None:
    """The cache root, or None when disk caching is off (kept for callers of this name: it is
    ``kernelgraft.cache.root.root``)."""
    return _cache.root()


def _distrust(directory: Path, why: str) -> None:
    """One warning per cache directory per process: its entries are ignored (misses)."""
    with _WARN_LOCK:
        if str(directory) in _WARNED:
            return
        _WARNED.add(str(directory))
    warnings.warn(f"kernelgraft: ignoring the compiled-code cache {directory}: {why}; its entries are "
                  "recompiled instead (a cache is used only when it is this user's alone: "
                  "chmod go-w, or point KERNELGRAFT_CACHE_DIR at a directory of your own)",
                  KernelgraftWarning, stacklevel=4)


class CodeCache:
    """``get(key) -> (meta, payload) | None`` and ``put(key, meta, payload)``; keys are hex digests."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._memory: dict[str, tuple[dict[str, Any], bytes]] = {}
        self._lock = threading.Lock()
        self.hits = {"memory": 0, "disk": 0}
        self.misses = 0

    def directory(self) -> Path | None:
        root = cache_root()
        return None if root is None else root / self.kind

    def _trusted(self, directory: Path, *, create: bool) -> bool:
        """Whether ``directory`` may be used (created private first when ``create``)."""
        if create:
            try:
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:  # a read-only or full disk costs a recompile, nothing more
                log.warning("cannot create the %s cache directory %s: %s", self.kind, directory, exc)
                return False
        elif not os.path.lexists(directory):
            return False
        why = untrusted(directory)
        if why:
            _distrust(directory, why)
            return False
        return True

    def get(self, key: str) -> tuple[dict[str, Any], bytes] | None:
        entry = self._memory.get(key)
        if entry is not None:
            self.hits["memory"] += 1
            return entry
        directory = self.directory()
        entry = None
        if directory is not None and self._trusted(directory, create=False):
            entry = _read(directory / f"{key}.kgc", key, directory)
        if entry is None:
            self.misses += 1
            return None
        self.hits["disk"] += 1
        self._memory[key] = entry
        return entry

    def put(self, key: str, meta: dict[str, Any], payload: bytes) -> None:
        self._memory[key] = (meta, payload)
        directory = self.directory()
        if directory is None:
            return
        header = json.dumps(
            {"key": key, "sha256": hashlib.sha256(payload).hexdigest(), "meta": meta},
            sort_keys=True,
        ).encode()
        if not self._trusted(directory, create=True):
            return
        try:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{key[:16]}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_MAGIC + struct.pack("<I", len(header)) + header + payload)
                os.replace(tmp, directory / f"{key}.kgc")
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:  # a read-only or full disk costs a recompile, nothing more
            log.warning("cannot write %s cache entry in %s: %s", self.kind, directory, exc)

    def clear_memory(self) -> None:
        self._memory.clear()


def _read(path: Path, key: str, directory: Path) -> tuple[dict[str, Any], bytes] | None:
    try:
        # Only a regular file: a FIFO would block (O_NONBLOCK: even the open would, without a
        # writer), a link to a device would never end, and a symlink could point anywhere.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            st = os.fstat(f.fileno())
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            log.debug("ignoring cache entry %s: not a regular file", path)
            return None
        why = owned_privately(path, st)
        if why is None and st.st_size > MAX_ENTRY_BYTES:
            why = f"{path} is {st.st_size} bytes, over the {MAX_ENTRY_BYTES}-byte cap of an entry"
        if why:
            _distrust(directory, why)
            return None
        try:
            data = f.read(MAX_ENTRY_BYTES + 1)
        except OSError:
            return None
    if len(data) > MAX_ENTRY_BYTES:  # grew since the stat
        _distrust(directory, f"{path} is over the {MAX_ENTRY_BYTES}-byte cap of an entry")
        return None
    try:
        if not data.startswith(_MAGIC):
            raise ValueError("bad magic")
        (size,) = struct.unpack_from("<I", data, len(_MAGIC))
        start = len(_MAGIC) + 4
        header = json.loads(data[start:start + size])
        payload = data[start + size:]
        if not isinstance(header, dict):
            raise ValueError(f"the header is {type(header).__name__}, not an object")
        if header.get("key") != key:
            raise ValueError("entry belongs to another key")
        if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
            raise ValueError("payload checksum mismatch")
        meta = header.get("meta") or {}
        if not isinstance(meta, dict):
            raise ValueError(f"'meta' is {type(meta).__name__}, not an object")
        return dict(meta), payload
    except (ValueError, struct.error, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        log.debug("ignoring corrupt cache entry %s: %s", path, exc)
        return None
