"""Tuning decisions on disk: one JSON file, safe under concurrent processes, never fatal.

The file lives in ``$KERNELGRAFT_CACHE_DIR`` or the user cache directory
(``$XDG_CACHE_HOME/kernelgraft``, ``~/.cache/kernelgraft``; ``%LOCALAPPDATA%`` on Windows).
Writers take a file lock, re-read the file, merge their entries, write a temp file in the same
directory and ``os.replace`` it, so no entry from another process is lost and readers (who take
no lock) always see a whole file. An entry is used only if its recorded environment (device,
driver, toolchain versions, key schema) equals this process's. A corrupt or truncated file gives
one warning, is moved aside and rebuilt; a cache directory that cannot be written gives one
warning and decisions stay in memory.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from .._errors import TuneWarning
from ._key import _KEY_SCHEMA_VERSION

__all__ = ["cache_dir", "cache_path", "DiskCache"]

log = logging.getLogger(__name__)

FILE_NAME = "tune.json"
_FORMAT = "kernelgraft-tune-cache"
_LOCK_TIMEOUT_S = 60.0


def cache_dir() -> Path:
    """Where tuning decisions are kept (``KERNELGRAFT_CACHE_DIR`` overrides)."""
    env = os.environ.get("KERNELGRAFT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kernelgraft"


def cache_path() -> Path:
    return cache_dir() / FILE_NAME


def _empty() -> dict[str, Any]:
    return {"format": _FORMAT, "schema": _KEY_SCHEMA_VERSION, "entries": {}}


class DiskCache:
    """Entries ``digest -> entry`` (see ``_tuner.Decision.to_json``) in one JSON file."""

    def __init__(self, path: Path | None = None) -> None:
        self._fixed = path
        self._warned: set[str] = set()
        self._mtime: tuple | None = None
        self._entries: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self._fixed or cache_path()

    def _warn(self, tag: str, message: str) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            warnings.warn(message, TuneWarning, stacklevel=4)

    # ------------------------------------------------------------------ reading
    def _read_file(self, path: Path, *, quarantine: bool) -> dict[str, Any]:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            self._warn(f"read:{path}", f"kernelgraft: cannot read the tuning cache {path}: {exc}")
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != _FORMAT:
                raise ValueError("not a kernelgraft tuning cache")
            entries = data.get("entries")
            if not isinstance(entries, dict):
                raise ValueError("'entries' is not an object")
            if data.get("schema") != _KEY_SCHEMA_VERSION:
                log.info("tuning cache %s has key schema %s, this kernelgraft uses %s; ignoring it",
                         path, data.get("schema"), _KEY_SCHEMA_VERSION)
                return {}
            return {k: v for k, v in entries.items() if isinstance(v, dict)}
        except ValueError as exc:
            self._warn(
                f"corrupt:{path}",
                f"kernelgraft: the tuning cache {path} is corrupt ({exc}); it is set aside and "
                "rebuilt, and the affected ops are tuned again",
            )
            if quarantine:
                try:
                    os.replace(path, path.with_name(f"{path.name}.corrupt-{int(time.time())}"))
                except OSError:
                    pass
            return {}

    def entries(self) -> dict[str, Any]:
        """All entries in the file (re-read only when the file changed)."""
        path = self.path
        try:
            st = path.stat()
            stamp = (str(path), st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stamp = (str(path), -1, -1, -1)
        with self._lock:
            if stamp != self._mtime:
                self._entries = self._read_file(path, quarantine=False) if stamp[1] >= 0 else {}
                self._mtime = stamp
            return self._entries

    def get(self, digest: str, env: dict[str, str]) -> dict[str, Any] | None:
        entry = self.entries().get(digest)
        if entry is None:
            return None
        key = entry.get("key")
        if not isinstance(key, dict) or key.get("env") != env:
            log.debug("tuning cache entry %s is for another device or toolchain; ignored", digest[:12])
            return None
        return entry

    # ------------------------------------------------------------------ writing
    def put(self, entries: dict[str, Any]) -> bool:
        """Merge ``entries`` into the file; False (with one warning) when it cannot be written."""
        return self._update(lambda current: current.update(entries))

    def remove(self, predicate=None) -> int:
        """Delete entries for which ``predicate(digest, entry)`` holds (all without one)."""
        removed = [0]

        def edit(current: dict[str, Any]) -> None:
            doomed = [d for d, e in current.items() if predicate is None or predicate(d, e)]
            for d in doomed:
                del current[d]
            removed[0] = len(doomed)

        self._update(edit)
        return removed[0]

    def _update(self, edit) -> bool:
        path = self.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(path) + ".lock", timeout=_LOCK_TIMEOUT_S):
                current = self._read_file(path, quarantine=True)
                edit(current)
                data = _empty()
                data["entries"] = current
                fd, tmp = tempfile.mkstemp(prefix=".tune-", suffix=".tmp", dir=path.parent)
                try:
                    with os.fdopen(fd, "w", encoding="utf-8") as fh:
                        json.dump(data, fh, indent=1, sort_keys=True)
                        fh.flush()
                        os.fsync(fh.fileno())
                    os.replace(tmp, path)
                except BaseException:
                    try:
                        os.unlink(tmp)
                    except OSError:
                        pass
                    raise
            with self._lock:
                self._mtime = None
            return True
        except (OSError, Timeout) as exc:
            self._warn(
                f"write:{path}",
                f"kernelgraft: cannot write the tuning cache {path} ({exc}); decisions are kept in "
                "memory only. Set KERNELGRAFT_CACHE_DIR to a writable directory to keep them.",
            )
            return False
