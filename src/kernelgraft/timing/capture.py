"""A CUDA-graph capture that may fail without breaking the process's random numbers.

Timing captures calls into a graph and falls back to eager timing when a call cannot be captured
(a host synchronisation, an allocation torch refuses). But a capture registers the default CUDA
generator of every device with the graph, and when it fails midway torch never unregisters them:
every later random op in the process (``torch.randn(..., device="cuda")``, dropout, sampling)
then raises "Offset increment outside graph capture encountered unexpectedly" (seen on torch 2.11
after the bench's capture of a call with ``.item()`` failed). A failed attempt inside kernelgraft
must not break the user's process, so each default generator's state is cloned before the
capture and put back (``graphsafe_set_state``) when the capture fails.

The capture is begun and ended on the graph itself rather than through ``torch.cuda.graph``, whose
entry synchronises the device and empties the caching allocator (``cudaFree`` synchronises the
device too): from a tuning running beside serving threads (off the caller's path) that would stall
their work and drop their cached memory, and a timing graph needs neither. Captures run on a
stream of kernelgraft's own (``_streams.private_stream``), never one of torch's pool that other
code may be capturing on, in ``thread_local`` mode, so they never break a capture on another thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .gpu_busy import cover
from .streams import private_stream

__all__ = ["capture", "capture_calls", "replay_graph", "exchange_capture_mode", "RELAXED", "THREAD_LOCAL"]

log = logging.getLogger(__name__)
THREAD_LOCAL, RELAXED = 1, 2  # CUstreamCaptureMode


@functools.cache
def _exchange() -> Any:
    try:
        fn = ctypes.CDLL("libcuda.so.1").cuThreadExchangeStreamCaptureMode
    except (OSError, AttributeError):  # no driver: nothing is captured either
        return None
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
    fn.restype = ctypes.c_int
    return fn


def exchange_capture_mode(mode: int) -> int | None:
    """Set this thread's stream-capture mode (``cuThreadExchangeStreamCaptureMode``); the previous
    one, or None where it could not be set. A tuning worker runs relaxed, so its synchronisations
    are neither refused nor break a capture another thread makes in the global mode; inside its
    own captures it is thread-local again, so what a capture refuses is what the user's would."""
    fn = _exchange()
    if fn is None:
        return None
    value = ctypes.c_int(mode)
    status = fn(ctypes.byref(value))
    if status != 0:
        log.debug("cuThreadExchangeStreamCaptureMode(%d) returned %d", mode, status)
        return None
    return value.value


def _generators() -> list:
    """The default CUDA generators that are already initialised (a capture registers those)."""
    return list(getattr(torch.cuda, "default_generators", ()))


@contextlib.contextmanager
def capture(graph: "torch.cuda.CUDAGraph", stream: "torch.cuda.Stream") -> Iterator[None]:
    """Capture the block's work on ``stream`` into ``graph`` (``thread_local`` error mode), with
    the default generators restored when the capture fails (the exception still propagates)."""
    saved = []
    for gen in _generators():
        try:
            saved.append((gen, gen.clone_state()))
        except Exception:  # a torch without graph-safe generator states: nothing to restore
            pass
    outer = exchange_capture_mode(THREAD_LOCAL)
    try:
        with torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                yield
            finally:
                graph.capture_end()
    except BaseException:
        for gen, state in saved:
            try:
                gen.graphsafe_set_state(state)
            except Exception as exc:  # pragma: no cover - depends on the torch build
                log.warning("could not restore a CUDA generator after a failed graph capture: %s", exc)
        raise
    finally:
        if outer is not None and outer != THREAD_LOCAL:
            exchange_capture_mode(outer)


def capture_calls(graph: "torch.cuda.CUDAGraph", call: Callable[[int], object], count: int) -> str | None:
    """Capture ``call(0) ... call(count - 1)`` into ``graph`` on the current device: None, or why
    the capture failed (a host synchronisation, an allocation torch refuses), so the caller can
    time another way. ``call(0)`` runs once first on the capture stream, as torch.cuda.graphs
    advises. The capture stream is our own, on the current device: torch's default capture stream
    is one per process, made on whichever device captured first, so a later capture of ``cuda:1``
    work would switch to device 0 and record nothing (an empty graph times as ~0)."""
    try:
        stream = private_stream(None, "capture")
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call(0)
        torch.cuda.current_stream().wait_stream(stream)
        with capture(graph, stream):
            for j in range(count):
                call(j)
    except Exception as exc:
        torch.cuda.synchronize()
        text = str(exc).splitlines()[0][:300] if str(exc) else ""
        return f"{type(exc).__name__}: {text}"
    return None


def replay_graph(call: Callable[[int], object], estimate_ms: float, target_ms: float = 1.0,
                 max_calls: int = 200) -> "tuple[torch.cuda.CUDAGraph, int] | str":
    """A graph of ``call(0) ... call(n - 1)`` whose replay takes about ``target_ms`` of GPU time,
    and ``n``; or why the capture failed.

    ``n`` starts from ``estimate_ms`` (an eager estimate of one call) and is corrected once by a
    timed replay: an eager estimate of a short call measures its host launch gaps, not its GPU
    time, and a first call that does host work (recording a native replay, a GC pass) can inflate
    it a hundredfold. A graph of one or two calls then adds the graph launch's own GPU latency (a
    few microseconds) to each call's time: the LLM suite once timed a 1.7 us RMSNorm at 19.7 us
    that way (``benchmarks/results/2026-12-01-h200-3``)."""
    calls = max(1, min(max_calls, int(target_ms / max(estimate_ms, 1e-4))))
    made: "tuple[torch.cuda.CUDAGraph, int] | None" = None
    for attempt in range(2):
        graph = torch.cuda.CUDAGraph()
        failed = capture_calls(graph, call, calls)
        if failed is not None:  # a larger graph that fails (memory) leaves the first one to use
            return made if made is not None else failed
        made = graph, calls
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()  # the first replay uploads the graph
        # GPU work queued ahead of the start event, so the timed replay is already queued when the
        # GPU reaches it: its GPU time, not the host's launch of it
        cover(20.0, slack_us=20.0)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        replay_ms = start.elapsed_time(end)
        if attempt or calls >= max_calls or replay_ms >= target_ms / 4:
            break
        # fewer calls than fill the target: recapture with as many as do
        calls = max(calls + 1, min(max_calls, int(calls * target_ms / max(replay_ms, 1e-4))))
    assert made is not None  # the first attempt either returned or made a graph
    return made
