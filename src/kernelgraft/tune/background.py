"""Tuning off the caller's path: a worker thread per device, a bounded queue, one job per key.

A call that meets a key without a decision is served at once by a provisional choice (see
``_meanwhile``) and the key becomes a job here; its decision swaps in when it lands (the op's
plan for the key waits on a ``_select.Pending``; the decision is stored before the flag is set).

**Where the work runs.** One worker thread per device takes the jobs one at a time and tunes each
with the same trials a tuning inside a call uses, under the same per-device lock, so a tuning on
a caller's thread (``kg.tune.pretune``, ``blocking=True``) and the worker never time candidates
against each other. On CUDA the worker has its own stream, created non-blocking: its launches never
queue behind the serving stream's, nor the serving stream's behind them, and it is no stream of
torch's pool, which other code may be handed (``kernelgraft.timing.streams``).

Why a thread rather than a worker process: a job needs the op itself (the reference, the bound and
compiled kernels, the user's ``supports`` and prune hooks, ``torch:compile`` of the reference), the
caller's tensors (copied on the device without a trip through the host; an index argument stays
valid for the others) and the process's own memory to land in. A process would need all of that
pickled or rebuilt, a CUDA context of its own (hundreds of MB) and its own compiles. A thread costs
the GIL and the GPU's time, and both are paced: every unit of work (``_phases``) starts only in a
quiet window (``_pace``: no other thread of the process busy on the CPU, nothing queued on the
device's default stream), so candidates are timed on an idle GPU, as inside a call, and served
calls do not wait behind a tuning for the GIL or the GPU. While serving stays busy the units start
at a duty cycle (5% of wall time, ``KERNELGRAFT_TUNE_DUTY``): a tuning still lands under constant
load, at a bounded cost; the report counts the units timed under load. The heavy Python part of a
tuning is compiling: that belongs in the compile phase's process pool, whose workers run at a
lower CPU priority. A unit that compiles in this process all the same (``torch:compile``'s gate,
a kernel's first launch the pool did not compile) holds the GIL for seconds, which no duty cycle
can split: it starts only in a pause of serving, or once serving stayed busy for
``KERNELGRAFT_TUNE_HEAVY_WAIT`` seconds (10), and the report counts those too.

**Bounds.** At most ``KERNELGRAFT_TUNE_QUEUE`` jobs per device (64) and ``KERNELGRAFT_TUNE_QUEUE_MB``
MiB of copied inputs in all (2048). A key over either is not queued (``submit`` returns None): the
tuner serves its provisional choice for a while and asks again. A job whose op was replaced or
unregistered (``forget``) or whose decisions were cleared (``clear``) is dropped; a running one
stops at its next unit (``_pace.Cancelled``). ``wait()`` waits for every job to finish. A job
whose inputs the op refuses (their output shapes, which the call served meanwhile was spared, do
not fit: ``kernelgraft.op.outputs``) ends quietly, and its key queues no job for inputs of those
exact shapes for ``REFUSED_S`` (60 s): their calls plan without a job, which works out the output
shapes first and refuses them in the op's words.

**Captures.** A call made while a CUDA graph is captured or ``torch.compile`` traces never queues a
job (the tuner checks ``no_tune_reason`` on the caller's thread first). The worker's own captures
(timing by graph replay) use ``capture_error_mode="thread_local"`` (``kernelgraft.timing.capture``),
so they never break a capture on another thread; and the worker thread runs in the driver's relaxed
capture mode (thread-local again inside its own captures, so a capture refuses there what it would
refuse the user), so its synchronisations are not prohibited by (and do not invalidate) a capture
another thread makes in the default global mode.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ..errors import KernelgraftError
from ..op.select import Pending
from ..timing.capture import RELAXED, exchange_capture_mode
from ..timing.streams import private_stream
from . import pace as _pace
from .inputs import clone_args, nbytes

__all__ = ["Job", "Background", "BACKGROUND", "queue_limits", "REFUSED_S"]

REFUSED_S = 60.0  # a key whose job found its inputs refused queues no job for this long
_MAX_REFUSED = 1024

log = logging.getLogger(__name__)


def _env_int(name: str, default: int) -> int:
    try:
        value = int(os.environ.get(name, "") or default)
    except ValueError:
        return default
    return value if value > 0 else default


def queue_limits() -> tuple[int, int]:
    """(jobs per device, bytes of copied inputs in all) from the environment."""
    return _env_int("KERNELGRAFT_TUNE_QUEUE", 64), _env_int("KERNELGRAFT_TUNE_QUEUE_MB", 2048) << 20


@dataclasses.dataclass(eq=False)
class Job:
    """One key to tune. ``run(job)`` tunes it on the worker (``job.args``: the copies, ready once
    ``job.ready``, a CUDA event or None, has fired) and stores the decision; ``pending`` lands
    after it returns, or when the job is dropped."""

    digest: str
    fingerprint: str
    device: str  # the worker's: 'cuda:0', 'cpu'
    run: Callable[["Job"], None]
    label: str
    nbytes: int
    pending: Pending = dataclasses.field(default_factory=Pending)
    args: tuple | None = None
    ready: Any = None
    enqueued: float = dataclasses.field(default_factory=time.perf_counter)
    started: float | None = None
    cancelled: bool = False
    shapes: tuple = ()  # the inputs' exact shapes (the digest is the bucket's)


class Background:
    """The jobs and workers of this process (``BACKGROUND``)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._jobs: dict[str, Job] = {}  # digest -> queued or running job
        self._queues: dict[str, collections.deque[Job]] = {}
        self._workers: dict[str, threading.Thread] = {}
        self._bytes = 0
        self._stopping = False
        self._broken: dict[str, str] = {}  # device -> why its worker could not start
        self._refused: dict[tuple, float] = {}  # (digest, exact shapes) -> until when they are refused
        self.stats: collections.Counter = collections.Counter()

    # ------------------------------------------------------------------ the caller's side
    def submit(self, digest: str, fingerprint: str, device: torch.device, args: tuple,
               run: Callable[[Job], None], label: str) -> Pending | None:
        """The pending decision of ``digest``: the job already queued or running for it, else a
        new one (its arguments copied now). None when it cannot be queued (limits, stopping, the
        arguments cannot be copied): the caller serves its provisional choice and asks later."""
        where = _device_key(device)
        jobs_cap, bytes_cap = queue_limits()
        size = nbytes(args)
        with self._lock:
            job = self._jobs.get(digest)
            if job is not None:
                return job.pending
            if self._stopping:
                return None
            if self._refused.get((digest, _shapes(args)), 0.0) > time.monotonic():  # they do not fit the op
                self.stats["refused"] += 1
                return None
            queue = self._queues.setdefault(where, collections.deque())
            if len(queue) >= jobs_cap or self._bytes + size > bytes_cap:
                self.stats["skipped"] += 1
                log.info("not queuing a tuning of %s: %d jobs and %d MiB of inputs queued (limits %d, %d MiB)",
                         label, len(queue), self._bytes >> 20, jobs_cap, bytes_cap >> 20)
                return None
            job = Job(digest, fingerprint, where, run, label, size, shapes=_shapes(args))
            self._jobs[digest] = job  # reserved: other callers of this key share its pending
            self._bytes += size
        try:
            copies, ready = clone_args(args)
        except Exception as exc:  # out of memory, or an argument that cannot be copied
            log.info("not queuing a tuning of %s: copying its inputs failed (%s: %s)", label,
                     type(exc).__name__, exc)
            with self._cond:
                self._drop(job, "skipped")
            return None
        with self._cond:
            if job.cancelled:  # forgotten while its inputs were copied
                self._drop(job, "dropped")
                return job.pending
            job.args, job.ready = copies, ready
            queue.append(job)
            self.stats["queued"] += 1
            self._start_worker(where)
            self._cond.notify_all()
        return job.pending

    def forget(self, fingerprint: str) -> None:
        """Drop the jobs of one op (it was replaced or unregistered)."""
        self._cancel(lambda job: job.fingerprint == fingerprint)

    def clear(self) -> None:
        """Drop every job (decisions were cleared), and forget which keys' inputs were refused."""
        with self._lock:
            self._refused.clear()
        self._cancel(lambda job: True)

    def _cancel(self, which: Callable[[Job], bool]) -> None:
        with self._cond:
            for job in [j for j in self._jobs.values() if which(j)]:
                job.cancelled = True
                if job.started is None and job.args is not None:  # queued, not running: gone now
                    self._queues[job.device].remove(job)
                    self._drop(job, "dropped")
            self._cond.notify_all()

    def _refuse(self, digest: str, shapes: tuple) -> None:
        """Queue no job for ``digest`` with inputs of these exact ``shapes`` for ``REFUSED_S``:
        they do not fit the op (a job per call would copy them and fail again). Other shapes of
        the same bucket are still tuned. The calls with these plan again without a job, which
        works out their output shapes and refuses them in the op's words."""
        with self._lock:
            if len(self._refused) >= _MAX_REFUSED:
                self._refused.pop(next(iter(self._refused)))
            self._refused[(digest, shapes)] = time.monotonic() + REFUSED_S
            self.stats["refused_inputs"] += 1

    def _drop(self, job: Job, stat: str) -> None:
        """Forget ``job`` and let its waiting plans go (the lock held)."""
        if self._jobs.get(job.digest) is job:
            del self._jobs[job.digest]
            self._bytes -= job.nbytes
        job.args = job.ready = None
        job.pending.land()
        self.stats[stat] += 1
        self._cond.notify_all()

    def usable(self, device: torch.device) -> bool:
        """Whether keys on ``device`` can be tuned here (else they are tuned inside the call)."""
        return not self._stopping and _device_key(device) not in self._broken

    def pending(self) -> int:
        """Jobs queued or running."""
        return len(self._jobs)

    def labels(self, fingerprint: str) -> list[str]:
        """What the queued or running jobs of one op tune (their keys' inputs)."""
        with self._lock:
            return [job.label for job in self._jobs.values() if job.fingerprint == fingerprint]

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no job is queued or running; False if ``timeout`` seconds passed first."""
        if threading.current_thread() in self._workers.values():
            return not self._jobs  # a worker waiting for itself would never return
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs, timeout)

    # ------------------------------------------------------------------ the workers
    def _start_worker(self, where: str) -> None:
        worker = self._workers.get(where)
        if worker is None or not worker.is_alive():
            worker = threading.Thread(target=self._work, args=(where,), name=f"kernelgraft-tune-{where}",
                                      daemon=True)
            self._workers[where] = worker
            worker.start()

    def _work(self, where: str) -> None:
        _pace.register_worker(threading.get_native_id())
        device = torch.device(where)
        queue = self._queues[where]
        stream = None
        try:
            # its start-up (imports, a CUDA context on this thread) waits for a quiet moment too: the
            # call that queued the first job is still finishing
            _pace.Pacer(_pace.Watch().busy).before()
            if device.type == "cuda":
                torch.cuda.set_device(device)
                exchange_capture_mode(RELAXED)  # see the module docstring
                stream = private_stream(device, "work")
        except Exception as exc:  # no worker on this device: its keys are tuned inside their calls
            log.exception("the background tuning worker for %s could not start", where)
            with self._cond:
                self._broken[where] = f"{type(exc).__name__}: {exc}"
                while queue:
                    self._drop(queue.popleft(), "skipped")
            _pace.unregister_worker(threading.get_native_id())
            return
        try:
            while True:
                with self._cond:
                    while not queue and not self._stopping:
                        self._cond.wait()
                    if self._stopping and not queue:
                        return
                    job = queue.popleft()
                    job.started = time.perf_counter()
                try:
                    self._run(job, stream)
                except _pace.Cancelled:
                    log.debug("tuning of %s dropped", job.label)
                except KernelgraftError as exc:  # the inputs do not fit, or the op cannot plan them:
                    log.info("not tuning %s: %s", job.label, exc)  # its calls are told so (the op)
                    self._refuse(job.digest, job.shapes)
                except BaseException:  # never lose the worker: the op keeps its provisional choice
                    log.exception("background tuning of %s failed", job.label)
                finally:
                    with self._cond:
                        self._drop(job, "done")
        finally:
            _pace.unregister_worker(threading.get_native_id())

    def _run(self, job: Job, stream: Any) -> None:
        if stream is None:
            job.run(job)
            return
        with torch.cuda.stream(stream):
            if job.ready is not None:
                stream.wait_event(job.ready)
            try:
                job.run(job)
            finally:
                # The copies were allocated on the caller's stream: they go back to its pool only
                # once this stream no longer reads them.
                stream.synchronize()

    def pacer(self, job: Job) -> _pace.Pacer:
        """The pacer of ``job``'s units on its device."""
        device = torch.device(job.device)
        default = torch.cuda.default_stream(device) if device.type == "cuda" else None
        watch = _pace.Watch()

        def busy() -> bool:
            return watch.busy() or (default is not None and not default.query())

        return _pace.Pacer(busy, cancelled=lambda: job.cancelled or self._stopping)

    def stop(self, timeout: float = 10.0) -> None:
        """Drop every job and let the workers end (at exit)."""
        with self._cond:
            self._stopping = True
        self.clear()
        deadline = time.monotonic() + timeout
        for worker in list(self._workers.values()):
            if worker is not threading.current_thread():
                worker.join(max(0.0, deadline - time.monotonic()))

    def _after_fork(self) -> None:
        """In a forked child no worker runs: start empty (plans waiting on a parent's job replan)."""
        for job in list(self._jobs.values()):
            job.pending.land()
        self._reset()


def _shapes(args: tuple) -> tuple:
    """The exact shapes of the tensor arguments (and of each list of tensors), in order."""
    return tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else
                 tuple(tuple(t.shape) for t in a if isinstance(t, torch.Tensor)) if isinstance(a, (list, tuple))
                 else None for a in args)


def _device_key(device: torch.device) -> str:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index}"
    return device.type


BACKGROUND = Background()
atexit.register(BACKGROUND.stop)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=BACKGROUND._after_fork)
