"""The protocol every backend implements, and the name -> backend registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from .._spec import Config, ImplSpec

__all__ = ["Backend", "register", "get", "names"]

Runner = Callable[..., Any]


class Backend(Protocol):
    """What the op needs from a backend. One module per backend implements it."""

    name: str
    # True when every launch goes through kernelgraft's own launch paths (the driver launcher, the
    # CuTe DSL packed call), which describe it to the native replay's recorder (kernelgraft._native).
    replayable: bool = False

    def available(self) -> str | None:
        """None when the backend can run in this process, else the reason it cannot."""

    def device_reason(self, device: torch.device) -> str | None:
        """None when the backend can run on ``device``, else the reason it cannot."""

    def bind(self, spec: ImplSpec, config: Config) -> Runner:
        """A callable ``runner(*inputs, *outputs)`` launching ``spec`` with ``config`` on the
        current stream. Compilation may happen here or on the first call; either is cached."""


_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    _REGISTRY[backend.name] = backend
    return backend


def get(name: str) -> Backend:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no kernelgraft backend named {name!r}; known: {sorted(_REGISTRY)}") from None


def names() -> list[str]:
    return sorted(_REGISTRY)
