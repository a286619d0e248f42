"""Bundles keep layouts: a candidate declared ``contiguous=False`` (or for some arguments only) is
bundled with the caller's strides as guarded expressions (``x.stride(d)``), not the sample's
strides baked in as constants; a kernel traced on contiguous inputs serves only contiguous ones,
in the Python loader and in the C++ runtime; ``kernelgraft aot`` builds strided signatures instead
of dropping them, and says which ones it cannot serve and why.

The ops are tests/_layout_ops.py: a mutating row scatter (``cache[slot_mapping[i]] = x[i]``, -1
pads) with a contiguous-only and a strided Triton candidate, a RoPE whose kernel takes q's strides
(a transposed q, as HF Llama has it), and an op whose launch copies a strided input (which no
bundle can serve). CPU tests build a real sm_90 bundle and run both loaders up to the launch (the
Python loader's launches recorded in a process where ``import triton`` fails, the C++ runtime's
planning hooks); GPU tests (``pytest -m gpu tests/integration/test_aot_layouts.py``, TRITON_INTERPRET unset)
write an interleaved K/V cache view through the bundle from Python and from C++."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelgraft.aot import manifest as _manifest
from kernelgraft.symbolic.expr import compile_exprs

from _aot_helpers import env
from _runtime_helpers import RECORDING_LOADER, json_child, so, variant  # noqa: F401 (so: a fixture)
from _paths import TESTS

OPS = TESTS / "_layout_ops.py"
SCATTER, ROPE, COPY = "kglayout::scatter_rows", "kglayout::rope", "kglayout::copy_first"
DENSE, STRIDED = "triton:scatter_dense[BLOCK=16]", "triton:scatter_strided[BLOCK=16]"
ROPE_LABEL = "triton:rope_strided[BLOCK=8]"


def _aot(out: Path, arch: str, *ops: str, partial: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kernelgraft", "aot", str(OPS), "--arch", arch, "-o", str(out)]
    cmd += ["--allow-partial"] * partial
    for op in ops:
        cmd += ["--op", op]
    return subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=900)


def _arch() -> str:
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return "sm_90"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(bundle, the CLI's run) of the scatter and RoPE ops, for this GPU's arch or sm_90. Partial
    builds are accepted here (the next test requires a complete one), so each test below checks its
    own part of what the bundle holds."""
    pytest.importorskip("cuda.bindings")
    out = tmp_path_factory.mktemp("layouts") / "b"
    return out, _aot(out, _arch(), SCATTER, ROPE, partial=True)


@pytest.fixture(scope="module")
def bundle(built) -> Path:
    out, run = built
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def manifest(bundle) -> dict:
    return _manifest.read(bundle)


def _candidate(manifest: dict, op: str, label: str) -> dict:
    entry = next(e for e in manifest["ops"] if e["name"] == op)
    return next(c for c in entry["candidates"] if c["label"] == label)


def _exprs(kernel: dict) -> list:
    return [p.get("expr", p.get("source")) for p in kernel["params"] if not p.get("null")]


# ------------------------------------------------------------------ the build


def test_aot_bundles_strided_signatures_instead_of_dropping_them(built):
    """The interleaved cache view, the transposed q and the strided copies check derives are all
    built: nothing dropped, and the summary counts what each candidate declines."""
    out, run = built
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "DROPPED" not in run.stdout and "(--allow-partial)" not in run.stdout
    manifest = _manifest.read(out)
    declined = sum(len(e["refused"]) for e in manifest["ops"])
    assert declined == 7  # scatter_dense: 3 strided signatures; rope: 4 with a strided cos
    assert (f"dropped 0 (candidate, signature) pairs, skipped 0 candidates, {declined} (candidate, signature) "
            "pairs declined by their candidate, 1 signatures served by no kernel") in run.stdout, run.stdout
    # the contiguous-only candidate declines the strided signatures, in eager dispatch's words
    assert f"{DENSE} declines 3 signature(s), as eager dispatch does: " in run.stdout
    assert "needs cache contiguous, got strides (32, 1) for shape (8, 16)" in run.stdout
    # a signature no candidate takes is named, with each candidate's reason
    assert ("NOT SERVED float32[2, 3, 5, 16] float32[5, 8]/(16, 2) float32[5, 8]: no bundled kernel takes it "
            f"({ROPE_LABEL}: needs cos contiguous, got strides (16, 2) for shape (5, 8))") in run.stdout


def test_the_manifest_records_layouts_as_declared(manifest):
    assert _candidate(manifest, SCATTER, DENSE)["contiguous"] is True
    assert _candidate(manifest, SCATTER, STRIDED)["contiguous"] is False
    assert _candidate(manifest, ROPE, ROPE_LABEL)["contiguous"] == ["cos", "sin"]
    # per kernel: the inputs traced contiguous (a loader selects the kernel only where they are)
    assert {tuple(k["contiguous"]) for k in _candidate(manifest, SCATTER, DENSE)["kernels"]} == {
        ("x", "cache", "slot_mapping")}
    assert {tuple(k["contiguous"]) for k in _candidate(manifest, SCATTER, STRIDED)["kernels"]} == {()}
    assert {tuple(k["contiguous"]) for k in _candidate(manifest, ROPE, ROPE_LABEL)["kernels"]} == {("cos", "sin")}


def test_strides_are_guarded_expressions_not_constants(manifest):
    strided = _candidate(manifest, SCATTER, STRIDED)["kernels"]
    names = ["x", "cache", "slot_mapping"]
    for k in strided:
        assert _exprs(k) == ["x", "cache", "slot_mapping", "cache.shape[0]", "x.shape[1]", "x.stride(0)",
                             "x.stride(1)", "cache.stride(0)", "cache.stride(1)", "slot_mapping.stride(0)"]
        # each stride passed as i32 is guarded to fit, and a stride compiled as divisible by 16 is guarded so
        assert "(slot_mapping.stride(0) >= -2147483648) and (slot_mapping.stride(0) < 2147483648)" in k["guards"]
        assert "((cache.stride(0)) % 16 == 0)" in k["guards"]
        # the C++ runtime reads the same strides: RPN stride tokens over the op's inputs
        params = [p for p in k["program"]["params"] if p is not None]
        assert params[-5:] == [[["stride", 0, 0]], [["stride", 0, 1]], [["stride", 1, 0]], [["stride", 1, 1]],
                               [["stride", 2, 0]]]
        # the caller's strides, not the sample's
        kv = torch.randn(10, 3, 16)
        slots = torch.arange(12)[::2]
        values = compile_exprs(names, _exprs(k)[3:])(torch.randn(6, 16), kv[:, 1, :], slots)
        assert values == (10, 16, 16, 1, 48, 1, 2)
    rope = _candidate(manifest, ROPE, ROPE_LABEL)["kernels"]
    assert all(_exprs(k)[-4:] == ["q.stride(0)", "q.stride(1)", "q.stride(2)", "q.stride(3)"] for k in rope)
    # output rules read sizes only: a Meta kernel gives shapes for any layout
    entry = next(e for e in manifest["ops"] if e["name"] == ROPE)
    assert entry["meta"]
    # ... derived from the kernels' per-guard programs, those that read a stride left out
    reads = lambda program: any(t[0] == "stride" for t in program)  # noqa: E731
    assert not any(reads(g) for e in manifest["ops"] for rule in e["meta"] for g in rule["guards"])
    strided = [k for e in manifest["ops"] for c in e["candidates"] for k in c["kernels"]
               if any(reads(g) for g in k["program"]["guards"])]
    assert strided and all(len(k["program"]["guards"]) == len(k["guards"]) for k in strided)


def test_a_signature_that_cannot_be_bundled_is_dropped_with_why(tmp_path):
    """A launch that copies a strided input makes a tensor the op never sees: the strided signature
    (the copy check derives) is dropped, named with its strides and the reason, counted, and the
    build fails without --allow-partial; the contiguous kernel guards its layout so it never
    serves a strided call."""
    pytest.importorskip("cuda.bindings")
    run = _aot(tmp_path / "b", "sm_90", COPY)
    assert run.returncode == 1, run.stdout + run.stderr
    assert ("DROPPED triton:double_copying[BLOCK=64] on float32[4, 8]/(32, 2): Unsupported: a kernel tensor "
            "argument that is not an input or output of the op (a tensor the launch made") in run.stdout
    assert "built 1 kernels, dropped 1 (candidate, signature) pairs, skipped 0 candidates" in run.stdout
    (k,) = _manifest.read(tmp_path / "b")["ops"][0]["candidates"][0]["kernels"]
    assert k["contiguous"] == [] and "(x.stride(1) == 1)" in k["guards"]
    guard = compile_exprs(["x"], k["guards"])  # each guard on its own, as the runner evaluates them
    assert all(guard(torch.randn(4, 8)))
    assert not all(guard(torch.randn(8, 4).t()))


# ------------------------------------------------------------------ the Python loader, up to the launch

PY_CHILD = RECORDING_LOADER + r"""
bundle = kg.load_bundle(sys.argv[1], arch="sm_90")
DENSE, STRIDED, ROPE = sys.argv[2:5]
manifest = bundle.manifest
def runner(op, label):
    entry = next(e for e in manifest["ops"] if e["name"] == op)
    cand = next(c for c in entry["candidates"] if c["label"] == label)
    return bundle.runner(op, cand["index"], cand["config"])

def launch(r, *args):
    why = r.covers(args)
    if why is not None:
        return {"covers": why}
    calls.clear()
    r(*args)
    (call,) = calls
    ptrs = [a.data_ptr() for a in args if isinstance(a, torch.Tensor)]
    n = len(ptrs)
    return {"ptrs_ok": call["values"][:n] == ptrs, "scalars": call["values"][n:-2], "grid": call["grid"]}

x = torch.randn(6, 16)
slots = torch.tensor([4, -1, 0, 9, 2, 7])
kv = torch.randn(10, 2, 16)
dense, strided = runner("kglayout::scatter_rows", DENSE), runner("kglayout::scatter_rows", STRIDED)
q = torch.randn(2, 5, 3, 16).transpose(1, 2)
cos, sin = torch.randn(5, 8), torch.randn(5, 8)
rope = runner("kglayout::rope", ROPE)
report = {
    "rebuilt": sorted(bundle.rebuilt),
    "declared": {op: [i.contiguous for i in bundle.ops[op].impls] for op in bundle.ops},
    "dense_contiguous": launch(dense, x, torch.randn(10, 16), slots),
    "dense_k_view": launch(dense, x, kv[:, 0, :], slots),
    "strided_k_view": launch(strided, x, kv[:, 0, :], slots),
    "strided_v_view": launch(strided, x, kv[:, 1, :], slots),
    "strided_slots": launch(strided, x, torch.randn(10, 16), torch.arange(12)[::2]),
    "strided_x": launch(strided, torch.randn(16, 32)[:6, ::2], kv[:, 0, :], slots),
    "strided_misdivisible": launch(strided, x, torch.randn(10, 24)[:, :16], slots),
    "rope_transposed": launch(rope, q, cos, sin, torch.empty(2, 3, 5, 16)),
    "rope_strided_cos": launch(rope, q, torch.randn(5, 16)[:, ::2], sin, torch.empty(2, 3, 5, 16)),
}
# the same kernel, another layout of the same shapes: planned again (its parameters read strides)
report["strided_k_then_wide"] = launch(strided, x, torch.randn(10, 3, 16)[:, 0, :], slots)
print(json.dumps(report))
"""


def test_the_python_loader_selects_by_layout_and_passes_the_callers_strides(bundle, tmp_path):
    report, _ = json_child(tmp_path, PY_CHILD, bundle, DENSE, STRIDED, ROPE_LABEL)
    assert report["rebuilt"] == [ROPE, SCATTER]
    # the ops rebuilt from the manifest decline a call on layout as the original ops do
    assert report["declared"] == {SCATTER: [True, False], ROPE: [["cos", "sin"]]}
    assert report["dense_contiguous"] == {"ptrs_ok": True, "scalars": [10, 16], "grid": [6, 1, 1]}
    assert "no bundled kernel" in report["dense_k_view"]["covers"]  # traced contiguous: not for a view
    # interleaved K/V: each half at its own address with the cache's real strides (32, 1)
    assert report["strided_k_view"] == {"ptrs_ok": True, "scalars": [10, 16, 16, 1, 32, 1, 1], "grid": [6, 1, 1]}
    assert report["strided_v_view"] == report["strided_k_view"]
    assert report["strided_slots"]["scalars"] == [10, 16, 16, 1, 16, 1, 2]  # slot_mapping's stride, not 1
    assert report["strided_x"]["scalars"] == [10, 16, 32, 2, 32, 1, 1]
    assert report["strided_k_then_wide"]["scalars"] == [10, 16, 16, 1, 48, 1, 1]
    # a stride the kernel was compiled as divisible by 16 for (every sample's was), that is not: the
    # guard declines it (a bundle serves the layouts its samples show; add one to serve this)
    assert "no bundled kernel" in report["strided_misdivisible"]["covers"]
    assert report["rope_transposed"] == {"ptrs_ok": True, "scalars": [3, 5, 8, 240, 16, 48, 1], "grid": [30, 1, 1]}
    assert "no bundled kernel" in report["rope_strided_cos"]["covers"]


# ------------------------------------------------------------------ the C++ runtime, up to the launch


def _plan(name: str, args: list) -> dict:
    return json.loads(torch.ops.kernelgraft._runtime_plan(name, json.dumps(args)))


def _t(shape, stride=None, dtype="float32") -> dict:
    return {"shape": list(shape), "dtype": dtype, **({"stride": list(stride)} if stride is not None else {})}


@pytest.fixture(scope="module")
def cpp(so, bundle, tmp_path_factory) -> str:
    """The bundle's ops in the C++ runtime under namespace kglay_cpp."""
    path = variant(bundle, tmp_path_factory.mktemp("cpp") / "b", "kglay_cpp")
    assert list(torch.ops.kernelgraft.load_bundle(str(path), None, "sm_90")) == ["kglay_cpp::scatter_rows",
                                                                                 "kglay_cpp::rope"]
    return "kglay_cpp"


@pytest.mark.parametrize("text", [
    "x.stride(0)", "x.stride(1) * x.shape[0] + n", "(x.stride(0) % 16 == 0) and (x.stride(1) == 1)",
    "x.stride(2)", "max(x.stride(0), x.stride(1)) // (x.stride(1) - 1)",
])
def test_stride_programs_equal_python_on_random_layouts(so, text):
    """The RPN stride token in C++ gives what the Python text gives on tensors of those strides
    (an error where Python raises: a dimension the tensor lacks, a division by zero)."""
    import random

    from kernelgraft.aot.rpn import compile_rpn

    program = compile_rpn(text, ["x", "n"])
    rng = random.Random(text)
    for _ in range(40):
        shape = [rng.randrange(1, 9), rng.randrange(1, 9)]
        stride = [rng.choice([0, 1, 2, 16, 48, 1000]) for _ in shape]
        n = rng.randrange(-5, 5)
        try:
            want = str(int(compile_exprs(["x", "n"], [text])(torch.empty_strided(shape, stride), n)[0]))
        except Exception:
            want = "error"
        got = torch.ops.kernelgraft._runtime_eval(json.dumps(program), json.dumps([_t(shape, stride), n]))
        assert got.startswith("error") if want == "error" else got == want, (text, shape, stride, n, got, want)


def test_the_cpp_runtime_selects_by_layout_and_reads_the_callers_strides(cpp):
    x, slots = _t((6, 16)), _t((6,), dtype="int64")
    contiguous = _plan(f"{cpp}::scatter_rows", [x, _t((10, 16)), slots])
    assert contiguous["candidate"] == DENSE and contiguous["params"][3:5] == ["10", "16"]
    k_view = _plan(f"{cpp}::scatter_rows", [x, _t((10, 16), (32, 1)), slots])
    assert k_view["candidate"] == STRIDED
    assert k_view["params"][3:10] == ["10", "16", "16", "1", "32", "1", "1"]
    strided_slots = _plan(f"{cpp}::scatter_rows", [x, _t((10, 16)), _t((6,), (2,), "int64")])
    assert strided_slots["candidate"] == STRIDED and strided_slots["params"][9] == "2"
    rope = _plan(f"{cpp}::rope", [_t((2, 3, 5, 16), (240, 16, 48, 1)), _t((5, 8)), _t((5, 8))])
    assert rope["candidate"] == ROPE_LABEL and rope["params"][4:11] == ["3", "5", "8", "240", "16", "48", "1"]
    assert rope["outputs"] == [[2, 3, 5, 16]] and rope["grid"] == [30, 1, 1]
    with pytest.raises(RuntimeError, match=f"{ROPE_LABEL.replace('[', '.').replace(']', '.')} needs cos contiguous"):
        _plan(f"{cpp}::rope", [_t((2, 3, 5, 16)), _t((5, 8), (16, 2)), _t((5, 8))])
    # the Meta kernel gives output shapes for any layout (its rules read no strides)
    q = torch.empty(2, 5, 3, 16, device="meta").transpose(1, 2)
    cos = torch.empty(5, 8, device="meta")
    assert getattr(torch.ops, cpp).rope(q, cos, cos).shape == (2, 3, 5, 16)


def test_a_kernel_traced_contiguous_is_refused_clearly_for_a_strided_call(so, bundle, tmp_path):
    def dense_only(op):
        op["candidates"] = [c for c in op["candidates"] if c["label"] != STRIDED]
        op["decisions"] = []

    path = variant(bundle, tmp_path / "b", "kglay_dense", edit_op=dense_only)
    torch.ops.kernelgraft.load_bundle(str(path), None, "sm_90")
    args = [_t((6, 16)), _t((10, 16), (32, 1)), _t((6,), dtype="int64")]
    with pytest.raises(RuntimeError) as info:
        _plan("kglay_dense::scatter_rows", args)
    text = str(info.value)
    assert "kglay_dense::scatter_rows: no bundled kernel serves these inputs" in text
    assert "cache: float32[10, 16] (not contiguous)" in text
    assert f"{DENSE} needs cache contiguous (its kernels were built for that layout only)" in text


CPU_PLAN_CHILD = r"""
import json, re, sys, torch
torch.ops.load_library(sys.argv[1])
torch.ops.kernelgraft.load_bundle(sys.argv[2], None, "sm_90")

def attempt(*args):  # the CUDA kernel's planning on CPU tensors (the runtime's test hook)
    try:
        torch.ops.kglay_plan.scatter_rows(*args)
    except RuntimeError as exc:
        text = str(exc).splitlines()[0]
    m = re.search(r"planned (\S+) kernel \S+ grid \[[^]]*\] \((\w+), \d+ cached\) scalars \[([^]]*)\]", text)
    return {"candidate": m[1], "how": m[2], "scalars": [int(v) for v in m[3].split(", ")]} if m else {"error": text}

x, slots = torch.randn(6, 16), torch.tensor([4, -1, 0, 9, 2, 7])
calls = [(x, torch.randn(10, 2, 16)[:, 0, :], slots), (x, torch.randn(10, 2, 16)[:, 1, :], slots),
         (x, torch.randn(10, 3, 16)[:, 0, :], slots), (x, torch.randn(10, 16), slots)]
print(json.dumps([attempt(*c) for c in calls]))
"""


def test_the_cpp_launch_cache_is_keyed_by_strides(so, bundle, tmp_path):
    """Two views of one shape with other strides plan separately: the cached plan of the first
    would launch with its strides."""
    path = variant(bundle, tmp_path / "b", "kglay_plan")
    report, _ = json_child(tmp_path, CPU_PLAN_CHILD, so, path,
                           extra_env={"KERNELGRAFT_RUNTIME_PLAN_ON_CPU": "1"}, isolated=False)
    assert [r.get("how") for r in report] == ["new", "cached", "new", "new"], report
    assert [r["candidate"] for r in report] == [STRIDED, STRIDED, STRIDED, DENSE]
    assert report[0]["scalars"] == [10, 16, 16, 1, 32, 1, 1] and report[2]["scalars"] == [10, 16, 16, 1, 48, 1, 1]
    assert report[3]["scalars"] == [10, 16]


# ------------------------------------------------------------------ on the GPU

GPU_PY_CHILD = r"""
import json, sys
sys.modules["triton"] = None  # the bundle, not the JIT, must serve
import torch
import kernelgraft as kg

kg.load_bundle(sys.argv[1])
g = torch.Generator(device="cuda").manual_seed(0)
S, D = 64, 16
slots = torch.tensor([5, -1, 0, 63, 17, -1, 40, 2], device="cuda")
x = torch.randn(len(slots), D, device="cuda", generator=g)
out = {}

def reference(cache, x, slot_mapping):
    keep = slot_mapping >= 0
    cache[slot_mapping[keep]] = x[keep]

for name, view in (("k", lambda kv: kv[:, 0, :]), ("v", lambda kv: kv[:, 1, :]), ("dense", None)):
    kv = torch.randn(S, 2, D, device="cuda", generator=g) if view else torch.randn(S, D, device="cuda", generator=g)
    want = kv.clone()
    reference(view(want) if view else want, x, slots)
    torch.ops.kglayout.scatter_rows(x, view(kv) if view else kv, slots)
    out[name] = bool(torch.equal(kv, want))  # the other half of the interleaved cache untouched too
wide = torch.arange(2 * len(slots), device="cuda")
wide[::2] = slots
kv = torch.randn(S, 2, D, device="cuda", generator=g)
want = kv.clone()
reference(want[:, 0, :], x, slots)
torch.ops.kglayout.scatter_rows(x, kv[:, 0, :], wide[::2])
out["strided_slots"] = bool(torch.equal(kv, want))
q = torch.randn(2, 7, 4, 16, device="cuda", generator=g).transpose(1, 2)
cos, sin = torch.randn(7, 8, device="cuda", generator=g), torch.randn(7, 8, device="cuda", generator=g)
q1, q2 = q[..., :8], q[..., 8:]
want = torch.cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin], dim=-1)
got = torch.ops.kglayout.rope(q, cos, sin)
out["rope"] = float((got - want).abs().max())
print(json.dumps(out))
"""


@pytest.mark.gpu
def test_gpu_a_strided_cache_view_written_through_the_python_loader(bundle, tmp_path):
    report, _ = json_child(tmp_path, GPU_PY_CHILD, bundle)
    assert report["k"] and report["v"] and report["dense"] and report["strided_slots"], report
    assert report["rope"] < 1e-5, report


@pytest.mark.gpu
def test_gpu_a_strided_cache_view_written_through_the_cpp_runtime(so, bundle, tmp_path):
    path = variant(bundle, tmp_path / "b", "kglay_gpu")
    torch.ops.kernelgraft.load_bundle(str(path), None, None)
    ops = torch.ops.kglay_gpu
    g = torch.Generator(device="cuda").manual_seed(1)
    S, D = 64, 16
    slots = torch.tensor([5, -1, 0, 63, 17, -1, 40, 2], device="cuda")
    x = torch.randn(len(slots), D, device="cuda", generator=g)
    for half in (0, 1):
        kv = torch.randn(S, 2, D, device="cuda", generator=g)
        want = kv.clone()
        keep = slots >= 0
        want[:, half, :][slots[keep]] = x[keep]
        ops.scatter_rows(x, kv[:, half, :], slots)
        torch.cuda.synchronize()
        assert torch.equal(kv, want), half
    q = torch.randn(2, 7, 4, 16, device="cuda", generator=g).transpose(1, 2)
    cos, sin = torch.randn(7, 8, device="cuda", generator=g), torch.randn(7, 8, device="cuda", generator=g)
    q1, q2 = q[..., :8], q[..., 8:]
    torch.testing.assert_close(ops.rope(q, cos, sin), torch.cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin], dim=-1))
