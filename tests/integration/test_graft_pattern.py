"""kg.graft(pattern=..., replacement=op): matching in export IR and Inductor IR, counts, checks."""

from __future__ import annotations

import pytest
import torch

import kernelgraft as kg
from kernelgraft.examples.add_relu import add_relu
from kernelgraft.examples.rmsnorm import rmsnorm
from kernelgraft.examples.swiglu import swiglu, swiglu_pattern
from kernelgraft.graft import pattern as _pattern


def _targets(ep) -> list[str]:
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


class AddRelu2(torch.nn.Module):
    def forward(self, a, b, c):
        return torch.relu(a + b) * torch.relu(c + a) + torch.relu(b + c)


def test_exported_program_rewrite_counts_and_matches():
    a, b, c = (torch.randn(6, 9) for _ in range(3))
    ep = torch.export.export(AddRelu2(), (a, b, c))
    report = kg.graft(ep, pattern=lambda x, y: torch.relu(x + y), replacement=add_relu,
                      example_inputs=(a, b, c))
    assert report.count == 3 and report.verified is True and report.program is ep
    assert _targets(ep).count("kgexamples.add_relu.default") == 3
    assert "aten.relu.default" not in _targets(ep)
    torch.testing.assert_close(ep.module()(a, b, c), AddRelu2()(a, b, c))


def test_pattern_output_that_is_the_program_output_keeps_the_signature():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x + y)

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    ep = torch.export.export(M(), (x, y))
    assert kg.graft(ep, pattern=lambda p, q: torch.relu(p + q), replacement=add_relu).count == 1
    out_names = [s.arg.name for s in ep.graph_signature.output_specs]
    graph_outs = [n.name for n in next(n for n in ep.graph.nodes if n.op == "output").args[0]]
    assert out_names == graph_outs
    torch.testing.assert_close(ep.module()(x, y), torch.relu(x + y))


def test_spelling_does_not_matter_and_eps_is_the_models():
    def pattern(x, w, eps):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)

    class Model(torch.nn.Module):
        def __init__(self, eps):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(32))
            self.eps = eps

        def forward(self, x):
            h = (x ** 2).mean(dim=-1, keepdim=True)  # same ops as .pow(2).mean(-1, keepdim=True)
            return torch.tanh(x * torch.rsqrt(h + self.eps) * self.w)

    x = torch.randn(3, 32)
    sample = (torch.randn(4, 32), torch.randn(32), 1e-6)
    for eps in (1e-6, 1e-5):  # the pattern is traced with 1e-6; the op gets the model's eps
        model = Model(eps)
        ep = torch.export.export(model, (x,))
        report = kg.graft(ep, pattern=pattern, replacement=rmsnorm, pattern_inputs=sample, example_inputs=(x,))
        assert report.count == 1 and report.verified is True
        assert [n.args[2] for n in ep.graph.nodes if "rmsnorm" in str(n.target)] == [eps]
        torch.testing.assert_close(ep.module()(x), model(x))


def test_bf16_graph_matches_a_pattern_given_fp32_examples():
    class M(torch.nn.Module):
        def forward(self, g, u):
            return torch.nn.functional.silu(g) * u + 1

    g, u = torch.randn(5, 8, dtype=torch.bfloat16), torch.randn(5, 8, dtype=torch.bfloat16)
    ep = torch.export.export(M(), (g, u))
    assert kg.graft(ep, pattern=swiglu_pattern, replacement=swiglu, example_inputs=(g, u)).count == 1


def test_pattern_that_differs_from_the_op_is_refused():
    with pytest.raises(kg.VerificationError, match="differ"):
        kg.graft(torch.nn.Identity(), pattern=lambda x, y: torch.relu(x - y), replacement=add_relu)


def test_module_pattern_counts_in_inductor_ir_and_uninstalls():
    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.g = torch.nn.Linear(16, 16)
            self.u = torch.nn.Linear(16, 16)

        def forward(self, x):
            return torch.nn.functional.silu(self.g(x)) * self.u(x) + torch.nn.functional.silu(x * 2) * x

    model = MLP().eval()
    report = kg.graft(model, pattern=swiglu_pattern, replacement=swiglu, example_inputs=(torch.randn(3, 16),))
    assert report.count == 2 and report.verified is True
    import torch._inductor.config as config

    assert _pattern._SLOT.installed()
    uuid = config.post_grad_custom_pre_pass.uuid()
    assert uuid is not None and report.pattern.uuid in uuid[2]
    assert kg.ungraft(model) == 1
    assert config.post_grad_custom_pre_pass is None and not _pattern.active()


def test_pattern_inside_saved_activations_is_not_replaced_in_training_graphs():
    """After autograd the backward needs silu's input and output; a match must not hide them."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.decomposition import select_decomp_table

    pat = _pattern.Pattern(swiglu_pattern, swiglu, (torch.randn(4, 8), torch.randn(4, 8)))
    counts = []

    def fw(gm, _):
        counts.append(_pattern.rewrite_graph(gm.graph, [pat], "inductor")[0])
        gm.recompile()
        return make_boxed_func(gm.forward)

    g = torch.randn(4, 8, requires_grad=True)
    u = torch.randn(4, 8, requires_grad=True)
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: (swiglu_pattern(a, b) * 2).sum(),
                      backend=aot_autograd(fw_compiler=fw, decompositions=select_decomp_table()))
    f(g, u).backward()
    assert counts and sum(counts) == 0
    torch.testing.assert_close(g.grad, torch.func.grad(lambda a: (swiglu_pattern(a, u) * 2).sum())(g))


def _add_rmsnorm(x, residual, weight, eps):
    """A residual add and the RMSNorm of its result, as a float32 decoder layer writes them."""
    h = x + residual
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight, h


class _Blocks(torch.nn.Module):
    """Two residual blocks: each sum is used again (the next residual), each norm feeds a layer."""

    def __init__(self, d=64):
        super().__init__()
        self.w1, self.w2 = (torch.nn.Parameter(torch.rand(d) + 0.5) for _ in range(2))
        self.f1, self.f2 = torch.nn.Linear(d, d), torch.nn.Linear(d, d)

    def forward(self, x, r):
        n1, h1 = _add_rmsnorm(self.f1(x), r, self.w1, 1e-6)
        n2, h2 = _add_rmsnorm(self.f2(n1), h1, self.w2, 1e-6)
        return n2 * 2, h2


def test_tuple_pattern_rewrites_exported_program():
    """A pattern with two outputs (the norm and the sum) becomes one call of an op returning both:
    every outside use of either output reads the op's result; the program still matches."""
    from kernelgraft.examples.rmsnorm_residual import rmsnorm_residual

    torch.manual_seed(0)
    model, x, r = _Blocks().eval(), torch.randn(5, 64), torch.randn(5, 64)
    ep = torch.export.export(model, (x, r))
    report = kg.graft(ep, pattern=_add_rmsnorm, replacement=rmsnorm_residual, example_inputs=(x, r))
    assert report.count == 2 and report.verified is True
    assert _targets(ep).count("kgexamples.rmsnorm_residual.default") == 2
    assert "aten.rsqrt.default" not in _targets(ep)
    out_names = [s.arg.name for s in ep.graph_signature.output_specs]
    assert out_names == [n.name for n in next(n for n in ep.graph.nodes if n.op == "output").args[0]]
    x2, r2 = torch.randn(5, 64), torch.randn(5, 64)
    for got, want in zip(ep.module()(x2, r2), model(x2, r2)):
        torch.testing.assert_close(got, want)


def test_tuple_pattern_in_inductor_ir_counts_and_runs():
    from kernelgraft.examples.rmsnorm_residual import rmsnorm_residual

    torch.manual_seed(0)
    model, x, r = _Blocks().eval(), torch.randn(5, 64), torch.randn(5, 64)
    report = kg.graft(model, pattern=_add_rmsnorm, replacement=rmsnorm_residual, example_inputs=(x, r))
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    try:
        assert report.count == 2 and report.verified is True
        torch._dynamo.reset()
        # a compile-cache hit would skip the post-grad pass (and so its count)
        with torch.no_grad(), inductor_config.patch(fx_graph_cache=False), \
                functorch_config.patch(enable_autograd_cache=False):
            got, code = run_and_get_code(lambda: torch.compile(model)(x, r))
        for g, w in zip(got, model(x, r)):
            torch.testing.assert_close(g, w)
        assert report.compiled == 2 and "kgexamples.rmsnorm_residual" in "\n".join(code)
    finally:
        kg.ungraft(model)


def test_tuple_pattern_output_count_must_match_the_op():
    with pytest.raises(kg.SpecError, match="returns 2 tensor"):
        kg.graft(torch.nn.Identity(), pattern=lambda x, y: (torch.relu(x + y), x + y), replacement=add_relu)


# ---------------------------------------------------------------- checks run kernels, not PyTorch
def _wrong_in_float64_op(name: str):
    """An op whose reference is right and whose one kernel is wrong on float64 (3x, not 2x)."""
    from _tune_ops import CONFIGS, _scale_kernel

    def launch(x, out, *, BLOCK):
        factor = 3.0 if x.dtype == torch.float64 else 2.0
        _scale_kernel[(-(-x.numel() // BLOCK),)](x, out, x.numel(), factor, BLOCK=BLOCK)

    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    return kg.op(double, name=name, impls=[kg.triton(launch, configs=CONFIGS)])


def _eager_wins(trial, settings):
    trial.run(0)
    return 0.1 if trial.candidate.label == "torch:eager" else 1.0


@pytest.fixture
def _competing(tmp_path, monkeypatch):
    """PyTorch competes and wins every key it can (fake timer); compiles and tuning-cache writes are
    recorded. Yields the list of compiles."""
    from kernelgraft.op import compete as _compete

    if not __import__("os").environ.get("TRITON_INTERPRET"):
        pytest.skip("the kernel runs on the CPU through Triton's interpreter")
    compiles: list = []
    monkeypatch.setattr(_compete, "compile_reference", lambda fn: compiles.append(fn) or fn)
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "cache"))
    kg.tune.clear()
    with kg.tune("on", timer=_eager_wins, compete=True):
        yield compiles
    kg.tune.clear()


def test_pattern_check_runs_a_kernel_even_where_pytorch_would_win(_competing):
    op = _wrong_in_float64_op("kgtest::graft_wrong_check")
    x = torch.randn(64, 32, dtype=torch.float64)
    with pytest.raises(kg.VerificationError, match="differ"):
        kg.graft(torch.nn.Identity(), pattern=lambda t: t * 2, replacement=op, pattern_inputs=(x,))
    assert _competing == []  # no torch.compile of the reference
    assert not (kg.tune.TUNER.disk.path and kg.tune.TUNER.disk.path.exists())  # nothing tuned to disk


def test_admission_runs_a_kernel_even_where_pytorch_would_win(_competing):
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.tanh(x * 2)

    op = _wrong_in_float64_op("kgtest::graft_wrong_admit")
    x = torch.randn(8, 16, dtype=torch.float64)  # the pattern's float32 example is right
    ep = torch.export.export(M(), (x,))
    with pytest.warns(kg.GraftWarning):
        report = kg.graft(ep, pattern=lambda t: t * 2, replacement=op,
                          pattern_inputs=(torch.randn(8, 16),), example_inputs=(x,))
    assert report.count == 0
    assert any("differ" in why for why in report.kept.values()), report.kept
    assert "kgtest.graft_wrong_admit.default" not in _targets(ep)
    assert _competing == []
    assert not (kg.tune.TUNER.disk.path and kg.tune.TUNER.disk.path.exists())


def _relu_sum(x, y):
    return torch.relu(x + y)


class _ReluSum(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y) * 2


def test_a_pattern_graft_ends_with_its_model_as_in_a_re_run_notebook_cell():
    # each run of the cell builds a new model and grafts it; the old model's pattern must stop
    # acting on every later compile once the model is gone (nothing could ungraft it any more)
    import gc

    before = _pattern.active()
    for _ in range(3):
        model = _ReluSum()
        kg.graft(model, pattern=_relu_sum, replacement=add_relu, verify=False)
    gc.collect()
    assert len([p for p in _pattern.active() if p not in before]) == 1
    assert kg.ungraft(model) == 1
    assert _pattern.active() == before


def test_a_pattern_graft_on_a_bound_method_belongs_to_its_object():
    model = _ReluSum()
    before = _pattern.active()
    kg.graft(model.forward, pattern=_relu_sum, replacement=add_relu, verify=False)
    import gc

    gc.collect()  # the bound method object is gone; the graft stays with the model
    assert len(_pattern.active()) == len(before) + 1
    assert kg.ungraft(model.forward) == 1 and _pattern.active() == before


@pytest.mark.parametrize("bad", [None, "model", [torch.nn.Linear(2, 2)], {"a": 1}], ids=["none", "str", "list", "dict"])
def test_ungraft_of_something_kg_graft_never_takes_says_what_it_expected(bad):
    with pytest.raises(kg.SpecError, match="kg.ungraft: expected the nn.Module or function given to kg.graft"):
        kg.ungraft(bad)


@pytest.mark.parametrize("how", ["unregister", "replace"])
def test_a_pattern_graft_stops_when_its_op_no_longer_holds_the_name(how):
    # the graft was verified against that op: after kg.unregister every later compile failed, and
    # after replace=True an unrelated compiled function silently computed the new op's code
    @kg.op(f"tgp_{how}::addrelu")
    def addrelu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + y)

    model = _ReluSum()
    kg.graft(model, pattern=_relu_sum, replacement=addrelu, pattern_inputs=(torch.randn(4, 8), torch.randn(4, 8)),
             verify=False)
    if how == "unregister":
        kg.unregister(addrelu.name)
    else:
        @kg.op(f"tgp_{how}::addrelu", replace=True)
        def addrelu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # noqa: F811
            return torch.relu(x - y)

    def f(a, b):
        return torch.relu(a + b) * 2

    a, b = torch.randn(4, 8), torch.randn(4, 8)
    torch._dynamo.reset()
    try:
        with pytest.warns(kg.GraftWarning, match="no longer acts"):
            out = torch.compile(f)(a, b)
        torch.testing.assert_close(out, f(a, b))
    finally:
        kg.ungraft(model)
        torch._dynamo.reset()


def test_ungraft_lets_the_pattern_go():
    import gc
    import weakref

    model = _ReluSum()
    kg.graft(model, pattern=_relu_sum, replacement=add_relu, verify=False)
    pattern = weakref.ref(_pattern.active()[-1])
    assert kg.ungraft(model) == 1
    gc.collect()
    assert pattern() is None  # the model's finalizer no longer holds it
