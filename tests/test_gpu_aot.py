"""AOT bundles on the GPU: a bundle built elsewhere (``$KERNELGRAFT_TEST_BUNDLE``, else built here)
is loaded in a process where ``import triton`` fails, and every bundled candidate's result matches
the op's reference (float64); the same bundle attached to the ops in a normal process, too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernelgraft as kg

HERE = Path(__file__).parent
pytestmark = pytest.mark.gpu


def _env():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    return env


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    given = os.environ.get("KERNELGRAFT_TEST_BUNDLE")
    if given:
        return Path(given)
    major, minor = torch.cuda.get_device_capability()
    out = tmp_path_factory.mktemp("bundle")
    cmd = [sys.executable, "-m", "kernelgraft", "aot", "kernelgraft.examples.add_relu",
           "kernelgraft.examples.rmsnorm", "--arch", f"sm_{major}{minor}", "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _reference(op_name, args):
    from kernelgraft.examples.add_relu import add_relu
    from kernelgraft.examples.rmsnorm import rmsnorm

    op = {"kgexamples::add_relu": add_relu, "kgexamples::rmsnorm": rmsnorm}[op_name]
    wide = [a.double() if isinstance(a, torch.Tensor) else a for a in args]
    return op.reference(*wide)


def _tol(dtype):
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]


def test_bundle_runs_without_triton_and_matches_reference(bundle, tmp_path):
    out = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, str(HERE / "_aot_child.py"), str(bundle), "run", str(out)],
                          capture_output=True, text=True, env=_env(), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
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
        tol = _tol(result.dtype)
        torch.testing.assert_close(result.double(), want, rtol=tol, atol=tol, msg=r["key"])
        ran.add((r["op"], r["label"]))
    assert ran == labels, f"candidates never run: {labels - ran}"


def test_bundle_attached_to_ops_in_process(bundle):
    from kernelgraft.aot._runner import BundledRunner
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
                    if not cand.supported or (cand.index, cand.config) not in op._bundled:
                        continue
                    runner = op._runner(cand)
                    assert isinstance(runner, BundledRunner)
                    if runner.covers(args) is not None:
                        continue
                    got = op.run(*args, impl=cand.index, config=cand.config)
                    want = op.reference(*[a.double() if isinstance(a, torch.Tensor) else a for a in args])
                    torch.testing.assert_close(got.double(), want, rtol=_tol(dt), atol=_tol(dt), msg=cand.label)
    finally:
        loaded.detach()
