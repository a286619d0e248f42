"""A new user's LayerNorm, written from README.md alone (a Triton and a CUDA C++ impl, a shape
``supports`` check, ``sample_inputs``), taken through what the README promises: the op matches
``F.layer_norm``, ``kernelgraft check`` (CUDA rows compile for sm_90 on a CPU machine), ``kernelgraft
aot`` from the .py path and from the module name, ``kg.load_bundle`` before and after ``import
layernorm``, a pattern graft into a model, ``torch.compile`` of it and ``torch.export``.

The fast tests run the op in this process; the whole tool chain, through the CLI and fresh
processes, is ``slow`` (about two minutes on the CPU machine)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kernelgraft as kg

# layernorm.py as a user writes it from the README: launch(*inputs, *outputs, **config), kg.Launch
# with typed scalars and a template for CUDA C++, config keys in the kernel name, supports().
LAYERNORM = '''"""LayerNorm over the last dimension, as a kernelgraft op with a Triton and a CUDA C++ kernel."""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import kernelgraft as kg


@triton.jit
def _layernorm(x, w, b, out, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    v = tl.load(x + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(v, axis=0) / n
    d = tl.where(mask, v - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n + eps)
    wv = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
    bv = tl.load(b + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + row * n + cols, (d * rstd * wv + bv).to(out.dtype.element_ty), mask=mask)


def launch_triton(x, weight, bias, eps, out, *, BLOCK):
    n = x.shape[-1]
    _layernorm[(x.numel() // n,)](x, weight, bias, out, n, eps, BLOCK=BLOCK)


SRC = r"""
#include <cuda_fp16.h>
template <typename T, int BLOCK>
__global__ void layernorm(const T* x, const T* w, const T* b, T* y, int n, float eps) {
    __shared__ float partial[BLOCK];
    const T* row = x + (long long)blockIdx.x * n;
    T* out = y + (long long)blockIdx.x * n;
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += BLOCK) s += (float)row[i];
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int k = BLOCK / 2; k > 0; k /= 2) {
        if (threadIdx.x < k) partial[threadIdx.x] += partial[threadIdx.x + k];
        __syncthreads();
    }
    float mean = partial[0] / n;
    __syncthreads();
    float q = 0.f;
    for (int i = threadIdx.x; i < n; i += BLOCK) { float d = (float)row[i] - mean; q += d * d; }
    partial[threadIdx.x] = q;
    __syncthreads();
    for (int k = BLOCK / 2; k > 0; k /= 2) {
        if (threadIdx.x < k) partial[threadIdx.x] += partial[threadIdx.x + k];
        __syncthreads();
    }
    float rstd = rsqrtf(partial[0] / n + eps);
    for (int i = threadIdx.x; i < n; i += BLOCK)
        out[i] = (T)(((float)row[i] - mean) * rstd * (float)w[i] + (float)b[i]);
}
"""


def launch_cuda(x, weight, bias, eps, out, *, BLOCK):
    n = x.shape[-1]
    return kg.Launch(grid=x.numel() // n, block=BLOCK,
                     args=(x, weight, bias, out, kg.driver.i32(n), kg.driver.f32(eps)),
                     template={"T": kg.ctype(x.dtype)})


def fits_in_one_block(x, weight, bias, eps, *, BLOCK):
    n = x.shape[-1]
    if weight.shape != (n,) or bias.shape != (n,):
        return f"weight and bias must have shape ({n},), got {tuple(weight.shape)} and {tuple(bias.shape)}"
    return n <= BLOCK or f"rows of {n} elements do not fit BLOCK={BLOCK}"


def same_shape(x, weight, bias, eps, *, BLOCK):
    n = x.shape[-1]
    if weight.shape != (n,) or bias.shape != (n,):
        return f"weight and bias must have shape ({n},), got {tuple(weight.shape)} and {tuple(bias.shape)}"
    return True


def samples(device):
    for dtype in (torch.float32, torch.float16):
        for rows, n in ((4, 64), (3, 200)):
            x = torch.randn(rows, n, device=device, dtype=dtype)
            w = torch.randn(n, device=device, dtype=dtype)
            b = torch.randn(n, device=device, dtype=dtype)
            yield x, w, b, 1e-5


@kg.op("newuser::layernorm", sample_inputs=samples, impls=[
    kg.triton(launch_triton, configs=[{"BLOCK": 256}, {"BLOCK": 1024}], supports=fits_in_one_block),
    kg.cuda(SRC, "layernorm<{T}, {BLOCK}>", launch=launch_cuda, configs=[{"BLOCK": 128}, {"BLOCK": 256}],
            supports=same_shape),
])
def layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension of x."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
'''

# The README's first example with the shape check it lacks (add_relu(randn(1000), randn(1)) read
# y out of bounds); the report proposes this text for README.md.
ADD_RELU = """
import torch, triton, triton.language as tl
import kernelgraft as kg

@triton.jit
def _add_relu(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(x + offs, mask=mask).to(tl.float32)
    b = tl.load(y + offs, mask=mask).to(tl.float32)
    tl.store(out + offs, tl.maximum(a + b, 0.0).to(out.dtype.element_ty), mask=mask)

def launch_add_relu(x, y, out, *, BLOCK):          # inputs, then outputs, then config as keywords
    n = x.numel()
    _add_relu[(triton.cdiv(n, BLOCK),)](x, y, out, n, BLOCK=BLOCK)

def same_shape(x, y, **config):                    # the kernel reads y as x's shape: no broadcasting
    return x.shape == y.shape or f"x and y must have the same shape, got {tuple(x.shape)} and {tuple(y.shape)}"

@kg.op("demo_readme::add_relu", impls=[kg.triton(launch_add_relu, configs=[{"BLOCK": 256}, {"BLOCK": 1024}],
                                                 supports=same_shape)])
def add_relu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    \"\"\"The reference: gives the schema, the CPU/fallback path and the test oracle.\"\"\"
    return torch.relu(x + y)
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return path


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, x):
        return self.norm(torch.relu(self.lin(x)))


def _ln_pattern(x, weight, bias, eps):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


@pytest.fixture
def layernorm(tmp_path):
    return _import(_write(tmp_path, "layernorm", LAYERNORM), "kgtest_new_user_layernorm").layernorm


def test_the_users_layernorm_matches_f_layer_norm(layernorm):
    from kernelgraft.op.samples import samples

    for x, w, b, eps in samples(layernorm, "cpu"):
        want = F.layer_norm(x.double(), (x.shape[-1],), w.double(), b.double(), eps)
        got = layernorm(x, w, b, eps)  # the Triton kernel, through the interpreter
        assert got.dtype == x.dtype and torch.allclose(got.double(), want, rtol=1e-2, atol=1e-2)
        triton_only = layernorm.run(x, w, b, eps, impl="triton", config={"BLOCK": 256})
        assert torch.allclose(triton_only.double(), want, rtol=1e-2, atol=1e-2)


def test_its_shape_check_keeps_a_wrong_weight_from_the_kernel(layernorm):
    x = torch.randn(4, 64)
    reasons = [c.reason for c in layernorm.candidates(x, torch.randn(1), torch.randn(1), 1e-5)]
    assert reasons[0] == "weight and bias must have shape (64,), got (1,) and (1,)"
    with pytest.raises(kg.InputError, match="newuser::layernorm"):
        layernorm(x, torch.randn(1), torch.randn(1), 1e-5)


def test_an_exported_model_is_grafted_with_the_users_layernorm(layernorm):
    torch.manual_seed(0)
    x = torch.randn(8, 64)
    ep = torch.export.export(_Block().eval(), (x,))
    want = ep.module()(x)
    report = kg.graft(ep, pattern=_ln_pattern, replacement=layernorm)
    assert report.count == 1
    assert "newuser.layernorm" in str(ep.graph)
    assert torch.allclose(ep.module()(x), want, rtol=1e-4, atol=1e-5)


def test_the_readme_add_relu_refuses_broadcasting_instead_of_reading_past_y(tmp_path):
    add_relu = _import(_write(tmp_path, "readme_add_relu", ADD_RELU), "kgtest_readme_add_relu").add_relu
    x, y = torch.randn(1000), torch.randn(1000)
    assert torch.equal(add_relu(x, y), torch.relu(x + y))
    short = torch.randn(1)
    with pytest.warns(kg.FallbackWarning, match="x and y must have the same shape, got \\(1000,\\) and \\(1,\\)"):
        out = add_relu(x, short)  # the reference broadcasts; the kernel never sees it
    assert torch.equal(out, torch.relu(x + short))


# ------------------------------------------------------------------ the tools, as the user runs them

def _env(tmp_path: Path, interpret: bool) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


def _cli(tmp_path: Path, *args: str, interpret: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "kernelgraft", *args], cwd=tmp_path, capture_output=True,
                          text=True, env=_env(tmp_path, interpret), timeout=600)
    assert proc.returncode == 0, f"kernelgraft {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


_CHILD = r"""
import json, sys, warnings
import torch, torch.nn.functional as F
import kernelgraft as kg
from kernelgraft.op import registry as _registry

bundle_dir, order, model_too = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
warnings.simplefilter("error", kg.KernelgraftWarning)  # a clean hand-over says nothing
out = {}
if order == "bundle-then-import":
    bundle = kg.load_bundle(bundle_dir, arch="sm_90")
    stand_in = bundle.ops["newuser::layernorm"]
    out["rebuilt"] = list(bundle.rebuilt)
    from layernorm import layernorm
    out["stand_in_forwards"] = stand_in.overload is layernorm.overload
else:
    from layernorm import layernorm
    bundle = kg.load_bundle(bundle_dir, arch="sm_90")
out["module_op_serves"] = _registry.lookup("newuser::layernorm") is layernorm
out["bundle_op_is_module_op"] = bundle.ops["newuser::layernorm"] is layernorm
out["rebuilt_after"] = list(bundle.rebuilt)
out["attached"] = sorted(bundle.attached["newuser::layernorm"])
out["bundled_keys"] = len(layernorm.dispatcher.bundled_keys())
if not model_too:
    print(json.dumps(out))
    sys.exit(0)

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
        self.norm = torch.nn.LayerNorm(64)
    def forward(self, x):
        return self.norm(torch.relu(self.lin(x)))

def ln_pattern(x, weight, bias, eps):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)

torch.manual_seed(0)
model, x = Block().eval(), torch.randn(8, 64)
with torch.no_grad():
    want = model(x)
    out["grafted"] = kg.graft(model, pattern=ln_pattern, replacement=layernorm, example_inputs=(x,)).count
    from torch._inductor.utils import run_and_get_code
    got, code = run_and_get_code(torch.compile(model, fullgraph=True), x)
    out["compiled_calls_op"] = any("newuser.layernorm" in c for c in code)
    out["compiled_err"] = (got - want).abs().max().item()
    ep = torch.export.export(Block().eval(), (x,))
    out["export_grafted"] = kg.graft(ep, pattern=ln_pattern, replacement=layernorm).count
    out["export_calls_op"] = "newuser.layernorm" in str(ep.graph)
print(json.dumps(out))
"""


def _child(tmp_path: Path, bundle: Path, order: str, model_too: bool) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(bundle), order, "1" if model_too else "0"],
                          cwd=tmp_path, capture_output=True,
                          text=True, env=_env(tmp_path, interpret=True), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_new_users_layernorm_through_check_aot_load_graft_compile_export(tmp_path):
    _write(tmp_path, "layernorm", LAYERNORM)
    check = _cli(tmp_path, "check", "layernorm.py").stdout
    assert "0 failed" in check and "compiled" in check, check  # CUDA C++ compiled for sm_90, not run
    manifest = {}
    for target, out in (("layernorm.py", "bundle"), ("layernorm", "bundle_by_module")):
        _cli(tmp_path, "aot", target, "-o", out, "--arch", "sm_90")
        manifest[out] = json.loads((tmp_path / out / "manifest.json").read_text())
        backends = {c["backend"] for op in manifest[out]["ops"] for c in op["candidates"]}
        assert backends == {"triton", "cuda"}, backends
    # built from the path or from the module name, the op is the same op
    assert manifest["bundle"]["ops"][0]["fingerprint"] == manifest["bundle_by_module"]["ops"][0]["fingerprint"]
    labels = sorted(c["label"] for c in manifest["bundle"]["ops"][0]["candidates"])

    for bundle, order in (("bundle_by_module", "bundle-then-import"), ("bundle", "import-then-bundle"),
                          ("bundle", "bundle-then-import")):
        model_too = bundle == "bundle" and order == "bundle-then-import"  # the README's order
        report = _child(tmp_path, tmp_path / bundle, order, model_too)
        assert report["module_op_serves"] and report["bundle_op_is_module_op"], (bundle, order, report)
        assert report.get("stand_in_forwards", True) and report["rebuilt_after"] == []
        assert report["attached"] == labels and report["bundled_keys"] == len(labels)
        if model_too:
            assert report["grafted"] == 1 and report["compiled_calls_op"] and report["compiled_err"] < 1e-4
            assert report["export_grafted"] == 1 and report["export_calls_op"]


_GPU_CHILD = r"""
import json, sys
import torch, torch.nn.functional as F
import kernelgraft as kg

bundle = kg.load_bundle(sys.argv[1])  # this GPU's arch
from layernorm import layernorm, samples

out = {"attached": len(bundle.attached["newuser::layernorm"]), "errors": [], "ran": 0}
for x, w, b, eps in samples("cuda"):
    want = F.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(), eps)
    for c in layernorm.candidates(x, w, b, eps):
        if c.reason is None:
            got = layernorm.run(x, w, b, eps, impl=c.index, config=c.config.as_dict())
            out["ran"] += 1
            err = (got.float() - want).abs().max().item()
            if not err < 2e-2:
                out["errors"].append(f"{c.impl.backend} {c.config.as_dict()} {x.dtype} {tuple(x.shape)}: {err}")
    err = (layernorm(x, w, b, eps).float() - want).abs().max().item()  # tuned, then planned
    if not err < 2e-2:
        out["errors"].append(f"tuned {x.dtype} {tuple(x.shape)}: {err}")
torch.cuda.synchronize()
out["jit_runners"] = len(layernorm.dispatcher.runners)  # every candidate came from the bundle
print(json.dumps(out))
"""


@pytest.mark.gpu
def test_the_users_bundle_serves_the_imported_layernorm_on_the_gpu(tmp_path):
    """The README's order on a GPU: load the bundle, import the module; the module's op runs the
    bundled Triton and CUDA C++ kernels (no JIT compile) and matches F.layer_norm."""
    _write(tmp_path, "layernorm", LAYERNORM)
    _cli(tmp_path, "aot", "layernorm.py", "-o", "bundle", "--arch", "sm_90")
    proc = subprocess.run([sys.executable, "-c", _GPU_CHILD, str(tmp_path / "bundle")], cwd=tmp_path,
                          capture_output=True, text=True, env=_env(tmp_path, interpret=False), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["attached"] == 4 and report["ran"] >= 12 and report["errors"] == [], report
    assert report["jit_runners"] == 0, report
