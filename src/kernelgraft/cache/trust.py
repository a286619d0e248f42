"""Whether a cache path may be trusted: it belongs to this user alone.

One rule for every kernelgraft cache (compiled code, the tuning file, the native replay and the C++
runtime builds): a directory that holds entries must be a real directory (not a symbolic link),
owned by this user and not writable by group or others; an entry must be a regular file with the
same owner and no group or other write bit. Anyone else who can write there could plant or swap
what this process loads or ships. Standard library only: the native build's child process, which
imports nothing of kernelgraft, loads this file by its path.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> untrusted(d) is None
True
>>> os.chmod(d, 0o777); untrusted(d).endswith("is writable by group or others (mode 777)")
True
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["untrusted", "owned_privately", "foreign_file"]


def untrusted(path: str | os.PathLike) -> str | None:
    """Why directory ``path`` must not hold what this process loads, or None: it must be a real
    directory (not a symlink), owned by this user and not writable by group or others."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path} cannot be inspected: {exc}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    return owned_privately(path, st)


def owned_privately(path: str | os.PathLike, st: os.stat_result) -> str | None:
    """Why ``st`` (of ``path``) is not this user's alone, or None."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    if uid is not None and st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def foreign_file(path: str | os.PathLike | Path, st: os.stat_result) -> str | None:
    """Why the file ``path`` (``st``: its fstat, taken on the open descriptor) must not be used, or
    None: a regular file of this user's alone."""
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    return owned_privately(path, st)
