"""benchmarks/bench_libraries.py on the CPU: the dry run (every LLM shape of every library op built on
the meta device, which library kernel each library's own function runs), the correctness checks of
one shape (kernelgraft's own kernels in Triton's interpreter), how a kernel is judged against a
library's function (bit-equal only where the same kernel runs), the ratios from made-up timings
with a library missing, and the serve check's child blocking the libraries even where installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from kernelgraft.bench import Case, shape_plan
from kernelgraft.examples import libraries

from _bench_scripts import BENCHMARKS, bench_script


@pytest.fixture(scope="module")
def bench():
    with bench_script("bench_libraries") as module:
        yield module


@pytest.fixture(scope="module")
def common(bench):
    return sys.modules["_libraries_common"]


def test_dry_run_plans_every_llm_shape_of_every_library_op(bench, common, capsys):
    assert bench.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    total = sum(len(shape_plan(common.load(n)[0].BENCH_SHAPES, "llm")) for n in libraries.MODULES)
    assert out.splitlines()[-1] == f"{total} shapes" and total >= 30
    for name in ("rmsnorm", "add_rmsnorm", "softmax", "swiglu", "rope_", "cross_entropy"):
        assert f"## kglib::{name}" in out
    # Liger's function picks its block-of-rows kernel for 32768+ rows of at most 256 elements
    assert "| head | 262144x128 | 67.1 | quack: quack_rmsnorm, liger: liger_rmsnorm_block |" in out
    assert "| hidden | 4096x4096 | 33.6 | quack: quack_rmsnorm, liger: liger_rmsnorm |" in out
    assert "| vocab | 4096x128256 | 1050.7 | quack: quack_cross_entropy |" in out
    for dist in libraries.LIBRARIES:  # each library either installed (its version) or said missing
        source, why = libraries.status(dist)
        assert f"- {dist}: {source or 'not installed: ' + why}" in out
        if source is None:
            assert f"- {dist} (not installed): " in out
    assert "- kernelgraft: softmax_rows, softmax_online" in out


def test_quick_keeps_two_shapes_per_op_and_ops_selects(bench, capsys):
    assert bench.main(["--dry-run", "--quick", "--ops", "rope_,kglib::cross_entropy"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "4 shapes"
    assert "## kglib::rope_" in out and "## kglib::cross_entropy" in out and "## kglib::rmsnorm" not in out
    assert "| decode | 16x1x32x8x128 |" in out and "| prefill | 4x8192x32x8x128 |" in out  # first and last
    with pytest.raises(SystemExit, match="unknown op layernorm"):
        bench.main(["--dry-run", "--ops", "layernorm"])


def test_every_impl_is_attributed_to_its_library(common):
    for name in libraries.MODULES:
        for impl in common.load(name)[1].impls:
            want = {"quack": "quack-kernels", "liger": "liger-kernel"}.get(impl.display_name.split("_")[0], libraries.OWN)
            assert libraries.library_of(impl) == want, (name, impl.display_name)


def test_a_kernel_is_bit_equal_to_its_librarys_function_only_where_it_runs_the_same_kernel(common):
    op = common.load("softmax")[1]
    want = torch.softmax(torch.randn(8, 64, dtype=torch.float32), -1)
    nudged = want.clone()
    nudged[3, 5] = torch.nextafter(nudged[3, 5], torch.tensor(2.0))  # one ulp
    same = common.against_function(op, [want.clone()], [want], same=True)
    assert same["ok"] and same["bit_equal"] and same["detail"] == "bit-equal"
    off = common.against_function(op, [nudged], [want], same=True)  # the same kernel must be bit-equal
    assert not off["ok"] and off["within_tolerance"] and off["detail"].startswith("NOT bit-equal (same kernel)")
    other = common.against_function(op, [nudged], [want], same=False)  # another kernel: the oracle's tolerance
    assert other["ok"] and not other["bit_equal"]
    wrong = want.clone()
    wrong[0, 0] += 0.5
    bad = common.against_function(op, [wrong], [want], same=False)
    assert not bad["ok"] and "[0, 0]" in bad["detail"]


def _t(*samples):
    return {"median_us": sorted(samples)[len(samples) // 2], "samples": list(samples)}


def test_ratios_pair_rounds_against_the_libraries_present(common):
    times = {"tuned": _t(10.0, 11.0, 9.0), "liger_a": _t(12.0, 11.0, 10.0), "liger_b": _t(20.0, 20.0, 20.0),
             "own_a": _t(10.0, 12.0, 9.5), "fn:liger": _t(12.5, 12.0, 11.0), "eager": _t(40.0, 40.0, 40.0),
             "compile": _t(20.0, 22.0, 18.0)}
    groups = {"quack-kernels": ["quack_a"], "liger-kernel": ["liger_a", "liger_b"], libraries.OWN: ["own_a"]}
    installed = {"quack-kernels": False, "liger-kernel": True}
    r = common.ratios(times, groups, {"liger-kernel": "fn:liger"}, installed)
    assert r["libraries"]["quack-kernels"] == {"status": common.NOT_INSTALLED}
    assert r["libraries"]["liger-kernel"]["best"] == "liger_a" and r["best_library"] == libraries.OWN
    # medians of per-round ratios: tuned / min(liger_a, own_a) = 10/10, 11/11, 9/9.5
    assert r["tuned_over_best_library"] == pytest.approx(1.0)
    assert r["libraries"]["liger-kernel"]["tuned_over"] == pytest.approx(0.9)  # 10/12, 11/11, 9/10
    assert r["tuned_over_best_function"] == pytest.approx(9 / 11)  # 10/12.5, 11/12, 9/11
    assert r["tuned_over_eager"] == pytest.approx(10 / 40) and r["tuned_over_compile"] == pytest.approx(0.5)
    entry = {"op": "kglib::softmax", "dims": "4x8", "chosen": "triton:own_a[-]", "times": times, "ratios": r,
             "checks": [{"ok": True, "same_kernel": True, "bit_equal": True}, {"ok": False, "bit_equal": False}]}
    text = common.table([entry, {"op": "kglib::softmax", "dims": "8x8", "error": "RuntimeError: boom"}])
    assert "| softmax | 4x8 | 10.000 | triton:own_a[-] | 1.000 (own) | n/i | 0.900 | " in text
    assert "| 1/2 ok |" in text and "failed: RuntimeError: boom" in text
    summary = common.summarize([entry, {"op": "kglib::softmax", "dims": "8x8", "error": "boom"}])
    assert summary["vs_best_library"]["at_most_1"] == 1 and summary["vs_best_library"]["below_1"] == 0
    assert summary["failed_shapes"] == 1 and len(summary["checks"]["failed"]) == 1
    assert summary["bit_equal"] == {"expected": 1, "held": 1}


def test_one_shape_is_checked_against_the_reference_without_timing(bench, common):
    module, op = common.load("softmax")
    case = Case(module.bench_case(4, 256, device="cpu"), "attention", (4, 256))
    entry = bench.bench_shape("softmax", op, case, bench.installed(), None, 1, time_it=False)
    checked = {c["what"] for c in entry["checks"] if c["against"] == "reference (float64)"}
    assert "tuned" in checked and "triton:softmax_rows[num_warps=4,rows_per_program=1]" in checked
    assert all(c["ok"] is not False for c in entry["checks"]), [c for c in entry["checks"] if not c["ok"]]
    # a library whose functions take CUDA tensors only is not run on these CPU ones, and says so
    for c in entry["checks"]:
        if c["ok"] is None:
            assert c["detail"].startswith("not run: ") and "cpu" in c["detail"], c
    if libraries.status("quack-kernels")[0] is not None:
        assert any(c["ok"] is None and c["what"].startswith("quack.") for c in entry["checks"]), entry["checks"]
    assert entry["chosen"] and entry["times"] == {}
    for dist in libraries.LIBRARIES:
        if libraries.status(dist)[0] is None:
            assert entry["ratios"]["libraries"][dist] == {"status": common.NOT_INSTALLED}


def test_serve_child_blocks_the_libraries_even_where_installed(tmp_path):
    # stand-ins for installed packages: importable normally, blocked in the child
    for package in ("quack", "liger_kernel/ops", "cutlass"):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "liger_kernel" / "__init__.py").write_text("")
    (tmp_path / "quack" / "rmsnorm.py").write_text("")
    (tmp_path / "liger_kernel" / "ops" / "rms_norm.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    plain = subprocess.run([sys.executable, "-P", "-c", "import quack.rmsnorm, liger_kernel.ops.rms_norm"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    child = subprocess.run([sys.executable, "-P", str(BENCHMARKS / "_libraries_serve_child.py"), "--probe"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert set(report["imports"].values()) == {"blocked"} and len(report["imports"]) == 7
    assert report["loaded"] == []


def test_run_writes_every_shape_and_the_ratios_with_a_stand_in_timer(bench, common, tmp_path, monkeypatch, capsys):
    """The GPU run's loop on the CPU: small inputs in place of the LLM shapes, each callable called
    by a stand-in for measure_interleaved (no GPU to time on) that reads the tuned op and every
    kernel candidate at 10 us and everything else at 20 us. cross_entropy's only library (quack)
    has no kernel here: its shapes have no library ratio, and say why."""
    import kernelgraft.bench as kgbench
    from kernelgraft.bench.timing import Timing

    def small(module, device, suite):
        for regime, dims in shape_plan(module.BENCH_SHAPES, suite):
            yield Case(module.bench_case(3, 64, device="cpu"), regime, dims)

    kernels = set()

    def together(fns, **_):
        out = []
        for fn in fns:
            try:
                fn()  # every callable really runs (the interpreter, tiny inputs)
            except Exception as exc:  # as measure_interleaved reports a callable that fails
                out.append(exc)
                continue
            out.append(Timing(10.0 if fn in kernels else 20.0, 1.0, 1.0, 1.0, 5, "graph", 40))
        return out

    real = bench._together

    def spy(fns, rounds):
        kernels.clear()
        kernels.update(fn for label, fn in fns.items()
                       if label == "tuned" or label.split(":")[0] in ("triton", "cutedsl"))  # candidate labels
        return real(fns, rounds)

    monkeypatch.setattr(kgbench, "module_inputs", small)
    monkeypatch.setattr(kgbench, "measure_interleaved", together)
    monkeypatch.setattr(bench, "_together", spy)
    args = bench.argparse.Namespace(ops=["softmax,cross_entropy"], quick=True, rounds=2, time_limit=600.0,
                                    no_compile=True, check_only=False)
    assert bench.run(args, tmp_path) == 0
    doc = json.loads((tmp_path / "libraries.json").read_text())
    assert [(e["op"], e["dims"]) for e in doc["shapes"]] == [
        ("kglib::softmax", "32x4096"), ("kglib::softmax", "64x65536"), ("kglib::cross_entropy", "1024x32000"),
        ("kglib::cross_entropy", "4096x128256")]
    for e in doc["shapes"]:
        assert e["times"]["tuned"]["samples"] == [10.0, 10.0] and e["times"]["eager"]["median_us"] == 20.0
        assert e["ratios"]["tuned_over_eager"] == pytest.approx(0.5)
    softmax, ce = doc["shapes"][:2], doc["shapes"][2:]
    assert all(e["ratios"]["tuned_over_best_library"] == pytest.approx(1.0) for e in softmax)
    for e in ce:
        assert e["ratios"]["tuned_over_best_library"] is None
        assert e["ratios"]["libraries"]["quack-kernels"]["status"] in (common.NOT_INSTALLED,
                                                                        "no candidate timed for this shape")
    summary = doc["summary"]["vs_best_library"]
    assert summary["at_most_1"] == summary["timed"] == 2 and len(summary["no_library"]) == 2
    assert not doc["summary"]["checks"]["failed"]
    table = (tmp_path / "libraries.md").read_text()
    assert "| softmax | 64x65536 | 10.000 |" in table and "2 of 2 shapes at most 1.00" in table
    assert capsys.readouterr().out.rstrip().endswith("libraries.md")


VARIANT_BUNDLE = """
import sys, torch
from kernelgraft.aot import build_bundle
from kernelgraft.examples.libraries import swiglu
gate = torch.randn(4, 64)
build_bundle([swiglu.swiglu], sys.argv[1], archs=["sm_90"], inputs={"kglib::swiglu": [(gate, torch.randn(4, 64))]})
"""


def test_serve_check_variants_hold_one_librarys_kernels_each_and_load(common, tmp_path):
    """The serve check's bundle variants (kernelgraft's own SwiGLU kernels, compiled for sm_90
    here; Liger's too where it is installed): a namespace of their own, only one library's
    candidates, output rules derived again, and a bundle the loader accepts."""
    import kernelgraft as kg
    from kernelgraft.aot import manifest as _manifest
    from kernelgraft.aot.program import meta_rules

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    built = subprocess.run([sys.executable, "-c", VARIANT_BUNDLE, str(tmp_path / "b")], capture_output=True, text=True,
                           env=env, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    with bench_script("_libraries_serve") as serve:
        op = common.load("swiglu")[1]
        ops = {op.name: op}
        liger = libraries.status("liger-kernel")[0] is not None
        kernels = serve.contents(tmp_path / "b", ops)[op.name]["kernels"]
        assert kernels == {libraries.OWN: 3, **({"liger-kernel": 1} if liger else {})}
        own = serve.variant(tmp_path / "b", tmp_path / "own", "kglib_own", ops,
                            lambda o, c: libraries.library_of(o.impls[c["index"]]) == libraries.OWN)
        assert own == ["kglib_own::swiglu"]
        assert serve.variant(tmp_path / "b", tmp_path / "quack", "kglib_quack", ops,
                             lambda o, c: libraries.library_of(o.impls[c["index"]]) == "quack-kernels") == []
        assert not (tmp_path / "quack").exists()
    (entry,) = _manifest.read(tmp_path / "own")["ops"]
    assert {c["impl"] for c in entry["candidates"]} == {"launch_swiglu"} and entry["meta"] == meta_rules(entry["candidates"])
    assert "kglib_own::swiglu" in kg.load_bundle(tmp_path / "own", arch="sm_90").ops
