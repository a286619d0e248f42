"""kg.graft by module type: attribute binding, signature checks, modes, verification, ungraft."""

from __future__ import annotations

import warnings

import pytest
import torch

import kernelgraft as kg
from kernelgraft.examples.rmsnorm import rmsnorm
from kernelgraft.examples.swiglu import swiglu


class MyRMSNorm(torch.nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        h = hidden_states.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(hidden_states.dtype)


class OffsetNorm(MyRMSNorm):
    """Gemma-style (1 + weight): not what rmsnorm computes."""

    def forward(self, hidden_states):
        h = hidden_states.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (1 + self.weight) * h


class Gate(torch.nn.Module):
    def forward(self, gate, up):
        return torch.nn.functional.silu(gate) * up


class Net(torch.nn.Module):
    def __init__(self, n=32):
        super().__init__()
        self.lin = torch.nn.Linear(n, 2 * n)
        self.norm1 = MyRMSNorm(n)
        self.norm2 = MyRMSNorm(n, eps=1e-5)
        self.gate = Gate()

    def forward(self, x):
        h = self.norm1(x)
        g, u = self.lin(h).chunk(2, dim=-1)
        return self.norm2(self.gate(g, u))


def _ops_in(fn, *args) -> set[str]:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return {str(n.target) for g in graphs for n in g.graph.nodes if "kgexamples" in str(n.target)}


def test_graft_replaces_binds_attributes_and_ungrafts():
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(4, 7, 32)
    with torch.no_grad():
        expected = net(x)
    report = kg.graft(net, {MyRMSNorm: rmsnorm}, example_inputs=(x,))
    assert report.count == 2 and set(report.replaced) == {"norm1", "norm2"}
    assert report.verified is True
    with torch.no_grad():
        torch.testing.assert_close(net(x), expected, atol=1e-5, rtol=1e-5)
        assert _ops_in(net, x) == {"kgexamples.rmsnorm.default"}
    # the attribute is read at call time: a changed eps reaches the op
    net.norm2.variance_epsilon = 0.5
    with torch.no_grad():
        h = net.gate(*net.lin(net.norm1(x)).chunk(2, dim=-1))
        torch.testing.assert_close(net.norm2(h), rmsnorm.reference(h, net.norm2.weight, 0.5))
    net.norm2.variance_epsilon = 1e-5
    assert kg.ungraft(net) == 2
    assert "forward" not in net.norm1.__dict__
    with torch.no_grad():
        assert _ops_in(net, x) == set()
        torch.testing.assert_close(net(x), expected)


def test_graft_by_class_name_and_explicit_mapping():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale_vec = torch.nn.Parameter(torch.randn(16))
            self.tiny = 1e-3

        def forward(self, x):
            return rmsnorm.reference(x, self.scale_vec, self.tiny)

    m = torch.nn.Sequential(Odd())
    x = torch.randn(3, 16)
    with pytest.raises(kg.SpecError, match="'weight'.*has no source"):
        kg.graft(m, {"Odd": rmsnorm}, example_inputs=(x,))
    report = kg.graft(m, {"Odd": (rmsnorm, {"weight": "scale_vec", "eps": "tiny"})}, example_inputs=(x,))
    assert report.count == 1
    with torch.no_grad():
        torch.testing.assert_close(m(x), rmsnorm.reference(x, m[0].scale_vec, 1e-3))


def test_incompatible_forward_is_refused():
    class TwoInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(8))
            self.eps = 1e-6

        def forward(self, x, residual):
            return rmsnorm.reference(x + residual, self.weight, self.eps)

    with pytest.raises(kg.SpecError, match="'residual' is required"):
        kg.graft(torch.nn.Sequential(TwoInputs()), {TwoInputs: rmsnorm})


def test_verification_failure_keeps_the_original():
    torch.manual_seed(1)
    m = torch.nn.Sequential(OffsetNorm(32))
    x = torch.randn(5, 32)
    with pytest.warns(kg.GraftWarning, match="verification failed"):
        report = kg.graft(m, {OffsetNorm: rmsnorm}, example_inputs=(x,))
    assert report.count == 0 and "0" in report.kept
    assert "forward" not in m[0].__dict__


def test_verification_without_example_inputs_uses_op_samples():
    m = torch.nn.Sequential(MyRMSNorm(64))  # rmsnorm has a (5, 64) sample
    report = kg.graft(m, {MyRMSNorm: rmsnorm})
    assert report.verified is True and report.count == 1
    bad = torch.nn.Sequential(OffsetNorm(64))
    with pytest.warns(kg.GraftWarning, match="verification failed"):
        assert kg.graft(bad, {OffsetNorm: rmsnorm}).count == 0


def test_training_mode_needs_a_backward():
    net = Net()
    with pytest.warns(kg.GraftWarning, match="no backward"):
        report = kg.graft(net, {MyRMSNorm: rmsnorm, Gate: swiglu}, mode="training")
    assert set(report.replaced) == {"gate"} and set(report.kept) == {"norm1", "norm2"}
    # gradients through the grafted op equal the original's
    x = torch.randn(3, 32, requires_grad=True)
    out = net(x)
    assert _ops_in(net, x) == {"kgexamples.swiglu.default"}
    out.square().sum().backward()
    grads = [p.grad.clone() for p in net.parameters()] + [x.grad.clone()]
    kg.ungraft(net)
    net.zero_grad()
    x.grad = None
    net(x).square().sum().backward()
    for got, want in zip(grads, [p.grad for p in net.parameters()] + [x.grad]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_inference_mode_runs_the_original_when_gradients_are_needed():
    norm = MyRMSNorm(64)
    kg.graft(torch.nn.Sequential(norm), {MyRMSNorm: rmsnorm})
    x = torch.randn(2, 64)
    with pytest.warns(kg.GraftWarning, match="gradients are enabled"):
        out = norm(x)
    assert out.grad_fn is not None and "Mul" in type(out.grad_fn).__name__  # the original ran
    with torch.no_grad():
        assert _ops_in(norm, x) == {"kgexamples.rmsnorm.default"}


def test_compiled_grafted_model_has_no_graph_breaks():
    from torch._dynamo.utils import counters

    net = Net().eval()
    kg.graft(net, {MyRMSNorm: rmsnorm, Gate: swiglu})
    x = torch.randn(2, 5, 32)
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        out = torch.compile(net, backend="aot_eager", fullgraph=True)(x)
        torch.testing.assert_close(out, net(x))
    assert not counters["graph_break"]
    assert counters["stats"]["unique_graphs"] == 1


def test_regraft_is_refused_until_ungrafted():
    m = torch.nn.Sequential(MyRMSNorm(64))
    kg.graft(m, {MyRMSNorm: rmsnorm})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = kg.graft(m, {MyRMSNorm: rmsnorm})
    assert report.count == 0 and "already grafted" in report.kept["0"]
    assert any(issubclass(w.category, kg.GraftWarning) for w in caught)
    kg.ungraft(m)
    assert kg.graft(m, {MyRMSNorm: rmsnorm}).count == 1
