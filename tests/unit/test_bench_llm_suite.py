"""benchmarks/bench_llm_suite.py on the CPU: the shape plan (--quick keeps a shape per regime and
the known gaps), --dry-run, and the summary (ratios, worst five, bandwidth) from made-up rows."""

from __future__ import annotations


import pytest

from kernelgraft.bench import Row
from kernelgraft.bench.run import COMPILE, EAGER, PEER, TUNED

from _bench_scripts import bench_script


@pytest.fixture(scope="module")
def suite():
    with bench_script("bench_llm_suite") as module:
        yield module


def test_plan_covers_every_example_and_quick_keeps_each_regime(suite):
    full, quick = suite.plan(False), suite.plan(True)
    assert {n for n, _, _ in full} == set(suite.MODULES) == {n for n, _, _ in quick}
    assert set(quick) < set(full) and len(quick) < len(full) / 2
    regimes = lambda p: {(n, r) for n, r, _ in p}  # noqa: E731
    assert regimes(quick) == regimes(full)
    assert ("softmax", "vocab", (1, 151936)) in quick and ("rmsnorm", "narrow", (65536, 128)) in quick
    assert {n for n, _, _ in suite.plan(True, ["softmax"])} == {"softmax"}


def test_dry_run_lists_shapes_without_a_gpu(suite, capsys):
    assert suite.main(["--dry-run", "--quick", "--op", "rmsnorm"]) == 0
    out = capsys.readouterr().out
    assert "| rmsnorm | narrow | 65536x128 | 16.8 |" in out  # 65536 x 128 bf16 + weight
    assert "| rmsnorm_residual | decode | 1x4096 |" in out and "shapes" in out.splitlines()[-1]


def _row(op, size, kind, variant, t, nbytes=1e8, bw=None, detail="", vs_compile=None):
    return Row(op=f"kgexamples::{op}", shape=f"s{size}", size=size, bytes=nbytes, flops=0.0, kind=kind,
               variant=variant, time_us=t, gbps=nbytes / t / 1e3 if t else None, bw_frac=bw, detail=detail,
               regime="decode", vs_compile=vs_compile)


def test_summary_ratios_worst_five_and_bandwidth(suite):
    rows = []
    # rmsnorm: 8 shapes, the op slower than compile by 1..8%; Liger 4% faster than the op on shape 7,
    # twice as slow elsewhere
    for i in range(8):
        n = 1e8 * (i + 1)
        rows += [_row("rmsnorm", i, EAGER, "torch eager", 20.0, n), _row("rmsnorm", i, COMPILE, "torch.compile", 10.0, n),
                 _row("rmsnorm", i, PEER, "peer: liger", 20.0 if i != 7 else 10.8 / 1.04, n),
                 _row("rmsnorm", i, TUNED, "tuned (kg.tune)", 10.0 * (1 + (i + 1) / 100), n, bw=0.5 + i / 20,
                      detail="triton:rmsnorm_rows[...]")]
    # gemm is compute bound: no bandwidth line; a failed tuned row counts as a failure
    rows += [_row("gemm", 0, EAGER, "torch eager", 100.0), _row("gemm", 0, PEER, "peer: cublas", 40.0),
             Row(op="kgexamples::gemm", shape="s0", size=0, bytes=1e8, flops=1e9, kind=TUNED,
                 variant="tuned (kg.tune)", error="RuntimeError: boom")]
    assert suite.largest(rows) == {"kgexamples::rmsnorm": 8e8}  # gemm is compute bound
    summary = suite.summarize(rows, copy_gbps=4000.0, same_size_copy_gbps={"kgexamples::rmsnorm": 80000.0})
    by = {(e["op"], e["shape"]): e for e in summary["shapes"]}
    assert by[("kgexamples::rmsnorm", "s0")]["vs_torch"] == pytest.approx(1.01)
    assert by[("kgexamples::rmsnorm", "s7")]["vs_liger"] == pytest.approx(1.04)
    assert [e["shape"] for e in summary["worst_vs_torch"]] == ["s7", "s6", "s5", "s4", "s3"]
    assert summary["worst_vs_liger"][0]["shape"] == "s7"
    assert summary["bandwidth"] == [{"op": "kgexamples::rmsnorm", "shape": "s7", "gbps": pytest.approx(1e8 * 8 / 10.8 / 1e3),
                                     "fraction": pytest.approx(0.85), "copy_gbps": 4000.0,
                                     "same_size_copy_gbps": 80000.0,
                                     "fraction_of_same_size_copy": pytest.approx(1e8 * 8 / 10.8 / 1e3 / 80000)}]
    # over 1.02x: shapes 2..7 (1.03 .. 1.08); none over 1.05x vs Liger
    assert summary["over_limit"] == {"vs_torch": 6, "vs_liger": 0, "bandwidth": 1, "failed": 1}
    assert by[("kgexamples::gemm", "s0")]["peers"] == {"cublas": 40.0}
    text = suite.markdown(summary)
    assert "| rmsnorm | decode | s7 | 10.80 | triton:rmsnorm_rows[...] | 20.00 | 10.00 | 10.38 | - | 1.080x | 1.040x |" in text
    assert "| gemm | decode | s0 | - | RuntimeError: boom | 100.00 | - | - | cublas 40.00 | - | - |" in text
    assert "| rmsnorm | s7 | 74074 | 85.0% | 80000 | 92.6% |" in text
    assert "Over the limits: 6 shapes vs torch, 0 vs Liger, 1 ops under the bandwidth bar; 1 shapes without a tuned time." in text


def test_without_a_gpu_the_run_refuses_clearly(suite, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert suite.main(["--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out


def test_rows_where_the_tuned_op_is_slower_than_its_own_kernel_are_flagged(suite):
    """A tuned op far slower than its chosen kernel forced (timed alike) is a measurement or
    dispatch problem, not a kernel's time: such rows are listed apart, so they are not quoted."""
    rows = [_row("rmsnorm", 0, TUNED, "tuned (kg.tune)", 19.7, detail="triton:launch_rmsnorm[...]"),
            _row("rmsnorm", 1, TUNED, "tuned (kg.tune)", 10.0, detail="triton:launch_rmsnorm[...]"),
            _row("rmsnorm", 2, TUNED, "tuned (kg.tune)", 5.0, detail="triton:launch_rmsnorm[...]"),
            _row("rmsnorm", 3, TUNED, "tuned (kg.tune)", 4.0, detail="triton:launch_rmsnorm[...]")]
    rows[0].vs_chosen, rows[1].vs_chosen, rows[2].vs_chosen, rows[3].vs_chosen = 19.7 / 1.68, 1.02, 1.0, 1.0
    for row, calls in zip(rows, (200, 150, 2, 76)):  # the third row: a graph of two calls, which inflates a tiny kernel's time
        row.method, row.calls = "graph", calls
    summary = suite.summarize(rows, copy_gbps=4000.0)
    assert [e["shape"] for e in summary["inconsistent"]] == ["s0", "s2"]
    text = suite.markdown(summary)
    assert "## Rows to distrust: the tuned op over 1.15x its own chosen kernel forced" in text
    assert "| rmsnorm | s0 | 19.70 | triton:launch_rmsnorm[...] | 11.726x | 200 |" in text
    assert "| rmsnorm | s2 | 5.00 | triton:launch_rmsnorm[...] | 1.000x | 2 |" in text


def test_ratios_are_paired_by_round_when_every_side_has_its_rounds(suite):
    """The same GEMM on a clock that drifts 10% over the rounds: the ratio of medians can land on
    either side of 1 by the drift, the median of per-round ratios does not."""
    drift = [1.0, 1.05, 1.10]
    rows = [_row("gemm", 0, EAGER, "torch eager", 200.0), _row("gemm", 0, COMPILE, "torch.compile", 230.0),
            _row("gemm", 0, TUNED, "tuned (kg.tune)", 206.0)]
    rows[0].samples = [200.0 * d for d in drift]
    rows[1].samples = [230.0 * d for d in drift]
    rows[2].samples = [200.0 * d * 1.001 for d in drift]  # the op: the same kernel, 0.1% of noise
    entry = suite.summarize(rows, copy_gbps=4000.0)["shapes"][0]
    assert entry["vs_torch"] == pytest.approx(1.001)
    assert suite.paired([1.0, 2.0], [[1.0, 2.0], [0.5, 4.0]]) == pytest.approx(1.5)  # per round, the fastest rival
    assert suite.paired([1.0, 2.0], [[1.0]]) is None  # a rival missing a round: not paired
    assert suite.paired([1.0], [[1.0]]) is None  # one round: nothing to pair
    # a round one side lost (None) is left out, the others still pair round by round
    assert suite.paired([2.0, None, 3.0], [[1.0, 1.0, 1.0]]) == pytest.approx(2.5)
    assert suite.paired([2.0, None, 3.0], [[1.0, 1.0, None]]) is None  # one complete round left
    rows[2].samples = None  # without rounds: the ratio of the times, as before
    assert suite.summarize(rows, copy_gbps=4000.0)["shapes"][0]["vs_torch"] == pytest.approx(206.0 / 200.0)
