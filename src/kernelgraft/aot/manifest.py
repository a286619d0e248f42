"""The bundle on disk: ``manifest.json`` (JSON only: no pickle, no code) and ``bin/<sha>.<kind>``.

The manifest carries a ``checksum``: the sha256 of its own canonical JSON without that field, so
an edited or truncated manifest is refused; every binary is named in it with its sha256 and size,
checked when it is read. These checks are unkeyed: they catch corruption and careless edits, not
someone who recomputes the sums (``_sign`` adds a keyed signature for that). A bundle is untrusted
input: ``read`` holds it to the bundle spec (``_bundle_spec``: JSON rules, caps, names, the schema
grammar, programs) before anything else looks at it, and every file is read by ``Reads``: regular
files only (no symlink, FIFO or device), each stat'ed and refused over its cap before a byte is
read, each read once per load, all of a load's reads charged to one budget. So a hostile bundle
fails with ``BundleError`` instead of hanging or exhausting memory. Writes go to a temporary file and
``os.replace``.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from ..errors import BundleError
from .bundle_check import check_manifest
from .bundle_spec import limit, loads, table

__all__ = ["FORMAT", "VERSION", "READS", "Reads", "write", "read", "parse", "store_binary",
           "read_binary", "read_file", "canonical", "normalize_arch", "MAX_MANIFEST_BYTES", "MAX_BINARY_BYTES",
           "MAX_DEPTH"]

FORMAT = "kernelgraft-bundle"
# The version this kernelgraft writes. 2: every expression also as an RPN program, op "meta" rules
# and "decisions" (the C++ runtime's data); 3: kernels pinned to string arguments ("pinned": {name:
# value}); 4: one RPN program per guard (2 and 3 joined the guards into one program, which loaders
# no longer read: the bundle spec's versions). Pins are written in any version from 3 on.
VERSION = 4
READS = tuple(sorted(table().versions))
# "so": a CuTe DSL kernel's shared library, "runtime": the native library it needs (native code: see _load)
_KINDS = {"cubin": ".cubin", "ptx": ".ptx", "so": ".so", "runtime": ".so"}
_REQUIRED = ("format", "version", "archs", "toolchain", "ops", "checksum")
# The bundle spec's caps (runtime/csrc/bundle_spec.h), under the names callers know.
MAX_MANIFEST_BYTES = limit("MANIFEST_BYTES")
MAX_BINARY_BYTES = limit("FILE_BYTES")
MAX_DEPTH = limit("JSON_DEPTH")


def normalize_arch(arch: object) -> str:
    """``'sm_90'`` for ``'sm_90'``, ``'sm90'``, ``'90'``, ``'9.0'`` or ``90``; BundleError otherwise."""
    text = str(arch).lower().strip().replace(".", "")
    digits = text.removeprefix("sm").removeprefix("_")
    number = digits[:-1] if digits.endswith("a") else digits
    if not (number.isdigit() and 2 <= len(number) <= 3):
        raise BundleError(f"arch {arch!r} is not a CUDA arch; write sm_90, sm_100, sm_90a, ...")
    return f"sm_{digits}"


class Reads:
    """The files one load reads: each at most once (later reads get the same bytes, which is also
    how a signed bundle's verified bytes are the ones used), all charged to ``TOTAL_BYTES``."""

    def __init__(self, root: str | Path) -> None:
        self.root = root
        self.total = 0
        self.files: dict[str, bytes] = {}
        self._sha256: dict[str, str] = {}

    def sha256(self, name: str) -> str:
        """The sha256 of a file read before, computed once."""
        found = self._sha256.get(name)
        if found is None:
            found = self._sha256[name] = hashlib.sha256(self.files[name]).hexdigest()
        return found

    def file(self, name: str, cap: int, size: int | None = None) -> bytes:
        found = self.files.get(name)
        if found is None:
            found = self.files[name] = read_file(self.root, name, cap, size=size, reads=self)
        elif size is not None and len(found) != size:
            raise BundleError(f"bundle {self.root}: {name} is {len(found)} bytes, the manifest says {size}")
        return found

    def charge(self, name: str, size: int) -> None:
        self.total += size
        if self.total > limit("TOTAL_BYTES"):
            raise BundleError(f"bundle {self.root}: reading {name} passes the cap of {limit('TOTAL_BYTES')} bytes "
                              "read from one bundle (TOTAL_BYTES)")


def read_file(root: str | Path, name: str, limit: int, *, size: int | None = None,
              reads: Reads | None = None) -> bytes:
    """The bytes of ``root/name``, a regular file of at most ``limit`` bytes (and of exactly
    ``size`` when given), charged to ``reads``; BundleError otherwise.

    Opened without following a final symlink and without blocking, so a FIFO or a link to
    ``/dev/zero`` is refused at once instead of hanging or filling memory; its size is checked
    before a byte is read, and at most ``limit + 1`` bytes are read."""
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
        if size is not None and info.st_size != size:
            raise BundleError(f"bundle {root}: {name} is {info.st_size} bytes, the manifest says {size}")
        if reads is not None:
            reads.charge(name, info.st_size)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise BundleError(f"bundle {root}: cannot read {name}: {exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:  # grew while being read
        raise BundleError(f"bundle {root}: {name} is over the {limit}-byte cap")
    if len(data) != info.st_size:
        raise BundleError(f"bundle {root}: {name} changed while being read")
    return data


def parse(root: str | Path, text: bytes, name: str = "manifest.json") -> Any:
    """JSON of a bundle file under the bundle spec's JSON rules (UTF-8, finite numbers, int64,
    no repeated key, bounded nesting)."""
    return loads(text, f"bundle {root}: {name}")


def canonical(manifest: dict) -> bytes:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


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
    try:
        manifest["checksum"] = hashlib.sha256(canonical(manifest)).hexdigest()
        # Compact: indentation tripled the size of a bundle's RPN token lists (the checksum is over
        # ``canonical``, so the layout of the file is free; ``python -m json.tool`` shows it indented).
        text = json.dumps(manifest, sort_keys=True, separators=(",", ":"), allow_nan=False).encode() + b"\n"
    except ValueError as exc:  # NaN or infinity (a default of float("inf")): JSON has no such number
        raise BundleError(f"bundle {root}: the manifest holds a number JSON cannot (NaN or infinity: {exc}); "
                          "a bundle stores finite numbers only") from None
    path = Path(root) / "manifest.json"
    _atomic_write(path, text)
    return path


def read(root: str | Path, text: bytes | None = None, reads: Reads | None = None) -> dict[str, Any]:
    """The manifest of a bundle directory (or its bytes ``text``, already read and verified by the
    caller), checked for format, version and checksum, then held to the bundle spec."""
    if text is None:
        if not (Path(root) / "manifest.json").exists() and not (Path(root) / "manifest.json").is_symlink():
            raise BundleError(f"bundle {root}: no manifest.json; build one with "
                              "`kernelgraft aot TARGET --arch sm_90 -o DIR`")
        text = (reads or Reads(root)).file("manifest.json", MAX_MANIFEST_BYTES)
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
    check_manifest(manifest, f"bundle {root}: manifest.json")
    return manifest


def read_binary(root: str | Path, image: dict, reads: Reads | None = None) -> bytes:
    """A binary named in the manifest, after checking its size and sha256."""
    if not isinstance(image, dict):
        raise BundleError(f"bundle {root}: a binary entry is {type(image).__name__}, not an object")
    name = str(image.get("file", ""))
    if not name.startswith("bin/") or ".." in name or "/" in name[4:]:
        raise BundleError(f"bundle {root}: binary path {name!r} is outside the bundle's bin/")
    size = image.get("bytes") if type(image.get("bytes")) is int else None
    if reads is not None:
        data = reads.file(name, MAX_BINARY_BYTES, size)
        got = reads.sha256(name)
    else:
        data = read_file(root, name, MAX_BINARY_BYTES, size=size)
        got = hashlib.sha256(data).hexdigest()
    if got != image.get("sha256"):
        raise BundleError(f"bundle {root}: checksum mismatch for {name}: manifest says "
                          f"{str(image.get('sha256'))[:16]}..., file has {got[:16]}...; the binary was "
                          "modified or corrupted; rebuild the bundle")
    return data
