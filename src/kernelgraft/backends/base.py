"""The protocols a backend implements: ``Backend`` (what the op needs to run a spec: availability, the
devices it runs on, a bound runner) and ``AotPath`` (what a bundle and ``kernelgraft check`` need:
record a launch on fake inputs, compile it for an arch). A backend is a folder under
``kernelgraft/backends/`` (or a package elsewhere, registered through the ``kernelgraft.backends``
entry point) whose ``BACKEND`` object implements ``Backend``; its ``aot()`` returns the ``AotPath``.

The op, the tuner, ``kernelgraft check`` and ``kernelgraft aot`` ask these objects, never a
backend's name: adding a backend is adding a folder (or a package) and registering it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from ..spec import Config, ImplSpec

__all__ = ["Backend", "AotPath", "CompilesAhead", "Runner"]

Runner = Callable[..., Any]


class Backend(Protocol):
    """What the op needs from a backend. One module per backend implements it."""

    name: str
    # True when every launch goes through kernelgraft's own launch paths (the driver launcher, the
    # CuTe DSL packed call), which describe it to the native replay's recorder (kernelgraft.native).
    replayable: bool = False
    # True when its AOT toolchain is an optional extra: without it, `kernelgraft aot` skips its
    # candidates (saying why) instead of dropping them as failures.
    aot_optional: bool = False
    # The distributions whose versions change the code it generates: part of every tuning key, so
    # a toolchain upgrade tunes again (none given: the backend's name is looked up as one).
    distributions: tuple[str, ...] = ()

    def available(self) -> str | None:
        """None when the backend can run in this process, else the reason it cannot."""

    def device_reason(self, device: torch.device) -> str | None:
        """None when the backend can run on ``device``, else the reason it cannot."""

    def bind(self, spec: ImplSpec, config: Config) -> Runner:
        """A callable ``runner(*inputs, *outputs)`` launching ``spec`` with ``config`` on the
        device of its tensors and that device's current stream (``on_tensor_device``).
        Compilation may happen here or on the first call; either is cached per device."""

    def aot(self) -> "AotPath | None":
        """The backend's AOT path (imported on first use: only bundles and checks need it), or None."""


class CompilesAhead(Protocol):
    """Optional, on a ``Backend``: compiling a candidate in a worker process before the tuner's
    gate launches it (``kernelgraft.tune.compile_pool``). A backend without ``compile_ahead``
    compiles in the gate, as it would anyway."""

    def compile_ahead(self, spec: ImplSpec, config: Config, args: Sequence[Any], target: Any) -> tuple:
        """Compile what ``runner(*args)`` would compile, launching nothing: ``args`` are meta
        tensors with the real ones' dtypes, shapes, strides and alignment; ``target`` names the GPU
        (``.arch`` "sm_90", ``.capability`` 90, ``.warp_size``). Returns what the launching
        process must take in (``adopt``), or () when the compiled code is where the launch finds it
        (a disk cache)."""

    def adopt(self, artifact: Any) -> None:
        """Take in one artifact ``compile_ahead`` returned in a worker (only if it returns any)."""

    def warm_launches(self, device: torch.device) -> None:
        """Optional: compute now, in the process that launches, what its first launch of a
        candidate compiled ahead computes once per process (the tuner calls it while the workers
        compile, so the first gate does not pay it)."""


class AotPath(Protocol):
    """What ``kernelgraft aot`` needs from a backend, per (candidate, signature): ``record`` runs the
    launch function on fake inputs whose sizes are symbols (``kernelgraft.symbolic.trace.Context``)
    and returns a JSON-able description of the one launch it makes; ``compile_call`` turns that
    description into a manifest entry and its binary images for one arch (a ``cubin``, which every
    loader launches through ``kernelgraft.driver``; or a CuTe DSL library ``so`` with its
    ``runtime``). ``kernelgraft check`` compiles a candidate it cannot run through the same two
    functions, unless the path has its own ``check_compile``.

    Optional module attributes:

    - ``COMPILES``: how ``kernelgraft check`` names what it compiled ("the NVRTC kernel").
    - ``check_compile(spec, config, tensors, arch) -> None``: compile the candidate for ``tensors``
      (CPU stand-ins of the inputs, then the outputs) another way than the bundle's; raise
      ``kernelgraft.symbolic.expr.Unsupported`` when this path cannot build it here (a skip, not
      the candidate's fault), the compiler's error when the candidate does not compile.
    """

    def toolchain_version(self) -> str:
        """The compiler's version (recorded in the bundle); raises when the toolchain is missing."""

    def record(self, ctx: Any, args: tuple, kwargs: dict, spec: ImplSpec) -> dict:
        """The launch ``spec``'s launch function makes on ``ctx``'s fake inputs. Keys: ``grid``
        (3 expression texts), ``block`` (3 ints), ``shared_mem`` (a text), ``params`` (one per
        kernel parameter: ``{"kind": "ptr", "source": name}`` or ``{"kind": "i32", "expr": text}``),
        ``aligned`` (the sources assumed 16-byte aligned), ``untied_float``, ``guards``; and what
        ``compile_call`` needs. The key ``impl`` is kernelgraft's (the impl's fingerprint)."""

    def compile_call(self, call: dict, arch: str) -> tuple[dict, dict[str, bytes]]:
        """(manifest entry, {kind: image bytes}) of one recorded launch compiled for ``arch``."""
