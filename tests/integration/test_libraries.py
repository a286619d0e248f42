"""Ops whose candidates come from kernel libraries (kernelgraft.examples.libraries): quack-kernels
(CuTe DSL) and Liger-Kernel (Triton) beside kernelgraft's own kernels and PyTorch. A library that
is not installed leaves its impls listed with the reason; ``kernelgraft check`` passes (quack's
kernels compiled for sm_90, Liger's run by Triton's interpreter where it can); a bundle carries
both libraries' kernels. CI installs both (the ``libraries`` extra); without them the tests that
need them skip, saying which."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from kernelgraft.check import check_op


def _need(dist: str):
    from kernelgraft.examples.libraries._sources import library

    source, reason = library(dist)
    if source is None:
        pytest.skip(reason)
    return source


def _env() -> dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    return env


BLOCKED = textwrap.dedent("""
    import json, sys, torch
    sys.modules["quack"] = None          # neither library importable in this process
    sys.modules["liger_kernel"] = None
    sys.modules["liger_kernel.ops"] = None
    from kernelgraft.examples.libraries import rmsnorm, softmax
    x = torch.randn(4, 64)
    reasons = {c.label: c.reason for c in softmax.softmax.candidates(x)}
    y = softmax.softmax(x)
    ok = bool(torch.allclose(y, torch.softmax(x, -1), atol=1e-6))
    out, rstd = rmsnorm.rmsnorm(x, torch.ones(64), 1e-6)
    print(json.dumps({"reasons": reasons, "ok": ok, "rms": list(out.shape) + list(rstd.shape)}))
""")


def test_missing_libraries_leave_their_impls_listed_with_the_reason():
    run = subprocess.run([sys.executable, "-c", BLOCKED], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    reasons = report["reasons"]
    assert "quack-kernels" in reasons["cutedsl:quack_softmax[-]"] or "CuTe DSL" in reasons["cutedsl:quack_softmax[-]"]
    assert "liger-kernel" in reasons["triton:liger_softmax[-]"] and "pip install" in reasons["triton:liger_softmax[-]"]
    assert any(label.startswith("triton:softmax_rows") and why is None for label, why in reasons.items())
    assert report["ok"] and report["rms"] == [4, 64, 4]


@pytest.fixture(scope="module")
def ops():
    from kernelgraft.examples.libraries import add_rmsnorm, cross_entropy, rmsnorm, rope, softmax, swiglu

    return {"rmsnorm": rmsnorm.rmsnorm, "add_rmsnorm": add_rmsnorm.add_rmsnorm, "softmax": softmax.softmax,
            "swiglu": swiglu.swiglu, "rope": rope.rope_, "cross_entropy": cross_entropy.cross_entropy}


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "add_rmsnorm", "cross_entropy", "rope"])
def test_library_ops_pass_check(ops, name):
    _need("quack-kernels") if name != "rope" else _need("liger-kernel")
    # every input variant check makes (odd sizes, broadcasts, offsets, strides), as on a GPU
    report = check_op(ops[name], device="cpu", opcheck=False)
    assert report.ok, [(r.candidate, r.sample, r.note) for r in report.failures]
    by = {}
    for r in report.results:
        by.setdefault(r.candidate, set()).add(r.status)
    if name != "rope":  # quack's kernel compiled for sm_90 wherever it would run
        quack = next(label for label in by if label.startswith("cutedsl:quack_"))
        assert "compiled" in by[quack], by[quack]
    if name in ("softmax", "rope"):  # Liger's kernel ran in Triton's interpreter
        assert "pass" in by[f"triton:liger_{'softmax' if name == 'softmax' else 'rope'}[-]"]


BUNDLE = textwrap.dedent("""
    import json, sys, torch
    from kernelgraft.aot import build_bundle
    from kernelgraft.examples.libraries import cross_entropy, rmsnorm, softmax
    x = torch.randn(8, 1024, dtype=torch.bfloat16)
    inputs = {"kglib::rmsnorm": [(x, torch.randn(1024, dtype=torch.bfloat16), 1e-6)],
              "kglib::softmax": [(x,)],
              "kglib::cross_entropy": [(x, torch.randint(0, 1024, (8,)))]}
    manifest = build_bundle([rmsnorm.rmsnorm, softmax.softmax, cross_entropy.cross_entropy], sys.argv[1],
                            archs=["sm_90"], inputs=inputs)
    print(json.dumps({op["name"]: {"built": sorted(c["label"] for c in op["candidates"] if c["kernels"]),
                                    "left": [s["candidate"] for s in op["skipped"] + op["dropped"]],
                                    "why": {s["candidate"]: s["reason"] for s in op["skipped"] + op["dropped"]}}
                      for op in manifest["ops"]}))
""")


# Liger's multi-block softmax calls tl.float32(...) as a constructor: a Triton whose dtypes are not
# callable (3.9) cannot compile it, and the impl says so in place of a compile error.
_MULTI_COMPILES = callable(getattr(__import__("triton.language").language, "float32"))


def test_library_kernels_are_bundled(tmp_path):
    _need("quack-kernels")
    _need("liger-kernel")
    run = subprocess.run([sys.executable, "-c", BUNDLE, str(tmp_path / "b")], capture_output=True, text=True,
                         timeout=900, env=_env())
    assert run.returncode == 0, run.stderr[-3000:]
    ops = json.loads(run.stdout.strip().splitlines()[-1])
    want = {"kglib::rmsnorm": ["cutedsl:quack_rmsnorm[-]", "triton:liger_rmsnorm[-]",
                               "triton:liger_rmsnorm_block[BLOCK_ROW=16]"],
            "kglib::softmax": ["cutedsl:quack_softmax[-]", "triton:liger_softmax[-]"] + (
                ["triton:liger_softmax_multi[-]"] if _MULTI_COMPILES else []),
            "kglib::cross_entropy": ["cutedsl:quack_cross_entropy[-]"]}
    for name, labels in want.items():
        assert set(labels) <= set(ops[name]["built"]), ops[name]
        assert not [c for c in ops[name]["left"] if c in labels], ops[name]
    if not _MULTI_COMPILES:  # left out with the reason, not a compile error
        why = ops["kglib::softmax"]["why"]["triton:liger_softmax_multi[-]"]
        assert "does not compile (its dtypes are not callable)" in why, why


def test_add_rmsnorm_rstd_is_judged_within_the_rounding_of_its_sum(ops):
    """rstd may come from the sum rounded to x's dtype (Liger) or from the float32 sum (quack): both
    pass the op's rule, on inputs where the float64 reference tells them apart; an rstd off by more
    than that rounding can move it fails, and so does one off by 1e-3 for float32 inputs."""
    from kernelgraft.verify import oracle

    op = ops["add_rmsnorm"]
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            x, r = (torch.randn(9, 768, generator=g).to(dtype) for _ in range(2))
            w = torch.randn(768, generator=g).to(dtype)
            ref = oracle.reference(op, (x, r, w, 1e-6))
            out, summed, _ = op.run(x, r, w, 1e-6, impl="reference")
            rounded = summed.float()
            unrounded = x.float() + r.float()
            for s in (rounded, unrounded):
                rstd = torch.rsqrt(s.pow(2).mean(-1) + 1e-6)
                verdict = oracle.verify(ref, [out, summed, rstd])
                assert verdict.ok, (seed, dtype, str(verdict))
            off = 2.0**-6 if dtype != torch.float32 else 1e-3
            bad = torch.rsqrt(rounded.pow(2).mean(-1) + 1e-6)
            bad[3] *= 1 + off
            assert not oracle.verify(ref, [out, summed, bad]).ok, (seed, dtype)
