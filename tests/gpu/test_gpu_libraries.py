"""On a GPU: the library-backed ops (kernelgraft.examples.libraries) against their libraries' own
functions (bit-equal where the same kernel runs with the same settings) and against the
references, and a bundle of them served in a process where neither library imports.

Needs quack-kernels (and nvidia-cutlass-dsl>=4.7) and liger-kernel installed; run with
``python -m pytest -m gpu tests/gpu/test_gpu_libraries.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from kernelgraft.check import check_op

pytestmark = pytest.mark.gpu


def _need(dist: str) -> None:
    from kernelgraft.examples.libraries._sources import library

    source, reason = library(dist)
    if source is None:
        pytest.skip(reason)


def _ops():
    from kernelgraft.examples.libraries import add_rmsnorm, cross_entropy, rmsnorm, rope, softmax, swiglu

    return add_rmsnorm, cross_entropy, rmsnorm, rope, softmax, swiglu


@pytest.mark.parametrize("rows,cols", [(1, 4096), (4096, 4096), (65536, 128), (8, 32768)])
def test_quack_backed_ops_match_quack_bit_for_bit(rows, cols):
    _need("quack-kernels")
    from quack.cross_entropy import cross_entropy_fwd
    from quack.rmsnorm import rmsnorm_fwd
    from quack.softmax import softmax_fwd

    _, cross_entropy, rmsnorm, _, softmax, _ = _ops()
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 3
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    out, rstd = rmsnorm.rmsnorm.run(x, w, 1e-6, impl="quack_rmsnorm")
    want, _, want_rstd = rmsnorm_fwd(x, w, eps=1e-6, store_rstd=True)
    assert torch.equal(out, want) and torch.equal(rstd, want_rstd)
    assert torch.equal(softmax.softmax.run(x, impl="quack_softmax"), softmax_fwd(x))
    target = torch.randint(0, cols, (rows,), device="cuda")
    target[0] = -100
    assert torch.equal(cross_entropy.cross_entropy.run(x, target, impl="quack_cross_entropy"),
                       cross_entropy_fwd(x, target))


@pytest.mark.parametrize("rows,cols", [(1, 4096), (4096, 4096), (65536, 128), (16, 14336)])
def test_liger_backed_ops_match_liger_bit_for_bit(rows, cols):
    _need("liger-kernel")
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.softmax import LigerSoftmaxFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    add_rmsnorm, _, rmsnorm, _, softmax, swiglu = _ops()
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "gemma", False)
        # Liger picks its block-of-rows kernel for narrow rows of many rows, else its row kernel
        block = cols <= 256 and rows >= 4096 * 8
        got, _ = rmsnorm.rmsnorm.run(x, w, 1e-6, impl="liger_rmsnorm_block" if block else "liger_rmsnorm")
        assert torch.equal(got, want)
        y, s = LigerFusedAddRMSNormFunction.apply(x, r, w, 1e-6, 0.0, "gemma", False)
        got_y, got_s, _ = add_rmsnorm.add_rmsnorm.run(x, r, w, 1e-6, impl="liger_add_rmsnorm")
        assert torch.equal(got_y, y) and torch.equal(got_s, s)
        assert torch.equal(swiglu.swiglu.run(x, r, impl="liger_swiglu"), LigerSiLUMulFunction.apply(x, r))
        assert torch.equal(softmax.softmax.run(x, impl="liger_softmax"), LigerSoftmaxFunction.apply(x))


def test_liger_rope_matches_liger():
    _need("liger-kernel")
    from liger_kernel.ops.rope import rope_forward

    from kernelgraft.examples.libraries import rope as rope_module

    q = torch.randn(2, 128, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 128, 8, 128, device="cuda", dtype=torch.bfloat16)
    cos, sin = rope_module._angles(1, 128, 128, "cuda", torch.bfloat16)
    # Liger's rope_forward takes (batch, heads, seq, dim) views of the same memory
    want_q, want_k = rope_forward(q.clone().transpose(1, 2), k.clone().transpose(1, 2), cos, sin)[:2]
    got_q, got_k = q.clone(), k.clone()
    rope_module.rope_.run(got_q, got_k, cos, sin, impl="liger_rope")
    assert torch.equal(got_q, want_q.transpose(1, 2)) and torch.equal(got_k, want_k.transpose(1, 2))


@pytest.mark.parametrize("index", range(6))
def test_library_ops_match_their_references(index):
    _need("quack-kernels")
    _need("liger-kernel")
    module = _ops()[index]
    op = getattr(module, module.__name__.rsplit(".", 1)[-1].replace("rope", "rope_"))
    report = check_op(op, device="cuda")
    assert report.ok, [(r.candidate, r.sample, r.note) for r in report.failures]


SERVE = textwrap.dedent("""
    import json, sys, torch
    for blocked in ("quack", "liger_kernel", "cutlass"):
        sys.modules[blocked] = None  # neither library (nor the DSL) importable here
    import kernelgraft as kg
    bundle = kg.load_bundle(sys.argv[1], allow_native=True, import_modules=True)
    from kernelgraft.examples.libraries import rmsnorm, softmax
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    x[3, 7], x[5, :] = float("nan"), float("-inf")  # a NaN, and a row of -inf, as the samples have
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    served = {"rmsnorm": rmsnorm.rmsnorm(x, w, 1e-6), "softmax": softmax.softmax(x)}
    served = {k: [t.cpu() for t in (v if isinstance(v, tuple) else (v,))] for k, v in served.items()}
    torch.save({"x": x.cpu(), "w": w.cpu(), "served": served}, sys.argv[2])
    print(json.dumps({"loaded": sorted(m for m in ("quack", "liger_kernel", "cutlass") if sys.modules.get(m))}))
""")


def test_bundle_serves_library_kernels_without_the_libraries(tmp_path):
    _need("quack-kernels")
    _need("liger-kernel")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "b"
    build = subprocess.run([sys.executable, "-m", "kernelgraft", "aot", "kernelgraft.examples.libraries.rmsnorm",
                            "kernelgraft.examples.libraries.softmax", "--arch", "sm_90", "-o", str(out)],
                           capture_output=True, text=True, env=env, timeout=1200)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    saved = tmp_path / "served.pt"
    run = subprocess.run([sys.executable, "-c", SERVE, str(out), str(saved)], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["loaded"] == []
    # judged here, by the one oracle, against the float64 reference on the same inputs
    from kernelgraft.examples.libraries import rmsnorm, softmax
    from kernelgraft.verify import oracle

    got = torch.load(saved)
    x, w = got["x"].cuda(), got["w"].cuda()
    for op, args in ((rmsnorm.rmsnorm, (x, w, 1e-6)), (softmax.softmax, (x,))):
        name = op.name.split("::")[1]
        verdict = oracle.verify(oracle.reference(op, args), [t.cuda() for t in got["served"][name]], op.tolerances)
        assert verdict.ok, (name, str(verdict))
