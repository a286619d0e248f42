"""The C++ runtime on a GPU: bundled ops launched by the runtime equal the Python ops, inside CUDA
graphs too, and in a process where neither kernelgraft nor triton imports; cuTile and CuTe DSL
kernels too, and every example op once per backend in such a process.

Run on the GPU machine: ``pytest -m gpu tests/gpu/test_gpu_runtime.py`` (TRITON_INTERPRET unset).
A GPU machine without tileiras builds no cuTile kernels: build the bundle on a machine that has it
(``kernelgraft aot kernelgraft.examples.add_relu kernelgraft.examples.rmsnorm --arch sm_90 -o DIR``)
and name it in ``$KERNELGRAFT_TEST_BUNDLE``."""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import pytest
import torch

from kernelgraft.aot import manifest as _manifest
from kernelgraft.examples import add_relu, rmsnorm  # registered before the per-test registry snapshot

from _runtime_helpers import WITHOUT_KERNELGRAFT, backend_only, json_child, so  # noqa: F401 (so: a fixture)
from _aot_helpers import gpu_bundle

pytestmark = pytest.mark.gpu

CASES = {
    "add_relu": [((3000,), torch.float32), ((128, 1024), torch.float32), ((7,), torch.float32),
                 ((33, 97), torch.float16), ((33, 97), torch.bfloat16), ((4096,), torch.float32)],
    "rmsnorm": [((5, 64), torch.float32), ((3, 1000), torch.float32), ((17, 4096), torch.float32),
                ((9, 768), torch.float16), ((9, 768), torch.bfloat16), ((1, 7), torch.float32)],
}
PYTHON_OPS = {"add_relu": add_relu.add_relu, "rmsnorm": rmsnorm.rmsnorm}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return gpu_bundle(tmp_path_factory, "KERNELGRAFT_TEST_BUNDLE")


@pytest.fixture(scope="module")
def served(so, bundle, tmp_path_factory):
    dst = tmp_path_factory.mktemp("served") / "b"
    shutil.copytree(bundle, dst)
    manifest = _manifest.read(dst)
    for op in manifest["ops"]:
        op["name"] = "kgrt_gpu::" + op["name"].split("::")[1]
    _manifest.write(dst, manifest)
    assert list(torch.ops.kernelgraft.load_bundle(str(dst), None, None)) == ["kgrt_gpu::add_relu",
                                                                             "kgrt_gpu::rmsnorm"]
    return torch.ops.kgrt_gpu


def _inputs(short: str, shape, dtype):
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{short}{shape}{dtype}".encode()))
    x = torch.randn(shape, generator=g, device="cuda").to(dtype)
    if short == "add_relu":
        return (x, torch.randn(shape, generator=g, device="cuda").to(dtype))
    return (x, torch.randn(shape[-1:], generator=g, device="cuda").to(dtype), 1e-6)


@pytest.mark.parametrize("short", list(CASES))
def test_runtime_ops_equal_the_python_ops(served, short):
    for shape, dtype in CASES[short]:
        args = _inputs(short, shape, dtype)
        got = getattr(served, short)(*args)
        want = PYTHON_OPS[short](*args)
        assert got.shape == want.shape and got.dtype == want.dtype
        tol = {"atol": 0, "rtol": 0} if short == "add_relu" else {"atol": 2e-2, "rtol": 2e-2}
        torch.testing.assert_close(got, want, **tol, msg=f"{short} {shape} {dtype}")


def test_views_with_deferred_values_are_resolved_and_other_layouts_refused(served):
    """The admission rule (runtime/csrc/admit.h) on the GPU: a view with the negative bit is read as
    its values (not its memory), a sparse tensor is refused by name."""
    x, y = _inputs("add_relu", (3000,), torch.float32)
    z = torch.randn(3000, dtype=torch.complex64, device="cuda")
    torch.testing.assert_close(served.add_relu(torch._neg_view(x), y), torch.relu(y - x), rtol=0, atol=0)
    torch.testing.assert_close(served.add_relu(z.conj().imag, y), torch.relu(y - z.imag), rtol=0, atol=0)
    torch.testing.assert_close(served.add_relu(x, y), torch.relu(x + y), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match=r"kgrt_gpu::add_relu: argument x expected a dense strided tensor, got a "
                                           r"sparse COO tensor"):
        served.add_relu(x.to_sparse(), y)


def test_runtime_ops_replay_in_a_cuda_graph(served):
    x, y = _inputs("add_relu", (4096,), torch.float32)
    served.add_relu(x, y)  # loads the module on this device before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = served.add_relu(x, y)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, torch.relu(x + y), atol=0, rtol=0)


def test_runtime_ops_run_on_the_current_stream(served):
    x, y = _inputs("add_relu", (1 << 20,), torch.float32)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)  # ~0.1 s: a launch on another stream would read x before the fill
        x.fill_(1.5)
        out = served.add_relu(x, y)
    stream.synchronize()
    torch.testing.assert_close(out, torch.relu(1.5 + y), atol=0, rtol=0)


CHILD = WITHOUT_KERNELGRAFT + r"""
torch.ops.load_library(sys.argv[1])
torch.ops.kernelgraft.load_bundle(sys.argv[2], None, None)
x = torch.randn(33, 97, device="cuda", dtype=torch.float16)
y = torch.randn(33, 97, device="cuda", dtype=torch.float16)
out = torch.ops.kgexamples.add_relu(x, y)
ok = torch.equal(out, torch.relu(x + y))
w = torch.randn(97, device="cuda", dtype=torch.float16)
norm = torch.ops.kgexamples.rmsnorm(x, w, 1e-6)
ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).half()
print(json.dumps({"add_relu_equal": ok, "rmsnorm_close": torch.allclose(norm, ref, atol=2e-2, rtol=2e-2),
                  "modules": loaded_blocked()}))
"""


def test_runs_where_kernelgraft_and_triton_do_not_import(so, bundle, tmp_path):
    assert json_child(tmp_path, CHILD, so, bundle)[0] == {"add_relu_equal": True, "rmsnorm_close": True,
                                                                "modules": []}


def _only(bundle: Path, dst: Path, namespace: str, backend: str) -> bool:
    """A copy of ``bundle`` under ``namespace`` holding only ``backend``'s candidates (False: an op has none)."""
    return all(backend_only(bundle, dst, namespace, backend))


def _each_case_equals_python(ns, backend: str) -> int:
    """Every case of CASES through the ops in ``ns``: equal to the Python op's result, or refused
    because no bundled kernel of that backend serves it (cuTile's rmsnorm kernels are compiled per
    row length; add_relu's CuTe DSL kernels need at least 2 elements). Returns how many ran."""
    served = 0
    for short, cases in CASES.items():
        for shape, dtype in cases:
            args = _inputs(short, shape, dtype)
            try:
                got = getattr(ns, short)(*args)
            except RuntimeError as exc:
                assert "no bundled kernel serves these inputs" in str(exc)
                continue
            want = PYTHON_OPS[short](*args)
            tol = {"atol": 0, "rtol": 0} if short == "add_relu" else {"atol": 2e-2, "rtol": 2e-2}
            torch.testing.assert_close(got, want, **tol, msg=f"{backend} {short} {shape} {dtype}")
            served += 1
    return served


def test_cutile_kernels_through_the_runtime_equal_the_python_ops(so, bundle, tmp_path):
    if not _only(bundle, tmp_path / "cutile", "kgrt_gpu_ct", "cutile"):
        pytest.skip("the bundle holds no cuTile kernels (built without tileiras: see the module doc)")
    torch.ops.kernelgraft.load_bundle(str(tmp_path / "cutile"), None, None)
    assert _each_case_equals_python(torch.ops.kgrt_gpu_ct, "cutile") >= 8


def test_cutedsl_kernels_through_the_runtime_equal_the_python_ops(so, bundle, tmp_path):
    dst = tmp_path / "cutedsl"
    if not _only(bundle, dst, "kgrt_gpu_cute", "cutedsl"):
        pytest.skip("the bundle holds no CuTe DSL kernels (built without nvidia-cutlass-dsl or a C compiler)")
    torch.ops.kernelgraft.load_bundle(str(dst), None, None, True)
    assert _each_case_equals_python(torch.ops.kgrt_gpu_cute, "cutedsl") >= 10
    x, y = _inputs("add_relu", (4096,), torch.float32)  # graph capture records the library's launch
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.kgrt_gpu_cute.add_relu(x, y)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, torch.relu(x + y), atol=0, rtol=0)


ALL_BACKENDS_CHILD = WITHOUT_KERNELGRAFT + r"""
torch.ops.load_library(sys.argv[1])
cases = json.loads(sys.argv[3])
report = {}
for backend, path in json.loads(sys.argv[2]).items():
    torch.ops.kernelgraft.load_bundle(path, None, None, True)
    ns = getattr(torch.ops, "kgrt_all_" + backend)
    for short, shapes in cases.items():
        served = failed = 0
        for shape, dtype in shapes:
            g = torch.Generator(device="cuda").manual_seed(len(shape) * 1000 + shape[-1])
            dt = getattr(torch, dtype)
            x = torch.randn(shape, generator=g, device="cuda").to(dt)
            try:
                if short == "add_relu":
                    y = torch.randn(shape, generator=g, device="cuda").to(dt)
                    good = torch.equal(ns.add_relu(x, y), torch.relu(x + y))
                else:
                    w = torch.randn(shape[-1:], generator=g, device="cuda").to(dt)
                    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(dt)
                    good = torch.allclose(ns.rmsnorm(x, w, 1e-6).float(), ref.float(), atol=2e-2, rtol=2e-2)
            except RuntimeError as exc:
                if "no bundled kernel serves these inputs" not in str(exc):
                    raise
                continue
            served += 1
            failed += not good
        report[f"{backend} {short}"] = [served, failed]
report["modules"] = loaded_blocked()
print(json.dumps(report))
"""


def test_every_backend_serves_every_example_op_where_kernelgraft_and_triton_do_not_import(so, bundle, tmp_path):
    """Each example op from one bundle, once per backend (Triton, CUDA C++, cuTile, CuTe
    DSL), in a process where neither kernelgraft nor triton imports, equals the reference."""
    paths = {}
    for backend in ("triton", "cuda", "cutile", "cutedsl"):
        dst = tmp_path / backend
        assert _only(bundle, dst, f"kgrt_all_{backend}", backend), f"the bundle has no {backend} candidates for every op"
        paths[backend] = str(dst)
    cases = {short: [(list(shape), str(dtype).removeprefix("torch.")) for shape, dtype in c] for short, c in CASES.items()}
    report, _ = json_child(tmp_path, ALL_BACKENDS_CHILD, so, json.dumps(paths), json.dumps(cases), timeout=600)
    assert report.pop("modules") == []
    for label, (served, failed) in report.items():
        assert served >= 1 and failed == 0, (label, served, failed, report)
