"""AOT bundles on a machine without a GPU: build for sm_90, manifest, tampering, arch, and loading
in a process where ``import triton`` fails, up to the launch."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import warnings
from pathlib import Path

import pytest
import torch

import kernelgraft as kg
from kernelgraft.aot import manifest as _manifest
from kernelgraft.symbolic.expr import compile_exprs, to_text
from kernelgraft.backends.cutile import jit as _cutile
from kernelgraft.examples import add_relu, rmsnorm  # registered before the per-test registry snapshot

from _aot_helpers import cutedsl_bundled, run_child



@pytest.fixture(scope="module")
def bundle(example_bundle) -> Path:
    return example_bundle  # built once per run (conftest); read-only


# cuTile kernels are bundled where its toolchain (tileiras) works, skipped with the reason elsewhere
AOT = ("triton", "cuda") + (("cutile",) if _cutile.toolchain_reason() is None else ())


def _copy(bundle: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "b"
    shutil.copytree(bundle, dst)
    return dst


def _kernels(manifest):
    for op in manifest["ops"]:
        for cand in op["candidates"]:
            for k in cand["kernels"]:
                yield op, cand, k


def test_every_triton_and_cuda_candidate_is_bundled_as_elf_cubins(bundle):
    manifest = _manifest.read(bundle)
    assert manifest["archs"] == ["sm_90"]
    assert manifest["toolchain"]["triton"] and manifest["toolchain"]["torch"] == torch.__version__
    backends = AOT + (("cutedsl",) if cutedsl_bundled() else ())  # CuTe DSL: tests/integration/test_aot_cutedsl.py
    for op in (add_relu.add_relu, rmsnorm.rmsnorm):
        entry = next(e for e in manifest["ops"] if e["name"] == op.name)
        want = {f"{i.backend}:{i.display_name}[{c.label()}]" for i in op.impls if i.backend in backends
                for c in i.configs}
        assert {c["label"] for c in entry["candidates"]} == want
        assert entry["schema"] == op.signature.schema
    seen = 0
    for op, cand, k in _kernels(manifest):
        if cand["backend"] == "cutedsl":  # shared libraries, not cubins
            continue
        cubin = (bundle / k["images"]["cubin"]["file"]).read_bytes()
        assert cubin[:4] == b"\x7fELF" and int.from_bytes(cubin[18:20], "little") == 190  # EM_CUDA
        assert hashlib.sha256(cubin).hexdigest() == k["images"]["cubin"]["sha256"]
        assert k["arch"] == "sm_90" and k["kernel"] and len(k["grid"]) == 3 and len(k["block"]) == 3
        if cand["backend"] == "triton":
            ptx = (bundle / k["images"]["ptx"]["file"]).read_text()
            assert ".target sm_90" in ptx and f".entry {k['kernel']}(" in ptx
            assert k["block"][0] == 32 * cand["config"]["num_warps"]
            assert [p.get("role") for p in k["params"][-2:]] == ["global_scratch", "profile_scratch"]
        assert k["scalar_order"] == [p["expr"] for p in k["params"] if "expr" in p]
        if cand["backend"] == "cuda":  # traced on aligned fakes: misaligned pointers must fall back
            assert sorted(k["aligned"]) == sorted({p["source"] for p in k["params"] if "source" in p})
        seen += 1
    assert seen >= 20


def test_sizes_become_expressions(bundle):
    manifest = _manifest.read(bundle)
    op = next(e for e in manifest["ops"] if e["name"] == "kgexamples::add_relu")
    cand = next(c for c in op["candidates"] if c["config"] == {"BLOCK": 1024, "num_warps": 4})
    k = next(k for k in cand["kernels"] if k["ranks"] == {"x": 1, "y": 1} and k["dynamic"]
             and "(x.shape[0] >= 2)" in k["guards"])
    assert k["grid"][0] == "((1023 + x.shape[0]) // 1024)"
    assert [p.get("source", p.get("expr")) for p in k["params"][:4]] == ["x", "y", "out0", "x.shape[0]"]
    assert k["outputs"] == {"shapes": [["x.shape[0]"]], "dtypes": ["float32"]}


def test_manifest_round_trips(bundle, tmp_path):
    manifest = _manifest.read(bundle)
    assert json.loads((bundle / "manifest.json").read_text()) == manifest
    _manifest.write(tmp_path, manifest)
    assert _manifest.read(tmp_path) == manifest


def test_tampered_cubin_is_refused(bundle, tmp_path):
    b = _copy(bundle, tmp_path)
    _, _, k = next(_kernels(_manifest.read(b)))
    path = b / k["images"]["cubin"]["file"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(kg.BundleError, match="checksum mismatch for bin/"):
        kg.load_bundle(b, arch="sm_90", import_modules=False)


def test_tampered_manifest_is_refused(bundle, tmp_path):
    b = _copy(bundle, tmp_path)
    text = (b / "manifest.json").read_text().replace("// 1024)", "// 512)", 1)
    (b / "manifest.json").write_text(text)
    with pytest.raises(kg.BundleError, match="manifest.json checksum mismatch"):
        kg.load_bundle(b, arch="sm_90")


def test_code_in_an_expression_is_refused_even_with_a_valid_checksum(bundle, tmp_path):
    b = _copy(bundle, tmp_path)
    manifest = _manifest.read(b)
    _, _, k = next(_kernels(manifest))
    k["grid"][0] = "__import__('os').getpid()"
    _manifest.write(b, manifest)
    with pytest.raises(kg.BundleError, match="grammar does not allow"):
        kg.load_bundle(b, arch="sm_90", import_modules=False)


def test_other_arch_is_refused(bundle):
    with pytest.raises(kg.BundleError, match=r"built for sm_90, not for sm_100"):
        kg.load_bundle(bundle, arch="sm_100")


@pytest.mark.parametrize("text,args,want", [
    ("((1023 + x.shape[0]) // 1024)", (torch.empty(3000),), 3),
    ("(max(16, x.shape[0]) % 7)", (torch.empty(5),), 2),
    ("((x.shape[0] | 3) == 7) and not (x.shape[0] < 0)", (torch.empty(5),), True),
    ("(x.shape[0] ** 2) + (1 << 4)", (torch.empty(5),), 41),
    ("next_pow2(x.shape[0]) * 2", (torch.empty(1000),), 2048),
    ("next_pow2(x.shape[0] - 1000) + next_pow2(1)", (torch.empty(1000),), 1),
], ids=["cdiv", "max-mod", "bool", "small-pow-shift", "next-pow2", "next-pow2-of-0"])
def test_expression_grammar(text, args, want):
    assert compile_exprs(["x"], [text])(*args) == (want,)


@pytest.mark.parametrize("text", ["x.data_ptr()", "x.__class__", "open('f')", "[1][0]", "'s'", "y",
                                  "9 ** 9 ** 9", "1 << x.shape[0]", "2 ** 100", "next_pow2(x.shape[0], 2)",
                                  "next_pow2()", "next_pow2(n=x.shape[0])", "next_pow2", "min"],
                         ids=["method", "dunder", "call", "list", "str", "unknown-name",
                              "tower-of-powers", "shift-by-size", "huge-power", "next-pow2-two-args",
                              "next-pow2-no-args", "next-pow2-keyword", "bare-next-pow2", "bare-min"])
def test_expression_grammar_refuses(text):
    with pytest.raises(kg.BundleError):
        compile_exprs(["x"], [text])


@pytest.mark.parametrize("names,text", [
    (["lambda"], "1"), (["x", "x"], "1"), (["True"], "1"), ([1], "1"),
    (["x"], "-" * 100_000 + "1"), (["x"], "1" + "+1" * 99_000), (["x"], "1\x00"),
], ids=["keyword-name", "duplicate-name", "constant-name", "int-name", "deep-unary", "deep-binop", "nul"])
def test_malformed_expressions_and_names_raise_bundle_errors(names, text):
    with pytest.raises(kg.BundleError):
        compile_exprs(names, [text])


def test_overlong_expression_message_says_too_long():
    with pytest.raises(kg.BundleError, match="longer than"):
        compile_exprs(["x"], ["1" * 300_000])


@pytest.mark.parametrize("edit", ["keyword-param", "no-params", "guards-not-a-list", "index-inf", "n-returns-inf"])
def test_malformed_manifest_with_a_valid_checksum_raises_bundle_error(bundle, tmp_path, edit):
    b = _copy(bundle, tmp_path)
    manifest = _manifest.read(b)
    entry = manifest["ops"][0]
    if edit == "keyword-param":
        entry["params"][0]["name"] = "lambda"
    elif edit == "no-params":
        del entry["params"]
    elif edit == "index-inf":  # JSON's 1e400 read as inf: int(inf) raised OverflowError
        entry["candidates"][0]["index"] = 987654321987
    elif edit == "n-returns-inf":
        entry["n_returns"] = 987654321987
    else:
        entry["candidates"][0]["kernels"][0]["guards"] = 7
    _manifest.write(b, manifest)
    if edit.endswith("-inf"):  # a number JSON writers refuse to write, as a hand edit puts it
        path = b / "manifest.json"
        path.write_text(path.read_text().replace("987654321987", "1e400"))
    with pytest.raises(kg.BundleError):
        kg.load_bundle(b, arch="sm_90", import_modules=False)


def test_next_pow2_refuses_floats_and_results_past_the_bound():
    f = compile_exprs(["n"], ["next_pow2(n)"])
    assert f(2 ** 4000 + 1) == (2 ** 4001,)
    with pytest.raises(kg.BundleError, match="exceeds 4096 bits"):
        f(2 ** 4096 + 1)
    with pytest.raises(kg.BundleError, match="takes an int, got float"):
        f(2.5)


def _symbolic_size(value: int):
    """A fake 1-d tensor's size as a SymInt of a fresh ShapeEnv, as the tracer makes them."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    env = ShapeEnv(duck_shape=False, specialize_zero_one=False)
    mode = FakeTensorMode(shape_env=env)
    x = mode.from_tensor(torch.empty(value), symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC]))
    return env, x.shape[0]


def test_traced_next_power_of_2_is_one_named_symbol():
    import triton
    from triton import next_power_of_2 as alias

    from kernelgraft.symbolic.pow2 import traced_next_pow2

    env, n = _symbolic_size(100)
    symbols = {n.node.expr: "x.shape[0]"}
    with traced_next_pow2(env, symbols):
        p = triton.next_power_of_2(n)
        assert alias(n) is p and triton.next_power_of_2(n * 2) is not p  # one symbol per argument
        assert triton.next_power_of_2(100) == 128  # plain ints: Triton's own function
        assert to_text(p.node.expr, symbols) == "next_pow2(x.shape[0])"
        assert to_text((4 * p <= 8192).node.expr, symbols) == "((4 * next_pow2(x.shape[0])) <= 8192)"
        assert int(p) == 128
    assert "next_pow2" not in to_text(triton.next_power_of_2(n).node.expr, symbols)  # restored


def test_expanded_next_power_of_2_of_older_bundles_still_loads():
    """Bundles built before next_pow2 hold Triton's body traced on sympy: it still checks,
    compiles to RPN, and agrees with next_pow2 everywhere a size can be."""
    import triton

    from kernelgraft.aot.rpn import compile_rpn, evaluate

    _, n = _symbolic_size(100)
    fn = getattr(triton.next_power_of_2, "fn", triton.next_power_of_2)
    expanded = to_text(fn(n).node.expr, {n.node.expr: "x.shape[0]"})
    assert "|" in expanded and len(expanded) > 500
    f = compile_exprs(["x"], [expanded, "next_pow2(x.shape[0])"])
    old, new = compile_rpn(expanded, ["x"]), compile_rpn("next_pow2(x.shape[0])", ["x"])
    for size in [0, 1, 2, 3, 4, 5, 127, 128, 129, 1000, 65536, 65537, 2 ** 31 - 1, 2 ** 31, 2 ** 40 + 3]:
        x = torch.empty(size, device="meta")
        a, b = f(x)
        assert a == b == evaluate(old, [x]) == evaluate(new, [x]), size


def test_next_power_of_2_is_one_call_in_the_bundle(bundle):
    """The rmsnorm launch and supports() call triton.next_power_of_2: the bundle names it once per
    use, so its manifest stays small (it was 5 MB with Triton's expansion)."""
    assert (bundle / "manifest.json").stat().st_size < 600_000
    manifest = _manifest.read(bundle)
    texts = [g for op, _, k in _kernels(manifest) for g in (*k["guards"], *k["grid"])]
    assert "(next_pow2(x.shape[1]) <= 1024)" in texts
    assert max(map(len, texts)) < 300 and not any("| (" in t for t in texts)


def test_loading_the_bundle_compiles_few_small_expressions(bundle):
    from kernelgraft.symbolic import expr as _expr

    _expr._one.cache_clear()
    loaded = kg.load_bundle(bundle, arch="sm_90")
    try:
        info = _expr._one.cache_info()
        # ~220 distinct expressions for ~140 kernels: shared guards, grids and shapes compile once
        assert 0 < info.misses < 400 and info.hits > info.misses
    finally:
        loaded.detach()


def test_sympy_printing_of_floor_and_ceil():
    import sympy
    from torch.utils._sympy.functions import CeilDiv, FloorDiv

    s = sympy.Symbol("s0", integer=True, positive=True)
    names = {s: "x.shape[0]"}
    f = compile_exprs(["x"], [to_text(FloorDiv(s + 1023, 1024), names), to_text(CeilDiv(s, 256), names)])
    assert f(torch.empty(1025)) == (2, 5)


def _child(bundle, mode, tmp_path):
    return run_child(bundle, mode, tmp_path / f"{mode}.json", timeout=300)


def test_loads_without_triton_up_to_the_launch(bundle, tmp_path):
    report = _child(bundle, "record", tmp_path)
    assert report["triton_imported"] is False
    assert sorted(report["rebuilt"]) == ["kgexamples::add_relu", "kgexamples::rmsnorm"]
    runs = report["runs"]
    labels = {r["label"] for r in runs}
    manifest = _manifest.read(bundle)
    assert labels == {c["label"] for op in manifest["ops"] for c in op["candidates"]}  # each ran once+
    for r in runs:
        assert r["error"] is None, r
        call, shape = r["call"], r["shape"]
        n_ptrs = len(r["ptrs"])
        if r["label"].startswith("cutile"):  # each array: pointer, sizes, strides (of the flat/2-d views)
            assert [v for v, k in zip(call["values"], call["kinds"]) if k == "ptr"] == r["ptrs"]
            assert call["block"] == [1, 1, 1]
            p = r["ptrs"]
            if r["op"] == "kgexamples::add_relu":
                n, tile = math.prod(shape), int(r["label"].split("TILE=")[1].split("]")[0])
                assert call["values"] == [p[0], n, 1, p[1], n, 1, p[2], n, 1]
                assert call["grid"] == [(n + tile - 1) // tile, 1, 1]
            else:
                rows, cols = math.prod(shape[:-1]), shape[-1]
                assert call["values"][:-1] == [p[0], rows, cols, cols, 1, p[1], cols, 1, p[2], rows, cols, cols, 1]
                assert call["values"][-1] == pytest.approx(1e-6) and call["grid"] == [rows, 1, 1]
            continue
        if r["label"].startswith("cutedsl"):  # the host function's runtime arguments, in order
            p = r["ptrs"]
            assert call["kinds"][:3] == ["ptr"] * 3 and call["values"][:3] == p and call["grid"] == [1, 1, 1]
            if r["op"] == "kgexamples::add_relu":
                assert call["values"][3:] == [math.prod(shape)] and call["kinds"][3:] == ["i32"]
            else:
                assert call["values"][3:5] == [math.prod(shape[:-1]), shape[-1]]
                assert call["values"][5] == pytest.approx(1e-6) and call["kinds"][3:] == ["i32", "i32", "f32"]
            continue
        assert call["values"][:n_ptrs] == r["ptrs"]
        if r["op"] == "kgexamples::add_relu":
            n = 1
            for s in shape:
                n *= s
            if r["label"].startswith("triton"):
                block = int(r["label"].split("BLOCK=")[1].split(",")[0])
                assert call["kernel"] == "_add_relu_kernel"
                assert call["values"][n_ptrs:] == [n, 0, 0] and call["kinds"] == ["ptr"] * 3 + ["i32", "ptr", "ptr"]
            else:
                cfg = r["label"].split("[")[1]
                block = int(cfg.split("BLOCK=")[1].split(",")[0]) * int(cfg.split("ITEMS=")[1].split("]")[0])
                assert call["kernel"].startswith("_Z8add_relu") and call["values"][n_ptrs:] == [n]
            assert call["grid"] == [(n + block - 1) // block, 1, 1]
        elif r["label"].startswith("triton:rmsnorm_rows"):  # blocks of rows: (n_rows, n_cols, eps)
            rows, cols = math.prod(shape[:-1]), shape[-1]
            per = int(r["label"].split("rows_per_program=")[1].split("]")[0].split(",")[0])
            assert call["grid"] == [(rows + per - 1) // per, 1, 1]
            assert call["values"][n_ptrs:n_ptrs + 2] == [rows, cols]
            assert call["values"][n_ptrs + 2] == pytest.approx(1e-6)
        else:
            rows, cols = shape[0], shape[-1]
            assert call["grid"] == [rows, 1, 1]
            assert call["values"][n_ptrs] == cols and call["values"][n_ptrs + 1] == pytest.approx(1e-6)


def test_without_a_gpu_the_launch_reaches_the_driver(bundle, tmp_path):
    report = _child(bundle, "driver", tmp_path)
    errors = [r["error"] for r in report["runs"]]
    assert errors and all(e and e.startswith("LaunchError") for e in errors), errors
    assert any("driver" in e or "cuda-bindings" in e for e in errors)


def test_attaches_to_ops_in_this_process(bundle):
    from kernelgraft.aot.runner import BundledRunner
    op = add_relu.add_relu
    loaded = kg.load_bundle(bundle, arch="sm_90")
    try:
        want = sum(len(i.configs) for i in op.impls if i.backend in AOT)
        assert loaded.rebuilt == [] and len(loaded.attached["kgexamples::add_relu"]) == want
        cand = next(c for c in op.candidates(torch.randn(8), torch.randn(8)) if c.impl.backend == "triton")
        assert isinstance(op.dispatcher.runner(cand), BundledRunner)
        x, y = torch.randn(300), torch.randn(300)  # CPU tensors still run (Triton's interpreter)
        torch.testing.assert_close(op.run(x, y, impl=0), torch.relu(x + y))
    finally:
        loaded.detach()
    assert not op.dispatcher.bundled_keys()


def test_runner_of_a_candidate_left_out_says_why(bundle, tmp_path):
    """A candidate built from other code is left out when the bundle loads; asking the bundle for
    its runner is a BundleError naming the op, the candidate and what is served, not a crash."""
    b = _copy(bundle, tmp_path)
    manifest = _manifest.read(b)
    entry = next(e for e in manifest["ops"] if e["name"] == "kgexamples::add_relu")
    cand = next(c for c in entry["candidates"] if c["backend"] == "triton")
    cand["impl_fingerprint"] = "0" * len(cand["impl_fingerprint"])  # as if its kernel was edited since
    _manifest.write(b, manifest)
    with pytest.warns(kg.KernelgraftWarning, match="built from different code"):
        loaded = kg.load_bundle(b, arch="sm_90")
    try:
        assert cand["label"] not in loaded.attached["kgexamples::add_relu"]
        with pytest.raises(kg.BundleError, match=r"kgexamples::add_relu: candidate \d+ with config .* is not served"):
            loaded.runner("kgexamples::add_relu", cand["index"], cand["config"])
        with pytest.raises(kg.BundleError, match="no op 'kgexamples::nope'"):
            loaded.runner("kgexamples::nope", cand["index"], cand["config"])
        other = next(c for c in entry["candidates"] if c["backend"] == "triton" and c is not cand
                     and c["impl_fingerprint"] != cand["impl_fingerprint"])
        assert loaded.runner("kgexamples::add_relu", other["index"], other["config"]) is not None
    finally:
        loaded.detach()


def test_candidates_attach_by_fingerprint_where_impl_indexes_differ(bundle, tmp_path):
    """A bundle built where the op had other impls before these (a backend that did not import on
    the building machine, cuTile say) numbers them differently: each bundled candidate attaches to
    the impl here with its fingerprint, and ``runner`` takes the manifest's index."""
    from kernelgraft.aot.runner import BundledRunner

    op = add_relu.add_relu
    name = "kgexamples::add_relu"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kg.KernelgraftWarning)  # CuTe DSL left out: native code
        plain = kg.load_bundle(bundle, arch="sm_90")
    want = sorted(plain.attached[name])
    plain.detach()
    b = _copy(bundle, tmp_path)
    manifest = _manifest.read(b)
    entry = next(e for e in manifest["ops"] if e["name"] == name)
    for cand in entry["candidates"]:
        cand["index"] += 1  # as numbered where one more impl came first
    _manifest.write(b, manifest)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kg.KernelgraftWarning)  # "built from different code" would raise
        warnings.filterwarnings("ignore", "bundle .* CuTe DSL candidates are native code", kg.KernelgraftWarning)
        loaded = kg.load_bundle(b, arch="sm_90")
    try:
        assert sorted(loaded.attached[name]) == want
        assert loaded.moved[name] == {c["index"]: c["index"] - 1 for c in entry["candidates"]
                                      if c["label"] in want}
        cand = next(c for c in entry["candidates"] if c["backend"] == "triton")
        runner = loaded.runner(name, cand["index"], cand["config"])
        assert isinstance(runner, BundledRunner)
        here = cand["index"] - 1
        assert op.dispatcher.bundled_runner(here, op.impls[here].config(cand["config"])) is runner
        x, y = torch.randn(300), torch.randn(300)  # CPU tensors still run (Triton's interpreter)
        torch.testing.assert_close(op.run(x, y, impl=here), torch.relu(x + y))
    finally:
        loaded.detach()
    assert not op.dispatcher.bundled_keys()
