"""Tuning decisions on disk: one JSON file, safe under concurrent processes, never fatal.

The file is ``tune.json`` in the kernelgraft cache root (``kernelgraft.cache.root.root``:
``KERNELGRAFT_CACHE_DIR``, else ``$XDG_CACHE_HOME/kernelgraft`` or ``~/.cache/kernelgraft``);
``KERNELGRAFT_CACHE_DIR=off`` keeps decisions in memory only. Writers take a file lock, re-read
the file, merge their entries, write a temp file in the same directory and ``os.replace`` it, so
no entry from another process is lost and readers (who take no lock) always see a whole file. An
entry is used only if its recorded environment (device, driver, toolchain versions, key schema)
equals this process's.

A file that cannot be used (not a regular file, over ``MAX_BYTES``, not UTF-8, not JSON, nested
too deep, fields of the wrong type) is a miss for every key with one warning, and is set aside as
``tune.json.bad-<timestamp>`` for inspection; the next decision starts a fresh file. An entry
whose own fields have the wrong types is a miss for its key (and is dropped at the next write).
The file is bounded to ``MAX_BYTES`` (16 MiB, some 15,000 decisions, parsed in well under a
second) so a first call stays fast: a larger file is refused unread (set aside, as above), and a
write that would pass the bound drops the oldest decisions first. A cache directory that cannot be written gives one warning and decisions stay in memory.

Decisions choose which kernel runs, so the file is trusted only when it is its owner's alone
(``kernelgraft.cache.trust``, the rule the native build follows): a cache directory that is not this
user's alone (another owner, group or other write, a symlink) is neither read nor written, and a
``tune.json`` that is not a regular file of this user's alone is ignored (a miss: the next write,
in a trusted directory, replaces it). Each gives one ``TuneWarning`` per directory per process.
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from ..cache import root as _cache
from ..errors import TuneWarning
from ..cache.trust import foreign_file, untrusted
from .key import KEY_SCHEMA_VERSION

__all__ = ["cache_dir", "cache_path", "DiskCache", "MAX_BYTES", "BadFile", "Foreign", "OtherSchema", "entry_problem",
           "read_json", "set_aside_files"]

log = logging.getLogger(__name__)

FILE_NAME = "tune.json"
# About 15,000 decisions (~1.1 KB each as written): a process reads the file once (again only
# when it changes), which at this size costs ~0.3 s of JSON parsing on an idle core (~0.6 s on a
# busy one, measured); a 32 MiB file already took 1.2-2 s there.
MAX_BYTES = 16 << 20
FORMAT = "kernelgraft-tune-cache"
_LOCK_TIMEOUT_S = 60.0
# A reader that finds a bad file sets it aside only if it gets the lock at once: an op call never
# waits on another process's write (the next writer sets the file aside under the lock anyway).
_ASIDE_LOCK_TIMEOUT_S = 0.5


def cache_dir() -> Path | None:
    """The directory of the tuning cache (the kernelgraft cache root), or None when it is off."""
    return _cache.root()


def cache_path() -> Path | None:
    """The tuning cache file, or None when disk caching is off."""
    root = _cache.root()
    return None if root is None else root / FILE_NAME


def _empty() -> dict[str, Any]:
    return {"format": FORMAT, "schema": KEY_SCHEMA_VERSION, "entries": {}}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def entry_problem(entry: Any) -> str | None:
    """Why ``entry`` cannot be a decision (a field of the wrong type), or None when it can.

    Checks what turning it into a decision relies on; items inside ``ranking``/``excluded``
    that name no candidate are skipped when choosing, so they are not checked here.

    >>> entry_problem({"key": {}, "ranking": [], "excluded": [], "created": 1.0})
    >>> entry_problem({"key": {}, "ranking": 5})
    "'ranking' is int, not a list of objects"
    """
    if not isinstance(entry, dict):
        return f"the entry is {type(entry).__name__}, not an object"
    if not isinstance(entry.get("key", {}), dict):
        return f"'key' is {type(entry['key']).__name__}, not an object"
    for field in ("ranking", "excluded"):
        value = entry.get(field, [])
        if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
            return f"{field!r} is {type(value).__name__}, not a list of objects"
    for field in ("created", "tune_s"):
        if field in entry and not _is_number(entry[field]):
            return f"{field!r} is {entry[field]!r}, not a finite number"
    for field in ("measured", "offered"):
        value = entry.get(field, 0)
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{field!r} is {value!r}, not an integer"
    return None


class BadFile(Exception):
    """The tuning cache file cannot be used as a whole (the message says why)."""


class Foreign(Exception):
    """The tuning cache file or its directory is not this user's alone: not read, not set aside."""


_DISTRUSTED: set[str] = set()  # directories warned about in this process
_DISTRUST_LOCK = threading.Lock()


def _distrust(directory: Path, why: str) -> None:
    with _DISTRUST_LOCK:
        if str(directory) in _DISTRUSTED:
            return
        _DISTRUSTED.add(str(directory))
    warnings.warn(f"kernelgraft: ignoring the tuning cache in {directory}: {why}; ops choose without its "
                  "decisions and new ones stay in memory (a cache is used only when it is this user's alone: "
                  "chmod go-w, or point KERNELGRAFT_CACHE_DIR at a directory of your own)", TuneWarning, stacklevel=5)


class OtherSchema(Exception):
    """The tuning cache file is a newer kernelgraft's (a later key schema): not read, and not
    overwritten but by an explicit clear, so an older version sharing the cache directory does not
    erase the newer one's work. A file of an earlier schema is read as empty and replaced: an
    upgrade keeps caching."""


def read_json(path: Path, *, owner_only: bool = False) -> Any:
    """The JSON value in ``path``, read within the bounds: raises ``BadFile`` when it is not a
    regular file, is over ``MAX_BYTES``, is not UTF-8 or not JSON or is nested too deep;
    ``FileNotFoundError`` and other ``OSError`` when it cannot be opened. ``owner_only`` (the
    cache's own file): ``Foreign`` unless it and its directory are this user's alone."""
    if owner_only:
        why = untrusted(path.parent)
        if why:
            raise Foreign(why)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise BadFile("it is not a regular file")
        why = foreign_file(path, st) if owner_only else None
        if why:
            raise Foreign(why)
        if st.st_size > MAX_BYTES:
            raise BadFile(f"it is {_size(st.st_size)}, over the {_size(MAX_BYTES)} bound")
        raw = fh.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise BadFile(f"it is over the {_size(MAX_BYTES)} bound")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadFile(f"it is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise BadFile("its JSON is nested too deep") from None
    except ValueError as exc:
        raise BadFile(f"it is not JSON ({exc})") from None


def load(path: Path) -> tuple[dict[str, Any], int]:
    """Read ``path``: (valid entries, number of mistyped entries dropped); ``{}`` for no file.
    Raises ``OtherSchema`` for a file of another key schema, ``BadFile`` for a file that cannot be
    used, ``OSError`` when it cannot be read."""
    try:
        data = read_json(path, owner_only=True)
    except FileNotFoundError:
        return {}, 0
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BadFile("it is not a kernelgraft tuning cache (no 'format': 'kernelgraft-tune-cache')")
    entries = data.get("entries")
    if not isinstance(entries, dict):
        raise BadFile(f"'entries' is {type(entries).__name__}, not an object")
    schema = data.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise BadFile(f"'schema' is {schema!r}, not an integer")
    if schema > KEY_SCHEMA_VERSION:
        raise OtherSchema(f"the tuning cache {path} has key schema {schema}, from a newer version of "
                          f"kernelgraft (this one uses {KEY_SCHEMA_VERSION})")
    if schema != KEY_SCHEMA_VERSION:
        log.info("tuning cache %s has key schema %s, from an earlier kernelgraft (this one uses %s); "
                 "its decisions are ignored and the next write replaces it", path, schema, KEY_SCHEMA_VERSION)
        return {}, 0
    good = {k: v for k, v in entries.items() if entry_problem(v) is None}
    return good, len(entries) - len(good)


def set_aside(path: Path, stamp: tuple | None = None) -> Path | None:
    """Rename ``path`` to ``<name>.bad-<timestamp>`` (only if it is still the file of ``stamp``)."""
    if stamp is not None and _stamp(path) != stamp:
        return None  # another process replaced it meanwhile: not the file that was found bad
    base = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%d-%H%M%S')}")
    target, n = base, 0
    while target.exists():
        n += 1
        target = base.with_name(f"{base.name}-{n}")
    try:
        os.replace(path, target)
    except OSError as exc:
        log.info("cannot set the tuning cache %s aside: %s", path, exc)
        return None
    return target


def set_aside_files(path: Path) -> list[Path]:
    """The files set aside from ``path`` so far, oldest first."""
    return sorted(path.parent.glob(f"{path.name}.bad-*"))


def _stamp(path: Path) -> tuple:
    try:
        st = os.stat(path)
        return (str(path), st.st_mtime_ns, st.st_size, st.st_ino)
    except OSError:
        return (str(path), -1, -1, -1)


class DiskCache:
    """Entries ``digest -> entry`` (see ``_tuner.Decision.to_json``) in one JSON file."""

    def __init__(self, path: Path | None = None) -> None:
        self._fixed = path
        self._warned: set[Any] = set()
        self._mtime: tuple | None = None
        self._entries: dict[str, Any] = {}
        self.dropped = 0  # mistyped entries in the file last read (misses, gone at the next write)
        self._lock = threading.Lock()

    @property
    def path(self) -> Path | None:
        """The file, or None when disk caching is off."""
        return self._fixed or cache_path()

    def _warn(self, tag: Any, message: str) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            warnings.warn(message, TuneWarning, stacklevel=4)

    # ------------------------------------------------------------------ reading
    def _read_file(self, path: Path, *, locked: bool, replace_newer: bool = False) -> dict[str, Any]:
        stamp = _stamp(path)
        try:
            entries, dropped = load(path)
        except OtherSchema as exc:
            if locked and not replace_newer:  # about to write: leave the newer file alone
                raise
            log.info("%s; its decisions are ignored", exc)
            return {}
        except Foreign as exc:
            _distrust(path.parent, str(exc))
            return {}
        except OSError as exc:
            self._warn(("read", stamp), f"kernelgraft: cannot read the tuning cache {path}: {exc}")
            return {}
        except BadFile as exc:
            aside = set_aside(path, stamp) if locked else self._set_aside_now(path, stamp)
            where = f"it was set aside as {aside.name}" if aside else "it is left in place"
            self._warn(("bad", stamp), (
                f"kernelgraft: the tuning cache {path} cannot be used ({exc}); {where}, and ops "
                "choose without cached decisions (they are tuned again when tuning is on)"))
            return {}
        if dropped:
            self._warn(("dropped", stamp), (
                f"kernelgraft: {dropped} entries of the tuning cache {path} have fields of the wrong "
                "type; they are ignored (their ops are tuned again) and dropped at the next write"))
        self.dropped = dropped
        return entries

    def _set_aside_now(self, path: Path, stamp: tuple) -> Path | None:
        try:
            with FileLock(str(path) + ".lock", timeout=_ASIDE_LOCK_TIMEOUT_S):
                return set_aside(path, stamp)
        except (OSError, Timeout):
            return None

    def entries(self) -> dict[str, Any]:
        """All usable entries in the file (re-read only when the file changed)."""
        path = self.path
        if path is None:
            return {}
        stamp = _stamp(path)
        with self._lock:
            if stamp != self._mtime:
                self._entries = self._read_file(path, locked=False) if stamp[1] >= 0 else {}
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
        """Merge ``entries`` into the file; False when caching is off or (with one warning) when
        the file cannot be written."""
        return self._update(lambda current: current.update(entries))

    def remove(self, predicate=None) -> int:
        """Delete entries for which ``predicate(digest, entry)`` holds (all without one)."""
        removed = [0]

        def edit(current: dict[str, Any]) -> None:
            doomed = [d for d, e in current.items() if predicate is None or predicate(d, e)]
            for d in doomed:
                del current[d]
            removed[0] = len(doomed)

        self._update(edit, replace_newer=predicate is None)  # clearing all replaces any file
        return removed[0]

    def _update(self, edit, *, replace_newer: bool = False) -> bool:
        path = self.path
        if path is None:
            return False
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            why = untrusted(path.parent)
            if why:  # neither read nor written: another user could swap what it holds
                _distrust(path.parent, why)
                return False
            with FileLock(str(path) + ".lock", timeout=_LOCK_TIMEOUT_S):
                current = self._read_file(path, locked=True, replace_newer=replace_newer)
                edit(current)
                blob = _serialize(current, path)
                fd, tmp = tempfile.mkstemp(prefix=".tune-", suffix=".tmp", dir=path.parent)
                try:
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(blob)
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
        except OtherSchema as exc:
            self._warn(("schema", str(path)), (
                f"kernelgraft: {exc}; it is left as it is and decisions are kept in memory only. Give "
                "each kernelgraft version its own KERNELGRAFT_CACHE_DIR to keep the decisions of both "
                "(kernelgraft cache clear replaces the file)."))
            return False
        except (OSError, Timeout, TypeError, ValueError) as exc:
            self._warn(
                ("write", str(path)),
                f"kernelgraft: cannot write the tuning cache {path} ({exc}); decisions are kept in "
                "memory only. Set KERNELGRAFT_CACHE_DIR to a writable directory to keep them.",
            )
            return False


def _serialize(entries: dict[str, Any], path: Path) -> bytes:
    """The file's bytes, within MAX_BYTES: past it, the oldest decisions are dropped (down to 3/4
    of the bound, so the next few writes do not each drop again)."""
    data = _empty()
    data["entries"] = entries
    blob = json.dumps(data, indent=1, sort_keys=True).encode()
    if len(blob) <= MAX_BYTES:
        return blob
    budget = MAX_BYTES * 3 // 4
    order = sorted(entries, key=lambda d: entries[d].get("created") if _is_number(
        entries[d].get("created")) else 0.0)
    kept = dict(entries)
    while len(blob) > budget and kept:
        excess, freed = len(blob) - budget, 0
        while order and freed < excess:  # an entry weighs a little more in the file than alone
            freed += len(json.dumps(kept.pop(order.pop(0)), indent=1)) + 70
        data["entries"] = kept
        blob = json.dumps(data, indent=1, sort_keys=True).encode()
    log.warning("tuning cache %s reached its bound (%s); dropped the %d oldest decisions",
                path, _size(MAX_BYTES), len(entries) - len(kept))
    return blob


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n} bytes"
