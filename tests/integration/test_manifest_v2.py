"""The C++ runtime's data (manifest version 2 on, in the form of version 4): RPN programs equal to
the Python expressions, one per guard, output-shape rules derived from the programs, decision tables
from a tuning cache, and the loader reading versions 1 to 4."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch

import kernelgraft as kg
from kernelgraft.aot import manifest as _manifest
from kernelgraft.symbolic.expr import compile_exprs
from kernelgraft.aot.program import _range, decision_table, kernel_program, meta_rules
from kernelgraft.aot.rpn import EvalError, compile_rpn, evaluate
from kernelgraft.examples import add_relu, rmsnorm  # registered before the per-test registry snapshot




@pytest.fixture(scope="module")
def bundle(example_bundle) -> Path:
    return example_bundle  # built once per run (conftest); read-only


def _python(text: str, names, args):
    """The Python loader's value of ``text``, or EvalError where it raises."""
    try:
        return compile_exprs(names, [text])(*args)[0]
    except kg.BundleError as exc:
        return EvalError(str(exc))


def _rpn(text: str, names, args):
    try:
        return evaluate(compile_rpn(text, names), args)
    except EvalError as exc:
        return exc


def _same(a, b) -> bool:
    if isinstance(a, EvalError) or isinstance(b, EvalError):
        return isinstance(a, EvalError) and isinstance(b, EvalError)
    return a == b  # Python's True is the program's 1


@pytest.mark.parametrize("text", [
    "((1023 + x.shape[0]) // 1024)", "(-((-x.shape[0]) // 256))", "max(16, x.shape[0], 3) % 7",
    "min(x.shape[0], 2.5)", "(x.shape[0] | 3) == 7 and not (x.shape[0] < 0)", "x.shape[0] ** 2 + (1 << 4)",
    "(x.shape[0] - 9) // 4", "(x.shape[0] - 9) % 4", "x.shape[0] / 3", "n // (x.shape[0] - 5)",
    "(x.shape[0] == 5) or (n // (x.shape[0] - 5))", "(x.shape[0] != 5) and (n // (x.shape[0] - 5))",
    "eps * 2", "-eps", "+n", "(x.shape[0] >> 1) & n", "True", "n == 3", "eps == 1e-06",
    "next_pow2(x.shape[0]) * n", "next_pow2(n - x.shape[0])", "next_pow2(eps)", "next_pow2(n == 3)",
], ids=lambda t: t[:30])
def test_rpn_equals_the_python_expression(text):
    names = ["x", "n", "eps"]
    rng = random.Random(text)
    for _ in range(50):
        args = (torch.empty(rng.randrange(0, 40)), rng.randrange(-8, 8), rng.choice([1e-6, 0.5, -2.0]))
        want, got = _python(text, names, args), _rpn(text, names, args)
        assert _same(want, got), (text, args, want, got)


def test_rpn_tokens_are_plain_json_with_exact_integers():
    rpn = compile_rpn("(x.shape[1] < 9223372036854775808) and (n >= -9223372036854775808)", ["x", "n"])
    assert json.loads(json.dumps(rpn)) == rpn
    assert ["int", "9223372036854775808"] in rpn and ["size", 0, 1] in rpn and ["arg", 1] in rpn
    assert rpn[-1] == ["bool", "and", 2]


@pytest.mark.parametrize("text,why", [
    ("x.shape[0] < n < 5", "chains comparisons"), ("x.shape[0] < 1361129467683753853853498429727072845824", "does not fit"),
    ("open('f')", "grammar does not allow"), ("next_pow2(x.shape[0], n)", "grammar does not allow"),
    ("next_pow2 + 1", "grammar does not allow"),
], ids=["chain", "huge-literal", "call", "next-pow2-two-args", "bare-next-pow2"])
def test_rpn_refuses_what_cpp_cannot_hold(text, why):
    with pytest.raises(kg.BundleError, match=why):
        compile_rpn(text, ["x", "n"])


# Triton's own values at and around 0 and 1, the 32- and 64-bit boundaries, and past the 128-bit
# integers of the RPN evaluator and the C++ runtime (an error there, never a wrapped value).
NEXT_POW2_EDGES = [-5, 0, 1, 2, 3, 1000, 1024, 1025, 2 ** 31 - 1, 2 ** 31, 2 ** 31 + 1, 2 ** 62 + 1,
                   2 ** 63 - 1, 2 ** 64, 2 ** 126, 2 ** 126 + 1, 2 ** 127 - 1]


@pytest.mark.parametrize("value", NEXT_POW2_EDGES, ids=str)
def test_next_pow2_is_tritons_next_power_of_2(value):
    import triton

    want = triton.next_power_of_2(value) if value <= 2 ** 64 else 1 << (value - 1).bit_length()
    assert _python("next_pow2(n)", ["n"], [value]) == want
    got = _rpn("next_pow2(n)", ["n"], [value])
    if want.bit_length() > 127:
        assert isinstance(got, EvalError) and "does not fit 128 bits" in str(got)
    else:
        assert got == want
    assert compile_rpn("next_pow2(n)", ["n"]) == [["arg", 0], ["call", "next_pow2", 1]]


def test_next_pow2_of_a_float_is_an_error_in_both():
    assert isinstance(_python("next_pow2(eps)", ["eps"], [0.5]), EvalError)
    assert isinstance(_rpn("next_pow2(eps)", ["eps"], [0.5]), EvalError)


def test_deep_expression_compiles_without_recursion():
    text = "x.shape[0]" + " + 1" * 500
    assert evaluate(compile_rpn(text, ["x"]), [torch.empty(3)]) == 503


def _guard_kernel(guards: list[str]) -> dict:
    """A kernel entry with these guards, as the builder records one (the fields programs read)."""
    k = {"guards": guards, "grid": ["1", "1", "1"], "shared_mem": 0, "params": [], "dtypes": {"x": "float32"},
         "ranks": {"x": 1}, "dynamic": True, "outputs": {"shapes": [["x.shape[0]"]], "dtypes": ["float32"]}}
    k["program"] = kernel_program(k, ["x"])
    return k


def test_each_guard_is_its_own_program_so_a_top_level_or_keeps_its_meaning():
    """The kernel's guard is the AND of its guards' programs, each compiled alone: what the Python
    runner computes from the texts (all of them hold), for a guard whose top level is an ``or``."""
    guards = ["x.shape[0] < 4 or x.shape[0] > 8", "x.shape[0] % 2 == 0", "(x.shape[0] >= 2)"]
    k = _guard_kernel(guards)
    assert k["program"]["guards"] == [compile_rpn(g, ["x"]) for g in guards]
    texts = compile_exprs(["x"], guards)
    served = []
    for n in range(0, 40):
        x = torch.empty(n, device="meta")
        want = all(texts(x))
        assert all(evaluate(p, [x]) for p in k["program"]["guards"]) == want, n
        (rule,) = meta_rules([{"kernels": [k]}])
        assert all(evaluate(p, [x]) for p in rule["guards"]) == want, n
        served += [n] * want
    assert served == [2] + list(range(10, 40, 2))


def test_a_rule_keeps_the_guards_whose_programs_read_no_stride():
    """Output rules come from the programs alone (what the C++ runtime derives too): a guard that
    reads a stride is left out of the rule, the others kept in order; rules repeat once."""
    k = _guard_kernel(["(x.shape[0] >= 2)", "(x.stride(0) == 1)", "x.shape[0] < 4 or x.shape[0] > 8"])
    (rule,) = meta_rules([{"kernels": [k, json.loads(json.dumps(k))]}])
    assert rule["guards"] == [k["program"]["guards"][0], k["program"]["guards"][2]]
    assert rule["shapes"] == k["program"]["outputs"] and "guard" not in rule
    k["guards"][0] = "(x.shape[0] >= 3)"  # a text alone changes nothing: the rules read programs
    assert meta_rules([{"kernels": [k]}]) == [rule]


def _kernels(manifest):
    for op in manifest["ops"]:
        for cand in op["candidates"]:
            for k in cand["kernels"]:
                yield op, cand, k


def _random_inputs(op: dict, k: dict, rng: random.Random) -> list:
    """Inputs of the kernel's ranks/dtypes with random sizes (most guards do not hold: both matter)."""
    args = []
    for p in op["params"]:
        if p["kind"] == "tensor":
            rank = k["ranks"][p["name"]]
            args.append(torch.empty([rng.choice([1, 2, 3, 7, 16, 64, 100, 1024, 4096, 5000])
                                     for _ in range(rank)], device="meta"))
        elif p["kind"] == "float":
            args.append(rng.choice([1e-6, 1e-5, 0.5]))
        else:
            args.append(rng.randrange(-4, 4096))
    return args


def test_every_program_in_a_real_bundle_equals_its_text(bundle):
    manifest = _manifest.read(bundle)
    assert manifest["version"] == _manifest.VERSION == 4
    rng = random.Random(0)
    checked = 0
    for op, _cand, k in _kernels(manifest):
        names = [p["name"] for p in op["params"]]
        prog = k["program"]
        assert len(prog["guards"]) == len(k["guards"]) and "guard" not in prog
        texts = [*k["guards"], *k["grid"], str(k["shared_mem"])]
        programs = [*prog["guards"], *prog["grid"], prog["shared_mem"]]
        for p, rpn in zip(k["params"], prog["params"]):
            assert (rpn is None) == ("expr" not in p)
            if rpn is not None:
                texts.append(p["expr"])
                programs.append(rpn)
        for shape, rpns in zip(k["outputs"]["shapes"], prog["outputs"]):
            texts += shape
            programs += rpns
        for _ in range(4):
            args = _random_inputs(op, k, rng)
            for text, rpn in zip(texts, programs):
                want = _python(text, names, args)
                try:
                    got = evaluate(rpn, args)
                except EvalError as exc:
                    got = exc
                assert _same(want, got), (op["name"], text[:200], [getattr(a, "shape", a) for a in args])
                checked += 1
    assert checked > 2000


def test_meta_rules_give_the_python_ops_output_shapes(bundle):
    manifest = _manifest.read(bundle)
    ops = {"kgexamples::add_relu": add_relu.add_relu, "kgexamples::rmsnorm": rmsnorm.rmsnorm}
    for entry in manifest["ops"]:
        assert entry["meta"], entry["name"]
        op = ops[entry["name"]]
        for sample in op.sample_inputs():
            args = list(sample)
            from torch._subclasses.fake_tensor import FakeTensorMode

            with FakeTensorMode() as mode:
                want = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
            for rule in entry["meta"]:
                names = [p["name"] for p in entry["params"]]
                tensors = dict(zip(names, args))
                if any(str(tensors[n].dtype).removeprefix("torch.") != d for n, d in rule["dtypes"].items()):
                    continue
                if any(tensors[n].dim() != r for n, r in rule["ranks"].items()):
                    continue
                if all(evaluate(g, args) for g in rule["guards"]):
                    shape = [evaluate(s, args) for s in rule["shapes"][0]]
                    assert shape == list(want.shape) and rule["out_dtypes"][0] == str(want.dtype)[6:]
                    break
            else:
                pytest.fail(f"no meta rule of {entry['name']} holds for {[getattr(a, 'shape', a) for a in args]}")


def _joined(manifest: dict) -> dict:
    """``manifest`` as versions 2 and 3 held it: one program of the guards joined with " and "."""
    old = json.loads(json.dumps(manifest))
    for op in old["ops"]:
        names = [p["name"] for p in op["params"]]
        for cand in op["candidates"]:
            for k in cand["kernels"]:
                del k["program"]["guards"]
                k["program"]["guard"] = compile_rpn(" and ".join(k["guards"]) or "True", names)
    return old


def test_loader_reads_versions_1_to_4(bundle, tmp_path):
    """1 (texts), 2 and 3 (their joined guard programs not read: the texts are, guard by guard) and
    4; the C++ runtime reads 4 only (tests/integration/test_runtime.py)."""
    v4 = _manifest.read(bundle)
    v1 = json.loads(json.dumps(v4))
    v1["version"] = 1
    for op in v1["ops"]:
        del op["meta"], op["decisions"]
        for cand in op["candidates"]:
            for k in cand["kernels"]:
                del k["program"]
    for version, manifest in ((1, v1), (2, dict(_joined(v4), version=2)), (3, dict(_joined(v4), version=3)),
                              (4, v4)):
        d = tmp_path / f"v{version}"
        shutil.copytree(bundle, d)
        _manifest.write(d, manifest)
        assert _manifest.read(d)["version"] == version
    # a version-4 manifest holds one program per guard: the joined form is refused there
    _manifest.write(tmp_path / "v4", _joined(v4))
    with pytest.raises(kg.BundleError, match=r"program: lacks 'guards'"):
        _manifest.read(tmp_path / "v4")
    _manifest.write(tmp_path / "v4", dict(v4, version=5))
    with pytest.raises(kg.BundleError, match="reads versions 1, 2, 3, 4"):
        _manifest.read(tmp_path / "v4")


def test_pins_need_version_3(bundle, tmp_path):
    """Kernels pinned to string arguments came with version 3: a version-2 manifest that pins is
    refused (a loader of version 2 would have ignored the pins)."""
    v4 = _manifest.read(bundle)
    old = _joined(v4)
    k = old["ops"][0]["candidates"][0]["kernels"][0]
    k["pinned"] = {}
    d = tmp_path / "b"
    shutil.copytree(bundle, d)
    _manifest.write(d, dict(old, version=2))
    with pytest.raises(kg.BundleError, match=r"pinned: needs manifest version 3"):
        _manifest.read(d)
    _manifest.write(d, dict(old, version=3))
    assert _manifest.read(d)["version"] == 3


@pytest.mark.parametrize("rule,bucket,want", [
    ("pow2", 1, [1, 1]), ("pow2", 2, [2, 2]), ("pow2", 1024, [513, 1024]), ("pow2", 0, [0, 0]),
    ("points", 96, [65, 96]), ("points", 64, [1, 64]), ("exact", 37, [37, 37]),
], ids=lambda v: str(v))
def test_bucket_ranges(rule, bucket, want):
    from kernelgraft.op.buckets import _boundaries, _exact, _pow2

    fn = {"pow2": _pow2, "points": _boundaries([64, 96, 128]), "exact": _exact}[rule]
    assert _range(fn, bucket) == want
    lo, hi = want
    if bucket:
        assert all(fn(s) == bucket for s in (lo, hi)) and (lo <= 1 or fn(lo - 1) < bucket)


def _tune_entry(op, shape, ranking, capability="9.0", fingerprint=None):
    return {"key": {"schema": 2, "op": op.name, "fingerprint": fingerprint or op.fingerprint,
                    "args": [["T", "torch.float16", list(shape), "c"], ["T", "torch.float16", list(shape), "c"]],
                    "env": {"device": "NVIDIA H200", "capability": capability}, "tolerances": {}},
            "ranking": ranking, "excluded": [], "created": 1.0}


def test_decision_table_from_tune_entries():
    op = add_relu.add_relu
    cands = [{"index": 0, "config": {"BLOCK": 1024, "num_warps": 4}},
             {"index": 1, "config": {"BLOCK": 256, "ITEMS": 4}}]
    entries = [
        _tune_entry(op, [4096], [{"impl": 1, "config": {"ITEMS": 4, "BLOCK": 256}},
                                 {"impl": 0, "config": {"BLOCK": 1024, "num_warps": 4}}]),
        _tune_entry(op, [64], [{"impl": 0, "config": {"BLOCK": 99}}]),        # no bundled candidate
        _tune_entry(op, [64], [{"impl": 0, "config": {"BLOCK": 1024, "num_warps": 4}}], capability="10.0"),
        _tune_entry(op, [64], [{"impl": 1, "config": {"BLOCK": 256, "ITEMS": 4}}], fingerprint="other"),
    ]
    rows = decision_table(op, cands, entries, ["sm_90"])
    assert rows == [{"arch": "sm_90", "ints": {}, "values": {}, "ranking": [1, 0], "source": "tuned on NVIDIA H200",
                     "tensors": {"x": {"dtype": "float16", "dims": [[2049, 4096]]},
                                 "y": {"dtype": "float16", "dims": [[2049, 4096]]}}}]
    assert len(decision_table(op, cands, entries, ["sm_90", "sm_100"])) == 2


def test_decisions_from_this_machines_cache(tmp_path, monkeypatch):
    from kernelgraft.aot.program import read_decisions

    entry = _tune_entry(add_relu.add_relu, [64], [])
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path))
    (tmp_path / "tune.json").write_text(json.dumps({"format": "kernelgraft-tune-cache", "schema": 2,
                                                    "entries": {"k": entry}}))
    assert read_decisions("cache") == [entry]
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", "off")
    with pytest.raises(kg.BundleError, match="the kernelgraft cache is off"):
        read_decisions("cache")
    with pytest.raises(kg.BundleError, match="not a readable tuning cache"):
        read_decisions(tmp_path / "missing.json")


def test_cli_decisions_flag_fills_the_table(tmp_path):
    from _aot_helpers import EXAMPLES, env
    import subprocess
    import sys

    pytest.importorskip("cuda.bindings")
    op = add_relu.add_relu
    tune = tmp_path / "tune.json"
    entry = _tune_entry(op, [4096], [{"impl": 0, "config": {"BLOCK": 256, "num_warps": 2}}])
    tune.write_text(json.dumps({"format": "kernelgraft-tune-cache", "schema": 2, "entries": {"k": entry}}))
    out = tmp_path / "b"
    proc = subprocess.run([sys.executable, "-m", "kernelgraft", "aot", EXAMPLES[0], "--arch", "sm_90",
                           "-o", str(out), "--decisions", str(tune)], capture_output=True, text=True,
                          env=env(), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 tuned decisions" in proc.stdout
    entry = _manifest.read(out)["ops"][0]
    (row,) = entry["decisions"]
    assert entry["candidates"][row["ranking"][0]]["config"] == {"BLOCK": 256, "num_warps": 2}
