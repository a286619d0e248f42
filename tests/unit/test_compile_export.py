"""torch.compile(fullgraph=True) without graph breaks, torch.export keeping the op, opcheck."""

import pytest
import torch

import kernelgraft as kg
from kernelgraft.examples.add_relu import add_relu
from kernelgraft.examples.rmsnorm import rmsnorm

from _kernels import LAUNCHES, launch_add_inplace


class Block(torch.nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)
        self.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        return rmsnorm(add_relu(self.lin(x), x), self.weight, 1e-6)

    def reference(self, x):
        return rmsnorm.reference(torch.relu(self.lin(x) + x), self.weight, 1e-6)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_has_no_graph_breaks_and_keeps_ops(backend):
    torch._dynamo.reset()
    model = Block()
    x = torch.randn(8, 64)
    graphs = []

    def record(gm, inputs):
        graphs.append(gm)
        if backend == "inductor":
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, inputs)
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(backend)(gm, inputs)

    with torch.no_grad():
        out = torch.compile(model, fullgraph=True, backend=record)(x)
        expected = model.reference(x)
    torch.testing.assert_close(out, expected)
    assert len(graphs) == 1
    targets = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert {"kgexamples.add_relu.default", "kgexamples.rmsnorm.default"} <= targets


def test_dynamo_explain_reports_zero_breaks_with_dynamic_shapes():
    torch._dynamo.reset()
    model = Block()
    explain = torch._dynamo.explain(model)(torch.randn(5, 64))
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
    with torch.no_grad():
        for rows in (3, 7, 11):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(compiled(x), model.reference(x))


def test_export_keeps_ops_and_runs():
    model = Block()
    x = torch.randn(4, 64)
    ep = torch.export.export(model, (x,))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "kgexamples.add_relu.default" in targets and "kgexamples.rmsnorm.default" in targets
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), model.reference(x))


def test_mutating_op_under_compile_and_export():
    @kg.op("kgtest::c_add_", impls=[kg.triton(launch_add_inplace, configs=[{"BLOCK": 64}])], mutates_args=("x",))
    def add_(x: torch.Tensor, y: torch.Tensor) -> None:
        x.add_(y)

    def f(x, y):
        add_(x, y)
        return x * 2

    torch._dynamo.reset()
    x, y = torch.randn(100), torch.randn(100)
    expected = (x + y) * 2
    x_c = x.clone()
    LAUNCHES.clear()
    out = torch.compile(f, fullgraph=True, backend="aot_eager")(x_c, y)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x_c, x + y)
    assert LAUNCHES  # the kernel ran inside the compiled graph

    class M(torch.nn.Module):
        def forward(self, x, y):
            return f(x, y)

    ep = torch.export.export(M(), (x.clone(), y))
    assert any("kgtest.c_add_" in str(n.target) for n in ep.graph.nodes)


def test_opcheck_passes_on_examples():
    x, y = torch.randn(33), torch.randn(33)
    torch.library.opcheck(add_relu.overload, (x, y))
    torch.library.opcheck(rmsnorm.overload, (torch.randn(3, 40), torch.randn(40), 1e-5))
