"""The worker side of isolated checks (``_isolate.py`` is the parent's): checks ops in its own
process and streams what it does over a pipe: ("op", index) as it starts an op, ("planned", keys,
sample, variant) once a variant's steps are known, ("step", key, sample, variant) before each step
that runs user code, ("result", key, Result) after it,
("op_done", index), and ("lost", key) or ("error", traceback) before it ends early."""

from __future__ import annotations

import dataclasses
import importlib
import multiprocessing
import os
import traceback
from collections.abc import Sequence
from typing import Any

import torch

from .harness import CheckOptions, iter_check

__all__ = ["start_method", "worker"]

_LOST = 3  # the worker's exit status after a CUDA error that leaves the context unusable


def start_method() -> str:
    """fork where no GPU is visible (cheap, inherits the ops), else spawn (``_isolate.py`` says why)."""
    if "fork" in multiprocessing.get_all_start_methods() and not torch.cuda.is_available():
        return "fork"
    return "spawn"


def _context_lost() -> bool:
    """After a failed CUDA kernel: is this process's CUDA context still usable?"""
    if not torch.cuda.is_initialized():
        return False
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
    except Exception:  # a sticky error (illegal address, launch failure): every later call fails too
        return True
    return False


def _load_ops(targets: Sequence[str], names: Sequence[str]) -> list[Any]:
    """In a spawned worker: import the targets (skipping what is already registered) and find the
    ops by name."""
    from ..op import registry as _registry

    missing = [name for name in names if _registry.lookup(name) is None]
    if missing:
        from ..op.targets import load_target

        for target in targets:
            if target.endswith(".py") or os.path.isfile(target):
                load_target(target)
            else:
                importlib.import_module(target)
    ops = [_registry.lookup(name) for name in names]
    absent = [name for name, op in zip(names, ops) if op is None]
    if absent:
        raise RuntimeError(f"importing {list(targets)} in the check process did not define {absent}")
    return ops


def worker(conn, ops, targets, names, options: CheckOptions, plans, prepare) -> None:
    if ops is not None:  # forked: the parent's OpenMP pool did not survive the fork, and a parallel
        torch.set_num_threads(1)  # torch op (a fill of a guard, a large sample) would wait for it forever
    if prepare is not None:
        prepare()
    try:
        if ops is None:
            ops = _load_ops(targets, names)
        for index, (op, plan) in enumerate(zip(ops, plans)):
            if plan is None:
                continue
            conn.send(("op", index))
            steps = iter_check(op, options, plan=plan,
                               announce=lambda key, sample, variant: conn.send(("step", key, sample, variant)),
                               planned=lambda keys, sample, variant: conn.send(("planned", keys, sample, variant)))
            for key, result in steps:
                if result.status == "fail" and key[2] not in ("meta", "opcheck", "trace") and _context_lost():
                    note = (f"{result.note}; this left the CUDA context unusable: its remaining samples "
                            "were not run, the check went on in a fresh process")
                    conn.send(("result", key, dataclasses.replace(result, note=note)))
                    conn.send(("lost", key))
                    conn.close()
                    os._exit(_LOST)
                conn.send(("result", key, result))
            conn.send(("op_done", index))
    except BaseException:  # noqa: BLE001 - anything here is reported by the parent, not swallowed
        conn.send(("error", traceback.format_exc(limit=8)))
    conn.close()
