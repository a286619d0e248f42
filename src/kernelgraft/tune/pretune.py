"""Tune ahead: every key of a list of op calls, blocking, resumable, with a progress bar.

``plan`` turns calls (an op and a function that allocates its arguments) into ``KeyJob``s, one per
distinct tuning key: the op's own key (its bucket rules) decides which calls are one key, and a key
met at several sizes is tuned at the largest. ``run_keys`` tunes the jobs one after the other:
a key already decided (in memory, or in tune.json for this device and toolchain) is skipped unless
``force``; every decision goes to tune.json as soon as it is made, so an interrupted run keeps what
it finished and the next run does only the rest. With torch.distributed, ``_shard`` splits the
jobs across ranks and merges their decisions.

``sites_of_call`` makes the site of one op call whose token dimension follows the pass, for
tuning ops (not a model) over ``Ranges``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..op.candidates import evaluate
from ..op.compete import key_backends, offered
from .key import TuneKey, build_key
from ..op.modes import settings, tune
from .ranges import Arg, Formula, Ranges, Site, describe_arg, materialize
from .decision import Decision, entry_label
from .tuner import TUNER

__all__ = ["KeyJob", "KeyResult", "Report", "prepare", "known_decision", "known_entry", "tune_key", "plan", "run_keys",
           "site_of_call", "calls_of_sites"]

log = logging.getLogger(__name__)
# A key whose tuning ran out of memory is tuned again, up to MEMORY_RETRIES times, once this
# process's cached GPU memory is handed back and after MEMORY_WAIT_S x the attempt: the shortage
# is often the caching allocator's own blocks, which a CUDA library allocating outside it (cuBLAS
# creating its handle: CUBLAS_STATUS_ALLOC_FAILED) or another rank on the same GPU cannot use.
MEMORY_RETRIES = 2
MEMORY_WAIT_S = 1.0


def release_cached_memory() -> None:
    """Hand this process's cached, unused GPU memory back to the device. Tuning ahead does this
    after every key: each key's peak (float64 references, guarded copies, rotated input sets)
    would otherwise stay reserved by this process, out of reach of other processes on the GPU
    (ranks sharing it, the workload) and of libraries that allocate outside PyTorch's allocator."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    try:
        torch.cuda.empty_cache()
    except RuntimeError as exc:  # a CUDA graph captured meanwhile on another thread: keep the cache
        log.debug("could not release cached GPU memory: %s", exc)


def prepare(op: Any, args: tuple, kwargs: dict) -> tuple[tuple, list, TuneKey | None]:
    """(bound arguments, supported candidates, key; None when no candidate supports them)."""
    args = op.signature.bind(op.name, tuple(args), dict(kwargs))
    tensors = op.dispatcher.check(args)
    supported = offered(op, evaluate(op.impls, tensors, args), tensors, settings())
    if not supported:
        return args, [], None
    return args, supported, build_key(op, args, key_backends(supported))


def known_decision(key: TuneKey) -> Decision | None:
    """The key's decision in memory or in tune.json (for this environment), without measuring."""
    found = TUNER.memory.get(key.digest)
    if found is not None:
        return found
    entry = TUNER.disk.get(key.digest, dict(key.env))
    if not entry:
        return None
    try:
        return Decision.from_json(entry, "disk")
    except ValueError:  # an entry an op call would not use either: none
        return None


def known_entry(key: TuneKey) -> dict[str, Any] | None:
    """The key's decision as tune.json holds it (memory first), or None."""
    found = TUNER.memory.get(key.digest)
    if found is not None and not found.provisional:
        return found.to_json()
    entry = TUNER.disk.get(key.digest, dict(key.env))
    if entry is None:
        return None
    try:
        Decision.from_json(entry, "disk")
    except ValueError:
        return None
    return entry


def tune_key(op: Any, args: tuple, supported: list, key: TuneKey, force: bool) -> Decision | None:
    """Tune one key now (mode 'on'); None where nothing can be measured (CPU tensors, no timer)."""
    from ..op import select as _select

    if force:
        TUNER.memory.pop(key.digest, None)
    with tune("on"):
        s = settings()
        if force:
            result = TUNER.measure(op, supported, args, key, s) if TUNER.may_measure(op, args, s) else None
            if result is not None and result.source != "default":
                TUNER.memory[key.digest] = result
        else:
            found = TUNER.memory.get(key.digest)  # a first decision off the path is not the whole one
            result = found if found is not None and not found.partial else TUNER.resolve(op, supported, args, key, s)
    _select.bump_epoch()
    return result


@dataclasses.dataclass
class KeyJob:
    """One distinct key to tune: ``make()`` allocates the call's arguments on the device."""

    op: Any
    make: Callable[[], tuple]
    digest: str
    label: str
    cost: int  # candidates offered: how long tuning it takes, roughly
    key: TuneKey | None = None
    size: int = 0  # elements of the call's tensors: the largest call of a key makes it


@dataclasses.dataclass
class KeyResult:
    op: str
    key: str
    digest: str
    status: str  # tuned | cached | failed | not measured | lost | unsupported
    winner: str | None = None
    seconds: float = 0.0
    rank: int = 0
    reason: str | None = None  # why it failed
    retries: int = 0  # tunings again after running out of memory (MEMORY_RETRIES at most)


@dataclasses.dataclass
class Report:
    """What a ``pretune`` over ranges or a suite did, key by key."""

    keys: list[KeyResult]
    seconds: float
    sites: int = 0
    left_out: list[str] = dataclasses.field(default_factory=list)
    ranks: int = 1
    error: str | None = None

    def count(self, status: str) -> int:
        return sum(k.status == status for k in self.keys)

    def __str__(self) -> str:
        parts = [f"{self.count(s)} {s}" for s in ("tuned", "cached", "failed", "not measured", "lost", "unsupported")
                 if self.count(s)]
        failed = [k for k in self.keys if k.status == "failed"]
        why = sorted({k.reason or "no reason recorded" for k in failed})
        return (f"pretune: {len(self.keys)} keys ({', '.join(parts) or 'none'}) in {self.seconds:.1f} s"
                + (f" on {self.ranks} ranks" if self.ranks > 1 else "")
                + (f"; {len(self.left_out)} call sites left out" if self.left_out else "")
                + (f"; {again} tuned again after running out of memory" if (again := sum(k.retries > 0 for k in self.keys))
                   else "")
                + (f"; failed ({failed[0].key}{' and others' if len(failed) > 1 else ''}): "
                   + "; ".join(w[:300] for w in why[:3]) + (f" (+{len(why) - 3} more)" if len(why) > 3 else "")
                   if failed else ""))


def plan(calls: Sequence[tuple[Any, Callable[[], tuple]]]) -> tuple[list[KeyJob], list[KeyResult]]:
    """(one job per distinct key, in first-seen order, each made by its largest call; the calls
    no candidate supports)."""
    jobs: dict[str, KeyJob] = {}
    unsupported = []
    for op, make in calls:
        args = make()
        args, supported, key = prepare(op, args, {})
        if key is None:
            shapes = ", ".join(str(tuple(a.shape)) for a in args if isinstance(a, torch.Tensor))
            unsupported.append(KeyResult(op.name, shapes, "", "unsupported"))
            continue
        label = f"{op.name} ({key.summary()})"
        size = sum(a.numel() for a in args if isinstance(a, torch.Tensor))
        found = jobs.get(key.digest)
        if found is None:
            jobs[key.digest] = KeyJob(op, make, key.digest, label, len(supported), key, size)
        elif size > found.size:
            found.make, found.size = make, size
        del args
    return list(jobs.values()), unsupported


class _Bar:
    """A rich progress bar over keys on a terminal; log lines elsewhere."""

    def __init__(self, total: int, enabled: bool, rank: int) -> None:
        self.bar: Any = None
        self.rank = rank
        if not enabled or total == 0:
            return
        try:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            console = Console(stderr=True)
            if console.is_terminal:
                self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                    TimeElapsedColumn(), console=console, transient=False)
                self.bar.start()
                self.task = self.bar.add_task("pretune", total=total)
        except Exception:  # a progress display is a nicety; never fail tuning for it
            self.bar = None

    def step(self, label: str, done: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done, description=f"pretune {label[:60]}")
        else:
            log.info("pretune%s: %s", f" rank {self.rank}" if self.rank else "", label)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run_keys(jobs: Sequence[KeyJob], *, force: bool = False, progress: bool = True, rank: int = 0,
             on_key: Callable[[KeyResult], None] | None = None) -> list[KeyResult]:
    """Tune ``jobs`` in order; each decision is on disk when the next key starts."""
    results = []
    bar = _Bar(len(jobs), progress, rank)
    try:
        for n, job in enumerate(jobs):
            bar.step(job.label, n)
            started = time.perf_counter()
            args, supported, key = prepare(job.op, job.make(), {})
            if key is None or key.digest != job.digest:  # supports() answered otherwise than at planning
                result = KeyResult(job.op.name, job.label, job.digest, "unsupported", rank=rank)
            else:
                known = None if force else known_decision(key)
                retries = 0
                # a failed tuning is tried again, and so is one short of memory (served meanwhile,
                # never saved) or a first decision whose whole tuning has not landed
                if known is not None and known.source != "default" and not (known.provisional or known.partial):
                    status, decision = "cached", known
                else:
                    decision, retries = _tune_with_retries(job, args, supported, key)
                    status = ("not measured" if decision is None else
                              "failed" if decision.source == "default" or decision.provisional else "tuned")
                winner = decision.winner if decision is not None else None
                reason = None
                if status == "failed" and decision is not None:
                    reason = decision.failure or ("some candidates ran out of memory: the others' ranking serves "
                                                  "this process, and nothing was saved")
                result = KeyResult(job.op.name, job.label, job.digest, status,
                                   entry_label(winner) if winner else None, time.perf_counter() - started, rank,
                                   reason, retries)
            del args
            release_cached_memory()
            results.append(result)
            if on_key is not None:
                on_key(result)
        bar.step("done", len(jobs))
    finally:
        bar.close()
    return results


def _tune_with_retries(job: KeyJob, args: tuple, supported: list, key: TuneKey) -> tuple[Decision | None, int]:
    """Tune one key now; again (``MEMORY_RETRIES`` times at most) while its tuning runs out of
    memory, each time after handing back this process's cached memory. (decision, retries)"""
    retries = 0
    with TUNER.one_shortage(key):  # the attempts here are one moment's shortage, not several in a row
        while True:
            with tune(progress=False, distributed=False):  # the ranks' split is _shard's
                decision = tune_key(job.op, args, supported, key, force=True)
            if decision is None or retries >= MEMORY_RETRIES or not TUNER.short_of_memory(key.digest):
                return decision, retries
            retries += 1
            log.warning("pretune %s: out of memory (%s); tuning it again (%d of %d) after releasing cached "
                        "memory", job.label, decision.failure or "some candidates", retries, MEMORY_RETRIES)
            release_cached_memory()
            time.sleep(MEMORY_WAIT_S * retries)


def _contiguous_strides(sizes: Sequence[Formula]) -> tuple[Formula, ...] | None:
    """Strides of a contiguous tensor as formulas (None when one is not linear in the pass)."""
    out, acc = [], Formula("1", 0, 1)
    for f in reversed(sizes):
        out.append(acc)
        if f.g == "1":
            acc = Formula(acc.g, acc.a * f.b, acc.b * f.b)
        elif acc.g == "1":
            acc = Formula(f.g, f.a * acc.b, f.b * acc.b)
        else:
            return None
    return tuple(reversed(out))


def site_of_call(op: Any, args: tuple, kwargs: dict, token_dims: dict[str, int] | None = None) -> Site | str:
    """The site of one call of ``op`` whose token dimensions (``{parameter: dim}``; default: dim 0
    of the first tensor parameter) are the pass's tokens; every other size stays as given."""
    args = op.signature.bind(op.name, tuple(args), dict(kwargs))
    params = op.signature.params
    if token_dims is None:
        first = next((p.name for p, a in zip(params, args) if isinstance(a, torch.Tensor)), None)
        if first is None:
            return f"{op.name} takes no tensor"
        token_dims = {first: 0}
    unknown = set(token_dims) - {p.name for p in params}
    if unknown:
        return f"{op.name} has no parameter {sorted(unknown)[0]!r}"
    out, samples = [], []
    for p, a in zip(params, args):
        d = describe_arg(a)
        if d[0] == "V":
            out.append(Arg("value", value=d[1]))
            samples.append(None)
            continue
        _, dtype, shape, stride, offset, sample = d
        dim = token_dims.get(p.name)
        sizes = [Formula("1", 0, s) for s in shape]
        if dim is not None:
            if not -len(shape) <= dim < len(shape):
                return f"{op.name}: {p.name} has {len(shape)} dimensions, no dimension {dim}"
            sizes[dim] = Formula("tokens", 1, 0)
            if not a.is_contiguous():
                return f"{op.name}: {p.name} grows with the tokens but is not contiguous"
            strides = _contiguous_strides(sizes)
            if strides is None:
                return f"{op.name}: the strides of {p.name} do not follow the tokens linearly"
        else:
            strides = tuple(Formula("1", 0, s) for s in stride)
        out.append(Arg("tensor", dtype, tuple(sizes), tuple(strides), offset))
        samples.append(sample)
    return Site(op, tuple(out), tuple(samples))


def calls_of_sites(sites: Sequence[Site], ranges: Ranges, device: Any) -> list[tuple[Any, Callable[[], tuple]]]:
    """The calls of every site at every point of ``ranges`` (a site that does not grow: once)."""
    calls = []
    for n, site in enumerate(sites):
        points = ranges.points() if site.grows() else ranges.points()[:1]
        for batch, seq in points:
            desc = site.at(batch, seq)

            def make(desc=desc, site=site, seed=n * 1_000_003 + batch * 1009 + seq) -> tuple:
                return materialize(desc, site.samples, device, seed)

            calls.append((site.op, make))
    return calls
