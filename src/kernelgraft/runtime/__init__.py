"""The C++ runtime: serves bundles to processes without kernelgraft's Python (libtorch programs,
AOTInductor packages, Python processes where ``kernelgraft`` or ``triton`` do not import).

Its source ships in this package (``csrc/``); ``library()`` builds it once with torch's C++
extension tools, in a child process, into ``<kernelgraft cache>/runtime/<torch>-<source hash>/``
(the native replay's build machinery: a build record with the library's sha256, checked before
every load, in a directory that must be this user's alone). A C++ program links or ``dlopen``s
the library; Python loads it with ``torch.ops.load_library`` and then::

    torch.ops.kernelgraft.load_bundle("bundle/", key=None, arch=None, allow_native=False)   # -> the op names

which verifies the bundle (checksums, the HMAC signature with ``key``: a key file), holds it to the
bundle spec the Python loader enforces too (``kernelgraft.aot.bundle_spec``: caps, names, a schema
that is exactly the recorded parameters; ``csrc/spec.cpp``), registers each op under its schema
with a CUDA kernel and a Meta kernel, and returns the op names. CuTe DSL
candidates are shared libraries (native code): they are loaded from a bundle verified with a key,
or with ``allow_native=True``; otherwise left out with a warning. A process that sets
``KERNELGRAFT_BUNDLES=DIR[:DIR...]`` (with ``KERNELGRAFT_BUNDLE_KEY``, ``KERNELGRAFT_BUNDLE_ARCH`` and
``KERNELGRAFT_BUNDLE_ALLOW_NATIVE=1`` if needed) gets those bundles loaded when the library loads.

>>> from kernelgraft import runtime
>>> so = runtime.library()  # doctest: +SKIP
>>> import torch; torch.ops.load_library(so)  # doctest: +SKIP
>>> torch.ops.kernelgraft.load_bundle("bundle/", arch="sm_90")  # doctest: +SKIP
['kgexamples::add_relu', 'kgexamples::rmsnorm']
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from ..native import builder as _build

__all__ = ["SOURCE_DIR", "sources", "directory", "library", "load", "load_bundle"]

log = logging.getLogger(__name__)
SOURCE_DIR = Path(__file__).with_name("csrc")
NAME = "kernelgraft_runtime"
_BUILD_TIMEOUT_S = 1800  # a cold build on a busy 2-core machine takes minutes


def sources() -> list[Path]:
    """The translation units (headers are found beside them)."""
    return sorted(SOURCE_DIR.glob("*.cpp")) + [SOURCE_DIR / "third_party" / "sha256.cpp"]


def _tag() -> str:
    import torch

    digest = hashlib.sha256()
    for path in sorted(p for p in SOURCE_DIR.rglob("*") if p.is_file()):
        digest.update(path.relative_to(SOURCE_DIR).as_posix().encode() + b"\0" + path.read_bytes())
    digest.update(" ".join(_build.LDFLAGS).encode())  # the link flags too: other flags, another build
    tag = f"torch{torch.__version__}-{digest.hexdigest()[:16]}"
    return tag.replace("+", "_")


def directory() -> Path:
    """The build directory for this torch and runtime source (created private: 0700)."""
    from ..cache.code import cache_root

    root = cache_root()
    base = root / "runtime" if root is not None else Path(tempfile.mkdtemp(prefix="kernelgraft-runtime-"))
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = base / _tag()
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def library() -> Path:
    """The runtime's shared library, built first if needed (minutes, in a child process).

    Raises ``CompileError`` saying why it cannot be built or why the build there must not load."""
    from ..errors import CompileError

    path = directory()
    why = _build.untrusted(path.parent) or _build.untrusted(path)
    if why:
        raise CompileError(f"refusing to build or load the kernelgraft runtime: {why}")
    found = _build.verified_library(path)
    if isinstance(found, Path):
        return found
    if isinstance(found, str):
        log.warning("%s; rebuilding the runtime", found)
    flags = ["-P"] if sys.version_info >= (3, 11) else []  # keep _native/ off the child's path
    log.info("building the kernelgraft C++ runtime into %s", path)
    with open(path / "build.log", "wb") as log_file:
        proc = subprocess.run([sys.executable, *flags, _build.__file__, str(path), *map(str, sources()),
                               "--library", NAME], stdin=subprocess.DEVNULL, stdout=log_file,
                              stderr=subprocess.STDOUT, timeout=_BUILD_TIMEOUT_S)
    found = _build.verified_library(path)
    if proc.returncode != 0 or not isinstance(found, Path):
        tail = (path / "build.log").read_text(errors="replace").strip().splitlines()[-20:]
        raise CompileError(f"the kernelgraft runtime did not build (exit status {proc.returncode}); "
                           f"see {path / 'build.log'}:\n" + "\n".join(tail))
    return found


_LOADED: list[Path] = []  # the runtime this process loaded (once: a second load_library is a no-op)
_LOAD_LOCK = threading.Lock()


def load() -> Path:
    """``torch.ops.load_library`` of the runtime (built first if needed), once per process;
    returns its path."""
    import torch

    with _LOAD_LOCK:
        if _LOADED:
            return _LOADED[0]
        so = library()
        found = _build.open_verified(so.parent)  # the bytes hashed are the bytes loaded (see _native)
        if not isinstance(found, tuple):
            from ..errors import CompileError

            raise CompileError(f"the kernelgraft runtime at {so} cannot be loaded: {found or 'no build record'}")
        fd, checked = found
        try:
            torch.ops.load_library(_build.fd_path(fd, checked))
        except BaseException:
            os.close(fd)
            raise
        _build.keep(fd)  # loaded from /proc/self/fd/<fd>: the number must not come back
        _LOADED.append(checked)
        return checked


def load_bundle(path: str | Path, *, key: str | Path | None = None, arch: str | None = None,
                allow_native: bool = False) -> list[str]:
    """Serve the bundle in ``path`` through the C++ runtime; returns the op names it holds.

    ``allow_native``: load CuTe DSL candidates (shared libraries: their code runs in this process)
    from an unsigned bundle; a bundle verified with ``key`` loads them anyway."""
    import torch

    load()
    return list(torch.ops.kernelgraft.load_bundle(str(path), None if key is None else str(key), arch, allow_native))
