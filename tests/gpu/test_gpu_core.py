"""The core op on a real GPU: the Triton candidate runs, CUDA graphs capture it, streams are
respected, torch.compile with Inductor and CUDA graphs works."""

import pytest
import torch

from kernelgraft.check import check_op
from kernelgraft.examples.add_relu import add_relu
from kernelgraft.examples.rmsnorm import rmsnorm

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("op", [add_relu, rmsnorm], ids=lambda o: o.name)
def test_every_candidate_matches_reference_on_gpu(op):
    report = check_op(op, device="cuda")
    assert report.ok, [r for r in report.failures]
    ran = {r.candidate for r in report.results if r.status == "pass" and ":" in r.candidate}
    assert len(ran) >= 2


def test_kernel_runs_not_reference():
    import kernelgraft as kg

    x, y = torch.randn(10_000, device="cuda"), torch.randn(10_000, device="cuda")
    with kg.tune(compete=False):  # PyTorch competing could win this shape; the kernels alone here
        out = add_relu(x, y)
        plan = next(iter(add_relu.dispatcher.plans().values()))
    torch.testing.assert_close(out, torch.relu(x + y))
    assert plan.candidate is not None and plan.candidate.impl.backend in ("triton", "cuda", "cutile", "cutedsl")


def test_cuda_graph_capture_and_replay_with_new_data():
    x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    w = torch.randn(256, device="cuda")
    h = torch.randn(16, 256, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            add_relu(x, y)
            rmsnorm(h, w, 1e-6)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = add_relu(x, y)
        normed = rmsnorm(h, w, 1e-6)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        y.copy_(torch.randn_like(y))
        h.copy_(torch.randn_like(h))
        out.fill_(float("nan"))
        normed.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, torch.relu(x + y))
        torch.testing.assert_close(normed, rmsnorm.reference(h, w, 1e-6))


def test_runs_on_the_current_stream():
    x, y = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    add_relu(x, y)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time: far longer than any host path of the call
        out = add_relu(x, y)
        done = torch.cuda.Event()
        done.record()
    assert not done.query()  # the op was queued behind the sleep, on the side stream
    side.synchronize()
    torch.testing.assert_close(out, torch.relu(x + y))


def test_compile_inductor_and_reduce_overhead():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(256, 256)
            self.w = torch.nn.Parameter(torch.rand(256) + 0.5)

        def forward(self, x):
            return rmsnorm(add_relu(self.lin(x), x), self.w, 1e-6)

    m = M().cuda()
    x = torch.randn(64, 256, device="cuda")
    with torch.no_grad():
        expected = rmsnorm.reference(torch.relu(m.lin(x) + x), m.w, 1e-6)
        for mode in ("default", "reduce-overhead"):
            torch._dynamo.reset()
            f = torch.compile(m, fullgraph=True, mode=mode)
            for _ in range(3):
                out = f(x)
            torch.testing.assert_close(out.clone(), expected, atol=1e-4, rtol=1e-4)


def test_export_on_gpu_keeps_ops():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return add_relu(x, y)

    x, y = torch.randn(100, device="cuda"), torch.randn(100, device="cuda")
    ep = torch.export.export(M(), (x, y))
    assert any("kgexamples.add_relu" in str(n.target) for n in ep.graph.nodes)
    torch.testing.assert_close(ep.module()(x, y), torch.relu(x + y))
