"""benchmarks/bench_graft_llama.py on the CPU: the interleaved rounds (every variant each round, the
order rotating), ratios paired by round, and each compiled variant getting a graph of its own."""

from __future__ import annotations

import itertools

import pytest
import torch

from _bench_scripts import bench_script


@pytest.fixture(scope="module")
def bench():
    with bench_script("bench_graft_llama") as module:
        yield module


def test_rounds_rotate_the_order_and_ratios_pair_within_a_round(bench):
    # A clock that drifts 10% per timing: timed one after the other, the later variant looks
    # slower; paired within rounds with a rotating order, two equal variants come out about equal.
    order, tick = [], itertools.count()

    def timer(fn, iters):
        order.append(fn)
        return 1.0 * (1 + 0.1 * next(tick))

    medians, per_round = bench.interleaved({"a": "a", "b": "b", "c": "c"}, rounds=3, iters=5, timer=timer)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert all(len(v) == 3 for v in per_round.values())
    assert medians["a"] == sorted(per_round["a"])[1]
    ratio = bench.paired_ratio(per_round, "b", "a")
    assert 0.95 < ratio < 1.1, ratio
    assert bench.paired_ratio(per_round, "b", "missing") is None


def test_each_compiled_variant_gets_a_graph_of_its_own(bench):
    # With nn modules inlined, Dynamo would serve a second copy of a model the first copy's graph
    # (same module types, same shapes): the fused copy, whose grafts act inside Inductor, would be
    # timed as the plain model.
    from torch._dynamo.utils import counters

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, ids, use_cache=False):
            return self.linear(ids)

    x = torch.randn(2, 4)
    torch.compile(bench._own_code(Model(), "plain"), fullgraph=True, backend="eager")(x)
    before = counters["stats"]["unique_graphs"]
    other = bench._own_code(Model(), "fused")
    out = torch.compile(other, fullgraph=True, backend="eager")(x)
    assert counters["stats"]["unique_graphs"] == before + 1
    torch.testing.assert_close(out, other.inner.linear(x))


def test_guard_count_reads_a_compiled_variants_guards(bench):
    class Model(torch.nn.Module):
        def forward(self, ids, use_cache=False):
            return ids + 1

    torch._dynamo.reset()
    compiled = torch.compile(bench._own_code(Model(), "guards"), fullgraph=True, backend="eager")
    assert bench.guard_count(compiled) == 0  # not compiled yet
    compiled(torch.randn(2))
    assert bench.guard_count(compiled) > 0
