"""The name -> backend registry. Filled in one place, ``kernelgraft.wiring``: the built-in backends
(one folder each under ``kernelgraft/backends/``) and any package that declares a backend under the
``kernelgraft.backends`` entry point group (its value: an object implementing ``base.Backend``, or a
module whose ``BACKEND`` is one)."""

from __future__ import annotations

import importlib.metadata
import logging
import warnings
from typing import Any

from ..errors import KernelgraftWarning
from .base import Backend

__all__ = ["register", "unregister", "get", "names", "aot_path", "load_entry_points", "ENTRY_POINT_GROUP"]

log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "kernelgraft.backends"
_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Make ``backend`` the one that serves specs whose ``backend`` is ``backend.name``."""
    name = getattr(backend, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(f"a kernelgraft backend needs a name that is an identifier, got {name!r}")
    for method in ("available", "device_reason", "bind"):
        if not callable(getattr(backend, method, None)):
            raise TypeError(f"kernelgraft backend {name!r} has no {method}() (see kernelgraft.backends.base.Backend)")
    _REGISTRY[name] = backend
    return backend


def unregister(name: str) -> Backend | None:
    """Forget the backend of that name (tests, plugins that unload); returns it."""
    return _REGISTRY.pop(name, None)


def get(name: str) -> Backend:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no kernelgraft backend named {name!r}; known: {sorted(_REGISTRY)}") from None


def names() -> list[str]:
    return sorted(_REGISTRY)


def aot_path(name: str) -> Any:
    """The AOT path (``base.AotPath``) of the backend ``name``: its ``aot()``, imported on first use;
    None for a backend that has none, or none registered under that name."""
    backend = _REGISTRY.get(name)
    get = getattr(backend, "aot", None)
    return get() if callable(get) else None


def load_entry_points() -> list[str]:
    """Register the backends packages declare under the ``kernelgraft.backends`` entry point group;
    returns their names. One that fails to load is left out with a warning naming it."""
    loaded = []
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            value = entry.load()
            backend = getattr(value, "BACKEND", value)
            register(backend)
        except Exception as exc:  # a broken plugin must not break kernelgraft's import
            warnings.warn(f"kernelgraft: the backend entry point {entry.name!r} ({entry.value}) did not "
                          f"load: {type(exc).__name__}: {exc}", KernelgraftWarning, stacklevel=2)
            continue
        loaded.append(backend.name)
        log.debug("backend %s registered from entry point %s", backend.name, entry.value)
    return loaded
