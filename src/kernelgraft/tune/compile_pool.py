"""Compile a key's candidates in parallel, in worker processes, before any of them is timed.

Compiling is seconds of host work per candidate (a 36-candidate GEMM key spent most of its 27 s
first call compiling, one candidate after the other, while the GPU idled); timing must stay serial
per GPU. So before the gate runs, ``compile_ahead`` sends one ``Job`` per candidate whose backend
compiles ahead (Triton, CUDA C++, cuTile: a backend's own ``compile_ahead``) to a pool of worker
processes, which compile them into the caches the launches read (``compile_jobs``); the gate then
finds every kernel compiled.

The workers are forks of the pool's zygote (``compile_zygote``: one ``python -m`` process that
imported torch and Triton once, so a cold pool pays one import, not one per worker) or, where there
is none, ``python -m kernelgraft.tune.compile_worker`` processes; never ``multiprocessing``
children of this process: a fresh interpreter re-imports only the op's module (never the user's
``__main__`` script), gets an explicit environment (Triton's interpreter off: workers compile, they never run a
kernel), creates no CUDA context (it compiles for a named target) and, when a compiler crashes it,
loses only its own job. Started once, at the first key that needs them (a key tuned off the
caller's path starts them when its job starts, so they import while the job prepares), they stay
for ``IDLE_S`` seconds after their last job.

The pool is used when the op's tensors are on a GPU, at least two jobs are to be compiled, the
op is importable by a worker (an op defined at module level; one defined inside a function, or in
a script run as ``__main__``, compiles serially, said once in the log) and
``KERNELGRAFT_COMPILE_WORKERS`` is not 0 (default: one worker per CPU core but one, at most 16,
the cores shared among the ranks of a host; fewer than two workers compile serially). A job that
fails compiles again in its gate run, as it would have without the pool: the pool can only save
time, never change a decision. The workers run at a lower CPU priority
(``compile_worker.WORKER_NICE``, where the system has ``os.nice``): on a machine whose cores are
busy serving they take what serving leaves, on an idle one they compile at full speed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from .. import backends
from . import pace as _pace
from .compile_jobs import Job, NotDescribable, Outcome, Source, Target, cache_env, compiles_ahead, describe
from .compile_process import STARTUP_S, Worker
from .compile_zygote import Zygote, available as _zygote_available

__all__ = ["Ahead", "CompilePool", "Summary", "compile_ahead", "jobs_for", "source_of", "workers", "prestart", "preload_for", "zygote_ready",
           "would_use", "run_jobs", "POOL", "MAX_WORKERS", "TOTALS"]

log = logging.getLogger(__name__)
MAX_WORKERS = 16
IDLE_S = 120.0
_ENV = "KERNELGRAFT_COMPILE_WORKERS"
_IN_WORKER = "KERNELGRAFT_COMPILE_WORKER"
_said: set[str] = set()
_unimportable: set[str] = set()  # fingerprints of ops a worker's import did not define
_not_preloaded: set[Source] = set()  # op modules whose import left a zygote unsafe to fork
# Totals over this process's keys (what compiling ahead cost and saved, for reports and benchmarks).
TOTALS = {"keys": 0, "jobs": 0, "compiled": 0, "failed": 0, "seconds": 0.0, "worker_seconds": 0.0}


def workers() -> int:
    """How many compile workers to use (0: compile serially)."""
    text = os.environ.get(_ENV, "").strip().lower()
    if os.environ.get(_IN_WORKER):
        return 0
    if text in ("0", "off", "no", "false"):
        return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    if text:
        try:
            return max(0, int(text))
        except ValueError:
            log.warning("%s=%r is not a number; using the default", _ENV, text)
    # ranks of one host (torchrun's LOCAL_WORLD_SIZE) share its cores: each gets its part
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    n = min(MAX_WORKERS, cores // local - 1)
    return n if n >= 2 else 0


def source_of(op: Any) -> Source | str:
    """Where a worker imports ``op`` from, or why it cannot."""
    name = getattr(op.reference, "__module__", None)
    module = sys.modules.get(name or "")
    if module is None:
        return f"its module {name!r} is not imported"
    if name == "__main__":
        spec = getattr(module, "__spec__", None)
        if spec is None or not spec.name:
            return "it is defined in a script run as __main__ (define ops in a module to compile them in parallel)"
        return Source(spec.name)
    path = getattr(module, "__file__", None)
    if "." in name:
        return Source(name)  # a module of a package: imported by name
    # a top-level name: imported by name if a fresh interpreter finds this very file under it,
    # else (a file a tool loaded under a name of its own, such as a CLI target) by its path
    import importlib.machinery

    found = importlib.machinery.PathFinder.find_spec(name)
    try:
        if found is not None and path and found.origin and os.path.samefile(found.origin, path):
            return Source(name)
    except OSError:
        pass
    if path and os.path.isfile(path):
        return Source(name, os.path.abspath(path))
    return f"its module {name!r} has no file a worker can import"


def jobs_for(op: Any, candidates: Sequence[Any], args: Sequence[Any], target: Target,
             source: Source) -> list[Job]:
    """One job per candidate a worker can compile (its backend has ``compile_ahead``; not one an AOT
    bundle serves). ``args``: exactly what the runner is called with, inputs then outputs."""
    try:
        described = tuple(describe(a) for a in args)
    except NotDescribable as exc:
        log.debug("%s: not compiled ahead: %s", op.name, exc)
        return []
    jobs, caches = [], cache_env()  # where this process's launches look for them, now
    for cand in candidates:
        if cand.index < 0 or not compiles_ahead(cand.impl.backend):
            continue
        if op.dispatcher.bundled_runner(cand.index, cand.config) is not None:
            continue
        jobs.append(Job(source, op.name, op.fingerprint, cand.index, tuple(cand.config), described, target,
                        caches))
    return jobs


@dataclasses.dataclass
class Summary:
    """What compiling ahead did for one key."""

    jobs: int = 0
    compiled: int = 0
    failed: int = 0
    seconds: float = 0.0  # wall time of the parallel phase
    worker_seconds: float = 0.0  # compile time summed over the jobs
    failures: list[str] = dataclasses.field(default_factory=list)
    built: set[tuple[int, tuple]] = dataclasses.field(default_factory=set)  # (impl, config) of each job done
    caches: tuple = ()  # the caches the jobs compiled into (``cache_env()`` when they were made)

    def built_for(self, candidate: Any) -> bool:
        """Whether a worker compiled ``candidate`` for this key (its launch here finds it in the
        cache; a failed job compiles again in the gate)."""
        return (candidate.index, tuple(candidate.config)) in self.built


class CompilePool:
    """``size`` worker processes; ``run(jobs)`` compiles them, each worker one job at a time."""

    def __init__(self, size: int) -> None:
        self.size = max(1, int(size))
        self._idle: queue.Queue[Worker] = queue.Queue()
        self._all: list[Worker] = []
        self._lock = threading.Lock()
        self._zygote: Zygote | None = None
        self.last_used = time.monotonic()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("TRITON_INTERPRET", None)  # workers compile; Triton's interpreter would refuse to
        env[_IN_WORKER] = "1"  # a worker that tunes (an op whose module tunes on import) never nests a pool
        env.update(cache_env())  # the caches this process uses now (each job carries them again: Job.caches)
        paths = [p or os.getcwd() for p in sys.path]  # as multiprocessing's spawn passes sys.path
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        return env

    def start(self, preload: Sequence[Source] = ()) -> None:
        """Start the workers that are missing (they import in parallel, in the background); a
        zygote started now imports the op modules ``preload`` names before forking them."""
        self.last_used = time.monotonic()  # started for use: not the idle reaper's
        with self._lock:
            self._all = [w for w in self._all if w.alive]
            live = set(map(id, self._all))
            drained = []
            while not self._idle.empty():
                w = self._idle.get_nowait()
                if id(w) in live:
                    drained.append(w)
            env = self._env()
            zygote = self._zygote_for(env, preload) if len(self._all) < self.size else None
            while len(self._all) < self.size:
                w = Worker(env, zygote)
                self._all.append(w)
                drained.append(w)
            for w in drained:
                self._idle.put(w)

    def _zygote_for(self, env: dict[str, str], preload: Sequence[Source] = ()) -> Zygote | None:
        """The zygote the missing workers fork from: started with the pool's first workers and again
        should it have exited; None where there is none (a platform without pidfds, turned off)."""
        if self._zygote is not None and not self._zygote.serving:
            _retire(self._zygote)
            self._zygote = None
        if self._zygote is None and _zygote_available():
            named = tuple(dict.fromkeys(s for s in preload if s not in _not_preloaded))
            try:
                self._zygote = Zygote(env, STARTUP_S, named)
            except OSError as exc:
                log.warning("compile workers start on their own: the zygote did not start: %s", exc)
        return self._zygote

    def zygote_ready(self) -> bool:
        """Wait until the pool's zygote can fork workers (its imports done, the named op modules'
        too, or those it leaves out found): a process that warms up at start-up pays that there,
        not at its first key. False where there is none, or it cannot fork."""
        with self._lock:
            zygote = self._zygote
        if zygote is None:
            return False
        ready = zygote.wait_ready()
        _not_preloaded.update(zygote.left_out)
        return ready

    def run(self, jobs: Sequence[Job]) -> list[Outcome]:
        self.start()
        self.last_used = time.monotonic()

        def one(job: Job) -> Outcome:
            w = self._idle.get()
            try:
                return w.call(job)
            finally:
                if w.alive:
                    self._idle.put(w)
                else:  # replaced at the next start(); this run goes on with the others
                    self.start()

        with ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="kernelgraft-compile") as ex:
            outcomes = list(ex.map(one, jobs))
        self.last_used = time.monotonic()
        return outcomes

    def close(self) -> None:
        with self._lock:
            workers_, self._all = self._all, []
            while not self._idle.empty():
                self._idle.get_nowait()
            zygote, self._zygote = self._zygote, None
        for w in workers_:
            w.close()
        if zygote is not None:
            _retire(zygote)

    @property
    def running(self) -> int:
        """Workers running or about to (a fork at their first job)."""
        return sum(w.alive for w in self._all)

    @property
    def pids(self) -> list[int]:
        """The pids of the workers started so far."""
        return [w.pid for w in self._all if w.pid is not None]

    @property
    def zygote_pid(self) -> int | None:
        """The pid of the process the workers fork from (until the zygote is ready, the process the
        pool started: the same, unless a child of it imported the named op modules); None where
        they start on their own."""
        return self._zygote.pid if self._zygote is not None else None

    @property
    def zygote_imports_s(self) -> float | None:
        """Seconds from the zygote's start until it could fork (its imports); None before that."""
        return self._zygote.imports_s if self._zygote is not None else None


def _retire(zygote: Zygote) -> None:
    """Close ``zygote``; the op modules it left out are not named to a zygote again."""
    _not_preloaded.update(zygote.left_out)
    zygote.close()


class _Shared:
    """The process's pool: made at first use, closed after ``IDLE_S`` idle and at exit."""

    def __init__(self) -> None:
        self.pool: CompilePool | None = None
        self._lock = threading.Lock()
        self._reaper: threading.Thread | None = None

    def get(self, size: int) -> CompilePool:
        with self._lock:
            if self.pool is None or self.pool.size != size:
                if self.pool is not None:
                    self.pool.close()
                self.pool = CompilePool(size)
                if self._reaper is None:
                    import atexit

                    atexit.register(self.close)
                    self._reaper = threading.Thread(target=self._reap, name="kernelgraft-compile-reaper",
                                                    daemon=True)
                    self._reaper.start()
            return self.pool

    def _reap(self) -> None:
        while True:
            time.sleep(min(IDLE_S, 10.0))
            with self._lock:
                pool = self.pool
                if pool is not None and pool.running and time.monotonic() - pool.last_used > IDLE_S:
                    pool.close()

    def close(self) -> None:
        with self._lock:
            if self.pool is not None:
                self.pool.close()


POOL = _Shared()


def _say_once(tag: str, message: str, *args: Any) -> None:
    if tag not in _said:
        _said.add(tag)
        log.info(message, *args)


def _pool_source(op: Any, device: torch.device) -> Source | str | None:
    """Where the pool's workers import ``op`` from; None where no pool compiles for ``device`` (the
    CPU runs Triton's interpreter, or fewer than two workers); a str where they cannot import it."""
    if device.type != "cuda" or workers() < 2:
        return None
    if op.fingerprint in _unimportable:
        return "importing its module does not define it (not a module-level op)"
    return source_of(op)


def would_use(op: Any, candidates: Sequence[Any], device: torch.device) -> bool:
    """Whether compiling a key of ``op`` on ``device`` would go to the pool: a GPU, two workers or
    more, an op a worker can import and two candidates or more of backends that compile ahead (the
    jobs themselves, made from the inputs, may still be fewer)."""
    return (isinstance(_pool_source(op, device), Source)
            and sum(1 for c in candidates if compiles_ahead(c.impl.backend)) >= 2)


def prestart(ops: Sequence[Any] = ()) -> None:
    """Start the compile workers now, in the background (they take seconds to import torch and
    Triton): a tool about to tune many keys overlaps that with its own set-up. Where the workers
    fork from a zygote started now, it imports the modules of ``ops`` first, once for all of them."""
    size = workers()
    if size >= 2:
        POOL.get(size).start(preload_for(ops))


def zygote_ready() -> bool:
    """Wait until the process's compile workers can fork from a zygote (``CompilePool.zygote_ready``);
    False where they would start on their own."""
    size = workers()
    return size >= 2 and POOL.get(size).zygote_ready()


def preload_for(ops: Sequence[Any]) -> tuple[Source, ...]:
    """Where a worker imports each of ``ops`` from, for the ones it can (``source_of``)."""
    found = (source_of(op) for op in ops)
    return tuple(dict.fromkeys(s for s in found if isinstance(s, Source)))


def compile_ahead(op: Any, candidates: Sequence[Any], args: Sequence[Any], device: torch.device) -> Summary | None:
    """Compile ``candidates`` in the pool for a call of their runners with ``args`` (inputs, then
    outputs) on ``device``; None where the pool is not used (see the module docstring)."""
    source = _pool_source(op, device)
    if source is None:
        return None
    if isinstance(source, str):
        _say_once(op.name, "%s: candidates compile one after the other: %s", op.name, source)
        return None
    jobs = jobs_for(op, candidates, args, Target.of_device(device), source)
    if len(jobs) < 2:
        return None
    summary = run_jobs(jobs, workers())
    summary.caches = jobs[0].caches
    return summary


def moved(summary: Summary | None) -> bool:
    """Whether the caches this process's launches read moved since ``summary``'s jobs were made
    (Inductor, compiling meanwhile, set ``TRITON_CACHE_DIR``): what they compiled is not where the
    gates look, and compiling ahead again beats each gate compiling its kernel here."""
    return summary is not None and summary.jobs > 0 and bool(summary.caches) and summary.caches != cache_env()


class Ahead:
    """``compile_ahead`` running on a thread of its own (it mostly waits for the workers), so the
    tuning thread can do other work meanwhile; ``result()`` waits for it and returns its summary,
    or raises what it raised. The thread counts as the tuning's own for the pacer."""

    def __init__(self, op: Any, candidates: Sequence[Any], args: Sequence[Any], device: torch.device) -> None:
        self._summary: Summary | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(op, candidates, args, device),
                                        name="kernelgraft-compile-ahead", daemon=True)
        self._thread.start()

    def _run(self, op: Any, candidates: Sequence[Any], args: Sequence[Any], device: torch.device) -> None:
        tid = threading.get_native_id()
        _pace.register_worker(tid)
        try:
            self._summary = compile_ahead(op, candidates, args, device)
        except BaseException as exc:  # handed to result(), on the tuning's thread
            self._error = exc
        finally:
            _pace.unregister_worker(tid)

    def result(self) -> Summary | None:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._summary


def run_jobs(jobs: Sequence[Job], size: int) -> Summary:
    """Compile ``jobs`` in the shared pool of ``size`` workers (what a worker hands back, such as a
    cuTile cubin, is adopted by its backend here)."""
    started = time.perf_counter()
    outcomes = POOL.get(size).run(jobs)
    summary = Summary(jobs=len(jobs), seconds=time.perf_counter() - started)
    for job, outcome in zip(jobs, outcomes):
        summary.worker_seconds += outcome.seconds
        if outcome.ok:
            summary.compiled += 1
            summary.built.add((job.impl, job.config))
            for artifact in outcome.artifacts:
                backends.get(outcome.backend).adopt(artifact)
        else:
            if outcome.detail.startswith("LookupError"):
                _unimportable.add(job.fingerprint)
            summary.failed += 1
            summary.failures.append(f"{job.label}: {outcome.detail}")
            log.debug("compile ahead of %s failed (it compiles in its gate run): %s", job.label, outcome.detail)
    for name in ("jobs", "compiled", "failed", "seconds", "worker_seconds"):
        TOTALS[name] += getattr(summary, name)
    TOTALS["keys"] += 1
    log.info("%s: compiled %d of %d candidates in %.2f s on %d workers (%.2f s of compiling)",
             jobs[0].op if jobs else "-", summary.compiled, summary.jobs, summary.seconds, size,
             summary.worker_seconds)
    return summary
