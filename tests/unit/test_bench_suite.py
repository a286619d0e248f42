"""The LLM shape suite and peers of ``kernelgraft bench``: every example declares its regimes, the
shapes build on the meta device within the memory budget, peers parse and time beside the op
(fake timer, kernels in Triton's interpreter), and graph-replay timing on the GPU."""

from __future__ import annotations

import importlib
import logging

import pytest
import torch

from kernelgraft.bench import Case, Timing, bench_inputs_of, bench_op, cases, regime_of, shape_plan
from kernelgraft.bench.peers import Peer, as_peers, parse_peer, peers_for
from kernelgraft.bench.run import EAGER, PEER, TUNED
from kernelgraft.bench.suite import check_shapes
from kernelgraft.examples import MODULES
from kernelgraft.bench import module_inputs

from _paths import ROOT

# the regimes each example must cover in the llm suite
REQUIRED = {
    "rmsnorm": {"decode", "prefill", "narrow", "wide"},
    "rmsnorm_residual": {"decode", "prefill", "wide"},
    "softmax": {"attention", "narrow", "vocab"},
    "swiglu": {"decode", "prefill", "wide"},
    "gemm": {"skinny", "gemm"},
    "fp8_kcache_scatter": {"decode", "prefill"},
    "kv_append": {"decode", "prefill"},
    "topk_router": {"decode", "prefill", "narrow"},
    "add_relu": {"elementwise"},
}
GB = 1e9


def _bytes(case) -> int:
    return sum(t.numel() * t.element_size() for t in case if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("name", MODULES)
def test_every_example_declares_both_suites_and_its_regimes(name):
    module = importlib.import_module(f"kernelgraft.examples.{name}")
    check_shapes(module.BENCH_SHAPES, name)
    assert set(module.BENCH_SHAPES) == {"short", "llm"}
    assert set(module.BENCH_SHAPES["llm"]) == REQUIRED[name]


@pytest.mark.parametrize("name", MODULES)
def test_llm_shapes_build_on_meta_within_budget(name):
    """Each shape's tensors fit easily in an H200 (under 4 GB; the GEMM's fp32 reference and the
    graph pool add a few times that), and the cases come out tagged in the declared order."""
    module = importlib.import_module(f"kernelgraft.examples.{name}")
    built = list(module_inputs(module, "meta", "llm"))
    assert [(c.regime, c.dims) for c in built] == shape_plan(module.BENCH_SHAPES, "llm")
    assert all(isinstance(c, tuple) and 0 < _bytes(c) < 4 * GB for c in built)
    # the default stays the short suite
    assert [c.dims for c in module_inputs(module, "meta")] == [d for _, d in shape_plan(module.BENCH_SHAPES, "short")]


def test_llm_suite_reaches_the_regimes_of_the_issue():
    from kernelgraft.examples import gemm, rmsnorm, softmax, swiglu

    llm = lambda m: [d for _, d in shape_plan(m.BENCH_SHAPES, "llm")]  # noqa: E731
    assert any(rows <= 64 for rows, _ in llm(rmsnorm)) and any(rows >= 32768 for rows, _ in llm(rmsnorm))
    assert any(cols <= 256 and rows >= 16384 for rows, cols in llm(rmsnorm))  # QK norm
    assert any(cols >= 16384 for _, cols in llm(rmsnorm))
    assert {(1, 151936), (64, 128256)} <= set(llm(softmax)) and max(c for _, c in llm(softmax)) >= 256000
    assert {m for m, _, _ in llm(gemm)} >= {1, 16, 4096}
    assert any(rows == 1 for rows, _ in llm(swiglu))


def test_case_is_a_tuple_with_a_regime():
    c = Case((1, "a"), "decode", (1, 8))
    assert c == (1, "a") and tuple(c) == (1, "a") and c.regime == "decode" and c.dims == (1, 8)
    assert regime_of(c) == "decode" and regime_of((1,)) == ""
    assert [c.regime for c in cases({"llm": {"vocab": [(1, 2)], "narrow": [(3, 4)]}}, "llm", lambda a, b: (a + b,))] \
        == ["vocab", "narrow"]


@pytest.mark.parametrize("shapes, suite, match", [
    ({"llm": {"decode": [(1,)]}}, "huge", "unknown benchmark suite 'huge'"),
    ({"short": {"decode": [(1,)]}}, "llm", "no shapes declared for suite 'llm'"),
], ids=["unknown-suite", "undeclared-suite"])
def test_shape_plan_errors(shapes, suite, match):
    with pytest.raises(ValueError, match=match):
        shape_plan(shapes, suite)


@pytest.mark.parametrize("shapes, match", [
    ({"long": {}}, "unknown suite 'long'"),
    ({"llm": {"tiny": [(1,)]}}, "unknown regime 'tiny'"),
    ({"llm": {"decode": [[1, 2]]}}, "dims must be tuples"),
], ids=["suite", "regime", "dims"])
def test_check_shapes_names_the_problem(shapes, match):
    with pytest.raises(ValueError, match=match):
        check_shapes(shapes)


def test_bench_inputs_of_passes_the_suite():
    from kernelgraft.examples.softmax import softmax

    first = next(iter(bench_inputs_of(softmax, "meta", "llm")))
    assert first.regime == "attention" and first.dims == (32, 4096)
    with pytest.raises(ValueError, match="unknown benchmark suite"):
        bench_inputs_of(softmax, "meta", "medium")


# ------------------------------------------------------------------------------------------ peers
def test_parse_peer_forms(tmp_path):
    p = parse_peer("torch.nn.functional:softmax")
    assert p.name == "softmax" and p.fn is torch.nn.functional.softmax and p.ops == ()
    p = parse_peer("rmsnorm,kgexamples::softmax=torch:relu")
    assert p.ops == ("rmsnorm", "kgexamples::softmax") and p.fn is torch.relu
    assert p.applies_to("kgexamples::rmsnorm") and p.applies_to("kgexamples::softmax")
    assert not p.applies_to("kgexamples::rmsnorm_residual")  # names, not substrings
    f = tmp_path / "mypeers.py"
    f.write_text("def fast(x):\n    return x\nfast.peer_name = 'vendor'\n")
    p = parse_peer(f"{f}:fast")
    assert p.name == "vendor" and p.fn(3) == 3


@pytest.mark.parametrize("spec, match", [
    ("torch.relu", "expected \\[OP=\\]module:function"),
    ("no_such_module_kg:fn", "cannot import module 'no_such_module_kg'"),
    ("torch:no_such_function_kg", "torch has no function 'no_such_function_kg'"),
    ("/nonexistent/p.py:f", "no such file"),
], ids=["no-colon", "module", "function", "file"])
def test_parse_peer_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_peer(spec)


def test_as_peers_and_peers_for():
    assert [p.name for p in as_peers(torch.relu)] == ["relu"]
    assert [p.name for p in as_peers(("mine", torch.abs))] == ["mine"]
    assert as_peers(None) == []
    with pytest.raises(TypeError, match="expected a callable"):
        as_peers([3])
    table = {"kgexamples::rmsnorm": [torch.abs], "softmax": [torch.relu]}
    assert [p.fn for p in peers_for("kgexamples::rmsnorm", table)] == [torch.abs]
    assert [p.fn for p in peers_for("kgexamples::softmax", table)] == [torch.relu]
    assert peers_for("kgexamples::rmsnorm_residual", table) == []
    only = [Peer("a", torch.abs, ("swiglu",)), Peer("b", torch.relu)]
    assert [p.name for p in peers_for("kgexamples::swiglu", only)] == ["a", "b"]
    assert [p.name for p in peers_for("kgexamples::gemm", only)] == ["b"]


class CountingTimer:
    """The same 5 us for every callable, timed by 'graph'; runs each once so kernels and peers
    really execute (in the interpreter)."""

    def __call__(self, fn):
        fn()
        return Timing(5.0, 5.0, 5.0, 5.0, 3, "graph")


def test_bench_op_times_peers_beside_the_op(caplog):
    from kernelgraft.examples.softmax import softmax

    calls = []

    def good(x):
        calls.append(x.shape)
        return torch.softmax(x.float(), -1).to(x.dtype)

    def wrong(x):
        return torch.zeros_like(x)

    def broken(x):
        raise RuntimeError("peer cannot do this shape")

    inputs = [Case((torch.randn(4, 64),), "vocab", (4, 64))]
    with caplog.at_level(logging.WARNING):
        rows = bench_op(softmax, inputs, ceilings=None, timer=CountingTimer(), compile=False, tune=False,
                        peers=[("good", good), ("wrong", wrong), ("broken", broken)], candidates=True)
    peers = {r.variant: r for r in rows if r.kind == PEER}
    assert set(peers) == {"peer: good", "peer: wrong", "peer: broken"}
    assert peers["peer: good"].time_us == 5.0 and peers["peer: good"].detail == "" and calls
    assert peers["peer: good"].vs_tuned == pytest.approx(1.0) and peers["peer: good"].method == "graph"
    assert peers["peer: wrong"].detail.startswith("differs from the op: peer wrong")
    assert peers["peer: broken"].error == "RuntimeError: peer cannot do this shape"
    assert peers["peer: broken"].time_us is None and "peer broken failed" in caplog.text
    assert {r.regime for r in rows} == {"vocab"}
    eager = next(r for r in rows if r.kind == EAGER)
    assert eager.vs_tuned == pytest.approx(1.0)


def test_bench_op_can_skip_candidates_and_the_untuned_row():
    from kernelgraft.examples.add_relu import add_relu

    rows = bench_op(add_relu, [(torch.randn(100), torch.randn(100))], ceilings=None, timer=CountingTimer(),
                    compile=False, tune=False, candidates=False, untuned=False)
    # without candidates and without the tuner nothing stands for the op: eager alone
    assert [r.kind for r in rows] == [EAGER]


def test_bench_op_rejects_an_unknown_timing():
    from kernelgraft.examples.add_relu import add_relu

    with pytest.raises(ValueError, match="bench timing 'warm': expected one of cold, graph"):
        bench_op(add_relu, [], ceilings=None, timing="warm")


def test_cli_reports_a_bad_peer_before_anything_else(capsys):
    from kernelgraft.cli import main

    assert main(["bench", "kernelgraft.examples.softmax", "--suite", "llm", "--against", "torch.relu"]) == 2
    assert "kernelgraft bench --against: peer 'torch.relu': expected [OP=]module:function" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_graph_timing_on_gpu():
    """Graph replay times a kernel without its host launch cost; a call that cannot be captured
    (a host synchronisation) falls back to per-call events and says so."""
    from kernelgraft.bench import measure

    x = torch.randn(1 << 20, device="cuda")
    t = measure(lambda: torch.relu(x), graph=True, warmup_ms=10, rep_ms=10)
    assert t.method == "graph" and t.median_us > 0
    e = measure(lambda: torch.relu(x).sum().item(), graph=True, warmup_ms=10, rep_ms=10)
    assert e.method == "events" and e.median_us > 0
    # the failed capture left the process's random numbers working (torch leaves the default
    # generators registered with a graph whose capture failed unless they are restored)
    assert torch.randn(8, device="cuda").isfinite().all()
    torch.nn.functional.dropout(torch.ones(64, device="cuda"), 0.5)


@pytest.mark.gpu
def test_bench_op_with_peers_and_graph_timing_on_gpu():
    from kernelgraft.examples import rmsnorm as module

    inputs = [c for c in module_inputs(module, "cuda", "llm") if c.dims in {(1, 4096), (65536, 128)}]
    peer = ("torch", lambda x, w, eps: torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), w.float(), eps).to(x.dtype))
    rows = bench_op(module.rmsnorm, inputs, ceilings=None, compile=False, peers=[peer], timing="graph",
                    candidates=False, untuned=False)
    tuned = [r for r in rows if r.kind == TUNED]
    peers = [r for r in rows if r.kind == PEER]
    assert len(tuned) == len(peers) == 2 and all(r.time_us and r.method == "graph" for r in tuned + peers)
    assert all(r.vs_tuned and not r.detail for r in peers), [(r.shape, r.detail) for r in peers]
    assert [r.regime for r in tuned] == ["decode", "narrow"]


@pytest.mark.gpu
def test_liger_peers_match_the_examples_on_gpu():
    pytest.importorskip("liger_kernel")
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import peers as peer_module

    from kernelgraft.verify.oracle import compare_trees

    checked = 0
    for op_name, fns in peer_module.PEERS.items():
        module = importlib.import_module(f"kernelgraft.examples.{op_name.split('::')[-1]}")
        op = getattr(module, op_name.split("::")[-1])
        for case in module_inputs(module, "cuda", "llm"):
            if sum(t.numel() for t in case if isinstance(t, torch.Tensor)) > 1 << 26:
                continue
            want = op(*case)
            for fn in fns:
                try:
                    got = fn(*case)
                except RuntimeError as exc:  # Liger refuses rows over 65536 elements
                    assert "exceeds" in str(exc) and case.dims[-1] > 65536, exc
                    continue
                assert compare_trees(want, got, tolerances=op.tolerances) is None, (op_name, case.dims)
                checked += 1
    assert checked > 20


def test_run_benchmarks_passes_suite_and_peers_per_op(tmp_path):
    from kernelgraft.bench import Ceilings, load_json, run_benchmarks
    from kernelgraft.examples.add_relu import add_relu
    from kernelgraft.examples.softmax import softmax

    asked = []

    def inputs_for(op, device, suite):
        asked.append((op.name, device, suite))
        x = torch.randn(4, 64)
        return [Case((x,) if op is softmax else (x, x), "decode", (4, 64))]

    peers = {"softmax": [("mine", lambda x: torch.softmax(x, -1))]}
    rows, _ = run_benchmarks([softmax, add_relu], device="cpu", json_path=str(tmp_path / "b.json"), compile=False,
                             tune=False, ceilings=Ceilings(4000.0, 800.0), timer=CountingTimer(),
                             inputs_for=inputs_for, say=lambda s: None, suite="llm", peers=peers)
    assert asked == [("kgexamples::softmax", "cpu", "llm"), ("kgexamples::add_relu", "cpu", "llm")]
    assert [(r.op, r.variant) for r in rows if r.kind == PEER] == [("kgexamples::softmax", "peer: mine")]
    back, _, _ = load_json(tmp_path / "b.json")
    assert {r.regime for r in back} == {"decode"} and any(r.kind == PEER and r.vs_tuned for r in back)


def test_bench_falls_back_to_sample_inputs_called_as_check_calls_them():
    """An op module without bench_inputs: bench times its sample_inputs, called with the device only
    when the function takes one (check and aot do the same), so a no-argument one works too."""
    import kernelgraft as kg
    from kernelgraft.bench import bench_inputs_of

    def samples():
        yield (torch.randn(8),)

    @kg.op("tbenchsuite::no_arg_samples", sample_inputs=samples)
    def no_arg_samples(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    got = list(bench_inputs_of(no_arg_samples, "cpu"))
    assert len(got) == 1 and got[0][0].shape == (8,)
