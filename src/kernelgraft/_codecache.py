"""Compiled-code caches: a process-wide memory layer over a directory of atomic files.

An entry is one file ``<key>.kgc``: a magic, a JSON header (the key, the sha256 of the payload,
whatever metadata the caller stores) and the payload bytes. Writes go to a temporary file in the
same directory and ``os.replace`` it, so readers see a whole entry or none. An entry that does not
parse, belongs to another key or whose payload does not match its sha256 is a miss (and is
overwritten by the next put), never a crash.

The directory is ``<cache root>/<kind>`` (``kernelgraft._cache.root``: ``KERNELGRAFT_CACHE_DIR``,
else ``$XDG_CACHE_HOME/kernelgraft`` or ``~/.cache/kernelgraft``); ``KERNELGRAFT_CACHE_DIR=off``
keeps the cache in memory only.
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
from pathlib import Path
from typing import Any

from . import _cache

__all__ = ["CodeCache", "cache_root"]

log = logging.getLogger(__name__)
_MAGIC = b"KGCC0001"


def cache_root() -> Path | None:
    """The cache root, or None when disk caching is off (kept for callers of this name: it is
    ``kernelgraft._cache.root``)."""
    return _cache.root()


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

    def get(self, key: str) -> tuple[dict[str, Any], bytes] | None:
        entry = self._memory.get(key)
        if entry is not None:
            self.hits["memory"] += 1
            return entry
        directory = self.directory()
        entry = _read(directory / f"{key}.kgc", key) if directory is not None else None
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
        try:
            directory.mkdir(parents=True, exist_ok=True)
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


def _read(path: Path, key: str) -> tuple[dict[str, Any], bytes] | None:
    try:
        # Only a regular file: a FIFO would block (O_NONBLOCK: even the open would, without a
        # writer) and a link to a device would never end.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                log.debug("ignoring cache entry %s: not a regular file", path)
                return None
            data = f.read()
    except OSError:
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
