"""Compile-only checks: a candidate that cannot run here (CUDA C++, cuTile or CuTe DSL without a
GPU, Triton without a GPU or its interpreter, a kernel for a newer GPU than this one) is still
compiled for a GPU arch, so a source that does not compile fails ``kernelgraft check`` instead of
passing as "skip".

Every backend with an AOT path (``kernelgraft.backends.base.AotPath``) is compiled through it: the
launch function runs on fake tensors and the recorded call is compiled for the arch, the very
kernel ``kernelgraft aot`` would build; a path with its own ``check_compile`` (cuTile exports the
sample's own cubin, CuTe DSL runs ``cute.compile`` alone) is given the sample instead. A limit of
these paths (say, a launch function making two Triton launches, which AOT refuses) is not the
candidate's fault: it stays a skip that says so. A compiler's error is the candidate's failure.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import torch

from .. import backends
from ..op.candidates import Candidate

__all__ = ["COMPILABLE", "NotCompiled", "Compiler", "compiler_message"]

log = logging.getLogger(__name__)

# Why a candidate could not run, for which a compile still proves something: it would run on a GPU.
COMPILABLE = ("device", "capability")


class NotCompiled(Exception):
    """The compile-only path cannot build this candidate; not a fault of the candidate."""


def compiler_message(exc: BaseException, limit: int = 600) -> str:
    """A compiler's error in one line: its error lines first (NVRTC's ``file(line): error: ...``),
    then the header naming the candidate, arch and compiler."""
    text = str(exc).strip() or type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines[1:] if "error" in line.lower()]
    body = errors or lines[1:4]
    head = lines[0] if lines else text
    message = " | ".join(body + [head]) if body else head
    return message if len(message) <= limit else message[: limit - 3] + "..."


def _arch_for(candidate: Candidate, default: str) -> str:
    need = candidate.impl.min_capability
    if need is None:
        return default
    have = int(default.removeprefix("sm_").rstrip("a"))
    wanted = need[0] * 10 + need[1]
    return f"sm_{need[0]}{need[1]}" if wanted > have else default


class Compiler:
    """Compiles the candidates of one op for ``arch``, each distinct kernel once."""

    def __init__(self, op: Any, arch: str = "sm_90") -> None:
        self.op = op
        self.arch = arch
        self._done: dict[str, BaseException | None] = {}

    def __call__(self, candidate: Candidate, args: tuple, out_specs) -> str:
        """What was compiled (a note); raises ``NotCompiled`` or the compiler's error."""
        arch = _arch_for(candidate, self.arch)
        backend = candidate.impl.backend
        path = backends.aot_path(backend)
        if path is None:
            raise NotCompiled(f"backend {backend} has no compile-only path")
        if callable(getattr(path, "check_compile", None)):
            self._own(path, candidate, args, out_specs, arch)
        else:
            self._aot(candidate, args, arch)
        what = getattr(path, "COMPILES", f"the {backend} kernel")
        return f"compiled {what} for {arch}, not run: {candidate.reason}"

    def _once(self, key: str, build) -> None:
        if key not in self._done:
            try:
                build()
                self._done[key] = None
            except Exception as exc:
                self._done[key] = exc
        failure = self._done[key]
        if failure is not None:
            raise failure

    def _aot(self, candidate: Candidate, args: tuple, arch: str) -> None:
        from ..aot.build import call_identity, compile_recorded, record_call
        from ..errors import UnsupportedError
        from ..symbolic.expr import Unsupported

        impl, config = candidate.impl, candidate.config
        try:
            result, _ = record_call(self.op, impl, config, args, True)
        except (Unsupported, UnsupportedError) as exc:  # UnsupportedError: the launch itself needs a GPU
            raise NotCompiled(f"the AOT path cannot record this launch: {exc}") from exc
        if isinstance(result, str):
            raise NotCompiled(f"supports() refused this sample: {result}")
        call = result[0]
        key = json.dumps([arch, call_identity(call)], sort_keys=True, default=str)

        def build() -> None:
            try:
                compile_recorded(impl.backend, call, arch)
            except Unsupported as exc:
                raise NotCompiled(f"the AOT path cannot compile this kernel: {exc}") from exc

        self._once(key, build)

    def _fresh(self, args: tuple, out_specs) -> list:
        # Compiles read dtypes, shapes, strides and alignment only: CPU tensors stand in for GPU ones.
        mutated = set(self.op.signature.mutated)
        inputs = [a.clone() if i in mutated and isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]
        outs = [torch.empty(tuple(shape), dtype=dtype) for shape, dtype, _ in out_specs]
        return inputs + outs

    def _own(self, path: Any, candidate: Candidate, args: tuple, out_specs, arch: str) -> None:
        """The path's own ``check_compile`` on the sample (inputs, then fresh outputs)."""
        from ..symbolic.expr import Unsupported

        impl, config = candidate.impl, candidate.config
        if impl.supports is not None:  # as the AOT path does: a refused sample is not compiled
            verdict = impl.supports(*args, **config.as_dict())
            if verdict is not True:
                raise NotCompiled(f"supports() refused this sample: {verdict or 'supports() returned False'}")
        tensors = self._fresh(args, out_specs)
        key = json.dumps([impl.backend, impl.fingerprint, candidate.label, arch, [
            [str(t.dtype), list(t.shape), list(t.stride())] if isinstance(t, torch.Tensor) else repr(t)
            for t in tensors]])

        def build() -> None:
            try:
                path.check_compile(impl, config, tensors, arch)
            except Unsupported as exc:
                raise NotCompiled(str(exc)) from exc

        self._once(key, build)
