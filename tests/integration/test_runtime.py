"""The C++ runtime on a machine without a GPU: it builds, loads through torch.ops.load_library,
verifies and parses a real bundle, evaluates programs as Python does, chooses kernels by guards and
decision rows, gives Meta output shapes, refuses tampered bundles, and works in a process where
neither kernelgraft nor triton imports. The launch itself needs a GPU (tests/gpu/test_gpu_runtime.py).

A bundle's ops are registered in this process under a test namespace (the manifest renamed and its
checksum rewritten), so the Python examples' ops of the same names stay as they are."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from kernelgraft.aot import manifest as _manifest
from kernelgraft.symbolic.expr import compile_exprs
from kernelgraft.aot.sign import sign_bundle
from kernelgraft.examples import add_relu, rmsnorm  # registered before the per-test registry snapshot

from _runtime_helpers import WITHOUT_KERNELGRAFT, json_child, so, variant  # noqa: F401 (so: a fixture)

PYTHON_OPS = {"add_relu": add_relu.add_relu, "rmsnorm": rmsnorm.rmsnorm}


@pytest.fixture(scope="module")
def bundle(example_bundle) -> Path:
    return example_bundle  # built once per run (conftest); read-only


def _load(path: Path, key=None, arch="sm_90", allow_native=True) -> list[str]:
    # allow_native: CuTe DSL libraries are read and checked now, opened only at a launch (GPU)
    return list(torch.ops.kernelgraft.load_bundle(str(path), None if key is None else str(key), arch, allow_native))


@pytest.fixture(scope="module")
def served(so, bundle, tmp_path_factory) -> dict:
    """The bundle served by the C++ runtime under namespace kgrt_test."""
    path = variant(bundle, tmp_path_factory.mktemp("served") / "b", "kgrt_test")
    assert _load(path) == ["kgrt_test::add_relu", "kgrt_test::rmsnorm"]
    return _manifest.read(path)


def _cpp_value(program, args) -> str:
    return torch.ops.kernelgraft._runtime_eval(json.dumps(program), json.dumps(args))


def _py_value(text: str, names, args) -> str:
    values = [torch.empty(a["shape"], device="meta") if isinstance(a, dict) else a for a in args]
    try:
        v = compile_exprs(names, [text])(*values)[0]
    except Exception:  # BundleError: the program must be an error too
        return "error"
    if isinstance(v, bool):
        v = int(v)
    return repr(v) if isinstance(v, float) else str(v)


def _same(cpp: str, py: str) -> bool:
    return cpp.startswith("error") if py == "error" else cpp == py


@pytest.mark.parametrize("text", [
    "((1023 + x.shape[0]) // 1024)", "(-((-x.shape[0]) // 256))", "max(16, x.shape[0], 3) % 7",
    "min(x.shape[0], 2.5)", "(x.shape[0] | 3) == 7 and not (x.shape[0] < 0)", "x.shape[0] ** 2 + (1 << 4)",
    "(x.shape[0] - 9) // 4", "(x.shape[0] - 9) % 4", "x.shape[0] / 3", "n // (x.shape[0] - 5)",
    "(x.shape[0] == 5) or (n // (x.shape[0] - 5))", "(x.shape[0] != 5) and (n // (x.shape[0] - 5))",
    "eps * 2", "-eps", "(eps - 1) // 0.25", "eps % -0.75", "(x.shape[0] >> 1) & n", "True", "n == 3",
    "eps == 1e-06", "x.shape[0] * 9223372036854775807", "(n - 3) ** 3", "x.shape[0] ** 20",
    "next_pow2(x.shape[0]) * n", "next_pow2(n - x.shape[0])", "next_pow2(eps)", "next_pow2(n == 3)",
], ids=lambda t: t[:30])
def test_programs_equal_python_on_random_inputs(so, text):
    from kernelgraft.aot.rpn import compile_rpn

    names = ["x", "n", "eps"]
    program = compile_rpn(text, names)
    rng = random.Random(text)
    for _ in range(60):
        args = [{"shape": [rng.randrange(0, 40)]}, rng.randrange(-8, 8), rng.choice([1e-6, 0.5, -2.0, 3.75])]
        cpp, py = _cpp_value(program, args), _py_value(text, names, args)
        assert _same(cpp, py), (text, args, cpp, py)


def test_integers_past_128_bits_are_errors_in_cpp(so):
    """Python's ints are unbounded (up to _expr's cap); the runtime's are 128-bit and checked."""
    from kernelgraft.aot.rpn import compile_rpn

    program = compile_rpn("x.shape[0] ** 40", ["x"])
    assert _cpp_value(program, [{"shape": [18]}]) == "error: an integer overflow"
    assert _cpp_value(program, [{"shape": [8]}]) == str(8 ** 40)


@pytest.mark.parametrize("value", [-5, 0, 1, 2, 3, 1000, 1024, 1025, 2 ** 31 - 1, 2 ** 31, 2 ** 31 + 1,
                                   2 ** 62 + 1, 2 ** 63 - 1, 2 ** 64, 2 ** 126, 2 ** 126 + 1, 2 ** 127 - 1], ids=str)
def test_next_pow2_equals_the_python_rpn_evaluator(so, value):
    """Edge values, and past 2**126 an overflow error (the result does not fit 128 bits), never a
    wrapped value; a literal carries values past int64 that an input cannot."""
    from kernelgraft.aot.rpn import EvalError, compile_rpn, evaluate

    for text, args in [(f"next_pow2({value})", [7])] + ([("next_pow2(n)", [value])] if value < 2 ** 63 else []):
        program = compile_rpn(text, ["n"])
        try:
            want = str(evaluate(program, args))
        except EvalError:
            want = "error: an integer overflow"
        assert _cpp_value(program, args) == want, text


def test_next_pow2_takes_one_operand_in_cpp(so):
    with pytest.raises(RuntimeError, match="next_pow2 takes 1 operand"):
        _cpp_value([["int", "3"], ["int", "4"], ["call", "next_pow2", 2]], [])
    assert _cpp_value([["float", 2.5], ["call", "next_pow2", 1]], []) == "error: next_pow2 of a float"


def _random_args(op: dict, k: dict, rng: random.Random) -> list:
    args = []
    for p in op["params"]:
        if p["kind"] == "tensor":
            sizes = [1, 2, 3, 7, 16, 64, 100, 1024, 4096, 5000, rng.randrange(1, 70000)]
            args.append({"shape": [rng.choice(sizes) for _ in range(k["ranks"][p["name"]])],
                         "dtype": k["dtypes"][p["name"]]})
        elif p["kind"] == "float":
            args.append(rng.choice([1e-6, 1e-5, 0.5]))
        else:
            args.append(rng.randrange(-4, 4096))
    return args


def test_every_program_of_a_real_bundle_equals_python(served):
    rng = random.Random(1)
    checked = 0
    for op in served["ops"]:
        names = [p["name"] for p in op["params"]]
        for cand in op["candidates"]:
            for k in cand["kernels"]:
                prog = k["program"]
                pairs = list(zip(k["guards"], prog["guards"])) + [(k["shared_mem"], prog["shared_mem"])]
                pairs += list(zip(k["grid"], prog["grid"]))
                pairs += [(p["expr"], r) for p, r in zip(k["params"], prog["params"]) if r is not None]
                pairs += list(zip(k["outputs"]["shapes"][0], prog["outputs"][0]))
                for _ in range(3):
                    args = _random_args(op, k, rng)
                    for text, program in pairs:
                        cpp, py = _cpp_value(program, args), _py_value(str(text), names, args)
                        assert _same(cpp, py), (op["name"], str(text)[:160], args, cpp, py)
                        checked += 1
    assert checked > 1000


def _python_plan(op: dict, args: list, order=None) -> dict | None:
    """What the Python runner would launch: the first kernel (candidates in ``order``) whose dtypes,
    ranks and guards hold, with its grid, scalars and output shapes from the expression texts."""
    names = [p["name"] for p in op["params"]]
    values = [torch.empty(a["shape"], device="meta") if isinstance(a, dict) else a for a in args]
    for c in order if order is not None else range(len(op["candidates"])):
        cand = op["candidates"][c]
        for k in cand["kernels"]:
            if any(args[names.index(n)].get("dtype") != d for n, d in k["dtypes"].items()):
                continue
            if any(len(args[names.index(n)]["shape"]) != r for n, r in k["ranks"].items()):
                continue
            try:  # the Python runner's rule: every guard text on its own holds
                if not all(compile_exprs(names, k["guards"] or ["True"])(*values)):
                    continue
            except Exception:
                continue
            exprs = [*k["grid"], str(k["shared_mem"])] + [p["expr"] for p in k["params"] if "expr" in p]
            got = compile_exprs(names, exprs + k["outputs"]["shapes"][0])(*values)
            scalars = iter(got[4:len(exprs)])
            return {"candidate": cand["label"], "kernel": k["kernel"], "grid": list(got[:3]), "shared_mem": got[3],
                    "params": [None if "expr" not in p else _fmt(next(scalars)) for p in k["params"]],
                    "outputs": [list(got[len(exprs):])]}
    return None


def _fmt(v) -> str:
    return repr(v) if isinstance(v, float) else str(int(v))


def _cpp_plan(name: str, args: list) -> dict:
    return json.loads(torch.ops.kernelgraft._runtime_plan(name, json.dumps(args)))


SHAPES = {
    "add_relu": [[3000], [128, 1024], [7], [33, 97], [4096], [2, 3, 5], [65536]],
    "rmsnorm": [[5, 64], [3, 1000], [17, 4096], [9, 768], [2, 3, 128], [4, 8192]],
}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_kernel_choice_and_launch_plan_equal_python(served, dtype):
    for op in served["ops"]:
        short = op["name"].split("::")[1]
        for shape in SHAPES[short]:
            if short == "add_relu":
                args = [{"shape": shape, "dtype": dtype}, {"shape": shape, "dtype": dtype}]
            else:
                args = [{"shape": shape, "dtype": dtype}, {"shape": shape[-1:], "dtype": dtype}, 1e-6]
            want = _python_plan(op, args)
            if want is None:
                with pytest.raises(RuntimeError, match="no bundled kernel serves these inputs"):
                    _cpp_plan(op["name"], args)
            else:
                assert _cpp_plan(op["name"], args) == want, (op["name"], shape, dtype)


def test_no_kernel_error_names_op_arguments_and_what_the_bundle_holds(served):
    args = [{"shape": [33, 97], "dtype": "float32", "contiguous": False}] * 2
    with pytest.raises(RuntimeError) as info:
        _cpp_plan("kgrt_test::add_relu", args)
    text = str(info.value)
    assert "kgrt_test::add_relu: no bundled kernel serves these inputs" in text
    assert "x: float32[33, 97] (not contiguous)" in text and "serve contiguous inputs of" in text
    with pytest.raises(RuntimeError, match="int32"):
        _cpp_plan("kgrt_test::add_relu", [{"shape": [8], "dtype": "int32"}] * 2)


# A guard whose top level is an `or`, beside another guard: each compiles to its own program, so the
# kernel's guard is (a or b) and c, as the Python runner takes the texts one by one. One program of
# the texts joined with " and " read a or (b and c), and served sizes 1 and 3 that Python refuses.
OR_GUARDS = ["x.shape[0] < 4 or x.shape[0] > 8", "x.shape[0] % 2 == 0"]


def _with_or_guards(op: dict) -> None:
    from kernelgraft.aot.rpn import compile_rpn

    if op["name"].endswith("::add_relu"):
        names = [p["name"] for p in op["params"]]
        for cand in op["candidates"]:
            for k in cand["kernels"]:
                k["guards"] = k["guards"] + OR_GUARDS
                k["program"]["guards"] = k["program"]["guards"] + [compile_rpn(g, names) for g in OR_GUARDS]


def _meta_shape(call, n: int):
    x = torch.empty(n, device="meta")
    try:
        return list(call(x, x).shape)
    except Exception:  # no output rule holds (C++: RuntimeError; Python: kernelgraft's error)
        return None


@pytest.mark.filterwarnings("ignore:.*CuTe DSL candidates are native code")
def test_a_guard_with_a_top_level_or_holds_where_python_says(so, bundle, tmp_path):
    import kernelgraft as kg

    _load(variant(bundle, tmp_path / "cpp", "kgrt_or", edit_op=_with_or_guards))
    path = variant(bundle, tmp_path / "py", "kgpy_or", edit_op=_with_or_guards)
    op = next(o for o in _manifest.read(path)["ops"] if o["name"].endswith("::add_relu"))
    loaded = kg.load_bundle(path, arch="sm_90")
    try:
        served = []
        for n in range(1, 20):
            holds = (n < 4 or n > 8) and n % 2 == 0
            args = [{"shape": [n], "dtype": "float32"}] * 2
            want = _python_plan(op, args)
            assert want is None or holds, n
            if want is None:
                with pytest.raises(RuntimeError, match="no bundled kernel serves these inputs"):
                    _cpp_plan("kgrt_or::add_relu", args)
            else:
                assert _cpp_plan("kgrt_or::add_relu", args) == want, n
                served.append(n)
            # the Meta kernels' rules too: the C++ runtime's and the Python loader's give the same
            cpp, py = _meta_shape(torch.ops.kgrt_or.add_relu, n), _meta_shape(torch.ops.kgpy_or.add_relu, n)
            assert cpp == py == ([n] if holds else None), (n, cpp, py)
        assert served and {1, 3}.isdisjoint(served)
    finally:
        loaded.detach()


def test_decision_rows_choose_the_tuned_candidate(so, bundle, tmp_path):
    manifest = _manifest.read(bundle)
    op = next(o for o in manifest["ops"] if o["name"].endswith("add_relu"))
    last = len(op["candidates"]) - 1

    def edit(m):
        entry = next(o for o in m["ops"] if o["name"].endswith("add_relu"))
        entry["decisions"] = [{"arch": "sm_90", "ints": {}, "values": {}, "ranking": [last], "source": "test",
                               "tensors": {"x": {"dtype": "float32", "dims": [[2049, 4096]]},
                                           "y": {"dtype": "float32", "dims": [[2049, 4096]]}}}]

    path = variant(bundle, tmp_path / "b", "kgrt_decide", edit)
    _load(path)
    inside = [{"shape": [3000], "dtype": "float32"}] * 2
    outside = [{"shape": [5000], "dtype": "float32"}] * 2
    assert _cpp_plan("kgrt_decide::add_relu", inside) == _python_plan(op, inside, [last])
    assert _cpp_plan("kgrt_decide::add_relu", inside)["candidate"] == op["candidates"][last]["label"]
    assert _cpp_plan("kgrt_decide::add_relu", outside) == _python_plan(op, outside)


def _python_meta(short: str, args: list):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        out = PYTHON_OPS[short](*fakes)
    return list(out.shape), out.dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_meta_kernels_give_the_python_ops_shapes(served, dtype):
    served_shapes = []
    for short, shapes in SHAPES.items():
        op = getattr(torch.ops.kgrt_test, short)
        for shape in shapes:
            x = torch.randn(shape).to(dtype)
            args = [x, torch.randn(shape).to(dtype)] if short == "add_relu" else [x, torch.randn(shape[-1:]).to(dtype), 1e-6]
            metas = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
            described = [{"shape": list(a.shape), "dtype": str(a.dtype)[6:]} if isinstance(a, torch.Tensor) else a
                         for a in args]
            try:
                meta = op(*metas)
            except RuntimeError as exc:  # a signature the bundle does not hold: no kernel either
                assert "no output rule of the bundle holds" in str(exc)
                with pytest.raises(RuntimeError, match="no bundled kernel serves these inputs"):
                    _cpp_plan(f"kgrt_test::{short}", described)
                continue
            assert (list(meta.shape), meta.dtype) == _python_meta(short, args) and meta.device.type == "meta"
            served_shapes.append((short, tuple(shape)))
    assert len(served_shapes) >= 6


def test_fake_tensor_mode_uses_the_meta_kernel(served):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(9, 768, dtype=torch.float16))
        w = mode.from_tensor(torch.randn(768, dtype=torch.float16))
        out = torch.ops.kgrt_test.rmsnorm(x, w, 1e-6)
    assert list(out.shape) == [9, 768] and out.dtype == torch.float16


def test_torch_export_traces_the_op_through_its_meta_kernel(served):
    class Norm(torch.nn.Module):
        def forward(self, x, w):
            return torch.ops.kgrt_test.rmsnorm(x, w, 1e-6)

    ep = torch.export.export(Norm(), (torch.randn(9, 768), torch.randn(768)))
    (node,) = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert node.target is torch.ops.kgrt_test.rmsnorm.default
    assert list(node.meta["val"].shape) == [9, 768]


def test_cpu_tensors_are_refused_naming_the_argument(served):
    x = torch.randn(8)
    with pytest.raises(RuntimeError, match=r"kgrt_test::add_relu: argument x must be a CUDA tensor, got a tensor on cpu"):
        torch.ops.kgrt_test.add_relu(x, x)


def _unreadable(x: torch.Tensor) -> dict:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested and quantized tensors warn that they are prototypes
        kinds = {"a sparse COO tensor": x.to_sparse(), "a sparse CSR tensor": x.to_sparse_csr(),
                 "a nested tensor": torch.nested.nested_tensor(list(x)),
                 "a quantized tensor": torch.quantize_per_tensor(x, 0.05, 10, torch.quint8)}
    if torch.backends.mkldnn.is_available():
        kinds["an mkldnn tensor"] = x.to_mkldnn()
    return kinds


def test_tensors_no_kernel_may_read_are_refused_naming_the_argument(served):
    """The admission rule of kernelgraft/admit.py, in C++: sparse, mkldnn, nested and quantized
    tensors never reach a kernel (the dispatcher's own error would list its backends instead)."""
    x = torch.randn(4, 8)
    for kind, t in _unreadable(x).items():
        with pytest.raises(RuntimeError, match=rf"kgrt_test::add_relu: argument y expected a dense strided tensor, "
                                               rf"got {kind} .*: pass "):
            torch.ops.kgrt_test.add_relu(x, t)


def test_a_mutated_view_with_deferred_values_is_refused(so, bundle, tmp_path):
    """A view with the negative bit that the op would write is refused (resolving it would write a
    copy); one it only reads is resolved and goes on to the op's kernel (here on CPU: its refusal
    of CPU tensors)."""
    def mutate_x(op):
        if op["name"].endswith("::add_relu"):
            op["schema"] = op["schema"].replace("(Tensor x,", "(Tensor(a0!) x,")  # the alias names its position
            op["params"][0]["mutated"] = True
            op["mutates_args"] = ["x"]

    _load(variant(bundle, tmp_path / "m", "kgrt_mut", edit_op=mutate_x))
    x, y = torch.randn(8), torch.randn(8)
    z = torch.randn(8, dtype=torch.complex64)
    for view in (torch._neg_view(x), z.conj().imag):
        with pytest.raises(RuntimeError, match=r"kgrt_mut::add_relu: argument x is mutated by the op but is a view "
                                               r"with the negative bit"):
            torch.ops.kgrt_mut.add_relu(view, y)
    with pytest.raises(RuntimeError, match=r"kgrt_mut::add_relu: argument x must be a CUDA tensor"):
        torch.ops.kgrt_mut.add_relu(x, torch._neg_view(y))


def test_meta_error_for_a_dtype_the_bundle_lacks(served):
    x = torch.empty(8, dtype=torch.int32, device="meta")
    with pytest.raises(RuntimeError, match=r"kgrt_test::add_relu: no output rule .*\(x: int32\[8\], y: int32\[8\]\)"):
        torch.ops.kgrt_test.add_relu(x, x)


def test_loading_again_is_a_no_op_and_a_python_op_is_left_alone(served, bundle, tmp_path, capfd):
    path = variant(bundle, tmp_path / "again", "kgrt_test")
    assert _load(path) == ["kgrt_test::add_relu", "kgrt_test::rmsnorm"]
    assert _load(bundle) == ["kgexamples::add_relu", "kgexamples::rmsnorm"]
    assert "op kgexamples::add_relu is already registered in this process" in capfd.readouterr().err
    for name in ("kgexamples::add_relu", "kgexamples::rmsnorm"):  # still kernelgraft's Python registration
        assert "runtime/csrc/ops.cpp" not in torch._C._dispatch_dump(name)


def test_an_op_of_the_same_name_from_other_code_is_refused(served, bundle, tmp_path):
    def edit(m):
        m["ops"][0]["fingerprint"] = "0" * 64

    path = variant(bundle, tmp_path / "other", "kgrt_test", edit)
    with pytest.raises(RuntimeError, match="built from different code \\(fingerprints differ\\)"):
        _load(path)


def _flip_cubin(m, root: Path):
    k = m["ops"][0]["candidates"][0]["kernels"][0]
    path = root / k["images"]["cubin"]["file"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("case,match", [
    ("cubin", "checksum mismatch for bin/"),
    ("manifest", "manifest.json checksum mismatch"),
    ("version1", "manifest version 1; the C\\+\\+ runtime reads version 4"),
    ("version3", "manifest version 3; the C\\+\\+ runtime reads version 4 \\(2 and 3 held one program for all"),
    ("arch", "was built for sm_90, not for sm_100"),
    ("program", "is not one of int/float/size/arg/op/unary/bool/call"),
    ("stack", "leaves 2 values on the stack"),
    ("input", "input 7 is out of range"),
    ("symlink", "symlink"),
    ("outside", "outside the bundle's bin/"),
], ids=lambda v: v if isinstance(v, str) and " " not in v else "")
def test_tampered_bundles_are_refused(so, bundle, tmp_path, case, match):
    ns = f"kgrt_bad_{case}"
    edits = {
        "version1": lambda m: m.update(version=1),
        "version3": lambda m: m.update(version=3),  # the Python loader reads it by its texts
        "program": lambda m: m["ops"][0]["candidates"][0]["kernels"][0]["program"]["grid"][0].append(["exec", 1]),
        "stack": lambda m: m["ops"][0]["candidates"][0]["kernels"][0]["program"]["grid"][0].append(["int", "1"]),
        "input": lambda m: m["ops"][0]["candidates"][0]["kernels"][0]["program"]["grid"].__setitem__(0, [["size", 7, 0]]),
        "outside": lambda m: m["ops"][0]["candidates"][0]["kernels"][0]["images"]["cubin"].update(file="../x.cubin"),
    }
    path = variant(bundle, tmp_path / "b", ns, edits.get(case))
    arch = "sm_90"
    if case == "cubin":
        _flip_cubin(_manifest.read(path), path)
    elif case == "manifest":
        text = (path / "manifest.json").read_text().replace("// 1024)", "// 512)", 1)
        (path / "manifest.json").write_text(text)
    elif case == "arch":
        arch = "sm_100"
    elif case == "symlink":
        k = _manifest.read(path)["ops"][0]["candidates"][0]["kernels"][0]
        target = path / k["images"]["cubin"]["file"]
        moved = tmp_path / "elsewhere.cubin"
        target.rename(moved)
        target.symlink_to(moved)
    with pytest.raises(RuntimeError, match=match):
        _load(path, arch=arch)
    with pytest.raises(RuntimeError, match="does not exist"):  # nothing of a refused bundle is registered
        torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::add_relu", "Meta")


def test_signed_bundles(so, bundle, tmp_path):
    key = tmp_path / "bundle.key"
    key.write_text("0123456789abcdef0123456789abcdef\n")
    other = tmp_path / "other.key"
    other.write_text("fedcba9876543210fedcba9876543210")
    path = variant(bundle, tmp_path / "signed", "kgrt_signed")
    with pytest.raises(RuntimeError, match="is not signed"):
        _load(path, key=key)
    sign_bundle(path, key)
    with pytest.raises(RuntimeError, match="does not verify with this key"):
        _load(path, key=other)
    (path / "bin" / "extra.cubin").write_bytes(b"x")
    with pytest.raises(RuntimeError, match="modified after signing: added bin/extra.cubin"):
        _load(path, key=key)
    (path / "bin" / "extra.cubin").unlink()
    assert _load(path, key=key) == ["kgrt_signed::add_relu", "kgrt_signed::rmsnorm"]


def test_checksum_covers_unicode_strings_and_floats_as_python_writes_them(so, bundle, tmp_path):
    def edit(m):
        m["ops"][0]["doc"] = 'naïve — "q" \\ \x01 \x7f tab\t 😀'
        m["extra"] = [1e-06, 1e16, 1e15, 123456789.125, 0.0001, -0.0, 1e22, 2.5e-300, 0.1, 1.0, -7, 2**62]
        m["ünïcode-kéy"] = {"b": 1, "a": [True, False, None]}

    path = variant(bundle, tmp_path / "b", "kgrt_canon", edit)
    assert _load(path) == ["kgrt_canon::add_relu", "kgrt_canon::rmsnorm"]


CHILD = WITHOUT_KERNELGRAFT + r"""
torch.ops.load_library(sys.argv[1])
names = list(torch.ops.kernelgraft.load_bundle(sys.argv[2], None, "sm_90"))
x = torch.empty(9, 768, dtype=torch.float16, device="meta")
out = torch.ops.kgexamples.rmsnorm(x, torch.empty(768, dtype=torch.float16, device="meta"), 1e-6)
print(json.dumps({"names": names, "shape": list(out.shape), "dtype": str(out.dtype),
                  "modules": loaded_blocked()}))
"""


def test_works_where_kernelgraft_and_triton_do_not_import(so, bundle, tmp_path):
    report, _ = json_child(tmp_path, CHILD, so, bundle)
    assert report == {"names": ["kgexamples::add_relu", "kgexamples::rmsnorm"], "shape": [9, 768],
                      "dtype": "torch.float16", "modules": []}


ENV_CHILD = r"""
import json, sys, torch
torch.ops.load_library(sys.argv[1])
x = torch.empty(33, 97, dtype=torch.float16, device="meta")
print(json.dumps(list(torch.ops.kgexamples.add_relu(x, x).shape)))
"""


def test_bundles_named_in_the_environment_load_with_the_library(so, bundle, tmp_path):
    missing = tmp_path / "missing"
    shape, proc = json_child(tmp_path, ENV_CHILD, so, extra_env={"KERNELGRAFT_BUNDLES": f"{missing}:{bundle}",
                                                                  "KERNELGRAFT_BUNDLE_ARCH": "sm_90"})
    assert shape == [33, 97]
    assert f"KERNELGRAFT_BUNDLES: bundle {missing} not loaded" in proc.stderr


CACHE_CHILD = r"""
import json, re, sys, torch
torch.ops.load_library(sys.argv[1])
torch.ops.kernelgraft.load_bundle(sys.argv[2], None, "sm_90")
DT = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float64: "float64"}

def attempt(name, *args):  # the CUDA kernel's planning on CPU tensors (the test hook), as a dict
    try:
        getattr(torch.ops.kgexamples, name)(*args)
    except RuntimeError as exc:
        text = str(exc).splitlines()[0]
    m = re.search(r"planned (\S+) kernel (\S+) grid \[(\d+), (\d+), (\d+)\] \((\w+), (\d+) cached\)", text)
    if m is None:
        return {"error": text}
    return {"candidate": m[1], "kernel": m[2], "grid": [int(m[3]), int(m[4]), int(m[5])], "how": m[6],
            "size": int(m[7])}

def described(name, *args):  # what _runtime_plan gives for the same call, from its JSON description
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append({"shape": list(a.shape), "dtype": DT[a.dtype], "contiguous": a.is_contiguous(),
                        "aligned": a.data_ptr() % 16 == 0})
        else:
            out.append(a)
    try:
        plan = json.loads(torch.ops.kernelgraft._runtime_plan("kgexamples::" + name, json.dumps(out)))
    except RuntimeError as exc:
        return {"error": str(exc).splitlines()[0]}
    return {"candidate": plan["candidate"], "kernel": plan["kernel"], "grid": plan["grid"]}

h = torch.float16
x, y = torch.randn(33, 97, dtype=h), torch.randn(33, 97, dtype=h)
wide = torch.randn(33, 200, dtype=h)  # views of x's shape: a key without layout would reuse x's plan
calls = [("add_relu", x, y), ("add_relu", x, y), ("add_relu", x.float(), y.float()),
         ("add_relu", wide[:, :97], wide[:, 100:197]),                       # strided views
         ("add_relu", torch.randn(33 * 97 + 1, dtype=h)[1:].view(33, 97), y),  # unaligned
         ("rmsnorm", torch.randn(9, 768, dtype=h), torch.randn(768, dtype=h), 1e-6),
         ("rmsnorm", torch.randn(9, 768, dtype=h), torch.randn(768, dtype=h), 1e-6),
         ("rmsnorm", torch.randn(9, 768, dtype=h), torch.randn(768, dtype=h), 1e-5),
         ("rmsnorm", torch.randn(9, 768, dtype=torch.float64), torch.randn(768, dtype=torch.float64), 1e-6)]
report = [(attempt(*c), described(*c)) for c in calls]
many = [attempt("add_relu", torch.randn(n), torch.randn(n)) for n in range(1, 301)]
print(json.dumps({"calls": report, "planned": sum("size" in m for m in many),
                  "max_size": max(m.get("size", 0) for m in many), "errors": [m for m in many if "error" in m][:3]}))
"""


def test_the_cuda_kernel_plans_each_signature_once(so, bundle, tmp_path):
    """The CUDA kernel's launch plan is memoized per call signature (dtypes, sizes, contiguity,
    alignment, scalars): a repeated call reuses it, any difference plans again, and every plan,
    cached or new, is the one the full path gives (``_runtime_plan``). Run through the CPU test hook
    (KERNELGRAFT_RUNTIME_PLAN_ON_CPU=1), which plans as the CUDA kernel does and then refuses."""
    report, _ = json_child(tmp_path, CACHE_CHILD, so, bundle, extra_env={"KERNELGRAFT_RUNTIME_PLAN_ON_CPU": "1"},
                           isolated=False)
    hows = []
    for got, want in report["calls"]:
        if "error" in want:  # the full path refuses: so does the kernel, with the same message
            assert got == want
            hows.append("error")
            continue
        assert {k: got[k] for k in want} == want
        hows.append(got["how"])
    # strided and unaligned views of x's shape: no kernel serves them, and the cached plan of x is
    # not taken for them
    assert hows == ["new", "cached", "new", "error", "error", "new", "cached", "new", "error"], hows
    assert report["planned"] == 300, report["errors"]
    assert 200 < report["max_size"] <= 256  # bounded


def test_the_runtime_library_exports_no_copy_of_libstdcxx(so):
    # The GPU machine's toolchain linked libstdc++ statically into the runtime and exported that
    # copy; a TORCH_WARN with a number then crashed the process inside std::ostream.
    # Symbols from static archives are kept local (-Wl,--exclude-libs,ALL): whatever the toolchain,
    # the library defines none of libstdc++'s own.
    import shutil
    import subprocess

    from kernelgraft.native import builder as _build

    assert "-Wl,--exclude-libs,ALL" in _build.LDFLAGS
    if shutil.which("nm") is None:
        pytest.skip("needs nm (binutils)")
    out = subprocess.run(["nm", "-D", "--defined-only", "-C", str(so)], capture_output=True, text=True,
                         check=True).stdout
    own = [line for line in out.splitlines()
           if any(s in line for s in ("std::locale::", "std::ios_base::", "std::basic_ostream<char, std::char_traits<char> >::_M_insert",
                                      "std::codecvt<", "transaction clone for std::"))]
    assert not own, own[:5]
