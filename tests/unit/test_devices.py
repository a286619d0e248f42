"""Per-device execution without a GPU: the runner seam, the driver's per-device contexts and
handles, the launcher's switch, candidates judged on the tensors' device, and the lock that
serializes Triton's interpreter. The real thing runs in tests/gpu/test_gpu_devices.py (two GPUs)."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch

import kernelgraft as kg
from kernelgraft import backends
from kernelgraft.op import candidates as _candidates
from kernelgraft.backends import device as _device
from kernelgraft.driver import cu as _cu, module as _module


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it lives on ``cuda:1`` (what the seam asks of a tensor)."""

    def get_device(self) -> int:  # type: ignore[override]
        return 1


class _Devices:
    """torch's current device, faked: ``use(i)`` is what ``torch.cuda.device(i)`` does."""

    def __init__(self, current: int = 0) -> None:
        self.current = current
        self.switches: list[int] = []

    def get(self) -> int:
        return self.current

    @contextlib.contextmanager
    def use(self, index: int):
        self.switches.append(index)
        before, self.current = self.current, index
        try:
            yield
        finally:
            self.current = before


@pytest.fixture
def devices(monkeypatch) -> _Devices:
    fake = _Devices()
    monkeypatch.setattr(_device, "current_device", fake.get)
    monkeypatch.setattr(_device, "use_device", fake.use)
    return fake


def test_runner_switches_to_its_tensors_device_only_when_it_differs(devices):
    seen = []
    run = _device.on_tensor_device(lambda *args: seen.append(devices.current) or "done")
    x = torch.zeros(2).as_subclass(_OnCuda)
    assert run(x, 3) == "done" and seen == [1] and devices.switches == [1]
    assert devices.current == 0  # switched back after the call
    devices.current = 1
    run(x, 3)
    assert seen == [1, 1] and devices.switches == [1]  # already current: no switch


def test_runner_finds_the_tensor_after_scalars_and_in_lists(devices):
    seen = []
    run = _device.on_tensor_device(lambda *args: seen.append(devices.current))
    x = torch.zeros(2).as_subclass(_OnCuda)
    run(2.0, [x, x])
    run(None, 7, x)
    assert seen == [1, 1] and devices.switches == [1, 1]


def test_cpu_calls_never_ask_for_the_current_device(monkeypatch):
    def no_cuda() -> int:
        raise AssertionError("a CPU call asked for the current CUDA device")

    monkeypatch.setattr(_device, "current_device", no_cuda)
    lock = threading.Lock()
    held = []
    run = _device.on_tensor_device(lambda *a: held.append(lock.locked()), cpu_lock=lock)
    run(torch.zeros(1), torch.zeros(1))
    run(1, 2)  # no tensor at all: runs as is
    assert held == [True, True]


def test_every_backend_binds_a_runner_through_the_seam(devices):
    from kernelgraft.examples import add_relu

    seen = {impl.backend for impl in add_relu.add_relu.impls}
    assert {"triton", "cuda"} <= seen
    for impl in add_relu.add_relu.impls:
        runner = backends.get(impl.backend).bind(impl, impl.configs[0])
        assert runner.__wrapped__ is not None, impl.backend


def test_the_wrapper_keeps_the_runners_replayable_flag():
    class R:
        replayable = False

        def __call__(self, *args):
            return None

    assert _device.on_tensor_device(R()).replayable is False
    assert not hasattr(_device.on_tensor_device(lambda: None), "replayable")


# ---------------------------------------------------------------- the driver, faked
class _Driver:
    """The driver calls ``_cu`` makes, over a per-thread context stack (contexts are ``100 + i``)."""

    def __init__(self, current: int | None) -> None:
        self.stack = [] if current is None else [100 + current]
        self.retained: list[int] = []
        self.loads: list[tuple[str, int | None]] = []

    def __call__(self, name: str, *args, what: str = ""):
        top = self.stack[-1] if self.stack else 0
        if name == "cuCtxGetCurrent":
            return top
        if name == "cuCtxGetDevice":
            assert top, "cuCtxGetDevice without a context"
            return top - 100
        if name == "cuDeviceGet":
            return args[0]
        if name == "cuDevicePrimaryCtxRetain":
            self.retained.append(args[0])
            return 100 + args[0]
        if name == "cuCtxSetCurrent":
            self.stack[-1:] = [args[0]]
            return None
        if name == "cuCtxPushCurrent":
            self.stack.append(args[0])
            return None
        if name == "cuCtxPopCurrent":
            return self.stack.pop()
        if name == "cuModuleLoadData":
            self.loads.append(("load", top - 100 if top else None))
            return f"module@{top - 100}"
        if name == "cuModuleGetFunction":
            self.loads.append(("function", top - 100 if top else None))
            return f"{args[0]}:{args[1].decode()}"
        raise AssertionError(f"unexpected driver call {name}")


@pytest.fixture
def driver(monkeypatch):
    def make(current: int | None) -> _Driver:
        fake = _Driver(current)
        monkeypatch.setattr(_cu, "call", fake)
        monkeypatch.setattr(_cu, "_PRIMARY", {})
        return fake

    return make


def test_ensure_context_replaces_another_devices_context(driver):
    fake = driver(0)
    _cu.ensure_context(0)
    assert fake.stack == [100] and fake.retained == []  # already device 0's: nothing done
    _cu.ensure_context(1)
    assert fake.stack == [101]
    _cu.ensure_context(0)
    _cu.ensure_context(1)
    assert fake.retained == [1, 0]  # each primary context retained once


def test_ensure_context_sets_one_on_a_thread_without_any(driver):
    fake = driver(None)
    _cu.ensure_context(1)
    assert fake.stack == [101]


def test_device_context_pushes_and_restores(driver):
    fake = driver(0)
    with _cu.device_context(1):
        assert fake.stack == [100, 101]
    assert fake.stack == [100]
    with _cu.device_context(0):
        assert fake.stack == [100]  # already current: no push
    fake = driver(None)
    with _cu.device_context(1):
        assert fake.stack == [101]
    assert fake.stack == []


def test_modules_load_and_find_kernels_in_each_devices_context(driver):
    fake = driver(0)
    fn = kg.driver.load_module(b"\x7fELF-per-device", "cubin", name="pd").function("k")
    assert fn.handle(1) == "module@1:k"
    assert fake.stack == [100]  # the caller's device 0 is current again
    assert fn.handle(0) == "module@0:k"
    assert fn.handle(1) == "module@1:k"  # cached per device
    assert fake.loads == [("load", 1), ("function", 1), ("load", 0), ("function", 0)]


def test_launcher_switches_to_its_device_and_uses_that_devices_stream(monkeypatch):
    fake = _Devices(current=0)
    launched = []
    monkeypatch.setattr(_module, "current_device", fake.get)
    monkeypatch.setattr(torch.cuda, "device", fake.use)
    monkeypatch.setattr(_module, "current_stream", lambda index: 5000 + index)

    def raw(function, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        launched.append((fake.current, function, stream))
        return 0

    fn = kg.driver.load_module(b"\x7fELF-launcher-switch", "cubin", name="ls").function("k")
    fn._handles.update({0: 700, 1: 701})  # as if loaded on both devices
    run = fn.launcher(["ptr", "i32"])
    run._launch = raw
    run(1, 4, 32, [0, 3])
    run(0, 4, 32, [0, 3])
    assert launched == [(1, 701, 5001), (0, 700, 5000)]
    assert fake.switches == [1] and fake.current == 0


# ---------------------------------------------------------------- candidates
def test_a_capability_reason_names_the_device(monkeypatch):
    monkeypatch.setattr(_candidates, "capability", lambda index: {0: (9, 0), 1: (8, 0)}[index])
    impl = kg.triton(lambda x, out: None, min_capability=(9, 0), name="needs_hopper")
    reason, category = _candidates._impl_reason(impl, torch.device("cuda", 1), [])
    assert category == "capability"
    assert reason == "needs sm_90 or newer, cuda:1 is sm_80"
    assert _candidates._impl_reason(impl, torch.device("cuda", 0), []) == (None, None)


def test_supports_predicates_run_on_the_tensors_device(devices):
    seen = []
    with _candidates._on(torch.device("cuda", 1)):
        seen.append(devices.current)
    with _candidates._on(torch.device("cpu")):
        seen.append(devices.current)
    assert seen == [1, 0] and devices.switches == [1]


def test_timing_runs_on_the_trials_device(monkeypatch):
    from kernelgraft.timing import on_device

    fake = _Devices(current=0)
    monkeypatch.setattr(torch.cuda, "current_device", fake.get)
    monkeypatch.setattr(torch.cuda, "device", fake.use)
    with on_device(torch.device("cuda", 1)):
        assert fake.current == 1
    with on_device("cuda:0"), on_device(None), on_device(torch.device("cpu")):
        assert fake.current == 0
    assert fake.switches == [1]


# ---------------------------------------------------------------- Triton's interpreter
def test_concurrent_interpreted_triton_calls_are_serialized_and_correct():
    from kernelgraft.backends.triton.jit import interpreting
    from kernelgraft.examples.add_relu import add_relu

    if not interpreting():
        pytest.skip("needs TRITON_INTERPRET=1 (Triton on the CPU)")
    n_threads = 12
    barrier = threading.Barrier(n_threads)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            g = torch.Generator().manual_seed(i)
            x = torch.randn(37 + i, generator=g)  # a fresh signature per thread
            y = torch.randn(37 + i, generator=g)
            barrier.wait()
            for _ in range(3):
                out = add_relu.run(x, y, impl="triton")
                torch.testing.assert_close(out, torch.relu(x + y))
        except BaseException as exc:  # reported below with the thread's index
            errors.append(RuntimeError(f"thread {i}: {type(exc).__name__}: {exc}"))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors


def test_a_bundled_binary_never_launches_on_a_gpu_of_another_arch(monkeypatch):
    """A bundle is loaded for one arch; a process may also drive a GPU of another (an sm_80 next
    to an sm_90). A tensor there must take the JIT fallback (or get an error naming both archs),
    never an sm_90 cubin launched on sm_80."""
    import torch

    from kernelgraft.errors import UnsupportedError
    from kernelgraft.aot import runner as _runner

    kernel = object.__new__(_runner.Kernel)
    kernel.where, kernel.arch, kernel.kinds = "bundle b: add kernel k", "sm_90", ["ptr"]
    kernel._checked, kernel._foreign = set(), {}
    caps = {0: (9, 0), 1: (8, 0)}
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: asked.append(d) or caps[d])
    monkeypatch.setattr(_runner.driver, "available", lambda: "no driver in this test")
    assert kernel.first_use(0) is None and 0 in kernel._checked
    why = kernel.first_use(1)
    assert why == "bundle b: add kernel k is built for sm_90, but the tensors are on cuda:1 (sm_80)"
    assert kernel.first_use(1) == why and asked == [0, 1]  # judged once per device

    runner = _runner.BundledRunner("add[BLOCK=64]", [kernel], 1)
    with pytest.raises(UnsupportedError, match=r"built for sm_90, but the tensors are on cuda:1 \(sm_80\)"):
        runner._run_fallback((), kernel.first_use(1))
    ran = []
    fallback = _runner.BundledRunner("add[BLOCK=64]", [kernel], 1, fallback=lambda: lambda *a: ran.append(a))
    fallback._run_fallback(("x",), kernel.first_use(1))
    assert ran == [("x",)]
