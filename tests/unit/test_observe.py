"""Launch observation is per thread: a recording sees the launches, torch ops and Triton launches
of its own thread only, while other threads launch at the same time (host-function kernels through
the packed C ABI, Triton kernels through the interpreter, Triton's launch hook and JIT wrapper)."""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch
import triton
import triton.language as tl

from _host_backend import HOST_FN, HostImpl, _Runner
from kernelgraft.native import record as _record
from kernelgraft.backends.triton import replay as _triton
from kernelgraft.spec import Config
from kernelgraft.driver import observe as _observe


@triton.jit
def _double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def _host_runner() -> tuple[_Runner, object]:
    """A host "kernel" out = x + y (n floats) and its runner, which notes every launch."""

    def run(packed):
        a, b, o = (ctypes.c_uint64.from_address(packed[i]).value for i in range(3))
        n = ctypes.c_int32.from_address(packed[3]).value
        A, B, O = ((ctypes.c_float * n).from_address(p) for p in (a, b, o))
        for i in range(n):
            O[i] = A[i] + B[i]

    fn = HOST_FN(run)
    spec = HostImpl(launch=lambda x, y, out: [x, y, out, x.numel()], configs=({},), fn=fn,
                    kinds=(ctypes.c_void_p,) * 3 + (ctypes.c_int32,))
    return _Runner(spec, Config({})), fn


class _Other(threading.Thread):
    """Launches ``work`` over and over until told to stop, starting once ``go`` is set."""

    def __init__(self, work, go: threading.Event) -> None:
        super().__init__(daemon=True)
        self.work, self.go = work, go
        self.first = threading.Event()
        self.stop = threading.Event()
        self.rounds = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            assert self.go.wait(30)
            while True:
                self.work()
                self.rounds += 1
                self.first.set()
                if self.stop.is_set():
                    return
        except BaseException as exc:  # reported by the test thread
            self.error = exc
            self.first.set()


def _finish(other: _Other) -> None:
    other.stop.set()
    other.join(60)
    assert not other.is_alive()
    if other.error is not None:
        raise other.error


def test_observers_are_per_thread():
    seen: dict[str, list] = {"a": [], "b": []}

    class Seen:
        def __init__(self, name):
            self.name = name

        def note(self, record, why=""):
            seen[self.name].append(why)

    both = threading.Barrier(2)

    def observe(name):
        with _observe.observing(Seen(name)):
            both.wait(10)  # both threads observe at once
            for i in range(50):
                _observe.note(None, f"{name}{i}")
            both.wait(10)
        _observe.note(None, "after")  # nobody observes any more: dropped

    threads = [threading.Thread(target=observe, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen == {n: [f"{n}{i}" for i in range(50)] for n in "ab"}
    assert _observe.active() is None


def test_observing_nests_and_restores():
    outer, inner = _record._Recorder(), _record._Recorder()
    with _observe.observing(outer):
        with _observe.observing(inner):
            _observe.note(None, "inner")
        _observe.note(None, "outer")
    assert inner.refused == ["inner"] and outer.refused == ["outer"]
    assert _observe.active() is None


def test_a_recording_sees_only_its_own_thread(monkeypatch):
    """Thread A records one host launch; meanwhile thread B launches host kernels, runs torch ops
    and interpreted Triton kernels, and fires Triton's launch hook: none of it reaches A's recorder."""
    from triton import knobs

    mine, my_fn = _host_runner()
    theirs, their_fn = _host_runner()
    go = threading.Event()

    def their_work():
        x, y, out = torch.randn(16), torch.randn(16), torch.empty(16)
        theirs(x, y, out)
        torch.testing.assert_close(out, x + y)
        out.zero_()  # a computing torch op: A's dispatch watch must not see it
        _double[(1,)](x, out, 16, BLOCK=16)
        torch.testing.assert_close(out, x * 2)
        knobs.runtime.launch_enter_hook(None)  # as Triton's launcher calls it for a compiled kernel

    other = _Other(their_work, go)
    other.start()
    x, y, out = torch.randn(8), torch.randn(8), torch.empty(8)
    with _record.recording() as rec:
        go.set()
        assert other.first.wait(60)
        mine(x, y, out)
        while other.rounds < 3 and other.error is None:  # B keeps launching while A records
            other.first.wait(0.01)
        _finish(other)
    torch.testing.assert_close(out, x + y)
    assert theirs.calls >= 3 and mine.calls == 1
    assert [r.fn for r in rec.launches] == [_observe.address_of(my_fn)]
    assert rec.launches[0].pointers == [(0, x.data_ptr()), (8, y.data_ptr()), (16, out.data_ptr())]
    assert rec.ops == [] and rec.refused == []
    assert rec.triton_launches == 0 and rec.triton_described == 0


def test_two_threads_record_at_once():
    """Two recordings in flight on two threads: each sees its own launches, Triton's hook counts
    each thread's launches into its own recorder, and the JIT wrapper and hook are removed only
    when the last recording ends."""
    from triton import knobs
    from triton.runtime.jit import JITFunction

    original = JITFunction.run
    hooks_before = list(getattr(knobs.runtime.launch_enter_hook, "calls", []))
    inside, leave = threading.Barrier(2), threading.Barrier(2)
    recorders: dict[int, object] = {}
    errors: list[BaseException] = []

    def record(i: int) -> None:
        try:
            runner, _fn = _host_runner()
            with _record.recording() as rec:
                inside.wait(10)
                assert JITFunction.run is not original
                for _ in range(i + 1):
                    runner(torch.randn(4), torch.randn(4), torch.empty(4))
                    knobs.runtime.launch_enter_hook(None)
                leave.wait(10)
            recorders[i] = (rec, _observe.address_of(runner.spec.fn))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=record, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    for i, (rec, fn) in recorders.items():
        assert [r.fn for r in rec.launches] == [fn] * (i + 1)
        assert rec.triton_launches == i + 1
    assert JITFunction.run is original
    assert list(getattr(knobs.runtime.launch_enter_hook, "calls", [])) == hooks_before


def test_the_jit_wrapper_describes_only_the_recording_thread():
    """The ``JITFunction.run`` wrapper lets other threads' launches through untouched and
    describes (here: fails to describe, noting why) the recording thread's."""
    kernel = object()
    calls = []

    def original(self, *args, grid, warmup, **kwargs):
        calls.append(threading.get_ident())
        return kernel

    run = _triton._wrap_run(original)
    go, done = threading.Event(), threading.Event()
    results = []

    def elsewhere():
        go.wait(10)
        results.append(run(None, 1, 2, grid=(1,), warmup=False))
        done.set()

    t = threading.Thread(target=elsewhere)
    t.start()
    with _record.recording() as rec:
        go.set()
        assert done.wait(10)
        assert rec.triton_described == 0 and rec.refused == []
        assert run(None, 1, 2, grid=(1,), warmup=False) is kernel
        assert run(None, 1, 2, grid=(1,), warmup=True) is kernel  # warm-ups launch nothing
    t.join(10)
    assert results == [kernel] and len(calls) == 3
    assert rec.triton_described == 1
    assert len(rec.refused) == 1 and rec.refused[0].startswith("describing the Triton launch failed")


def test_the_driver_does_not_import_native():
    """The driver layer describes launches; whoever observes them (the native replay) depends on
    the driver, never the other way round (function-level imports included)."""
    import ast
    import inspect

    from kernelgraft.driver import cu as _cu, module as _module, params as _params

    for module in (_cu, _module, _observe, _params):
        tree = ast.parse(inspect.getsource(module))
        names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [n for n in names if "_native" in n], (module.__name__, names)
