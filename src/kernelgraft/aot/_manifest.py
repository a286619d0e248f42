"""The bundle on disk: ``manifest.json`` (JSON only: no pickle, no code) and ``bin/<sha>.<kind>``.

The manifest carries a ``checksum``: the sha256 of its own canonical JSON without that field, so
an edited or truncated manifest is refused; every binary is named in it with its sha256, checked
when it is read. These checks are unkeyed: they catch corruption and careless edits, not someone
who recomputes the sums (``_sign`` adds a keyed signature for that). A bundle is untrusted input:
only regular files are read (no symlink, FIFO or device), each under a size cap, and the manifest's
JSON nesting is bounded, so a hostile bundle fails with ``BundleError`` instead of hanging or
exhausting memory. Writes go to a temporary file and ``os.replace``.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from .._errors import BundleError

__all__ = ["FORMAT", "VERSION", "PINNED_VERSION", "READS", "write", "read", "parse", "store_binary", "read_binary", "read_file",
           "canonical", "normalize_arch", "MAX_MANIFEST_BYTES", "MAX_BINARY_BYTES", "MAX_DEPTH"]

FORMAT = "kernelgraft-bundle"
# 2: every expression also as an RPN program, op "meta" rules and "decisions" (the C++ runtime's data)
VERSION = 2
PINNED_VERSION = 3  # version 2 plus kernels pinned to string arguments ("pinned": {name: value})
READS = (1, 2, 3)
# "so": a CuTe DSL kernel's shared library, "runtime": the native library it needs (native code: see _load)
_KINDS = {"cubin": ".cubin", "ptx": ".ptx", "so": ".so", "runtime": ".so"}
_REQUIRED = ("format", "version", "archs", "toolchain", "ops", "checksum")
# Far above what a real bundle needs (a manifest of two ops is ~250 KB, a cubin tens of KB; the
# deepest manifest path is ~12 levels) and far below what would exhaust a host's memory.
MAX_MANIFEST_BYTES = 64 << 20
MAX_BINARY_BYTES = 256 << 20
MAX_DEPTH = 32


def normalize_arch(arch: object) -> str:
    """``'sm_90'`` for ``'sm_90'``, ``'sm90'``, ``'90'``, ``'9.0'`` or ``90``; BundleError otherwise."""
    text = str(arch).lower().strip().replace(".", "")
    digits = text.removeprefix("sm").removeprefix("_")
    number = digits[:-1] if digits.endswith("a") else digits
    if not (number.isdigit() and 2 <= len(number) <= 3):
        raise BundleError(f"arch {arch!r} is not a CUDA arch; write sm_90, sm_100, sm_90a, ...")
    return f"sm_{digits}"


def read_file(root: str | Path, name: str, limit: int) -> bytes:
    """The bytes of ``root/name``, a regular file of at most ``limit`` bytes (BundleError otherwise).

    Opened without following a final symlink and without blocking, so a FIFO or a link to
    ``/dev/zero`` is refused at once instead of hanging or filling memory."""
    path = Path(root) / name
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        why = "it is a symlink" if path.is_symlink() else exc.strerror or exc
        raise BundleError(f"bundle {root}: cannot read {name} ({why}); a bundle holds regular files only") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BundleError(f"bundle {root}: {name} is not a regular file (mode {stat.filemode(info.st_mode)}); "
                              "a bundle holds regular files only")
        if info.st_size > limit:
            raise BundleError(f"bundle {root}: {name} is {info.st_size} bytes, over the {limit}-byte cap")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise BundleError(f"bundle {root}: cannot read {name}: {exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:  # grew while being read
        raise BundleError(f"bundle {root}: {name} is over the {limit}-byte cap")
    return data


def _check_depth(value: Any, root: str | Path) -> None:
    """Iteratively (a recursive walk is what a deep document would break) bound the nesting."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BundleError(f"bundle {root}: manifest.json nests deeper than {MAX_DEPTH} levels")
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def parse(root: str | Path, text: bytes) -> Any:
    """JSON of a manifest, with its size and nesting bounded."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise BundleError(f"bundle {root}: manifest.json nests deeper than {MAX_DEPTH} levels") from None
    except (ValueError, MemoryError) as exc:  # UnicodeDecodeError is a ValueError
        raise BundleError(f"bundle {root}: manifest.json is not valid JSON ({exc})") from None
    _check_depth(value, root)
    return value


def canonical(manifest: dict) -> bytes:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a bundle is read by other users and machines
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def store_binary(root: Path, image: bytes, kind: str) -> dict:
    digest = hashlib.sha256(image).hexdigest()
    name = f"bin/{digest[:24]}{_KINDS[kind]}"
    path = root / name
    if not path.exists():
        _atomic_write(path, image)
    return {"file": name, "sha256": digest, "bytes": len(image)}


def write(root: Path, manifest: dict) -> Path:
    manifest = dict(manifest)
    manifest["checksum"] = hashlib.sha256(canonical(manifest)).hexdigest()
    path = Path(root) / "manifest.json"
    # Compact: indentation tripled the size of a bundle's RPN token lists (the checksum is over
    # ``canonical``, so the layout of the file is free; ``python -m json.tool`` shows it indented).
    _atomic_write(path, json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    return path


def read(root: str | Path, text: bytes | None = None) -> dict[str, Any]:
    """The manifest of a bundle directory (or its bytes ``text``, already read and verified by the
    caller), checked for size, nesting, format, version and checksum."""
    if text is None:
        if not (Path(root) / "manifest.json").exists():
            raise BundleError(f"bundle {root}: no manifest.json; build one with "
                              "`kernelgraft aot TARGET --arch sm_90 -o DIR`")
        text = read_file(root, "manifest.json", MAX_MANIFEST_BYTES)
    manifest = parse(root, text)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"bundle {root}: manifest.json is not a kernelgraft bundle manifest")
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise BundleError(f"bundle {root}: manifest.json lacks {missing}")
    if type(manifest["version"]) is not int or manifest["version"] not in READS:
        raise BundleError(f"bundle {root}: manifest version {manifest['version']!r}, this kernelgraft "
                          f"reads versions {', '.join(map(str, READS))}; rebuild the bundle with this kernelgraft")
    want = hashlib.sha256(canonical(manifest)).hexdigest()
    if manifest["checksum"] != want:
        raise BundleError(f"bundle {root}: manifest.json checksum mismatch (recorded "
                          f"{str(manifest['checksum'])[:16]}..., content {want[:16]}...): the manifest "
                          "was modified or corrupted after it was built; rebuild the bundle")
    return manifest


def read_binary(root: str | Path, image: dict) -> bytes:
    """A binary named in the manifest, after checking its sha256."""
    if not isinstance(image, dict):
        raise BundleError(f"bundle {root}: a binary entry is {type(image).__name__}, not an object")
    name = str(image.get("file", ""))
    if not name.startswith("bin/") or ".." in name or "/" in name[4:]:
        raise BundleError(f"bundle {root}: binary path {name!r} is outside the bundle's bin/")
    data = read_file(root, name, MAX_BINARY_BYTES)
    got = hashlib.sha256(data).hexdigest()
    if got != image.get("sha256"):
        raise BundleError(f"bundle {root}: checksum mismatch for {name}: manifest says "
                          f"{str(image.get('sha256'))[:16]}..., file has {got[:16]}...; the binary was "
                          "modified or corrupted; rebuild the bundle")
    return data
