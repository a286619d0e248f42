"""Trials in a subprocess (``kg.tune(isolate=True)`` / ``KERNELGRAFT_TUNE_ISOLATE=1``).

A candidate that corrupts the CUDA context (illegal address, trap) or kills the process takes
down only a child: it is excluded with the reason, a new child continues with the rest. The child
re-imports the module that defines the op (ops defined in ``__main__`` or inside functions cannot
be re-imported: those are tuned in-process with a warning) and gets the inputs as CPU copies.
"""

from __future__ import annotations

import importlib
import importlib.util
import multiprocessing as mp
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import TuneWarning
from .trials import Result, run_trials

__all__ = ["run_isolated"]

_CHILD_TIMEOUT_S = 600.0


def _to(value: Any, device: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to(device)
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return type(value)(v.detach().to(device) for v in value)
    return value


def _load_op(module: str, path: str | None, name: str) -> Any:
    from ..op import registry as _registry

    try:
        importlib.import_module(module)
    except ImportError:
        if not path:
            raise
        spec = importlib.util.spec_from_file_location(module, path)
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[module] = mod
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
    op = _registry.lookup(name)
    if op is None:
        raise LookupError(f"importing {module} did not define the op {name}")
    return op


def _child(job: dict, conn: Any) -> None:
    sys.path[:] = job["sys_path"]
    op = _load_op(job["module"], job["file"], job["op"])
    if op.fingerprint != job["fingerprint"]:
        conn.send(("fatal", "the re-imported op differs from the one being tuned"))
        return
    args = tuple(_to(a, job["device"]) for a in job["args"])
    by_id = {(c.index, c.config): c for c in op.candidates(*args)}
    for n, ident in enumerate(job["ids"]):
        conn.send(("start", n))
        cand = by_id[ident]
        r = run_trials(op, [cand], args, job["settings"])[0]
        conn.send(("done", n, r.ms, r.kind, r.reason, r.gpu_ms, r.host_ms))
    conn.send(("end",))


def run_isolated(op: Any, candidates: Sequence[Any], args: Sequence[Any], settings: Any, progress=None) -> list[Result]:
    module = getattr(op.reference, "__module__", "__main__")
    qual = getattr(op.reference, "__qualname__", "")
    file = getattr(sys.modules.get(module), "__file__", None)
    if module == "__main__" or "<locals>" in qual:
        warnings.warn(f"{op.name}: cannot re-import the op in a subprocess (defined in {module}.{qual}); "
                      "tuning in this process", TuneWarning, stacklevel=6)
        return run_trials(op, candidates, args, settings, progress)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    device = str(tensors[0].device) if tensors else "cpu"
    results: dict[int, Result] = {}
    pending = list(range(len(candidates)))
    ctx = mp.get_context("spawn")
    while pending:
        job = {"module": module, "file": file, "op": op.name, "fingerprint": op.fingerprint,
               "sys_path": list(sys.path), "device": device, "settings": settings,
               "args": [_to(a, "cpu") for a in args],
               "ids": [(candidates[i].index, candidates[i].config) for i in pending]}
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_child, args=(job, child), daemon=True)
        proc.start()
        child.close()
        current = None
        while True:
            if not parent.poll(_CHILD_TIMEOUT_S):
                proc.kill()
                break
            try:
                msg = parent.recv()
            except EOFError:
                break
            if msg[0] == "start":
                current = pending[msg[1]]
                if progress is not None:
                    progress(len(results), candidates[current])
            elif msg[0] == "done":
                i = pending[msg[1]]
                results[i] = Result(candidates[i], ms=msg[2], kind=msg[3], reason=msg[4], gpu_ms=msg[5], host_ms=msg[6])
                current = None
            elif msg[0] == "fatal":
                proc.kill()
                raise RuntimeError(msg[1])
            elif msg[0] == "end":
                break
        proc.join(30)
        if current is not None:
            results[current] = Result(candidates[current], kind="crash", reason=(
                f"the trial process died (exit code {proc.exitcode}) while running this candidate"))
        elif proc.exitcode not in (0, None) and len(results) == 0:
            raise RuntimeError(f"the trial process failed to start (exit code {proc.exitcode})")
        pending = [i for i in pending if i not in results]
    if progress is not None:
        progress(len(candidates), None)
    return [results[i] for i in range(len(candidates))]
