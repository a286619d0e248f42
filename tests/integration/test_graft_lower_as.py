"""kg.lower_as: functions and module forwards run the op in eager, compile and export."""

from __future__ import annotations

import pytest
import torch

import kernelgraft as kg
from kernelgraft.examples.add_relu import add_relu
from kernelgraft.examples.rmsnorm import rmsnorm


def _graph_targets(gm: torch.fx.GraphModule) -> set[str]:
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def _dynamo_graph(fn, *args):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    assert len(graphs) == 1
    return out, graphs[0]


def test_function_runs_the_op_in_eager_compile_and_export():
    @kg.lower_as(add_relu)
    def fused(a, b):
        return torch.clamp(a + b, min=0)

    x, y = torch.randn(37, 5), torch.randn(37, 5)
    expected = torch.relu(x + y)
    torch.testing.assert_close(fused(x, y), expected)
    out, gm = _dynamo_graph(fused, x, y)
    torch.testing.assert_close(out, expected)
    assert any("kgexamples.add_relu" in t for t in _graph_targets(gm))

    class M(torch.nn.Module):
        def forward(self, a, b):
            return fused(a, b) * 2

    ep = torch.export.export(M(), (x, y))
    assert "kgexamples.add_relu.default" in _graph_targets(ep.graph_module)
    torch.testing.assert_close(ep.module()(x, y), expected * 2)


def test_method_reads_attributes_for_missing_op_parameters():
    class Norm(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(n))
            self.variance_epsilon = 1e-5

        @kg.lower_as(rmsnorm)
        def forward(self, hidden):
            h = hidden.float()
            return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * self.weight).to(hidden.dtype)

    norm = Norm(48)
    x = torch.randn(6, 48)
    with torch.no_grad():
        got = norm(x)
        ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        out, gm = _dynamo_graph(norm, x)
    assert any("kgexamples.rmsnorm" in t for t in _graph_targets(gm))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_wrong_function_fails_verification_when_decorated():
    with pytest.raises(kg.VerificationError, match="kgexamples::add_relu"):
        @kg.lower_as(add_relu)
        def not_relu(a, b):
            return a + b


def test_incompatible_signature_is_refused():
    with pytest.raises(kg.SpecError, match="'c' is required"):
        @kg.lower_as(add_relu)
        def three(a, b, c):
            return torch.relu(a + b) + c


def test_extra_argument_with_default_keeps_the_original_when_passed():
    @kg.lower_as(add_relu)
    def maybe_scaled(a, b, scale=None):
        out = torch.relu(a + b)
        return out if scale is None else out * scale

    x, y = torch.randn(10), torch.randn(10)
    torch.testing.assert_close(maybe_scaled(x, y), torch.relu(x + y))
    torch.testing.assert_close(maybe_scaled(x, y, scale=3.0), torch.relu(x + y) * 3)


def test_context_manager_is_refused_with_an_explanation():
    with pytest.raises(kg.UnsupportedError, match="decorate it with @kg.lower_as"):
        with kg.lower_as(add_relu):
            pass


def test_sample_inputs_taking_a_device_without_default_work_for_verification():
    """The documented convention is sample_inputs(device); verification must pass one."""
    import kernelgraft as kg

    def samples(device):
        yield (torch.randn(3, 5, device=device),)

    @kg.op("kgtest_lower::triple_dev", sample_inputs=samples)
    def triple(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    @kg.lower_as(triple)
    def times_three(t):
        return t + t + t

    x = torch.randn(4)
    torch.testing.assert_close(times_three(x), x * 3)
