"""Functions on ``kernelgraft.tune``: tune given inputs now, look decisions up, wait for the tunings
running off the caller's path, report, clear, count."""

from __future__ import annotations

import time
from typing import Any

from collections.abc import Callable, Sequence

import torch

from ..errors import SpecError
from ..op import registry as _registry, select as _select
from . import dist as _dist
from ..op.modes import settings
from .pretune import (
    KeyResult,
    Report as PretuneReport,
    calls_of_sites,
    known_decision,
    plan,
    prepare,
    run_keys,
    site_of_call,
    tune_key,
)
from .ranges import Ranges
from .report import Report, build_report
from .decision import Decision
from .tuner import TIE_MARGIN, TUNER

__all__ = ["pretune", "decision", "clear", "stats", "wait", "pending", "report"]


def pretune(target: Any = None, *args: Any, ranges: Ranges | None = None, example_inputs: Any = None,
            hf_config: Any = None, calls: Sequence[tuple[Any, Any]] | None = None,
            token_dims: dict[str, int] | None = None,
            device: Any = None, force: bool = False, progress: bool = True,
            on_key: Callable[[KeyResult], None] | None = None, **kwargs: Any) -> Decision | PretuneReport | None:
    """Tune now, blocking: one call of an op, or every key a model or a list of ops meets ahead.

    - ``pretune(op, *args)``: tune ``op`` for these inputs (mode 'on' for the call) and return the
      decision (None when no candidate supports them); the cache is used unless ``force``.
    - ``pretune(model, ranges=Ranges(decode=64, prefill=[512, 2048]), hf_config=config)`` or
      ``example_inputs=...``: record the kernelgraft op calls of the (grafted) model at a few
      ``(batch, seq)`` passes (``_record``: the ops answer with their references, nothing
      compiles), find each call site's sizes as functions of the batch and the sequence length,
      and tune every distinct key of every site over the ranges. ``hf_config``: a Hugging Face
      config (its ``vocab_size`` gives token ids); ``example_inputs``: one call of the model
      (``args`` or ``(args, kwargs)``), resized along dimensions 0 (batch) and 1 (sequence) of
      its tensors, or a function ``(batch, seq) -> args or (args, kwargs)``.
    - ``pretune(op, *args, ranges=...)`` (or a list of ops, each on its first ``sample_inputs``):
      the tokens are dimension 0 of the first tensor (``token_dims={"x": 1}`` says otherwise).
    - ``pretune(calls=[(op, args), ...])``: these calls (``args`` a tuple, or a function that makes
      it: one call's tensors alive at a time), e.g. a benchmark suite's shapes.

    Those return a ``Report``. In the one-call form, an argument of the op named like an option
    here (``ranges``, ``device``, ...) is passed positionally. Keys already decided (memory, or
    tune.json for this device and toolchain) are skipped unless ``force``; each decision is
    written to tune.json when made, so an interrupted run resumes. Under torch.distributed
    (``torchrun``) every rank makes the same call and the keys are split across the ranks, then
    every rank's tune.json gets all the decisions (``_shard``). ``device``: where tuning inputs
    are made (default: CUDA when available).
    """
    if ranges is None and calls is None and example_inputs is None and hf_config is None and _is_op(target):
        return _one(target, args, kwargs, force)
    started = time.perf_counter()
    dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        from .compile_pool import prestart

        prestart(_named_ops(target, calls))  # the workers import while the calls are planned
    sites, left_out = 0, []
    if calls is not None:
        calls = [(_ops(op)[0], a if callable(a) else (lambda a=a: tuple(a))) for op, a in calls]
    else:
        if ranges is None:
            raise SpecError("kg.tune.pretune: give ranges=kg.tune.Ranges(decode=..., prefill=...) (or calls=...)")
        if _is_op(target) or (isinstance(target, (list, tuple)) and target and all(_is_op(t) for t in target)):
            found = _op_sites(target, args, kwargs, dev, token_dims)
        else:
            found = _model_sites(target, example_inputs, hf_config, dev)
        site_list, left_out = found
        sites = len(site_list)
        calls = calls_of_sites(site_list, ranges, dev)
    jobs, unsupported = plan(calls)
    error = None
    if settings().distributed and _dist.active():
        from .shard import pretune_ranks

        results, error = pretune_ranks(jobs, force=force, progress=progress, on_key=on_key)
        ranks = _dist.world()
    else:
        results, ranks = run_keys(jobs, force=force, progress=progress, on_key=on_key), 1
    report = PretuneReport(results + unsupported, time.perf_counter() - started, sites, left_out, ranks,
                    f"{type(error).__name__}: {error}" if error is not None else None)
    _select.bump_epoch()
    if error is not None:
        raise error
    return report


def _is_op(value: Any) -> bool:
    return hasattr(value, "signature") and hasattr(value, "dispatcher") and hasattr(value, "impls")


def _named_ops(target: Any, calls: Any) -> list:
    """The ops a pretune names before its calls are planned (the compile workers' zygote imports
    their modules once): those of ``calls``, the target op or ops, else every op defined so far
    (a model's sites are found later)."""
    if calls is not None:
        return [op for op, _ in calls if _is_op(op)]
    if _is_op(target) or (isinstance(target, (list, tuple)) and all(_is_op(t) for t in target)):
        return list(target) if isinstance(target, (list, tuple)) else [target]
    return _registry.all_ops()


def _ops(target: Any) -> list:
    ops = list(target) if isinstance(target, (list, tuple)) else [target]
    bad = next((o for o in ops if not _is_op(o)), None)
    if bad is not None:
        raise SpecError(f"kg.tune.pretune: expected kernelgraft ops, got {type(bad).__name__}")
    return ops


def _one(op: Any, args: tuple, kwargs: dict, force: bool) -> Decision | None:
    args, supported, key = prepare(op, args, kwargs)
    if key is None:
        return None
    return tune_key(op, args, supported, key, force)


def _op_sites(target: Any, args: tuple, kwargs: dict, device: torch.device, token_dims) -> tuple[list, list]:
    ops = _ops(target)
    sites, left_out = [], []
    for op in ops:
        if len(ops) == 1 and args:
            call = args
        else:
            found = _samples(op, device.type)
            if not found:
                left_out.append(f"{op.name}: no sample_inputs to take a call from")
                continue
            call = found[0]
        site = site_of_call(op, tuple(call), dict(kwargs) if len(ops) == 1 else {}, token_dims)
        (left_out if isinstance(site, str) else sites).append(site)
    return sites, left_out


def _samples(op: Any, device: str) -> list:
    import inspect

    if op.sample_inputs is None:
        return []
    try:
        takes_device = "device" in inspect.signature(op.sample_inputs).parameters
    except (TypeError, ValueError):
        takes_device = False
    return list(op.sample_inputs(device=device) if takes_device else op.sample_inputs())


def _model_sites(model: Any, example_inputs: Any, config: Any, device: torch.device) -> tuple[list, list]:
    from .record import inputs_from_config, resized_inputs, sites_of_model

    if not callable(model):
        raise SpecError(f"kg.tune.pretune: expected an op, a list of ops or a model, got {type(model).__name__}")
    if example_inputs is not None:
        make = example_inputs if callable(example_inputs) and not isinstance(example_inputs, torch.Tensor) \
            else resized_inputs(example_inputs)
    elif config is not None:
        param = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
        make = inputs_from_config(config, param.device if param is not None else device)
    else:
        raise SpecError("kg.tune.pretune: a model needs example_inputs=... or hf_config=<a Hugging Face config> "
                        "to record its op calls")
    return sites_of_model(model, make)


def decision(op: Any, *args: Any, **kwargs: Any) -> Decision | None:
    """The decision in memory or on disk for these inputs, without measuring; None if none."""
    args, supported, key = prepare(op, args, kwargs)
    if key is None:
        return None
    return known_decision(key)


def clear(*, disk: bool = False) -> None:
    """Forget decisions in memory (and on disk with ``disk=True``); ops choose again."""
    TUNER.clear(disk=disk)


def stats() -> dict[str, int]:
    """Counters: tuned keys, memory/disk hits, rank leader/follower decisions, and the background
    queue's (``background_queued``, ``_done``, ``_dropped``, ``_skipped``)."""
    out = dict(TUNER.stats)
    for name, count in TUNER.background.stats.items():
        out[f"background_{name}"] = out.get(f"background_{name}", 0) + count
    return out


def wait(timeout: float | None = None) -> bool:
    """Wait until no tuning is queued or running off the caller's path (``timeout`` seconds at
    most; None: as long as it takes). True when none is left. The next call of each op then
    serves its decision.

    >>> import kernelgraft as kg
    >>> kg.tune.wait(timeout=1.0)
    True
    """
    return TUNER.background.wait(timeout)


def pending() -> int:
    """How many keys are being tuned off the caller's path (queued or running)."""
    return TUNER.background.pending()


def report(op: Any) -> Report:
    """What the tuner tried for each key of ``op`` it knows (decided in this process, or in the
    disk cache), the seconds it spent compiling and gating against measuring, and why each
    candidate lost or was excluded; keys still being tuned are listed as pending. ``str()`` of it
    reads as a table (``kernelgraft tune`` prints it)."""
    found: dict[str, Decision] = {}
    for digest, entry in TUNER.disk.entries().items():
        key = entry.get("key") if isinstance(entry, dict) else None
        if isinstance(key, dict) and key.get("fingerprint") == op.fingerprint:
            try:
                found[digest] = Decision.from_json(entry, "disk")
            except ValueError:  # an entry no call would use either
                continue
    for digest, d in list(TUNER.memory.items()):
        if d.key.get("fingerprint") == op.fingerprint:
            found[digest] = d
    return build_report(op.name, found.items(), TUNER.background.labels(op.fingerprint), TIE_MARGIN)
