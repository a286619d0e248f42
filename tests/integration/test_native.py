"""The native replay (kernelgraft/_native): built for real with the C++ compiler, driven on CPU
through its packed-call launch kind with a ctypes host function standing in for the kernel, and on
the GPU through real ops of every backend (Triton, CUDA C++, cuTile, CuTe DSL)."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import kernelgraft as kg
from kernelgraft import native as _native
from kernelgraft.driver import observe
from kernelgraft.driver.params import packed_slots
from kernelgraft.native import record as _record
from _graphs import check_graph_replay

PLAIN = (torch.Tensor, torch.nn.Parameter)
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p))


@pytest.fixture(scope="module")
def native():
    if not _has_compiler():
        pytest.skip("no C++ compiler on this machine: the native replay cannot be built")
    module = _native.load()
    assert module is not None, _native.reason()
    return module


class HostKernel:
    """out[i] = relu(a[i] + b[i]) * scale over n floats, through the packed C ABI
    (slots: a, b, out, n, scale, stream); every call's raw slot values are kept."""

    def __init__(self, fail_with: int = 0) -> None:
        self.calls: list[tuple] = []
        self.result = ctypes.c_int32(0)
        self.fail_with = fail_with
        self.fn = HOST_FN(self._run)

    def _run(self, packed):
        a, b, o = (ctypes.c_uint64.from_address(packed[i]).value for i in range(3))
        n = ctypes.c_int32.from_address(packed[3]).value
        scale = ctypes.c_float.from_address(packed[4]).value
        stream = ctypes.c_uint64.from_address(packed[5]).value
        self.calls.append((a, b, o, n, scale, stream))
        if self.fail_with:
            self.result.value = self.fail_with
            return
        A, B, O = ((ctypes.c_float * n).from_address(p) for p in (a, b, o))
        for i in range(n):
            O[i] = max(A[i] + B[i], 0.0) * scale

    def record(self, a, b, out, n, scale, *, result=True) -> _record._Recorder:
        kinds = [ctypes.c_void_p] * 3 + [ctypes.c_int32, ctypes.c_float, ctypes.c_void_p]
        buf, offsets, pointers = packed_slots(kinds, [a, b, out, n, scale, 0])
        recorder = _record._Recorder()
        recorder.launches.append(observe.Record(
            kind=1, fn=observe.address_of(self.fn), function=0, grid=(1, 1, 1), block=(1, 1, 1),
            smem=0, buffer=buf, offsets=offsets, pointers=pointers, stream=0, device=-1,
            stream_offset=offsets[-1], result=ctypes.addressof(self.result) if result else 0,
            owner=self))
        return recorder


def _replay(native, kernel, x, y, scale=2.0):
    out = torch.empty_like(x)
    rec = kernel.record(x.data_ptr(), y.data_ptr(), out.data_ptr(), x.numel(), scale)
    replay = _record.replay_for(native, (x, y, scale), (out,), 1, rec, PLAIN)
    assert not isinstance(replay, str), replay
    return replay


def test_replay_writes_fresh_pointers_and_allocates_outputs(native):
    kernel = HostKernel()
    x, y = torch.randn(37), torch.randn(37)
    replay = _replay(native, kernel, x, y)
    for _ in range(3):
        a, b = torch.randn(37), torch.randn(37)
        out = replay((a, b, 2.0))
        assert out.shape == (37,) and out.dtype == torch.float32 and out.is_contiguous()
        torch.testing.assert_close(out, torch.relu(a + b) * 2.0)
        assert kernel.calls[-1][:5] == (a.data_ptr(), b.data_ptr(), out.data_ptr(), 37, 2.0)
    outs = {replay((x, y, 2.0)).data_ptr() for _ in range(2)}
    assert replay.stats() == {"calls": 5, "misses": 0}
    assert len(outs) >= 1 and x.data_ptr() not in outs


def test_replay_hands_back_every_other_signature(native):
    kernel = HostKernel()
    x, y = torch.randn(16, 4), torch.randn(16, 4)
    replay = _replay(native, kernel, x, y)
    base = torch.randn(16 * 4 + 1)

    class Sub(torch.Tensor):
        pass

    others = {
        "shape": (torch.randn(4, 16), y, 2.0),
        "strides": (torch.randn(4, 16).t(), y, 2.0),
        "dtype": (x.double(), y, 2.0),
        "alignment": (base[1:].view(16, 4), y, 2.0),
        "scalar value": (x, y, 3.0),
        "scalar type": (x, y, 2),
        "arity": (x, y),
        "subclass": (x.as_subclass(Sub), y, 2.0),
        "conjugate": (torch.randn(16, 4, dtype=torch.complex64).conj(), y, 2.0),
        "not a tuple": [x, y, 2.0],
    }
    for what, args in others.items():
        assert replay(args) is NotImplemented, what
    # Parameters are plain tensors; with grad on, a tensor that requires grad is the autograd path.
    w = torch.nn.Parameter(x.clone())
    with torch.no_grad():
        torch.testing.assert_close(replay((w, y, 2.0)), torch.relu(x + y) * 2.0)
    assert replay((w, y, 2.0)) is NotImplemented
    assert replay.stats()["calls"] == 1 and len(kernel.calls) == 1


def test_replay_steps_aside_for_modes(native):
    kernel = HostKernel()
    x, y = torch.randn(8), torch.randn(8)
    replay = _replay(native, kernel, x, y)

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Fn(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Watch():
        assert replay((x, y, 2.0)) is NotImplemented
    with Fn():
        assert replay((x, y, 2.0)) is NotImplemented

    seen = []

    def under_vmap(a):
        seen.append(replay((a, y, 2.0)))
        return a

    torch.func.vmap(under_vmap)(torch.randn(3, 8))
    assert seen == [NotImplemented]
    assert kernel.calls == []


def test_failed_launch_goes_back_to_python(native):
    kernel = HostKernel(fail_with=700)
    x, y = torch.randn(8), torch.randn(8)
    replay = _replay(native, kernel, x, y)
    assert replay((x, y, 2.0)) is NotImplemented
    assert len(kernel.calls) == 1 and replay.stats() == {"calls": 0, "misses": 1}


def test_pointer_mapping():
    x, y = torch.randn(10, 8), torch.randn(4)
    ptr = x.data_ptr()
    assert _record.map_pointers([(0, ptr), (8, y.data_ptr()), (16, 0)], [x, y]) == [(0, 0, 0), (8, 1, 0)]
    # A view into the middle of a tensor maps to it with a byte offset.
    assert _record.map_pointers([(0, x[3].data_ptr())], [x, y]) == [(0, 0, 3 * 8 * 4)]
    workspace = torch.empty(4)
    assert "no input or output" in _record.map_pointers([(0, workspace.data_ptr())], [x, y])
    assert "several" in _record.map_pointers([(0, ptr)], [x, x])


def test_recording_refuses_what_it_cannot_replay(native):
    kernel = HostKernel()
    x, y = torch.randn(8), torch.randn(8)
    out = torch.empty(8)
    with _record.recording() as rec:
        torch.empty_like(x)  # metadata and allocation are fine
        x.view(2, 4).t()
        out.zero_()  # computing is not
    assert rec.ops == ["aten.zero_.default"]
    assert "torch ops besides its kernel (aten.zero_.default)" in _record.replay_for(
        native, (x, y, 2.0), (out,), 1, rec, PLAIN)
    two = kernel.record(x.data_ptr(), y.data_ptr(), out.data_ptr(), 8, 2.0)
    two.launches *= 2
    assert "2 recorded launches" in _record.replay_for(native, (x, y, 2.0), (out,), 1, two, PLAIN)
    with _record.recording() as rec:
        observe.note(None, "no ctypes here")
    assert _record.replay_for(native, (x, y, 2.0), (out,), 1, rec, PLAIN) == "no ctypes here"
    assert observe.active() is None


def test_recording_refuses_arguments_a_kernel_may_not_read_as_stored(native):
    """A replay recorded from a view with the negative or conjugate bit would serve later calls
    by the view's memory: such a call is never recorded (plans only run admitted tensors)."""
    kernel = HostKernel()
    x, y = torch.randn(8), torch.randn(8)
    out = torch.empty(8)
    for view in (torch._neg_view(x), torch.randn(8, dtype=torch.complex64).conj().imag):
        rec = kernel.record(view.data_ptr(), y.data_ptr(), out.data_ptr(), 8, 2.0)
        why = _record.replay_for(native, (view, y, 2.0), (out,), 1, rec, PLAIN)
        assert isinstance(why, str) and "negative bit" in why, why


def test_bad_specs_are_refused(native):
    kernel = HostKernel()
    good = dict(tensor_types=PLAIN, args=(("v", 1),), outs=(), out_kind=0, launch_kind=1,
                fn=observe.address_of(kernel.fn), function=0, grid=(1, 1, 1), block=(1, 1, 1), smem=0,
                buffer=bytes(48), offsets=(0,), tail=(), patches=(), stream_offset=-1, result=0,
                stream_device=(0, -1))
    native.Replay(**good)
    for change, message in [
        ({"launch_kind": 5}, "launch_kind"),
        ({"offsets": (64,)}, "outside the buffer"),
        ({"patches": ((0, 0, 0),)}, "reads no tensor"),
        ({"patches": ((44, 0, 0),)}, "outside the buffer"),
        ({"out_kind": 1}, "out_kind"),
        ({"fn": 0}, "function address"),
        ({"args": (("x", 1),)}, "argument spec"),
    ]:
        with pytest.raises((ValueError, TypeError), match=message):
            native.Replay(**{**good, **change})


def test_turned_off_by_environment(monkeypatch):
    monkeypatch.setenv("KERNELGRAFT_NATIVE", "0")
    assert not _native.enabled()
    assert "KERNELGRAFT_NATIVE=0" in _native.reason()


# ---------------------------------------------------------------- GPU: real ops replay natively
def _backend_op(backend):
    from kernelgraft.examples import add_relu as ex

    spec = next((s for s in ex.IMPLS if s.backend == backend), None)
    if spec is None:
        pytest.skip(f"add_relu has no {backend} impl")
    from kernelgraft.backends import get as get_backend

    why = get_backend(backend).available()
    if why:
        pytest.skip(why)
    # compete=False: the kernel must serve (PyTorch winning would leave nothing to replay natively)
    return kg.op(f"kgtest_native::add_relu_{backend}", impls=[spec], fallback="error",
                 compete=False)(ex.add_relu.reference)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cuda", "cutile", "cutedsl"])
def test_ops_replay_natively_on_the_gpu(backend):
    assert _native.load() is not None, _native.reason()
    op = _backend_op(backend)
    x, y = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    for _ in range(3):
        op(x, y)
    replay = op.dispatcher.current_replay()
    assert replay is not None, next(iter(p.native.get("why") for p in op.dispatcher.plans().values()), None)
    before = replay.stats()["calls"]
    for n in (5000, 5000, 777, 5000):  # 777: another signature, then back
        a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        out = op(a, b)
        torch.cuda.synchronize()
        torch.testing.assert_close(out, torch.relu(a + b))
    assert op.dispatcher.current_replay() is not None
    assert replay.stats()["calls"] >= before + 2
    # CUDA graph capture records the replayed launch on the capturing stream.
    calls = replay.stats()["calls"]
    check_graph_replay(op, x, y, lambda a, b: torch.relu(a + b))
    assert replay.stats()["calls"] == calls + 2  # the side-stream call and the captured one


def _copy(a):
    """A copy with the same strides (a non-contiguous view stays one)."""
    return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device).copy_(a)


def _redrawn(inputs):
    """The same signature with new values: floating tensors redrawn, the rest copied."""
    return [_copy(torch.randn_like(a)) if isinstance(a, torch.Tensor) and a.is_floating_point()
            else _copy(a) if isinstance(a, torch.Tensor) else a for a in inputs]


@pytest.mark.gpu
@pytest.mark.parametrize("module", ["rmsnorm", "rmsnorm_residual", "softmax", "swiglu", "fp8_kcache_scatter"])
def test_triton_example_ops_replay_natively(module):
    """Each example's Triton kernel, alone in an op: from the third call on, every call of a
    sample signature is a native replay of the JIT-compiled kernel (float and int scalars,
    constexprs, tuple outputs, a mutated non-contiguous cache view), and matches the reference."""
    import importlib

    assert _native.load() is not None, _native.reason()
    mod = importlib.import_module(f"kernelgraft.examples.{module}")
    base = getattr(mod, module)
    spec = next(s for s in mod.IMPLS if s.backend == "triton")
    mutated = tuple(p.name for p in base.signature.params if p.mutated)
    op = kg.op(f"kgtest_native::{module}_triton", impls=[spec], mutates_args=mutated,
               fallback="error")(base.reference)
    where = [i for i, p in enumerate(base.signature.params) if p.mutated]
    checked = 0
    for sample in list(base.sample_inputs("cuda"))[:4]:
        if not op.candidates(*sample)[0].supported:
            continue
        replay = None
        for call in range(4):
            inputs = _redrawn(sample)
            # mutating ops (the FP8 scatter) are byte-exact in the input dtype; the rest in float64
            want_in = [a if not isinstance(a, torch.Tensor) else _copy(a) if where
                       else a.double() if a.is_floating_point() else a for a in inputs]
            want = base.reference(*want_in)
            got = op(*inputs)
            torch.cuda.synchronize()
            if where:  # mutating: compare the mutated tensors byte for byte
                for i in where:
                    assert torch.equal(inputs[i], want_in[i]), f"{module} call {call}"
            else:
                got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
                for g, w in zip(got, want):
                    torch.testing.assert_close(g.double(), w, rtol=2e-2, atol=2e-2)
            if call == 2:
                replay = op.dispatcher.current_replay()
                assert replay is not None, [p.native.get("why") for p in op.dispatcher.plans().values()]
                calls = replay.stats()["calls"]
        assert replay.stats()["calls"] == calls + 1  # the fourth call replayed
        checked += 1
    assert checked >= 2


@pytest.mark.gpu
def test_triton_autotuned_and_specialised_kernels_replay():
    """A ``triton.autotune``d kernel (its first call benchmarks configs: not recorded) replays
    with the config it chose; a stride that Triton specialises to a constant when it is 1 gives
    two signatures (contiguous and strided input), each replaying its own compiled kernel."""
    from _triton_replay_kernels import ops

    assert _native.load() is not None, _native.reason()
    scale, gather = ops()
    for n in (1000, 1000, 1000, 1000, 77777, 77777, 77777, 1000):
        x = torch.randn(n, device="cuda")
        torch.testing.assert_close(scale(x, 0.5), x * 0.5)
    assert scale.dispatcher.current_replay() is not None, [p.native.get("why") for p in scale.dispatcher.plans().values()]
    assert scale.dispatcher.current_replay().stats()["calls"] >= 1
    base = torch.randn(2 * 4099, device="cuda")
    for step in (1, 2, 1, 2, 1, 2, 2, 1):
        base.copy_(torch.randn_like(base))
        x = base[: 4099 * step : step]
        torch.testing.assert_close(gather(x), x.contiguous())
    replays = [p.native.get("replay") for p in gather.dispatcher.plans().values()]
    assert len(replays) == 2 and all(r is not None for r in replays), \
        [p.native.get("why") for p in gather.dispatcher.plans().values()]
    assert all(r.stats()["calls"] >= 1 for r in replays)


def _has_compiler() -> bool:
    return shutil.which("c++") is not None or shutil.which("g++") is not None


@pytest.mark.slow
def test_a_build_killed_midway_leaves_no_stale_lock(tmp_path):
    """A build child may die while compiling (its parent exited, a kill); the next build must
    build, not wait on the dead one's lock (torch's own build lock file is never cleared then).
    The child is killed once it holds the lock and has made its work folder (it compiles from
    then on): a state, not a guess of how long the compile takes."""
    import os
    import subprocess
    import sys
    import time

    from kernelgraft.native import builder as _build

    if not _has_compiler():
        pytest.skip("no C++ compiler on this machine")
    env = {**os.environ, "KERNELGRAFT_CACHE_DIR": str(tmp_path)}
    where = subprocess.run([sys.executable, "-c", "from kernelgraft import native as _native; print(_native.directory())"],
                           env=env, capture_output=True, text=True, timeout=120)
    directory = Path(where.stdout.strip())
    child = subprocess.Popen([sys.executable, _build.__file__, str(directory), str(_native._SOURCE)], env=env)
    deadline = time.monotonic() + 120
    while not list(directory.glob("build-*")):
        assert child.poll() is None and time.monotonic() < deadline, "the build child never started compiling"
        time.sleep(0.02)
    child.kill()
    child.wait()
    assert not (directory / "record.json").exists()
    code = "from kernelgraft import native as _native; m = _native.load(); print(m is not None, _native.reason())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=400)
    assert done.stdout.split()[:1] == ["True"], done.stdout + done.stderr
    assert isinstance(_build.verified_library(directory), Path)
    assert not list(directory.glob("build-*"))


@pytest.fixture()
def fresh(tmp_path, monkeypatch):
    """The native state forgotten and the cache in ``tmp_path``; restored afterwards."""
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path))
    saved = dict(_native._STATE)
    _native._reset()
    yield tmp_path
    _native._reset()
    _native._STATE.update(saved)


def _plant(directory: Path, library: bytes, recorded: bytes | None = None, name="kernelgraft_native-x.so"):
    import hashlib
    import json

    (directory / name).write_bytes(library)
    digest = hashlib.sha256(recorded if recorded is not None else library).hexdigest()
    (directory / "record.json").write_text(json.dumps({"file": name, "sha256": digest}))


def _no_build(monkeypatch):
    """Fail the test if anything would build or import torch's extension tooling's loader."""
    from torch.utils import cpp_extension

    def refuse(*a, **k):
        raise AssertionError("cpp_extension.load was called")

    monkeypatch.setattr(cpp_extension, "load", refuse)
    monkeypatch.setattr(_native, "_start_child", lambda path: pytest.fail("a build child was started"))


def test_an_altered_library_is_refused(fresh, monkeypatch, caplog):
    """The record's sha256 does not match the library (replaced after the build): not loaded,
    not rebuilt on demand, and the reason says so."""
    directory = _native.directory()
    _plant(directory, b"\x7fELF planted code", recorded=b"what the build produced")
    _no_build(monkeypatch)
    monkeypatch.setattr(_native, "_open", lambda path, fd=None: pytest.fail(f"{path} was opened"))
    assert _native.get() is None and _native.load() is None
    assert "does not match the sha256 recorded" in _native.reason()
    assert any("does not match" in r.getMessage() for r in caplog.records)


def test_the_loader_maps_the_bytes_it_hashed_not_what_the_path_names_later(fresh, monkeypatch):
    """Hashing by path and then loading by path leaves a window in which the file can be swapped;
    the loader hashes through a descriptor and loads that descriptor (/proc/self/fd)."""
    import os

    directory = _native.directory()
    checked = b"\x7fELF the bytes that were checked"
    _plant(directory, checked)
    seen = {}

    def swap_then_open(library, fd=None):
        os.replace(directory / "record.json", directory / "record.json.bak")  # keep the record aside
        (directory / "swapped.so").write_bytes(b"\x7fELF swapped in after the check")
        os.replace(directory / "swapped.so", library)  # the path now names other bytes
        with open(f"/proc/self/fd/{fd}", "rb") as fh:
            seen["bytes"] = fh.read()
        raise ImportError("not a real library")

    _no_build(monkeypatch)
    monkeypatch.setattr(_native, "_open", swap_then_open)
    assert _native.get() is None
    assert seen["bytes"] == checked
    assert "did not load: ImportError" in _native.reason()


def test_a_planted_library_without_a_record_never_loads(fresh, monkeypatch):
    """A .so dropped into the directory (the old name, or one like a build's) is not what a
    record names: the loader starts a build instead of opening it."""
    directory = _native.directory()
    (directory / "kernelgraft_native.so").write_bytes(b"\x7fELF planted")
    (directory / "kernelgraft_native-0123456789abcdef.so").write_bytes(b"\x7fELF planted")
    started = []
    monkeypatch.setattr(_native, "_start_child", started.append)
    monkeypatch.setattr(_native, "_open", lambda path, fd=None: pytest.fail(f"{path} was opened"))
    assert _native.get() is None
    assert started == [directory]


@pytest.mark.parametrize("where", ["build directory", "parent"])
def test_a_directory_others_can_write_is_refused(fresh, monkeypatch, where):
    import os

    directory = _native.directory()
    _plant(directory, b"\x7fELF whatever")
    target = directory if where == "build directory" else directory.parent
    os.chmod(target, 0o777)
    try:
        _no_build(monkeypatch)
        monkeypatch.setattr(_native, "_open", lambda path, fd=None: pytest.fail(f"{path} was opened"))
        assert _native.get() is None
        assert "writable by group or others (mode 777)" in _native.reason()
        assert str(target) in _native.reason()
        from kernelgraft.errors import CompileError

        with pytest.raises(CompileError, match="refusing to build or load"):
            _native.build()
    finally:
        os.chmod(target, 0o700)


def test_a_record_that_is_not_one_is_refused(fresh, monkeypatch):
    directory = _native.directory()
    (directory / "record.json").write_text('{"file": "../elsewhere.so", "sha256": "' + "0" * 64 + '"}')
    _no_build(monkeypatch)
    assert _native.get() is None
    assert "not a library name in this directory" in _native.reason()


def test_caching_off_uses_a_private_directory(monkeypatch):
    import os
    import stat

    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", "off")
    path = _native.directory()
    base = path.parent
    assert base == _native._STATE["private"] and base.name.startswith("kernelgraft-native-")
    assert stat.S_IMODE(os.stat(base).st_mode) == 0o700 and os.stat(base).st_uid == os.getuid()
    assert _native.directory() == path  # one per process


def test_a_cached_build_loads_without_the_extension_tooling(native, monkeypatch):
    """A verified build loads by opening the library: torch's cpp_extension.load is never called
    and no child process starts (``_no_build``), on the calling thread."""
    saved = dict(_native._STATE)
    _native._reset()
    _no_build(monkeypatch)
    try:
        module = _native.get()
        assert module is not None, _native.reason()
        assert hasattr(module, "Replay") and not _native.busy()
    finally:
        _native._STATE.update(saved)


def test_busy_while_a_child_builds(fresh, monkeypatch):
    """The build child is polled, never waited on, by ``get``; ``busy`` is true meanwhile."""
    import os
    import subprocess
    import sys

    directory = _native.directory()
    gate = directory / "gate"

    def slow_child(path):  # a stand-in build: waits for the test, then leaves no record
        proc = subprocess.Popen([sys.executable, "-c",
                                 f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.01)"])
        _native._STATE["child"] = (proc, path)
        _native._STATE["pid"] = os.getpid()  # as _start_child records: this process started it

    monkeypatch.setattr(_native, "_start_child", slow_child)
    assert _native.get() is None and _native.busy()
    assert _native.get() is None and _native.busy()  # still building: a poll, no wait
    gate.touch()
    _native._STATE["child"][0].wait(30)
    assert not _native.busy()
    assert _native.get() is None
    assert "without a build record" in _native.reason()


@pytest.mark.slow
def test_the_child_process_build(fresh):
    """``build()`` compiles in a child process, records the library's hash, and loads it."""
    import json

    if not _has_compiler():
        pytest.skip("no C++ compiler on this machine")
    library = _native.build()
    record = json.loads((library.parent / "record.json").read_text())
    assert record["file"] == library.name
    assert _native.get() is not None and _native.get().__file__ == str(library)
    assert (library.parent / "build.log").read_text().split() == [str(library)]  # what the child printed


def test_doctor_reports_the_native_replay(native):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "kernelgraft", "doctor"], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    assert "backends" in done.stdout
    assert "native replay (eager CUDA C++, cuTile, CuTe DSL calls): ready" in done.stdout


# ---------------------------------------------------------------- CPU: real ops through the replay
@pytest.fixture()
def relu_add(native):
    def make(name, launch=None):
        def relu_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.relu(x + y)

        from _host_backend import HOST_FN, kg_host

        def run(packed):
            a, b, o = (ctypes.c_uint64.from_address(packed[i]).value for i in range(3))
            n = ctypes.c_int32.from_address(packed[3]).value
            A, B, O = ((ctypes.c_float * n).from_address(p) for p in (a, b, o))
            for i in range(n):
                O[i] = max(A[i] + B[i], 0.0)

        fn = HOST_FN(run)
        impl = kg_host(fn, [ctypes.c_void_p] * 3 + [ctypes.c_int32],
                       launch or (lambda x, y, out: [x, y, out, x.numel()]))
        op = kg.op(name, impls=[impl], dtypes=(torch.float32,), fallback="error")(relu_add)
        op._keep_fn = fn  # the callback must outlive the op
        return op

    return make


def _fresh(n=33):
    return torch.randn(n), torch.randn(n)


def test_a_call_through_torch_ops_replays_without_the_python_key(relu_add, monkeypatch):
    """torch.compile's graphs call ops through torch.ops on every call: the dispatcher kernel tries
    the native replay first, and only a call the replay hands back builds the Python key."""
    op = relu_add("kgtest_native::relu_add_ops")
    overload = torch.ops.kgtest_native.relu_add_ops.default
    for _ in range(3):
        x, y = _fresh()
        op(x, y)
    replay = op.dispatcher.current_replay()
    assert replay is not None
    calls = replay.stats()["calls"]

    def no_key(*a, **k):
        raise AssertionError("the Python key was built")

    monkeypatch.setattr(op.dispatcher, "key", no_key)
    x, y = _fresh()
    torch.testing.assert_close(overload(x, y), torch.relu(x + y))
    assert replay.stats()["calls"] == calls + 1
    monkeypatch.undo()
    x, y = _fresh(50)  # another signature: the replay hands it back, the key path serves it
    torch.testing.assert_close(overload(x, y), torch.relu(x + y))


def test_an_op_replays_from_its_third_call(relu_add):
    op = relu_add("kgtest_native::relu_add_a")
    for i in range(4):
        x, y = _fresh()
        torch.testing.assert_close(op(x, y), torch.relu(x + y))
        assert (op.dispatcher.current_replay() is None) == (i == 0)  # the second call is recorded
    replay = op.dispatcher.current_replay()
    assert replay.stats() == {"calls": 2, "misses": 0}
    x, y = _fresh(7)  # another signature takes the Python path (and gets its own plan)
    torch.testing.assert_close(op(x, y), torch.relu(x + y))
    assert replay.stats() == {"calls": 2, "misses": 1}
    x, y = _fresh()
    torch.testing.assert_close(op(x, y=y), torch.relu(x + y))  # keywords bind to the same tuple
    assert replay.stats()["calls"] == 3


def test_a_new_selection_epoch_drops_the_replay(relu_add):
    op = relu_add("kgtest_native::relu_add_b")
    for _ in range(3):
        op(*_fresh())
    replay = op.dispatcher.current_replay()
    with kg.tune("off"):  # other settings: plans (and replays) are made again
        for _ in range(3):
            x, y = _fresh()
            torch.testing.assert_close(op(x, y), torch.relu(x + y))
        assert op.dispatcher.current_replay() is not None and op.dispatcher.current_replay() is not replay
    assert replay.stats()["calls"] == 1


def test_calls_that_cannot_be_replayed_stay_in_python(relu_add, monkeypatch):
    computes = relu_add("kgtest_native::relu_add_c", lambda x, y, out: (out.zero_(), [x, y, out, x.numel()])[1])
    elsewhere = torch.randn(33)
    workspace = relu_add("kgtest_native::relu_add_d", lambda x, y, out: [x, elsewhere, out, x.numel()])
    for _ in range(4):
        x, y = _fresh()
        torch.testing.assert_close(computes(x, y), torch.relu(x + y))
        torch.testing.assert_close(workspace(x, y), torch.relu(x + elsewhere))
    assert computes.dispatcher.current_replay() is None and workspace.dispatcher.current_replay() is None
    why = {op: next(iter(op.dispatcher.plans().values())).native["why"] for op in (computes, workspace)}
    assert "aten.zero_" in why[computes]
    assert "no input or output tensor" in why[workspace]
    monkeypatch.setenv("KERNELGRAFT_NATIVE", "0")
    off = relu_add("kgtest_native::relu_add_e")
    for _ in range(3):
        off(*_fresh())
    assert off.dispatcher.current_replay() is None


def test_a_mutating_op_replays(native):
    from _host_backend import accumulate_op

    op = accumulate_op("kgtest_native::accumulate")
    for _ in range(4):
        x, acc = _fresh()
        want = acc + x
        assert op(x, acc) is None
        torch.testing.assert_close(acc, want)
    assert op.dispatcher.current_replay() is not None and op.dispatcher.current_replay().stats()["calls"] == 2


def test_a_triton_launch_not_described_keeps_the_call_in_python(native):
    """A Triton kernel launched inside a recorded call other than through JITFunction.run (a
    CompiledKernel launched directly) would be skipped by a replay; Triton's launch-enter hook
    counts it (the interpreter does not run launch hooks, so the hook is called here as Triton's
    launcher calls it)."""
    from triton import knobs
    from triton.runtime.jit import JITFunction

    run = JITFunction.run
    before = list(getattr(knobs.runtime.launch_enter_hook, "calls", []))
    with _record.recording() as rec:
        assert JITFunction.run is not run  # launches through the JIT are described meanwhile
        knobs.runtime.launch_enter_hook(None)
    assert JITFunction.run is run
    assert rec.triton_launches == 1 and rec.triton_described == 0
    why = _record.replay_for(native, (), (), 0, rec, PLAIN)
    assert why == "the call launches a Triton kernel other than through JITFunction.run, which a replay would skip"
    assert list(getattr(knobs.runtime.launch_enter_hook, "calls", [])) == before
    knobs.runtime.launch_enter_hook(None)  # outside a recording: nothing counted, nothing raised
    assert rec.triton_launches == 1


_TRITON_PARAMS_CHILD = r"""
import json, sys, torch, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelgraft.backends.triton import replay as _triton

@triton.jit
def scale_kernel(x, y, n, scale, flag, wide, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    v = tl.load(x + i, mask=m) * scale + wide
    if flag:
        v = v + 1
    tl.store(y + i, v, mask=m)

sig = {"x": "*fp32", "y": "*fp32", "n": "i32", "scale": "fp32", "flag": "i1", "wide": "i64", "BLOCK": "constexpr"}
k = triton.compile(ASTSource(scale_kernel, sig, constexprs={"BLOCK": 128}), target=GPUTarget("cuda", 90, 32))
x, y = torch.randn(100), torch.empty(100)
bound = {"x": x, "y": y, "n": 100, "scale": 0.5, "flag": True, "wide": 2**40, "BLOCK": 128}
out = {"ok": _triton.params_of(k, bound), "ptrs": [x.data_ptr(), y.data_ptr()]}
out["not_a_tensor"] = _triton.params_of(k, {**bound, "y": 7})
out["missing"] = _triton.params_of(k, {key: v for key, v in bound.items() if key != "scale"})
k.src.signature["n"] = "i64"  # what a stale or mismatched description would pack
out["mismatch"] = _triton.params_of(k, bound)
json.dump(out, sys.stdout)
"""


def test_triton_launch_parameters_follow_the_compiled_kernel(tmp_path):
    """The JIT Triton describer packs a real (cross-compiled, sm_90) kernel's parameters as
    Triton's launcher does: pointers, i32, fp32, i1 as a byte, i64, then the null scratch
    pointers its PTX lists; and refuses what its PTX parameter list contradicts."""
    import json
    import subprocess
    import sys

    from _aot_helpers import env

    child = tmp_path / "child.py"  # Triton reads a jit function's source from its file
    child.write_text(_TRITON_PARAMS_CHILD)
    proc = subprocess.run([sys.executable, str(child)], capture_output=True, text=True, env=env(), timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    kinds, values = out["ok"]
    n_scratch = len(kinds) - 6
    assert kinds == ["ptr", "ptr", "i32", "f32", "i8", "i64"] + ["ptr"] * n_scratch
    assert 0 <= n_scratch <= 2
    assert values == out["ptrs"] + [100, 0.5, 1, 2**40] + [0] * n_scratch
    assert "'y'" in out["not_a_tensor"] and "not a tensor" in out["not_a_tensor"]
    assert "'scale'" in out["missing"]
    assert "PTX parameter sizes" in out["mismatch"]


def test_alternating_signatures_each_replay(relu_add):
    """Two signatures in turn: each call misses the other's replay, then its plan replays it."""
    op = relu_add("kgtest_native::relu_add_f")
    sizes = [33, 7] * 2
    for n in sizes:
        op(*_fresh(n))  # two calls of each: both recorded
    replays = {n: next(p for k, p in op.dispatcher.plans().items() if k[0][2] == (n,)).native["replay"] for n in (33, 7)}
    for n in sizes * 2:
        x, y = _fresh(n)
        torch.testing.assert_close(op(x, y), torch.relu(x + y))
    assert replays[33].stats()["calls"] == 4 and replays[7].stats()["calls"] == 4


def test_the_replay_keeps_its_kernel_alive(native):
    """The replay calls raw addresses (the function, its result slot): it holds their owner."""
    import gc
    import weakref

    kernel = HostKernel()
    x, y = torch.randn(8), torch.randn(8)
    replay = _replay(native, kernel, x, y)
    ref = weakref.ref(kernel)
    del kernel
    gc.collect()
    assert ref() is not None
    torch.testing.assert_close(replay((x, y, 2.0)), torch.relu(x + y) * 2.0)
    del replay
    gc.collect()
    assert ref() is None


def test_launch_record_packs_like_the_driver_buffer():
    """The Record the driver launcher and the Triton describer build: the driver's packed bytes
    padded to 8, each parameter's offset, and the pointer slots with their addresses (null too)."""
    from kernelgraft.driver.params import ParamBuffer

    buffer = ParamBuffer(["ptr", "i32", "f32", "i8", "ptr", "ptr"])
    values = [0x7F0000001000, 5, 0.5, 1, 0x7F0000002000, 0]
    owner = object()
    rec = _record.launch_record(HOST_FN(lambda p: None), 1234, (3, 1, 1), (128, 1, 1), 0, buffer,
                                values, None, 0, owner=owner)
    assert rec.kind == 0 and rec.function == 1234 and rec.fn != 0
    assert rec.buffer[:buffer.size] == buffer.pack(values) and len(rec.buffer) % 8 == 0
    assert rec.offsets == buffer.offsets == (0, 8, 12, 16, 24, 32)
    assert rec.pointers == [(0, 0x7F0000001000), (24, 0x7F0000002000), (32, 0)]
    assert rec.stream == 0 and rec.owner is owner


def _tiny_library(path: Path, symbol: str, value: int) -> Path:
    import subprocess

    source = path.with_suffix(".c")
    source.write_text(f"int {symbol}(void) {{ return {value}; }}\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(path), str(source)], check=True)
    return path


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir() or shutil.which("cc") is None,
                    reason="needs /proc/self/fd and a C compiler")
def test_the_fd_a_library_was_loaded_from_stays_open_so_the_next_memfd_library_is_itself(tmp_path):
    # The dynamic loader matches a library by the path it came from before it looks at the file:
    # when the native replay's fd closed after loading from /proc/self/fd/<n> and a bundle's CuTe
    # DSL runtime then got fd <n> in memory, its dlopen returned the replay extension instead
    # (seen on an H200), and the kernel library that needs the runtime did not load.
    import os

    from kernelgraft import runtime
    from kernelgraft.native import builder as _build
    from kernelgraft.aot.native_kernel import open_library

    # kernelgraft's own loads keep their fds: the runtime, loaded once per process
    so = runtime.load()
    assert runtime.load() == so
    kept = [f for f in _build._LOADED_FDS if os.readlink(f"/proc/self/fd/{f}") == str(so)]
    assert len(kept) == 1, (so, _build._LOADED_FDS)
    lib = open_library("after", _tiny_library(tmp_path / "after.so", "after_marker", 3).read_bytes())
    assert lib.after_marker() == 3
