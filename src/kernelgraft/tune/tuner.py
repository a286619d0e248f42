"""The tuner: the chooser kernelgraft's ops call once per new input signature.

Per call it builds the key, looks in memory, then (agreeing across ranks) on disk, then measures
if the mode allows: on CUDA off the caller's path by default (``_offpath``: the call is served at
once meanwhile), else inside the call. Decisions hold the ranking of every candidate that passed
the gate, so a new signature that falls into a known bucket takes the best candidate that supports
it, without measuring. A warm call never reaches this module: the op's per-signature plan is the
cache.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .. import native as _native
from ..op import outputs as _outputs, select as _select
from ..op.compete import find, is_torch, key_backends, servable
from ..errors import FallbackWarning, InputError, SpecError, TuneWarning, memory_note, out_of_memory
from ..spec import Config
from . import dist as _dist, phases as _phases
from .background import BACKGROUND, Background
from .cache import DiskCache
from .decision import Decision, entry_label
from .inputs import tensors_of
from .key import TuneKey, build_key
from ..op.modes import Settings, no_tune_reason, settings, warn_no_tune
from .offpath import off_path, serve
from .progress import Progress
from .prune import apply_prune
from .trials import Result, run_trials

__all__ = ["Decision", "Tuner", "TUNER", "entry_label"]

log = logging.getLogger(__name__)
# Timings this close to the fastest count as a tie. 2% let a 3.4 us GEMM config 3.3% slower than
# the best win on the H200 (its first-pass time fell within 2%); 1% after the finalists' re-timing.
TIE_MARGIN = 0.01


def _entry(c: Any, **extra: Any) -> dict[str, Any]:
    return {"impl": c.index, "impl_name": c.impl.display_name, "backend": c.impl.backend,
            "config": c.config.as_dict(), **extra}


def _spent(phases: _phases.Phases, candidate: Any) -> dict[str, float]:
    """A candidate's seconds by phase: the gate (its compile included) and timing, where recorded."""
    return {name: round(s, 4) for name, s in phases.of(candidate).items()}


def _parts(r: Result) -> dict[str, float]:
    """A ranked entry's GPU and host milliseconds, where they were measured."""
    return {k: v for k, v in (("gpu_ms", r.gpu_ms), ("host_ms", r.host_ms)) if v is not None}


class _Held(threading.local):
    locks: list = []


# A tuning that failed for want of memory is retried after RETRY_S, doubling per failure in a row up
# to RETRY_MAX_S: long enough that the threads that waited for the failed tuning are served the
# default first, short enough that a passing shortage costs seconds of untuned calls.
RETRY_S = 2.0
RETRY_MAX_S = 600.0
# Tunings in a row where some candidates ran out of memory before those candidates count as not
# fitting (saved excluded): a naive reference at a long sequence may never fit beside the workload.
SHORT_LIMIT = 3


class Tuner:
    """Chooses per key; ``TUNER`` is the instance installed as kernelgraft's chooser."""

    def __init__(self, disk: DiskCache | None = None, background: Background | None = None) -> None:
        self.memory: dict[str, Decision] = {}
        self.disk = disk or DiskCache()
        self.background = background or BACKGROUND  # keys tuned off the caller's path
        self.stats: Counter = Counter()
        # One lock per device: threads whose first calls tune at once would time their candidates
        # against each other on one GPU. Re-entrant: a reference may call another op that tunes.
        self._device_locks: dict[str, threading.RLock] = {}
        self._locks_guard = threading.Lock()
        self._held = _Held()  # the device tuning locks the calling thread holds, innermost last
        # key digest -> (time.monotonic() from which it is tuned again, failures in a row, the
        # failed decision in memory): keys whose tuning failed for a reason that may pass
        self._retry: dict[str, tuple[float, int, Decision]] = {}
        self._shortage_cap: dict[str, int] = {}  # key digest -> the most its count may reach (one_shortage)

    def forget(self, fingerprint: str) -> None:
        """Drop the in-memory decisions of one op (it was replaced or unregistered); the disk
        cache keeps them, keyed by that fingerprint, for when the same op comes back. Its jobs
        off the caller's path are dropped first, so none lands after."""
        self.background.forget(fingerprint)
        for digest, decision in list(self.memory.items()):
            if decision.key.get("fingerprint") == fingerprint:
                self.memory.pop(digest, None)
                self._retry.pop(digest, None)

    def _device_lock(self, op: Any, args: tuple) -> threading.RLock:
        first = next(iter(op.signature.tensors(args)), None)
        device = str(first[1].device) if first is not None else "cpu"
        with self._locks_guard:
            lock = self._device_locks.get(device)
            if lock is None:
                lock = self._device_locks[device] = threading.RLock()
        return lock

    # ------------------------------------------------------------------ the chooser
    def __call__(self, op: Any, candidates: Sequence[Any], args: tuple) -> Any:
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        s = settings()
        if s.mode == "off":
            return candidates[0]
        try:
            key = build_key(op, args, key_backends(candidates))
        except Exception as exc:  # a key we cannot build: no tuning, but the op still runs
            log.warning("%s: cannot build a tuning key (%s); using the default candidate", op.name, exc)
            return candidates[0]
        decision = self._remembered(key)
        if decision is not None and decision.partial and s.blocking is True:
            decision = None  # a first decision: tuning inside the call wants the whole one (resolve waits)
        if decision is None:
            self.stats["memory_miss"] += 1
            if off_path(self, op, args, s) and self.may_measure(op, args, s):
                return serve(self, op, candidates, args, key, s)  # a provisional choice, at once
            # Inside the call: inputs that do not fit are refused before anything is tuned. The
            # op's planning worked the output shapes out already unless it expected a job to
            # (kernelgraft.op.outputs.may_defer), which tuning inside the call replaces here.
            first = next(tensors_of(args), None)
            if first is not None and _outputs.may_defer(s, [("", first)]):
                op.dispatcher.output_specs(args)
            decision = self.resolve(op, candidates, args, key, s)
        else:
            self.stats["memory_hit"] += 1
            if decision.partial:
                _select.provisional(decision.refining)  # its plans make way when the whole decision lands
        retry = self._retry.get(key.digest)
        if retry is not None and time.monotonic() < retry[0] and self.memory.get(key.digest) is retry[2]:
            _select.provisional(retry[0])  # the default serves until the key is tuned again
        # Not torch:compile once it failed (it stays in the key: see _compete.servable).
        return self.pick(op, decision, servable(op, candidates))

    def _remembered(self, key: TuneKey) -> Decision | None:
        """The key's decision in memory; a failed tuning whose retry time came counts as none."""
        decision = self.memory.get(key.digest)
        retry = self._retry.get(key.digest)
        if decision is not None and retry is not None and decision is retry[2] and time.monotonic() >= retry[0]:
            return None
        return decision

    def may_measure(self, op: Any, args: tuple, s: Settings) -> bool:
        """Whether a call of ``op`` on ``args`` may be tuned now: tuning on, nothing forbidding it
        (a CUDA graph being captured, torch.compile tracing: warned once), and a GPU or a timer."""
        if s.mode != "on":
            return False
        reason = no_tune_reason()
        if reason:
            warn_no_tune(op.name, reason)
            return False
        on_gpu = any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args) or any(
            isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor) and a[0].device.type == "cuda"
            for a in args)
        return on_gpu or s.timer is not None

    def resolve(self, op: Any, candidates: Sequence[Any], args: tuple, key: TuneKey, s: Settings) -> Decision:
        """The key's decision: from memory or the disk cache, else measured now (under the
        device's tuning lock, where it may measure), else the default."""
        measure = self.may_measure(op, args, s)
        if not measure:
            return self.resolve_locked(op, candidates, args, key, s, measure)
        lock = self._device_lock(op, args)
        if self._held.locks and not any(held is lock for held in self._held.locks):
            # Tuning nested inside another device's tuning (an op whose reference or candidate
            # calls an op on a second GPU): waiting for that device's lock while holding ours can
            # deadlock against a thread doing the opposite, so take it only if it is free at once.
            # Otherwise the default candidate serves this one call (provisional: the op keeps no
            # plan for it, nothing is remembered) and a later call tunes the key.
            if not lock.acquire(blocking=False):
                self.stats["nested_busy"] += 1
                _select.provisional(0.0)
                return Decision(key.as_json(), [], [], source="default")
        else:
            lock.acquire()
        try:
            with self._holding(lock):
                found = self._remembered(key)  # another thread may have tuned it while we waited
                if found is not None and not found.partial:  # a first decision: its job's second pass goes on
                    self.stats["memory_hit"] += 1
                    return found
                return self.resolve_locked(op, candidates, args, key, s, measure)
        finally:
            lock.release()

    @contextlib.contextmanager
    def _holding(self, lock: threading.RLock) -> Iterator[None]:
        """``lock`` (acquired) counted among the device locks this thread holds, for the block."""
        self._held.locks = [*self._held.locks, lock]
        try:
            yield
        finally:
            self._held.locks = self._held.locks[:-1]

    def measure_first(self, op: Any, candidates: Sequence[Any], args: tuple, key: TuneKey,
                      s: Settings) -> Decision | None:
        """A first decision among some of the key's candidates, not saved (``offpath._land_first``),
        under the device's lock as any tuning; None when the key was decided meanwhile (a call
        tuned it inside) or nothing passed."""
        lock = self._device_lock(op, args)
        with lock, self._holding(lock):
            if self._remembered(key) is not None:
                return None
            decision = self.measure(op, candidates, args, key, s, save=False)
        return decision if decision.source != "default" and decision.ranking else None

    def resolve_locked(self, op: Any, candidates: Sequence[Any], args: tuple, key: TuneKey, s: Settings,
                       measure: bool) -> Decision:
        """``resolve`` with the device's lock held by the caller, or not needed (``measure`` False:
        the disk cache, else the default; nothing is measured)."""
        env = dict(key.env)

        def local() -> Decision:
            entry = self.disk.get(key.digest, env)
            if entry is not None:
                try:
                    decision = Decision.from_json(entry, "disk")
                except ValueError as exc:  # an entry that does not load is a miss
                    log.debug("tuning cache entry %s does not load (%s); ignored", key.digest[:12], exc)
                else:
                    self.stats["disk_hit"] += 1
                    return decision
            if measure:
                return self.measure(op, candidates, args, key, s)
            return Decision(key.as_json(), [], [], source="default")

        if s.distributed and _dist.active():
            namespace = "on" if measure else "cached"
            value, role = _dist.agree(key.digest, namespace, lambda: local().to_json(),
                                      peek=("on",) if namespace == "cached" else ())
            decision = Decision.from_json(value, "rank" if role == "follower" else "tuned")
            self.stats[f"rank_{role}"] += 1
            if role == "follower" and decision.source != "default" and not decision.provisional:
                self.disk.put({key.digest: decision.to_json()})
        else:
            decision = local()
        if decision.source != "default":
            self.memory[key.digest] = decision
        return decision

    def pick(self, op: Any, decision: Decision, candidates: Sequence[Any]) -> Any:
        """The candidate of ``candidates`` that ``decision`` ranks first; where it ranks none of
        them, the first the gate did not refuse, else the reference (warned)."""
        by_id = {(c.index, c.config): c for c in candidates}
        for entry in decision.ranking:
            try:
                found = by_id.get((int(entry["impl"]), Config.of(entry["config"], where=op.name)))
            except Exception:
                found = None
            if found is not None:
                return found
        if decision.ranking or not decision.excluded:
            return candidates[0]
        offered = {(c.index, c.config) for c in candidates}
        failed: dict[tuple, dict[str, Any]] = {}
        for e in decision.excluded:
            try:
                ident = (int(e["impl"]), Config.of(e["config"], where=op.name))
            except Exception:  # an entry that does not parse excludes nothing
                continue
            if ident in offered:
                failed[ident] = e
        if len(failed) < len(candidates):  # some candidate was never measured: take it
            return next(c for c in candidates if (c.index, c.config) not in failed)
        warnings.warn(
            f"{op.name}: every candidate failed the tuning gate ("
            + "; ".join(f"{e.get('impl_name')}[{e.get('config')}]: {e.get('reason')}"
                        for e in list(failed.values())[:3])
            + "); running the PyTorch reference instead",
            FallbackWarning,
            stacklevel=5,
        )
        return None

    # ------------------------------------------------------------------ measuring
    def measure(self, op: Any, candidates: Sequence[Any], args: tuple, key: TuneKey, s: Settings,
                save: bool = True) -> Decision:
        """Prune, gate and time ``candidates`` for ``key``; store the decision on disk (``save``:
        a first decision over some of the key's candidates is not saved: ``measure_first``)."""
        if _native.busy():
            # The extension's build (a child process competing for the CPU) or load (holding a
            # thread) would skew host-bound timings: let it finish first (10-15 s, once).
            log.info("%s: waiting for the native replay's build before tuning", op.name)
            _native.load()
        started = time.perf_counter()
        # Pruning picks among the kernels (a user's prune hook knows their configs); the PyTorch
        # candidates are always measured: they are what "never slower than PyTorch" is judged by.
        kernels = [c for c in candidates if not is_torch(c)]
        chosen = apply_prune(op, kernels, args, enabled=s.prune, max_candidates=s.max_candidates)
        chosen += [c for c in candidates if is_torch(c)]
        log.info("%s: tuning %d of %d candidates for %s", op.name, len(chosen), len(candidates), key.summary())
        progress = Progress(op.name, key, len(chosen), s.progress)
        phases = _phases.current() or _phases.Phases()  # a background job brings its own (paced)
        try:
            with phases.recording():
                if s.isolate:
                    from .isolate import run_isolated

                    results = run_isolated(op, chosen, args, s, progress)
                else:
                    results = run_trials(op, chosen, args, s, progress)
        except (InputError, SpecError):
            raise  # the inputs or the op, not the tuning: the caller's error, nothing remembered
        except Exception as exc:
            failure, short_now = f"{type(exc).__name__}: {exc}", out_of_memory(exc)
            if short_now:  # whose memory it was: this process's cache, or another process
                first = next(tensors_of(args), None)
                note = memory_note(first.device) if first is not None else ""
                failure += f" ({note})" if note else ""
            failed = Decision(key.as_json(), [], [], source="default", failure=failure)
            if not save:  # a first pass: the whole tuning runs next and says what failed, once
                log.debug("%s: a first pass over part of the candidates failed", op.name, exc_info=True)
                return failed
            # Kept in memory (not on disk): the threads that waited for this key, and later
            # calls, use the default candidate instead of each failing the same tuning again.
            if short_now:
                # Out of memory may pass (the workload's peak moves on): tune the key again after
                # a backoff that doubles with each failure in a row, and keep no plan for good
                # meanwhile. Any other failure would recur with the same inputs and candidates: it
                # stays for the process (kg.tune.clear() forgets it). The retry is set before the
                # decision is published: a thread reading the decision sees it is provisional.
                then = f"; tuning again in {self._retry_later(key, failed):.0f} s"
            else:
                self._retry.pop(key.digest, None)
                then = " for this process (kernelgraft.tune.clear() retries)"
            self.memory[key.digest] = failed
            warnings.warn(f"{op.name}: tuning failed ({type(exc).__name__}: {exc}); using the default "
                          f"candidate{then}", TuneWarning, stacklevel=5)
            log.debug("tuning failure", exc_info=True)
            return failed
        decision = self._decision(key, results, started, len(candidates), phases)
        if not save:
            return decision  # served until the whole tuning lands (measure_first): nothing kept here
        short = [r for r in results if r.kind == "memory"]
        if short and self._failures(key) < SHORT_LIMIT:
            return self._short_of_memory(op, key, decision, short, s)
        # SHORT_LIMIT tunings in a row short of memory: those candidates do not fit here; the
        # decision is saved with them excluded, as any other failure (kg.tune.clear() retries).
        self._retry.pop(key.digest, None)
        self.stats["tuned"] += 1
        self.disk.put({key.digest: decision.to_json()})
        for r in results:
            if r.ms is None:
                log.info("%s: excluded %s: %s", op.name, r.candidate.label, r.reason)
        return decision

    def short_of_memory(self, digest: str) -> bool:
        """Whether the key's last tuning failed for want of memory (it is tuned again later)."""
        return digest in self._retry

    @contextlib.contextmanager
    def one_shortage(self, key: TuneKey) -> Iterator[None]:
        """Tunings of ``key`` in the block count as one toward ``SHORT_LIMIT`` (tuning again at
        once after releasing memory is one moment's shortage, not shortages in a row)."""
        self._shortage_cap[key.digest] = self._failures(key) + 1
        try:
            yield
        finally:
            self._shortage_cap.pop(key.digest, None)

    def _failures(self, key: TuneKey) -> int:
        """Tunings of ``key`` in a row that failed for a reason that may pass."""
        retry = self._retry.get(key.digest)
        return retry[1] if retry is not None else 0

    def _retry_later(self, key: TuneKey, decision: Decision) -> float:
        """Serve ``decision`` (in memory, not on disk) until the key is tuned again, after a
        backoff that doubles with each failure in a row; returns the delay in seconds."""
        failures = self._failures(key) + 1
        cap = self._shortage_cap.get(key.digest)  # attempts made at once count as one (one_shortage)
        if cap is not None:
            failures = min(failures, cap)
        delay = min(RETRY_S * 2 ** (failures - 1), RETRY_MAX_S)
        self._retry[key.digest] = (time.monotonic() + delay, failures, decision)
        return delay

    def _short_of_memory(self, op: Any, key: TuneKey, decision: Decision, short: Sequence[Result],
                         s: Settings) -> Decision:
        """Some candidates ran out of memory: that says nothing about them, only about the moment
        (the workload's own tensors). The others' ranking serves for now (the default where none
        passed); nothing goes to disk, where it would stand for every later process, and the key
        is tuned again after a backoff. Across ranks the leader's decision serves the process on
        every rank (a retry on one rank alone would part them), and a later process tunes again."""
        if not decision.ranking:  # the default, unless the gate proved it wrong: not a candidate it refused
            decision = Decision(key.as_json(), [], [e for e in decision.excluded if e.get("kind") != "memory"],
                                source="default")
        decision.provisional = True
        if decision.source == "default":
            decision.failure = f"out of memory: {short[0].candidate.label}: {short[0].reason}"
        if s.distributed and _dist.active():
            then = " for this process"
        else:
            then = f"; tuning again in {self._retry_later(key, decision):.0f} s"
        self.memory[key.digest] = decision  # after the retry is set: see measure
        serving = entry_label(decision.ranking[0]) if decision.ranking else "the default candidate"
        warnings.warn(f"{op.name}: {len(short)} candidate(s) ran out of memory while tuning "
                      f"({short[0].candidate.label}: {short[0].reason}); serving {serving}{then}",
                      TuneWarning, stacklevel=6)
        return decision

    @staticmethod
    def _decision(key: TuneKey, results: Sequence[Result], started: float, offered: int,
                  phases: _phases.Phases | None = None) -> Decision:
        order = {id(r): n for n, r in enumerate(results)}
        passed = sorted((r for r in results if r.ms is not None), key=lambda r: (r.ms, order[id(r)]))
        if passed:
            # Within TIE_MARGIN of the fastest, the op's own eager reference wins, else the
            # candidate listed first: near-equal timings are noise, a kernel serves a shape only
            # where it beats PyTorch by more than that ("never slower than PyTorch"), and the
            # user's order (impls, then configs) is a stable tie-break that keeps the same choice
            # across runs and ranks.
            limit = passed[0].ms * (1.0 + TIE_MARGIN)
            near = [r for r in passed if r.ms <= limit]
            first = min(near, key=lambda r: (find(r.candidate.impl) != "eager", order[id(r)]))
            passed.remove(first)
            passed.insert(0, first)
        return Decision(
            key=key.as_json(),
            ranking=[_entry(r.candidate, ms=r.ms, **_parts(r)) for r in passed],
            excluded=[_entry(r.candidate, kind=r.kind, reason=r.reason) for r in results if r.ms is None],
            tune_s=time.perf_counter() - started,
            measured=len(results),
            offered=offered,
            phases=phases.totals() if phases is not None else {},
            spent={r.candidate.label: _spent(phases, r.candidate) for r in results} if phases is not None else {},
        )

    def clear(self, *, disk: bool = False) -> None:
        self.background.clear()
        self.memory.clear()
        self._retry.clear()
        if disk:
            self.disk.remove()
        _select.bump_epoch()


TUNER = Tuner()

