"""The protocols a backend implements: ``Backend`` (what the op needs to run a spec: availability, the
devices it runs on, a bound runner) and ``AotPath`` (what a bundle needs: record a launch on fake
inputs, compile it for an arch). A backend is a folder under ``kernelgraft/backends/`` (or a package
elsewhere, registered through the ``kernelgraft.backends`` entry point) whose ``BACKEND`` object
implements both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from ..spec import Config, ImplSpec

__all__ = ["Backend", "AotPath", "Runner"]

Runner = Callable[..., Any]


class Backend(Protocol):
    """What the op needs from a backend. One module per backend implements it."""

    name: str
    # True when every launch goes through kernelgraft's own launch paths (the driver launcher, the
    # CuTe DSL packed call), which describe it to the native replay's recorder (kernelgraft.native).
    replayable: bool = False

    def available(self) -> str | None:
        """None when the backend can run in this process, else the reason it cannot."""

    def device_reason(self, device: torch.device) -> str | None:
        """None when the backend can run on ``device``, else the reason it cannot."""

    def bind(self, spec: ImplSpec, config: Config) -> Runner:
        """A callable ``runner(*inputs, *outputs)`` launching ``spec`` with ``config`` on the
        device of its tensors and that device's current stream (``on_tensor_device``).
        Compilation may happen here or on the first call; either is cached per device."""

    def aot(self) -> "AotPath | None":
        """The backend's AOT path (imported on first use: only bundles need it), or None."""


class AotPath(Protocol):
    """What ``kernelgraft aot`` needs from a backend, per (candidate, signature): ``record`` runs the
    launch function on fake inputs whose sizes are symbols (``kernelgraft.symbolic.trace.Context``)
    and returns a JSON-able description of the one launch it makes; ``compile_call`` turns that
    description into a manifest entry and its binary images for one arch."""

    def toolchain_version(self) -> str:
        """The compiler's version (recorded in the bundle); raises when the toolchain is missing."""

    def record(self, ctx: Any, args: tuple, kwargs: dict, spec: ImplSpec) -> dict:
        """The launch ``spec``'s launch function makes on ``ctx``'s fake inputs."""

    def compile_call(self, call: dict, arch: str) -> tuple[dict, dict[str, bytes]]:
        """(manifest entry, {kind: image bytes}) of one recorded launch compiled for ``arch``."""
