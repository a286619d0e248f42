"""The end-to-end case: a Hugging Face Llama (small config, random weights) with RMSNorm grafted by
module type and the SwiGLU gate grafted by pattern, in eager, torch.compile and torch.export."""

from __future__ import annotations

import pytest
import torch

import kernelgraft as kg
from kernelgraft.examples.rmsnorm import rmsnorm
from kernelgraft.examples.swiglu import swiglu, swiglu_pattern

from _hf_models import logits, tiny_llama

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402


def _no_compile_caches():
    """Inductor and AOTAutograd caches skip the post-grad pass on a hit (the pass's uuid is in the
    key, so a hit is a graph grafted alike); turn them off where a test counts the pass's work."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    return inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False)


def _kg_ops(graph) -> list[str]:
    return [str(n.target) for n in graph.nodes if "kgexamples" in str(n.target)]


@pytest.fixture
def grafted():
    model = tiny_llama()
    ids = torch.randint(0, 256, (2, 12))
    expected = logits(model, ids)
    inputs = ((ids,), {"use_cache": False})
    by_type = kg.graft(model, {LlamaRMSNorm: rmsnorm}, example_inputs=inputs)
    by_pattern = kg.graft(model, pattern=swiglu_pattern, replacement=swiglu, example_inputs=inputs)
    yield model, ids, expected, by_type, by_pattern
    kg.ungraft(model)
    torch._dynamo.reset()


def test_eager_logits_match_and_counts(grafted):
    model, ids, expected, by_type, by_pattern = grafted
    assert by_type.count == 5 and by_type.verified  # 2 per layer + the final norm
    assert by_pattern.count == 2 and by_pattern.verified  # one SwiGLU per layer
    torch.testing.assert_close(logits(model, ids), expected, atol=1e-5, rtol=1e-5)


def test_compile_fullgraph_has_no_graph_breaks(grafted):
    from torch._dynamo.utils import counters

    model, ids, expected, *_ = grafted
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    counters.clear()
    torch.testing.assert_close(logits(torch.compile(model, backend=backend, fullgraph=True), ids),
                               expected, atol=1e-5, rtol=1e-5)
    assert not counters["graph_break"] and len(graphs) == 1
    assert _kg_ops(graphs[0].graph).count("kgexamples.rmsnorm.default") == 5


def test_export_contains_both_ops(grafted):
    model, ids, expected, *_ = grafted
    with torch.no_grad():
        ep = torch.export.export(model, (ids,), {"use_cache": False})
    report = kg.graft(ep, pattern=swiglu_pattern, replacement=swiglu,
                      example_inputs=((ids,), {"use_cache": False}))
    ops = _kg_ops(ep.graph)
    assert report.count == 2
    assert ops.count("kgexamples.rmsnorm.default") == 5 and ops.count("kgexamples.swiglu.default") == 2
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(ids, use_cache=False).logits, expected, atol=1e-5, rtol=1e-5)


def test_inductor_runs_the_pattern_pass(grafted):
    """The one Inductor compile in the CPU suite: the generated code calls both ops."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    model, ids, expected, by_type, by_pattern = grafted
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True)
    a, b = _no_compile_caches()
    with torch.no_grad(), a, b:
        out, code = run_and_get_code(lambda: compiled(ids, use_cache=False).logits)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    text = "\n".join(code)
    assert "kgexamples.swiglu" in text and "kgexamples.rmsnorm" in text
    assert by_pattern.compiled == 2
    assert not counters["graph_break"]


def test_residual_add_and_norm_graft_as_one_op_by_pattern():
    """A two-output pattern: each residual add with the RMSNorm of its sum becomes one
    rmsnorm_residual call (the sum is also the next residual); the first layer's norm has no add
    before it and stays."""
    from kernelgraft.examples.rmsnorm_residual import add_rmsnorm_pattern, rmsnorm_residual

    model = tiny_llama()
    ids = torch.randint(0, 256, (2, 12))
    expected = logits(model, ids)
    report = kg.graft(model, pattern=add_rmsnorm_pattern, replacement=rmsnorm_residual,
                      example_inputs=((ids,), {"use_cache": False}))
    try:
        # counted and verified in Inductor's IR, the graph run eagerly after the rewrite
        assert report.count == 4 and report.verified  # 2 layers x 2 adds; the first norm has none
        torch.testing.assert_close(logits(model, ids), expected)  # eager: the model as written
        # torch.export's IR checks each .to() result with an assertion node: the rewrite sets
        # them aside while matching and puts back those whose value is still in the program
        ep = torch.export.export(model, (ids,), {"use_cache": False})
        asserts = sum("_assert_tensor_metadata" in str(n.target) for n in ep.graph.nodes)
        exported = kg.graft(ep, pattern=add_rmsnorm_pattern, replacement=rmsnorm_residual,
                            example_inputs=((ids,), {"use_cache": False}))
        assert exported.count == 4 and exported.verified
        assert _kg_ops(ep.graph).count("kgexamples.rmsnorm_residual.default") == 4
        left = sum("_assert_tensor_metadata" in str(n.target) for n in ep.graph.nodes)
        assert 0 < left < asserts
        torch.testing.assert_close(ep.module()(ids, use_cache=False).logits, expected, atol=1e-5, rtol=1e-5)
    finally:
        kg.ungraft(model)
        torch._dynamo.reset()


def test_training_graft_keeps_rmsnorm_without_backward():
    model = tiny_llama()
    with pytest.warns(kg.GraftWarning, match="no backward"):
        report = kg.graft(model, {LlamaRMSNorm: rmsnorm}, mode="training")
    assert report.count == 0 and len(report.kept) == 5


def test_swiglu_gradcheck_float64():
    gate = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    up = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(swiglu, (gate, up))
    out = swiglu(gate, up)
    assert "swiglu" in type(out.grad_fn).__name__  # the op's own backward, not a decomposition


# ---------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_reduce_overhead_logits(dtype):
    model = tiny_llama("cuda", dtype, hidden_size=256, intermediate_size=704, num_hidden_layers=2)
    ids = torch.randint(0, 256, (4, 64), device="cuda")
    expected = logits(model, ids)
    inputs = ((ids,), {"use_cache": False})
    try:
        kg.graft(model, {LlamaRMSNorm: rmsnorm}, example_inputs=inputs)
        report = kg.graft(model, pattern=swiglu_pattern, replacement=swiglu, example_inputs=inputs)
        torch._dynamo.reset()
        compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        a, b = _no_compile_caches()
        with a, b:
            for _ in range(3):  # warm-up, record, replay
                out = logits(compiled, ids)
        tol = 5e-2 if dtype == torch.bfloat16 else 1e-3
        torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)
        assert report.compiled >= 2
        ids2 = torch.randint(0, 256, (4, 64), device="cuda")
        torch.testing.assert_close(logits(compiled, ids2).float(), logits(model, ids2).float(),
                                   atol=tol, rtol=tol)
    finally:
        kg.ungraft(model)
        torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_swiglu_gradients_match_reference(dtype):
    gate = (torch.randn(64, 1000, device="cuda", dtype=dtype) * 3).requires_grad_()
    up = torch.randn(64, 1000, device="cuda", dtype=dtype).requires_grad_()
    grad = torch.randn(64, 1000, device="cuda", dtype=dtype)
    out = swiglu(gate, up)
    dg, du = torch.autograd.grad(out, (gate, up), grad)
    g64, u64 = gate.detach().double().requires_grad_(), up.detach().double().requires_grad_()
    ref = swiglu.reference(g64, u64)
    rg, ru = torch.autograd.grad(ref, (g64, u64), grad.double())
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    torch.testing.assert_close(dg.double(), rg, atol=tol, rtol=tol)
    torch.testing.assert_close(du.double(), ru, atol=tol, rtol=tol)


@pytest.mark.gpu
def test_gpu_training_graft_gradients_match():
    model = tiny_llama("cuda", torch.float32)
    model.train()
    ids = torch.randint(0, 256, (2, 32), device="cuda")

    def grads():
        model.zero_grad()
        model(ids, use_cache=False).logits.float().square().mean().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    want = grads()
    # SwiGLU is not a module in Llama: graft the pattern and train through torch.compile (Inductor);
    # matches whose inner values the backward saves are left alone, the rest use the op.
    report = kg.graft(model, pattern=swiglu_pattern, replacement=swiglu)
    try:
        torch._dynamo.reset()
        compiled = torch.compile(model)
        model.zero_grad()
        compiled(ids, use_cache=False).logits.float().square().mean().backward()
        got = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-3)
        assert report.pattern is not None
    finally:
        kg.ungraft(model)
        torch._dynamo.reset()


def test_compiled_grafted_llama_has_the_plain_models_guards_but_a_few():
    # Dynamo's guards run on every call of the compiled model, before its first kernel: on the
    # H200 the compiled grafted Llama, every op site inlined by Inductor, ran the plain model's
    # kernels in the same GPU time and still took 1-3% longer. With the grafted forward on each
    # instance it had ~25 more lines of guards per grafted norm (~20 us per forward on the CPU with
    # 4 layers; research/diag_graft_host.py).
    import copy

    def guards(model):
        torch._dynamo.reset()
        with torch.no_grad():
            explained = torch._dynamo.explain(model)(ids, use_cache=False)
        assert explained.graph_count == 1 and explained.graph_break_count == 0
        return len(explained.out_guards)

    plain = tiny_llama()
    grafted = copy.deepcopy(plain)
    ids = torch.randint(0, 256, (1, 4))
    assert kg.graft(grafted, {LlamaRMSNorm: rmsnorm}, example_inputs=((ids,), {"use_cache": False})).count == 5
    try:
        assert guards(grafted) - guards(plain) <= 8
    finally:
        kg.ungraft(grafted)
        torch._dynamo.reset()
