"""Which kernel libraries are importable here, with their versions, or why not.

A library kernel's launch function names its library and version in a closure value, so the op's
fingerprint (and with it the tuning key) changes when the library is upgraded.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata

__all__ = ["library", "unavailable"]

# distribution -> (module to import, minimum version, how to install)
_LIBRARIES = {
    "quack-kernels": ("quack", "0.6.5", "pip install 'quack-kernels>=0.6.5' (needs nvidia-cutlass-dsl>=4.7)"),
    "liger-kernel": ("liger_kernel.ops", "0.8.5", "pip install 'liger-kernel>=0.8.5'"),
}


def _tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts)


@functools.cache
def library(dist: str) -> tuple[str | None, str | None]:
    """(``"<dist> <version>"``, None) when ``dist`` imports here at its minimum version or newer,
    else (None, why not, with how to install it)."""
    module, minimum, install = _LIBRARIES[dist]
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None, f"{dist} is not installed ({install})"
    if _tuple(version) < _tuple(minimum):
        return None, f"{dist} {version} is installed, these kernels need {minimum} or newer ({install})"
    try:
        importlib.import_module(module)
    except Exception as exc:  # an install whose imports fail (say, an older nvidia-cutlass-dsl)
        text = (str(exc).splitlines() or [""])[0][:200]
        return None, f"{dist} {version} does not import here ({type(exc).__name__}: {text}); {install}"
    return f"{dist} {version}", None


def unavailable(reason: str):
    """A ``supports`` predicate that refuses every call with ``reason`` (the library is missing)."""

    def supports(*args, **config):
        return reason

    return supports
