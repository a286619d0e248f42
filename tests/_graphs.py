"""CUDA-graph capture of an op call, shared by the GPU tests."""

import torch


def check_graph_replay(op, x, y, expected):
    """Call ``op(x, y)`` on a side stream (as torch.cuda.graphs advises), capture one call in a
    CUDA graph, refill ``x`` and ``y`` with fresh values, replay, and compare with ``expected(x, y)``."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        op(x, y)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = op(x, y)
    x.copy_(torch.randn_like(x))
    y.copy_(torch.randn_like(y))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected(x, y))
