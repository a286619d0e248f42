"""Building the native replay's extension, in a child process, and checking what a build left.

Run as a script (``python builder.py DIRECTORY SOURCE [SOURCE ...] [--library NAME]``) by
``kernelgraft.native`` (and ``kernelgraft.runtime``, whose ``--library`` build is a plain shared
library loaded with ``torch.ops.load_library`` rather than a Python module): compiling
takes 10-15 s of CPU and torch's C++ extension tooling, and neither belongs in the user's process,
whose first seconds may be timed. The script imports nothing of kernelgraft (it loads
``cache/trust.py`` by its path), so the child imports only torch, filelock and those two files.

A finished build is two files in DIRECTORY: ``<name>-<sha256 prefix>.so`` and
``record.json`` naming it with its full sha256, written last and atomically (a temporary file and
``os.replace``), so a reader sees either no record or one whose library is complete. The loader
opens only the library the record names, and only when its bytes hash to the recorded value and
the directory is the user's alone (``untrusted``, from ``kernelgraft.cache.trust``: the rule every cache
uses): a planted or altered ``.so`` never loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

try:
    from ..cache.trust import owned_privately as _owned_privately, untrusted
except ImportError:  # run as a script, by a child that imports nothing of kernelgraft: the one copy, by path
    import importlib.util as _util

    _spec = _util.spec_from_file_location("kernelgraft_trust", Path(__file__).resolve().parents[1] / "cache" / "trust.py")
    _trust = _util.module_from_spec(_spec)
    _spec.loader.exec_module(_trust)
    untrusted, _owned_privately = _trust.untrusted, _trust.owned_privately

NAME = "kernelgraft_native"
RECORD = "record.json"
_RECORD_LIMIT = 4096  # bytes: a record is a few lines; anything larger is not one
# A toolchain that links libstdc++ statically into shared objects (the GPU machine's did: the
# runtime library defined 4685 std:: symbols and needed no libstdc++.so) exports that copy's
# symbols, and a process then runs a mix of two libstdc++ copies: formatting a number into a
# TORCH_WARN message crashed in std::ostream. Symbols from static archives stay local.
LDFLAGS = ["-Wl,--exclude-libs,ALL"]


def read_record(directory: Path) -> dict | None | str:
    """The build record of ``directory``: a dict with ``file`` and ``sha256``, None when there is
    none (not built yet), or a str saying why the one there is unusable."""
    path = directory / RECORD
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_RECORD_LIMIT + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path} cannot be read: {exc}"
    try:
        if len(raw) > _RECORD_LIMIT:
            raise ValueError(f"larger than {_RECORD_LIMIT} bytes")
        record = json.loads(raw.decode())
        name, digest = record["file"], record["sha256"]
        if not isinstance(name, str) or Path(name).name != name or not name.endswith(".so"):
            raise ValueError(f"file {name!r} is not a library name in this directory")
        if not isinstance(digest, str) or len(digest) != 64:
            raise ValueError(f"sha256 {digest!r} is not a sha256 digest")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        return f"{path} is not a build record ({exc})"
    return record


def verified_library(directory: Path) -> Path | None | str:
    """The library ``directory``'s record names, once its bytes match the recorded sha256; None
    when nothing is built; a str saying why what is there must not be loaded."""
    found = open_verified(directory)
    if isinstance(found, tuple):
        os.close(found[0])
        return found[1]
    return found


def open_verified(directory: Path) -> tuple[int, Path] | None | str:
    """Like ``verified_library``, with the library open: ``(fd, path)``, where the bytes hashed are
    the ones read through ``fd``, so loading ``/proc/self/fd/<fd>`` maps exactly the file that was
    checked, whatever happens to the path meanwhile. The caller closes ``fd``, or, once a library
was loaded through it, hands it to ``keep``."""
    why = untrusted(directory)
    if why:
        return why
    record = read_record(directory)
    if record is None or isinstance(record, str):
        return record
    library = directory / record["file"]
    try:
        fd = os.open(library, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return f"the recorded library {library} cannot be opened: {exc}"
    try:
        st = os.fstat(fd)
        why = (f"the recorded library {library} is not a regular file" if not stat.S_ISREG(st.st_mode)
               else _owned_privately(library, st))
        if not why:
            digest = hashlib.sha256()
            with os.fdopen(os.dup(fd), "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
            if digest.hexdigest() != record["sha256"]:
                why = (f"{library} does not match the sha256 recorded when it was built "
                       f"({digest.hexdigest()[:16]}... vs {record['sha256'][:16]}...): it was altered or replaced")
    except OSError as exc:
        why = f"the recorded library {library} cannot be read: {exc}"
    if why:
        os.close(fd)
        return why
    os.lseek(fd, 0, os.SEEK_SET)
    return fd, library


_LOADED_FDS: list[int] = []  # fds that libraries were loaded from: open for the process


def fd_path(fd: int, library: Path) -> str:
    """The path that loads the file open as ``fd`` (``/proc/self/fd/<fd>``: the inode that was
    hashed, whatever ``library`` names now), or ``library`` where the platform has no /proc.
    Once the load succeeded, hand ``fd`` to ``keep``."""
    return f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else str(library)


def keep(fd: int) -> None:
    """Keep ``fd`` open for the process: a library was loaded from ``/proc/self/fd/<fd>``. The
    dynamic loader matches a library by the path it was loaded from before it looks at the file,
    so once ``fd`` closed and its number came back for another file, a ``dlopen`` of that path
    would return the library loaded before (it happened: a bundled CuTe DSL runtime opened from a
    memfd got the native replay extension, loaded through the same fd number, in its place)."""
    _LOADED_FDS.append(fd)


def _write_atomically(directory: Path, name: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, directory / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build(directory: Path, source: Path | list[Path], name: str = NAME, python_module: bool = True) -> Path:
    """Compile ``source`` (one file or several; headers beside the first are found) into
    ``directory`` unless a verified build is already there; returns the library. A build killed
    midway leaves only a ``build-*`` folder, removed by the next one (``filelock`` holds an OS
    lock, released when its process dies, unlike torch's lock file)."""
    sources = [Path(s) for s in (source if isinstance(source, (list, tuple)) else [source])]
    from filelock import FileLock
    from torch.utils import cpp_extension

    why = untrusted(directory)
    if why:
        raise PermissionError(f"refusing to build the native replay: {why}")
    with FileLock(str(directory / "build.lock")):
        done = verified_library(directory)
        if isinstance(done, Path):
            return done
        for stale in directory.glob("build-*"):  # left by a process that died building
            shutil.rmtree(stale, ignore_errors=True)
        if not cpp_extension.is_ninja_available():
            raise RuntimeError("ninja is not installed (pip install ninja)")
        work = Path(tempfile.mkdtemp(prefix="build-", dir=directory))
        try:
            cpp_extension.load(name, [str(s) for s in sources], build_directory=str(work), extra_cflags=["-O2"],
                               extra_include_paths=[str(sources[0].parent)], extra_ldflags=["-ldl", *LDFLAGS],
                               is_python_module=python_module, verbose=False)
            data = (work / f"{name}.so").read_bytes()
        finally:
            shutil.rmtree(work, ignore_errors=True)
        digest = hashlib.sha256(data).hexdigest()
        library = f"{name}-{digest[:16]}.so"
        _write_atomically(directory, library, data)
        record = {"file": library, "sha256": digest,
                  "source_sha256": hashlib.sha256(b"".join(s.read_bytes() for s in sources)).hexdigest()}
        _write_atomically(directory, RECORD, json.dumps(record, indent=1).encode())
        for old in directory.glob(f"{name}*.so"):  # earlier builds no record names any more
            if old.name != library:
                old.unlink(missing_ok=True)
        return directory / library


def main(argv: list[str]) -> int:
    args = list(argv[1:])
    name, python_module = NAME, True
    if "--library" in args:
        at = args.index("--library")
        name, python_module = args[at + 1], False
        del args[at:at + 2]
    if len(args) < 2:
        print(f"usage: {argv[0]} DIRECTORY SOURCE [SOURCE ...] [--library NAME]", file=sys.stderr)
        return 2
    try:
        print(build(Path(args[0]), [Path(s) for s in args[1:]], name, python_module))
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
