"""The bundle on disk: ``manifest.json`` (JSON only: no pickle, no code) and ``bin/<sha>.<kind>``.

The manifest carries a ``checksum``: the sha256 of its own canonical JSON without that field, so
an edited or truncated manifest is refused; every binary is named in it with its sha256, checked
when it is read. Writes go to a temporary file and ``os.replace``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .._errors import BundleError

__all__ = ["FORMAT", "VERSION", "write", "read", "store_binary", "read_binary", "canonical"]

FORMAT = "kernelgraft-bundle"
VERSION = 1
_KINDS = {"cubin": ".cubin", "ptx": ".ptx"}
_REQUIRED = ("format", "version", "archs", "toolchain", "ops", "checksum")


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
    _atomic_write(path, json.dumps(manifest, indent=1, sort_keys=True).encode())
    return path


def read(root: str | Path) -> dict[str, Any]:
    """The manifest of a bundle directory, checked for format, version and checksum."""
    path = Path(root) / "manifest.json"
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise BundleError(f"bundle {root}: cannot read manifest.json ({exc}); build one with "
                          "`kernelgraft aot TARGET --arch sm_90 -o DIR`") from None
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise BundleError(f"bundle {root}: manifest.json is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"bundle {root}: manifest.json is not a kernelgraft bundle manifest")
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise BundleError(f"bundle {root}: manifest.json lacks {missing}")
    if manifest["version"] != VERSION:
        raise BundleError(f"bundle {root}: manifest version {manifest['version']!r}, this kernelgraft "
                          f"reads version {VERSION}; rebuild the bundle with this kernelgraft")
    want = hashlib.sha256(canonical(manifest)).hexdigest()
    if manifest["checksum"] != want:
        raise BundleError(f"bundle {root}: manifest.json checksum mismatch (recorded "
                          f"{str(manifest['checksum'])[:16]}..., content {want[:16]}...): the manifest "
                          "was modified or corrupted after it was built; rebuild the bundle")
    return manifest


def read_binary(root: str | Path, image: dict) -> bytes:
    """A binary named in the manifest, after checking its sha256."""
    name = str(image.get("file", ""))
    if not name.startswith("bin/") or ".." in name or "/" in name[4:]:
        raise BundleError(f"bundle {root}: binary path {name!r} is outside the bundle's bin/")
    try:
        data = (Path(root) / name).read_bytes()
    except OSError as exc:
        raise BundleError(f"bundle {root}: cannot read {name}: {exc}") from None
    got = hashlib.sha256(data).hexdigest()
    if got != image.get("sha256"):
        raise BundleError(f"bundle {root}: checksum mismatch for {name}: manifest says "
                          f"{str(image.get('sha256'))[:16]}..., file has {got[:16]}...; the binary was "
                          "modified or corrupted; rebuild the bundle")
    return data
