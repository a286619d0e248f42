"""In-place patterns: patterns and models are matched in functional form, so a pattern written with
``/=``, ``relu_`` or ``add_`` matches the code it matches written out of place (and the other way
round); a pattern whose in-place step cannot be read as data flow is a SpecError that says so."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import kernelgraft as kg
from kernelgraft.examples.add_relu import add_relu

from _hf_models import logits, tiny_mixtral


# ---------------------------------------------------------------------------- a top-k router op
@triton.jit
def _router_kernel(logits_ptr, w_ptr, idx_ptr, E, K: tl.constexpr, BLOCK_E: tl.constexpr):
    # One program per token: softmax over the experts in float32, then K rounds of "take the
    # largest, mask it out"; the weights are normalised by their sum.
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    mask = offs < E
    x = tl.load(logits_ptr + row * E + offs, mask=mask, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = tl.where(mask, p / tl.sum(p, axis=0), -1.0)
    total = 0.0
    q = p
    for _ in tl.static_range(K):
        best = tl.max(q, axis=0)
        total += best
        q = tl.where(offs == tl.argmax(q, axis=0), -1.0, q)
    for j in tl.static_range(K):
        best = tl.max(p, axis=0)
        i = tl.argmax(p, axis=0)
        tl.store(w_ptr + row * K + j, best / total)
        tl.store(idx_ptr + row * K + j, i.to(tl.int64))
        p = tl.where(offs == i, -1.0, p)


def _launch_router(logits, top_k, weights, indices):
    tokens, experts = logits.shape
    _router_kernel[(tokens,)](logits, weights, indices, experts, K=top_k,
                              BLOCK_E=triton.next_power_of_2(experts))


def _router_fits(logits, top_k, **config):
    if logits.dim() != 2 or logits.dtype != torch.float32:
        return "logits must be [tokens, experts] float32"
    if not 1 <= top_k <= logits.shape[1] <= 1024:
        return f"top_k={top_k} with {logits.shape[1]} experts"
    return True


def router_pattern(router_logits, top_k: int):
    """Mixtral's router as transformers 5 writes it (``MixtralTopKRouter.forward``): softmax in
    float, top-k, the top-k weights normalised in place."""
    router_probs = torch.nn.functional.softmax(router_logits.float(), dim=-1)
    router_top_value, router_indices = torch.topk(router_probs, top_k, dim=-1)
    router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
    return router_top_value, router_indices


@kg.op("kgtest_inplace::router", impls=[kg.triton(_launch_router, configs=[{}], supports=_router_fits)])
def router(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-k softmax weights normalised to sum 1, their expert indices) per token."""
    probs = F.softmax(router_logits.float(), dim=-1)
    weights, indices = torch.topk(probs, top_k, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), indices


_ROUTER_EXAMPLE = (torch.randn(10, 8), 2)


class RouterBlock(torch.nn.Module):
    """The router's part of a Mixtral MoE block, with its expert mixing reduced to a weighted
    sum of per-expert scales (enough to make wrong weights or indices change the output)."""

    def __init__(self, hidden=16, experts=8, top_k=2, in_place=True):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(experts, hidden))
        self.scale = torch.nn.Parameter(torch.randn(experts))
        self.top_k, self.in_place = top_k, in_place

    def forward(self, h):
        logits = F.linear(h, self.weight)
        probs = F.softmax(logits.float(), dim=-1)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        if self.in_place:
            top /= top.sum(dim=-1, keepdim=True)
        else:
            top = top / top.sum(dim=-1, keepdim=True)
        return h * (top * self.scale[idx]).sum(-1, keepdim=True)


@pytest.mark.parametrize("in_place", [True, False], ids=["model-in-place", "model-out-of-place"])
@pytest.mark.parametrize("ir", ["export", "module"])
def test_router_pattern_written_in_place_grafts(in_place, ir):
    """The in-place pattern matches either spelling of the model, in an exported program and in
    a module (its graph compiled as Inductor would, run eagerly after the rewrite), and verifies."""
    torch.manual_seed(0)
    model = RouterBlock(in_place=in_place)
    h = torch.randn(12, 16)
    want = model(h)
    target = torch.export.export(model, (h,)) if ir == "export" else model
    report = kg.graft(target, pattern=router_pattern, replacement=router, pattern_inputs=_ROUTER_EXAMPLE,
                      example_inputs=(h,))
    try:
        assert report.count == 1 and report.verified and not report.kept
        if ir == "export":
            torch.testing.assert_close(target.module()(h), want)
    finally:
        kg.ungraft(model)
        torch._dynamo.reset()


# ---------------------------------------------------------------------------- spellings x IRs
def p_out_of_place(x, y):
    return torch.relu(x + y)


def p_relu_(x, y):
    h = x + y
    h.relu_()
    return h


def p_writes_its_argument(x, y):
    x.add_(y)  # what a pattern writes into its own arguments is not what it returns
    return torch.relu(x)


class Out(torch.nn.Module):
    def forward(self, a, b):
        return torch.relu(a + b) * 2


class ReluInPlace(torch.nn.Module):
    def forward(self, a, b):
        h = a + b
        h.relu_()
        g = h * 2
        g.mul_(3)  # an in-place step outside the pattern
        return g


@pytest.mark.parametrize("pattern", [p_out_of_place, p_relu_], ids=lambda f: f.__name__)
@pytest.mark.parametrize("model_cls", [Out, ReluInPlace], ids=lambda c: c.__name__)
@pytest.mark.parametrize("ir", ["export", "module"])
def test_in_place_and_out_of_place_spellings_match_alike(pattern, model_cls, ir):
    a, b = torch.randn(6, 9), torch.randn(6, 9)
    want = model_cls()(a.clone(), b.clone())
    model = model_cls()
    target = torch.export.export(model, (a, b)) if ir == "export" else model
    report = kg.graft(target, pattern=pattern, replacement=add_relu, example_inputs=(a, b))
    try:
        assert report.count == 1 and report.verified
        if ir == "export":
            targets = [str(n.target) for n in target.graph.nodes if n.op == "call_function"]
            assert "kgexamples.add_relu.default" in targets
            # the program's own in-place step, outside the match, is left in place
            assert ("aten.mul_.Tensor" in targets) == (model_cls is ReluInPlace)
            torch.testing.assert_close(target.module()(a, b), want)
    finally:
        kg.ungraft(model)
        torch._dynamo.reset()


def test_a_pattern_that_writes_its_argument_matches_what_it_returns():
    class M(torch.nn.Module):
        def forward(self, a, b):
            return torch.relu(a + b) - 1

    a, b = torch.randn(4, 5), torch.randn(4, 5)
    ep = torch.export.export(M(), (a, b))
    report = kg.graft(ep, pattern=p_writes_its_argument, replacement=add_relu, example_inputs=(a, b))
    assert report.count == 1 and report.verified
    torch.testing.assert_close(ep.module()(a, b), M()(a, b))


def test_a_write_seen_through_a_view_keeps_the_site():
    """The model reads h's relu through a view taken before the write: the write stays in place,
    and the pattern (relu out of place) does not match across it."""
    class M(torch.nn.Module):
        def forward(self, a, b):
            h = a + b
            v = h.view(-1)
            h.relu_()
            return v * 2

    a, b = torch.randn(4, 5), torch.randn(4, 5)
    ep = torch.export.export(M(), (a, b))
    with pytest.warns(kg.GraftWarning):
        report = kg.graft(ep, pattern=p_relu_, replacement=add_relu, example_inputs=(a, b))
    assert report.count == 0
    assert "aten.relu_.default" in [str(n.target) for n in ep.graph.nodes]
    torch.testing.assert_close(ep.module()(a, b), M()(a, b))


@kg.op("kgtest_inplace::add_relu_head")
def add_relu_head(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    h = x + y
    h[:, :2].relu_()
    return h


def test_a_write_through_a_view_in_an_export_pattern_is_a_spec_error():
    """torch.export's graph keeps ``h[:, :2].relu_()`` as a write nothing reads: read as data
    flow, the pattern would be ``x + y``. It cannot be matched, and says so."""
    class M(torch.nn.Module):
        def forward(self, a, b):
            return add_relu_head.reference(a, b) * 2

    a, b = torch.randn(4, 5), torch.randn(4, 5)
    ep = torch.export.export(M(), (a, b))
    with pytest.raises(kg.SpecError, match="in place"):
        kg.graft(ep, pattern=add_relu_head.reference, replacement=add_relu_head,
                 pattern_inputs=(a, b))
    torch.testing.assert_close(ep.module()(a, b), M()(a, b))


# ---------------------------------------------------------------------------- Mixtral
def test_mixtral_router_written_in_place_grafts_and_compiled_logits_match():
    """transformers' Mixtral router normalises its top-k weights with ``/=``: the pattern, written
    as Mixtral writes it, replaces the router, and Inductor's code runs the op."""
    pytest.importorskip("transformers")
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    model = tiny_mixtral()
    ids = torch.randint(0, 128, (2, 9))
    expected = logits(model, ids)
    report = kg.graft(model, pattern=router_pattern, replacement=router, pattern_inputs=_ROUTER_EXAMPLE,
                      example_inputs=((ids,), {"use_cache": False}))
    try:
        assert report.count == 1 and report.verified and not report.kept
        torch._dynamo.reset()
        compiled = torch.compile(model)
        with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
            got = logits(compiled, ids)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        assert report.compiled == 1
    finally:
        kg.ungraft(model)
        torch._dynamo.reset()


@pytest.mark.gpu
def test_gpu_mixtral_router_grafts_and_compiles():
    pytest.importorskip("transformers")
    model = tiny_mixtral("cuda", num_hidden_layers=2, num_local_experts=16, num_experts_per_tok=4)
    ids = torch.randint(0, 128, (4, 33), device="cuda")
    expected = logits(model, ids)
    report = kg.graft(model, pattern=router_pattern, replacement=router,
                      pattern_inputs=(torch.randn(10, 16, device="cuda"), 4),
                      example_inputs=((ids,), {"use_cache": False}))
    try:
        assert report.count == 2 and report.verified
        torch._dynamo.reset()
        got = logits(torch.compile(model), ids)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    finally:
        kg.ungraft(model)
        torch._dynamo.reset()
