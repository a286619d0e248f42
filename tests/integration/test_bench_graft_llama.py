"""benchmarks/bench_graft_llama.py on the CPU: calls taken in turn (one call of each variant, in
orders where each follows each other equally often), ratios paired by turn, grafted copies against
plain copies, the kernels two variants do not share, and each compiled variant getting a graph of
its own."""

from __future__ import annotations

import statistics

import pytest
import torch

from _bench_scripts import bench_script


@pytest.fixture(scope="module")
def bench():
    with bench_script("bench_graft_llama") as module:
        yield module


class DriftingClock:
    """A clock that drifts 1% per call: stamps are call counts, a call's time grows with its place."""

    def __init__(self):
        self.now, self.order = 0, []

    def call(self, name):
        def fn():
            self.order.append(name)
            self.now += 1
        return fn

    def stamp(self):
        return self.now

    def elapsed(self, start, end):
        return (end - start) * (1 + 0.01 * end) * (1.2 if self.order[end - 1] == "b" else 1.0)

    def sync(self):
        pass


def test_calls_are_taken_in_turn_and_ratios_pair_the_calls_of_a_turn(bench):
    # A clock that drifts 1% per call, and b 20% slower than a and c: paired within a turn (calls
    # a few milliseconds apart, in balanced orders), b / a comes out about 1.2.
    import gc

    clock = DriftingClock()
    collecting = []
    fns = {n: clock.call(n) for n in "abc"}
    fns["a"] = lambda inner=fns["a"]: (collecting.append(gc.isenabled()), inner())
    medians, per_round, per_call = bench.interleaved(fns, rounds=2, iters=6, clock=clock)
    # each round: one untimed call of each, then six turns, each a balanced order of the three
    orders = ["".join("abc"[k] for k in o) for o in bench.balanced_orders(3)]
    relabel = lambda order, r: "".join("abc"[("abc".index(x) + r) % 3] for x in order)  # noqa: E731
    assert "".join(clock.order) == "".join("abc" + "".join(relabel(orders[(r * 6 + i) % len(orders)], r)
                                                          for i in range(6)) for r in range(2))
    # the collector runs between rounds: on for the untimed calls, off for the timed turns
    assert collecting == [True] + [False] * 6 + [True] + [False] * 6 and gc.isenabled()
    assert all(len(v) == 2 for v in per_round.values()) and all(len(v) == 12 for v in per_call.values())
    assert medians["a"] == pytest.approx(statistics.median(per_round["a"]))
    assert bench.paired_ratio(per_call, "b", "a") == pytest.approx(1.2, rel=0.02)
    assert bench.paired_ratio(per_call, "c", "a") == pytest.approx(1.0, rel=0.02)
    q1, q3 = bench.quartiles(per_call, "b", "a")
    assert 1.17 < q1 <= q3 < 1.23
    assert bench.paired_ratio(per_call, "b", "missing") is None and bench.quartiles(per_call, "a", "x") is None
    one = {"a": [1.0], "b": [2.0]}  # a single turn: a ratio, but no quartiles
    assert bench.paired_ratio(one, "b", "a") == 2.0 and bench.quartiles(one, "b", "a") is None
    assert bench.paired_ratio({"a": [], "b": []}, "a", "b") is None
    # b is slower in every turn; a and c take turns being ahead of each other with the drift
    assert bench.turns_faster(per_call, "b", "a") == [0, 12] and bench.turns_faster(per_call, "a", "b") == [12, 0]
    won, lost = bench.turns_faster(per_call, "c", "a")
    assert won + lost == 12 and 0 < won < 12
    assert bench.turns_faster({"a": [1.0, 2.0], "b": [1.0, 1.0]}, "a", "b") == [0, 1]  # a tie counts for neither
    assert bench.turns_faster(per_call, "a", "missing") is None


def test_group_ratios_compare_grafted_copies_with_plain_copies(bench):
    # two plain copies 2% apart, two grafted ones at 1.01x their mean, over four turns
    samples = {"compile": [1.0, 2.0, 1.0, 2.0], "compile_copy": [1.02, 2.04, 1.02, 2.04],
               "compile_grafted": [1.0201, 2.0402, 1.0201, 2.0402], "compile_grafted2": [1.0201, 2.0402, 1.0201, 2.02]}
    g = bench.group_ratios(samples, ["compile_grafted", "compile_grafted2"], ["compile", "compile_copy"])
    assert g["turns_faster"] == [0, 4]
    assert g["each / plain"]["compile"] == pytest.approx(1 / 1.01)
    assert g["each / plain"]["compile_copy"] == pytest.approx(1.02 / 1.01)
    assert g["each / plain"]["compile_grafted"] == pytest.approx(1.01)
    assert g["ours / plain"] == pytest.approx(1.01, rel=1e-3)
    assert g["each / plain"]["compile_grafted2"] == pytest.approx(1.01)
    q1, q3 = g["quartiles"]
    assert q1 <= g["ours / plain"] <= q3
    lo, hi = g["interval_95"]
    assert lo <= 1.01 * (1 + 1e-3) and hi >= 1.01 * (1 - 1e-3)


def test_copies_interval_is_as_wide_as_the_copies_spread(bench):
    # equal programs whose copies read 2% apart: the interval spans 1.0 and about that spread
    lo, hi = bench.copies_interval([0.99, 1.01, 1.0, 0.995], [1.0, 1.01, 0.99, 1.005])
    assert lo < 1.0 < hi and hi - lo < 0.03
    # a real 5% difference stands out from a 1% spread
    lo, hi = bench.copies_interval([1.05, 1.06, 1.04], [1.0, 1.01, 0.99])
    assert 1.02 < lo < hi < 1.08
    assert bench.copies_interval([1.0], [1.0, 1.0]) is None
    assert bench.copies_interval([1.0, 1.0], [1.0, 1.0], seed=3) == [1.0, 1.0]


def test_kernel_difference_names_what_one_variant_runs_alone(bench):
    profile = {"compile_grafted": {"total_us": 3.0, "by_kernel_us": {"gemm": 2.0, "kg_rmsnorm": 1.0}},
               "compile": {"total_us": 2.5, "by_kernel_us": {"gemm": 2.0, "triton_red_fused_rsqrt_0": 0.5}}}
    diff = bench.kernel_difference(profile, "compile_grafted", "compile")
    assert diff["only compile_grafted"] == {"kg_rmsnorm": 1.0}
    assert diff["only compile"] == {"triton_red_fused_rsqrt_0": 0.5}
    assert diff["total_us"] == {"compile_grafted": 3.0, "compile": 2.5}
    assert bench.kernel_difference(profile, "compile_grafted", "eager") is None


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


def test_suspended_pattern_grafts_leave_later_compiles_plain_and_ungraft_still_counts_them(bench):
    # the benchmark compiles plain and grafted copies in turn: a grafted copy's pattern graft must
    # not act on the plain copy compiled after it
    import kernelgraft as kg
    from kernelgraft.examples.swiglu import swiglu, swiglu_pattern
    from kernelgraft.graft import pattern as _pattern

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.up = torch.nn.Linear(8, 16), torch.nn.Linear(8, 16)

        def forward(self, x):
            return torch.nn.functional.silu(self.gate(x)) * self.up(x)

    model = MLP()
    before = _pattern.active()
    kg.graft(model, pattern=swiglu_pattern, replacement=swiglu)
    mine = [p for p in _pattern.active() if p not in before]
    try:
        assert len(mine) == 1, "the pattern graft is active"
        bench.suspend_patterns(model)
        assert not any(p in _pattern.active() for p in mine)
        bench.suspend_patterns(MLP())  # a model with no pattern grafts: nothing to do
    finally:
        assert kg.ungraft(model) == 1
    assert not any(p in _pattern.active() for p in mine)
