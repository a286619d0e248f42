"""Keyed bundle signatures: HMAC-SHA256 (stdlib ``hmac``) over ``manifest.json`` and every file in
``bin/``, stored in ``signature.json`` beside the manifest.

The unkeyed sha256 sums in the manifest catch corruption; anyone who edits a bundle can recompute
them. A signature can only be made with the key, so ``load_bundle(path, key=...)`` refuses a bundle
that is unsigned, signed with another key, or changed after signing (a file modified, added or
removed), naming what changed. Each file's MAC covers its name as well as its bytes, so files cannot
be swapped. The key is a secret shared by whoever builds and whoever loads (a file of at least 16
bytes, e.g. ``python -c "import secrets; print(secrets.token_hex(32))" > bundle.key``).

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp()); (d / "bin").mkdir(); _ = (d / "manifest.json").write_text("{}")
>>> _ = sign_bundle(d, b"0123456789abcdef")
>>> verify_bundle(d, b"0123456789abcdef")
b'{}'
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from pathlib import Path

from ..errors import BundleError
from .bundle_spec import limit
from .manifest import MAX_BINARY_BYTES, MAX_MANIFEST_BYTES, Reads, _atomic_write, parse

__all__ = ["sign_bundle", "verify_bundle", "load_key", "SIGNATURE"]

SIGNATURE = "signature.json"
FORMAT = "kernelgraft-bundle-signature"
_ALGORITHM = "hmac-sha256"
_MIN_KEY = 16
_SHA256_HEX = re.compile(r"[0-9a-f]{64}\Z")
_NAME = re.compile(r"(manifest\.json|bin/[A-Za-z0-9_-][A-Za-z0-9_.-]*)\Z")


def load_key(key: bytes | str | os.PathLike) -> bytes:
    """The key itself (``bytes``) or read from a key file (``str`` or path; surrounding whitespace,
    such as a trailing newline, is not part of the key)."""
    if isinstance(key, (bytes, bytearray)):
        data = bytes(key)
        where = "the key"
    elif isinstance(key, (str, os.PathLike)):
        path = Path(key)
        try:
            data = path.read_bytes()[:65536].strip()
        except OSError as exc:
            raise BundleError(f"cannot read the bundle key file {path}: {exc.strerror or exc}") from None
        where = f"key file {path}"
    else:
        raise BundleError(f"a bundle key is bytes or the path of a key file, got {type(key).__name__}")
    if len(data) < _MIN_KEY:
        raise BundleError(f"{where} has {len(data)} bytes; a bundle key needs at least {_MIN_KEY} "
                          "(make one: python -c \"import secrets; print(secrets.token_hex(32))\" > bundle.key)")
    return data


def _mac(key: bytes, name: str, data: bytes) -> str:
    return hmac.new(key, name.encode() + b"\0" + data, hashlib.sha256).hexdigest()


def _files(root: Path) -> list[str]:
    """manifest.json and every entry of bin/ (listed only up to the FILES cap)."""
    cap = limit("FILES")
    entries = []
    try:
        with os.scandir(root / "bin") as it:
            for entry in it:
                entries.append(entry.name)
                if len(entries) > cap:
                    raise BundleError(f"bundle {root}: bin/ holds more than {cap} files, over the cap (FILES)")
    except OSError as exc:
        raise BundleError(f"bundle {root}: cannot list bin/: {exc.strerror or exc}") from None
    return ["manifest.json"] + [f"bin/{e}" for e in sorted(entries)]


def _read(reads: Reads, name: str) -> bytes:
    return reads.file(name, MAX_MANIFEST_BYTES if name == "manifest.json" else MAX_BINARY_BYTES)


def _seal(key: bytes, files: dict[str, str]) -> str:
    return _mac(key, SIGNATURE, json.dumps(files, sort_keys=True, separators=(",", ":")).encode())


def sign_bundle(path: str | Path, key: bytes | str | os.PathLike) -> Path:
    """Write ``signature.json`` for the bundle in ``path`` (after it is built); returns its path."""
    root, secret = Path(path), load_key(key)
    reads = Reads(root)
    files = {name: _mac(secret, name, _read(reads, name)) for name in _files(root)}
    body = {"format": FORMAT, "version": 1, "algorithm": _ALGORITHM, "files": files,
            "mac": _seal(secret, files)}
    out = root / SIGNATURE
    _atomic_write(out, json.dumps(body, indent=1, sort_keys=True).encode())
    return out


def verify_bundle(path: str | Path, key: bytes | str | os.PathLike, reads: Reads | None = None) -> bytes:
    """Check the bundle's signature with ``key``; returns the verified bytes of ``manifest.json``
    (parse those, not a second read of the file; ``reads`` keeps every verified file's bytes, which
    the loader then uses). BundleError naming what was modified otherwise."""
    root, secret = Path(path), load_key(key)
    reads = reads if reads is not None else Reads(root)
    if not (root / SIGNATURE).exists() and not (root / SIGNATURE).is_symlink():
        raise BundleError(f"bundle {root} is not signed (no {SIGNATURE}) and a key was given; sign it with "
                          "`kernelgraft aot ... --sign KEYFILE` or load it without key=")
    body = parse(root, reads.file(SIGNATURE, limit("SIGNATURE_BYTES")), SIGNATURE)
    files = body.get("files") if isinstance(body, dict) else None
    if (not isinstance(body, dict) or body.get("format") != FORMAT or body.get("algorithm") != _ALGORITHM
            or not isinstance(files, dict) or len(files) > limit("FILES") + 1
            or not all(isinstance(v, str) and _SHA256_HEX.match(v) and _NAME.match(k) for k, v in files.items())):
        raise BundleError(f"bundle {root}: {SIGNATURE} is not a {_ALGORITHM} bundle signature")
    if not hmac.compare_digest(str(body.get("mac", "")), _seal(secret, files)):
        raise BundleError(f"bundle {root}: {SIGNATURE} does not verify with this key: it was signed with "
                          "another key or modified")
    present = _files(root)
    added = [n for n in present if n not in files]
    removed = [n for n in files if n not in present]
    if added or removed:
        raise BundleError(f"bundle {root} was modified after signing: "
                          + "; ".join(filter(None, [added and f"added {added[:5]}", removed and f"removed {removed[:5]}"])))
    manifest = b""
    for name in present:
        data = _read(reads, name)
        if not hmac.compare_digest(files[name], _mac(secret, name, data)):
            raise BundleError(f"bundle {root} was modified after signing: {name} differs from the signed file")
        if name == "manifest.json":
            manifest = data
    return manifest
