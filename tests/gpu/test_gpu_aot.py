"""AOT bundles on the GPU: a bundle built elsewhere (``$KERNELGRAFT_TEST_BUNDLE``, else built here)
is loaded in a process where ``import triton`` fails, and every bundled candidate's result matches
the op's reference (float64); the same bundle attached to the ops in a normal process, too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import kernelgraft as kg
from kernelgraft.verify.oracle import rtol_for as tolerance

from _aot_helpers import gpu_bundle, run_child

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return gpu_bundle(tmp_path_factory, "KERNELGRAFT_TEST_BUNDLE")


def _reference(op_name, args):
    from kernelgraft.examples.add_relu import add_relu
    from kernelgraft.examples.rmsnorm import rmsnorm

    op = {"kgexamples::add_relu": add_relu, "kgexamples::rmsnorm": rmsnorm}[op_name]
    wide = [a.double() if isinstance(a, torch.Tensor) else a for a in args]
    return op.reference(*wide)


def test_bundle_runs_without_triton_and_matches_reference(bundle, tmp_path):
    out = tmp_path / "run.json"
    report = run_child(bundle, "run", out, timeout=600)
    assert report["triton_imported"] is False and report["op_call_ok"] is True
    saved = torch.load(str(out) + ".pt")
    manifest = json.loads((bundle / "manifest.json").read_text())
    labels = {(op["name"], c["label"]) for op in manifest["ops"] for c in op["candidates"]}
    ran = set()
    for r in report["runs"]:
        assert r["error"] is None, r
        args, result = saved[r["key"]]
        assert not torch.isnan(result).any(), f"{r['key']}: output left unwritten"
        want = _reference(r["op"], args)
        tol = tolerance(result.dtype)  # the same per-dtype rule as kernelgraft check
        torch.testing.assert_close(result.double(), want, rtol=tol, atol=tol, msg=r["key"])
        ran.add((r["op"], r["label"]))
    assert ran == labels, f"candidates never run: {labels - ran}"


def test_bundle_attached_to_ops_in_process(bundle):
    from kernelgraft.aot.runner import BundledRunner
    from kernelgraft.examples.add_relu import add_relu
    from kernelgraft.examples.rmsnorm import rmsnorm

    loaded = kg.load_bundle(bundle)
    try:
        cases = {add_relu: lambda dt: (torch.randn(4096, device="cuda", dtype=dt),) * 2,
                 rmsnorm: lambda dt: (torch.randn(9, 768, device="cuda", dtype=dt),
                                      torch.randn(768, device="cuda", dtype=dt), 1e-6)}
        for op, make in cases.items():
            for dt in (torch.float32, torch.float16):
                args = make(dt)
                for cand in op.candidates(*args):
                    if not cand.supported or (cand.index, cand.config) not in op.dispatcher.bundled_keys():
                        continue
                    runner = op.dispatcher.runner(cand)
                    assert isinstance(runner, BundledRunner)
                    if runner.covers(args) is not None:
                        continue
                    got = op.run(*args, impl=cand.index, config=cand.config)
                    want = op.reference(*[a.double() if isinstance(a, torch.Tensor) else a for a in args])
                    torch.testing.assert_close(got.double(), want, rtol=tolerance(dt), atol=tolerance(dt), msg=cand.label)
    finally:
        loaded.detach()


def test_bundled_candidates_replay_natively(bundle):
    """An eager call served by a bundled binary (Triton's included: it launches through
    kernelgraft.driver) is recorded once and then replayed by the native extension."""
    from kernelgraft import native as _native
    from kernelgraft.aot.runner import BundledRunner
    from kernelgraft.examples.add_relu import add_relu

    assert _native.load() is not None, _native.reason()
    loaded = kg.load_bundle(bundle)
    try:
        n = 3 * 4096  # a multiple of 16, like the bundle's samples (Triton specialises on it)
        with kg.tune("off"):  # the first supported candidate: add_relu's Triton impl, bundled
            for _ in range(3):
                x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
                torch.testing.assert_close(add_relu(x, y), torch.relu(x + y))
            plan = next(p for k, p in add_relu.dispatcher.plans().items() if k[0][2] == (n,))
            runner = add_relu.dispatcher.runner(plan.candidate)
            assert isinstance(runner, BundledRunner), plan.candidate.label
            if runner.covers((x, y)) is not None:
                pytest.skip(f"the bundle has no binary for these inputs: {runner.covers((x, y))}")
            replay = add_relu.dispatcher.current_replay()
            assert replay is not None, plan.native.get("why")
            calls = replay.stats()["calls"]
            x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
            torch.testing.assert_close(add_relu(x, y), torch.relu(x + y))
            assert replay.stats()["calls"] == calls + 1
    finally:
        loaded.detach()


def test_cutedsl_candidates_from_a_bundle_equal_the_reference(bundle):
    """The Python loader: CuTe DSL candidates are served from the bundle's shared libraries (with
    allow_native) and match the reference; without it they are left out with a warning."""
    from kernelgraft.aot.native_kernel import NativeKernel
    from kernelgraft.examples.add_relu import add_relu
    from kernelgraft.examples.rmsnorm import rmsnorm

    manifest = json.loads((bundle / "manifest.json").read_text())
    if not any(c["backend"] == "cutedsl" for op in manifest["ops"] for c in op["candidates"]):
        pytest.skip("the bundle holds no CuTe DSL kernels (built without nvidia-cutlass-dsl or a C compiler)")
    with pytest.warns(kg.KernelgraftWarning, match="native code"):
        plain = kg.load_bundle(bundle)
    assert not any(label.startswith("cutedsl:") for labels in plain.attached.values() for label in labels)
    plain.detach()
    loaded = kg.load_bundle(bundle, allow_native=True)
    try:
        cases = {add_relu: [((4096,), torch.float32), ((33, 97), torch.float16), ((33, 97), torch.bfloat16)],
                 rmsnorm: [((9, 768), torch.float32), ((17, 4096), torch.float16), ((3, 1000), torch.bfloat16)]}
        ran = 0
        for op, shapes in cases.items():
            for entry in manifest["ops"]:
                if entry["name"] != op.name:
                    continue
                for cand in entry["candidates"]:
                    if cand["backend"] != "cutedsl":
                        continue
                    runner = loaded.runner(op.name, cand["index"], cand["config"])
                    assert all(isinstance(k, NativeKernel) for k in runner.kernels)
                    for shape, dt in shapes:
                        x = torch.randn(shape, device="cuda", dtype=dt)
                        args = (x, torch.randn(shape, device="cuda", dtype=dt)) if op is add_relu else \
                            (x, torch.randn(shape[-1:], device="cuda", dtype=dt), 1e-6)
                        assert runner.covers(args) is None, (cand["label"], shape, dt)
                        out = torch.full(shape, float("nan"), device="cuda", dtype=dt)
                        runner(*args, out)
                        want = op.reference(*[a.double() if isinstance(a, torch.Tensor) else a for a in args])
                        tol = tolerance(dt)
                        torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol, msg=cand["label"])
                        ran += 1
        assert ran >= 5 * 3
    finally:
        loaded.detach()
