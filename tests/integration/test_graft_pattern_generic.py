"""Pattern grafts match the models users have: at the model's ranks and scalar values, with a
reason when they match nothing, and for ``torch.export`` through the ExportedProgram."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import kernelgraft as kg
from kernelgraft.examples.rmsnorm import rmsnorm


def _targets(ep) -> list[str]:
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


def _calls(ep, name: str) -> list[tuple]:
    return [n.args for n in ep.graph.nodes if n.op == "call_function" and name in str(n.target)]


def _layernorm_op(ndim=None):
    """A LayerNorm op whose samples are rank 2, as a user's first op would have them."""

    def samples(device="cpu", dtype=torch.float32):
        yield torch.randn(6, 32, device=device, dtype=dtype), torch.rand(32) + 0.5, torch.randn(32), 1e-5

    def layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], w, b, eps)

    return kg.op("kgtest_graft15::layernorm", sample_inputs=samples, ndim=ndim)(layernorm)


def _layernorm_pattern(x, w, b, eps):
    return F.layer_norm(x, x.shape[-1:], w, b, eps)


class _Norm(torch.nn.Module):
    """LayerNorm over ``dim`` written out by hand, then a tanh (so the norm is not the output)."""

    def __init__(self, d=32, eps=1e-5, dim=-1):
        super().__init__()
        self.w, self.b = torch.nn.Parameter(torch.rand(d) + 0.5), torch.nn.Parameter(torch.randn(d))
        self.eps, self.dim = eps, dim

    def forward(self, x):
        var, mean = torch.var_mean(x, dim=self.dim, correction=0, keepdim=True)
        return torch.tanh((x - mean) * torch.rsqrt(var + self.eps) * self.w + self.b)


def _rms_pattern(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


class _Rms(torch.nn.Module):
    def __init__(self, eps, d=32):
        super().__init__()
        self.w, self.eps = torch.nn.Parameter(torch.rand(d) + 0.5), eps

    def forward(self, x):
        h = (x ** 2).mean(dim=x.dim() - 1, keepdim=True)  # the last dim, spelled as a positive index
        return torch.tanh(x * torch.rsqrt(h + self.eps) * self.w)


# ---------------------------------------------------------------------------- ranks
@pytest.mark.parametrize("shape", [(2, 5, 32), (2, 3, 4, 32)], ids=["rank3", "rank4"])
def test_model_of_higher_rank_matches_a_pattern_whose_op_samples_are_rank_2(shape):
    """Inductor's decomposition of layer_norm reduces over [1] at rank 2 and [2] at rank 3: the
    pattern is traced again at the model's rank, and the op runs on the model's tensors."""
    op = _layernorm_op()
    torch.manual_seed(0)
    model, x = _Norm().eval(), torch.randn(shape)
    report = kg.graft(model, pattern=_layernorm_pattern, replacement=op, example_inputs=(x,))
    try:
        assert report.count == 1 and report.verified is True and report.reason is None
        ranks = {v.key.ranks[0] for v in report.pattern.variants("inductor")}
        assert 2 in ranks  # the op's sample rank is the base trace
    finally:
        kg.ungraft(model)


def test_rank_3_norm_over_another_dim_is_not_taken_for_the_rank_2_pattern():
    """At rank 2 the pattern reduces over dim 1 (its last); a rank-3 model reducing over dim 1
    (not its last) has the same ops and literals, and must not match."""
    op = _layernorm_op()
    model, x = _Norm(d=32, dim=1).eval(), torch.randn(2, 32, 32)
    with pytest.warns(kg.GraftWarning, match="matched nothing"):
        report = kg.graft(model, pattern=_layernorm_pattern, replacement=op, example_inputs=(x,))
    assert report.count == 0
    assert "aten.var_mean.correction" in report.reason and "dim=[1]" in report.reason


def test_rank_the_op_does_not_take_is_named_in_the_reason():
    op = _layernorm_op(ndim={"x": 2})
    model, x = _Norm().eval(), torch.randn(2, 5, 32)
    with pytest.warns(kg.GraftWarning, match="matched nothing"):
        report = kg.graft(model, pattern=_layernorm_pattern, replacement=op, example_inputs=(x,))
    assert report.count == 0
    assert "rank 3" in report.reason and "only at rank 2 (its ndim)" in report.reason


# ---------------------------------------------------------------------------- scalars
@pytest.mark.parametrize("model_eps", [1e-6, 1e-5, 1e-3])
def test_model_eps_is_read_from_the_model_and_passed_to_the_op(model_eps):
    """The pattern is traced with the op's sample eps (1e-6); every model eps matches and the op
    is called with the model's own, so the grafted program gives the model's numbers."""
    torch.manual_seed(0)
    model, x = _Rms(model_eps).eval(), torch.randn(2, 4, 32)
    ep = torch.export.export(model, (x,))
    report = kg.graft(ep, pattern=_rms_pattern, replacement=rmsnorm, example_inputs=(x,))
    assert report.count == 1 and report.verified is True
    (args,) = _calls(ep, "kgexamples.rmsnorm")
    assert args[2] == model_eps
    x2 = torch.randn(2, 4, 32)  # other values than the graft saw
    torch.testing.assert_close(ep.module()(x2), model(x2))


@pytest.mark.parametrize("model_eps", [1e-6, 1e-5])
def test_model_eps_in_inductor_ir(model_eps):
    torch.manual_seed(0)
    model, x = _Rms(model_eps).eval(), torch.randn(3, 32)
    sample = (torch.randn(4, 32), torch.rand(32) + 0.5, 1e-5)  # traced with another eps
    report = kg.graft(model, pattern=_rms_pattern, replacement=rmsnorm, pattern_inputs=sample,
                      example_inputs=(x,))
    try:
        assert report.count == 1 and report.verified is True
    finally:
        kg.ungraft(model)


def test_scalar_that_enters_through_a_computed_value_stays_fixed_and_says_so():
    def squared_eps(x, w, eps):  # the graph holds eps * eps, not eps
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps * eps) * w

    class M(torch.nn.Module):
        def forward(self, x, w):
            return torch.tanh(squared_eps(x, w, 1e-2))

    x, w = torch.randn(3, 32), torch.rand(32)
    ep = torch.export.export(M(), (x, w))
    sample = (torch.randn(4, 32), torch.rand(32), 1e-3)
    with pytest.warns(kg.GraftWarning, match="matched nothing"):
        report = kg.graft(ep, pattern=squared_eps, replacement=rmsnorm, pattern_inputs=sample, verify=False)
    assert "eps is fixed at 0.001" in report.reason and "computed value" in report.reason


# ---------------------------------------------------------------------------- reasons
def test_no_match_names_the_pattern_ops_and_the_closest_difference():
    class MeanOverFirst(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.rand(32))

        def forward(self, x):
            return torch.tanh(x * torch.rsqrt((x * x).mean(0, keepdim=True) + 1e-6) * self.w)

    x = torch.randn(2, 4, 32)
    ep = torch.export.export(MeanOverFirst(), (x,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = kg.graft(ep, pattern=_rms_pattern, replacement=rmsnorm)
    assert report.count == 0
    text = report.reason
    assert "aten.pow.Tensor_Scalar -> aten.mean.dim" in text  # what was looked for, in order
    assert "rank 3" in text and "closest site" in text
    assert any(text in str(w.message) and issubclass(w.category, kg.GraftWarning) for w in caught)
    assert text in str(report)


def test_no_match_in_an_unrelated_model_says_the_last_op_is_missing():
    ep = torch.export.export(torch.nn.ReLU(), (torch.randn(4, 32),))
    with pytest.warns(kg.GraftWarning, match="where the pattern ends"):
        report = kg.graft(ep, pattern=_rms_pattern, replacement=rmsnorm)
    assert report.count == 0 and "aten.mul.Tensor" in report.reason


# ---------------------------------------------------------------------------- export
def test_grafting_the_module_does_not_reach_torch_export_grafting_the_program_does():
    """A pattern graft on an nn.Module is an Inductor pass: ``torch.export(module)`` afterwards
    holds the original ops. Grafting the ExportedProgram puts the op into the program."""
    torch.manual_seed(0)
    model, x = _Rms(1e-5).eval(), torch.randn(2, 4, 32)
    report = kg.graft(model, pattern=_rms_pattern, replacement=rmsnorm, example_inputs=(x,))
    try:
        assert report.count == 1
        ep = torch.export.export(model, (x,))
        assert not _calls(ep, "kgexamples.rmsnorm")
    finally:
        kg.ungraft(model)
    assert kg.graft(ep, pattern=_rms_pattern, replacement=rmsnorm, example_inputs=(x,)).count == 1
    assert _calls(ep, "kgexamples.rmsnorm") and "aten.rsqrt.default" not in _targets(ep)
    torch.testing.assert_close(ep.module()(x), model(x))


def test_int_scalar_is_a_wildcard_too():
    def scale_shift(x: torch.Tensor, k: int) -> torch.Tensor:
        return torch.relu(x * k + 1)

    op = kg.op("kgtest_graft15::scale_shift", sample_inputs=lambda device="cpu", dtype=torch.float32:
               iter([(torch.randn(4, 8, device=device, dtype=dtype), 3)]))(scale_shift)

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x * 5 + 1).sum(-1)

    x = torch.randn(2, 4, 8)
    ep = torch.export.export(M(), (x,))
    assert kg.graft(ep, pattern=scale_shift, replacement=op, example_inputs=(x,)).count == 1
    assert [args[1] for args in _calls(ep, "kgtest_graft15.scale_shift")] == [5]
    torch.testing.assert_close(ep.module()(x), M()(x))


def test_shape_in_the_pattern_points_to_pattern_inputs():
    """``layer_norm`` in export IR carries its normalized_shape: traced at the op's sample width
    (32) it differs from a model of width 64, and the reason says to pass pattern_inputs."""
    op = _layernorm_op()
    model, x = torch.nn.LayerNorm(64).eval(), torch.randn(2, 5, 64)
    ep = torch.export.export(model, (x,))
    with pytest.warns(kg.GraftWarning, match="pattern_inputs"):
        report = kg.graft(ep, pattern=_layernorm_pattern, replacement=op)
    assert report.count == 0 and "normalized_shape=[32]" in report.reason
    at_width = (torch.randn(4, 64), torch.rand(64) + 0.5, torch.randn(64), 1e-5)
    report = kg.graft(ep, pattern=_layernorm_pattern, replacement=op, pattern_inputs=at_width,
                      example_inputs=(x,))
    assert report.count == 1 and _calls(ep, "kgtest_graft15.layernorm")
    torch.testing.assert_close(ep.module()(x), model(x))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_rank3_model_eps_reaches_the_kernel(dtype):
    """On the GPU the admission check runs the op's kernel on the model's device and dtype."""
    torch.manual_seed(0)
    model = _Rms(1e-5, d=256).to("cuda", dtype).eval()
    x = torch.randn(2, 7, 256, device="cuda", dtype=dtype)
    ep = torch.export.export(model, (x,))
    report = kg.graft(ep, pattern=_rms_pattern, replacement=rmsnorm, example_inputs=(x,))
    assert report.count == 1 and report.verified is True
    assert [args[2] for args in _calls(ep, "kgexamples.rmsnorm")] == [1e-5]
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), model(x), rtol=2e-2, atol=2e-2)
