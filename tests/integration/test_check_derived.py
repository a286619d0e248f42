"""``kernelgraft check`` finds what the samples do not show: inputs derived from the samples
(broadcast, transposed, at a storage offset, odd sizes), opcheck over every candidate, a trace
under torch.compile and torch.export, and honest verdicts when the check process dies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernelgraft as kg
from kernelgraft.check import CheckOptions, check_isolated, check_op
from kernelgraft.check import derive as _derive, isolate as _isolate
from kernelgraft.check.harness import RUN
from kernelgraft.check.report import summarize

import _check_ops as ops
from _kernels import LAUNCHES, launch_scale
from _paths import TESTS

OPS_FILE = str(Path(ops.__file__).resolve())
SRC_DIR = str(Path(kg.__file__).resolve().parents[1])
TESTS_DIR = str(TESTS)
ROWS = "triton:launch_rope_rows[BLOCK=32]"


def _cli(*args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join([SRC_DIR, TESTS_DIR, os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, "-m", "kernelgraft", "check", *args], capture_output=True, text=True,
                          env=env, timeout=900)


# ------------------------------------------------------------------------------ derived inputs
def test_variants_are_what_the_reference_accepts_and_the_declaration_allows():
    x, cos, sin = next(ops.rope_samples())
    names = [name for name, _ in _derive.variants(ops.rope, (x, cos, sin), limit=20)]
    assert names == [
        "x broadcast from [1, 64] to [8, 64]", "cos broadcast from [1, 32] to [8, 32]",
        "x, cos, sin transposed (column-major)", "storage offset of one element (misaligned data pointers)",
        "odd sizes (8 -> 9)",  # 64 -> 65 and 32 -> 33 break the halves: the reference refuses them
        "sin broadcast from [1, 32] to [8, 32]",
        "x broadcast from [64] to [8, 64]", "cos broadcast from [32] to [8, 32]", "sin broadcast from [32] to [8, 32]",
    ]
    assert len(_derive.variants(ops.rope, (x, cos, sin))) == _derive.LIMIT
    for name, args in _derive.variants(ops.rope, (x, cos, sin), limit=20):
        assert ops.rope.reference(*args).shape == ((9, 64) if name.startswith("odd") else (8, 64)), name

    @kg.op("kgderive::rope_2d", ndim={"x": 2, "cos": 2, "sin": 2}, impls=ops.rope.impls)
    def rope_2d(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return ops._rope_reference(x, cos, sin)

    declared = [name for name, _ in _derive.variants(rope_2d, (x, cos, sin), limit=20)]
    assert declared == names[:6]  # ndim= refuses the inputs with fewer dims


def test_odd_sizes_leave_the_sizes_of_index_inputs_alone():
    k_cache, k, slots = next(ops.append_samples())
    (odd,) = [v for v in _derive.variants(ops.zeroing_second, (k_cache, k, slots)) if v[0].startswith("odd")]
    assert odd[0] == "odd sizes (16 -> 17, 8 -> 9, 2 -> 3)"  # not 5, the number of slots
    new_cache, new_k, new_slots = odd[1]
    assert new_cache.shape == (17, 3, 9) and new_k.shape == (5, 3, 9) and new_slots is slots
    assert torch.equal(new_k[:, :2, :8], k)  # the sample's values, fresh ones around them


def test_check_cli_fails_a_rope_without_supports_on_a_broadcast_cos(tmp_path):
    # The samples never broadcast: before derived inputs this op passed 22/0, and a call with cos
    # of shape [1, D/2], which the reference broadcasts, gave NaN.
    out = tmp_path / "results.json"
    run = _cli(OPS_FILE, "--op", "kgderive::rope", "--no-opcheck", "--json", str(out))  # rope_declared too
    assert run.returncode == 1, run.stdout + run.stderr
    everything = json.loads(out.read_text())
    results = [r for r in everything if r["op"] == "kgderive::rope"]
    assert {r["candidate"] for r in everything if r["status"] == "fail"} == {ROWS}
    assert {r["status"] for r in everything if r["op"] == "kgderive::rope_declared"} == {"pass", "skip"}
    cos = [r for r in results if r["candidate"] == ROWS and r["variant"] == "cos broadcast from [1, 32] to [8, 32]"]
    assert [r["status"] for r in cos] == ["fail"] and "NaN where the reference has a number" in cos[0]["note"]
    assert cos[0]["sample"] == "float32[8, 64] float32[1, 32] float32[8, 32]"
    # the strided kernel takes every variant the reference does
    good = [r for r in results if r["candidate"] == "triton:launch_rope[BLOCK=32]"]
    assert {r["status"] for r in good} == {"pass"} and len(good) == 16
    assert "cos broadcast from [1, 32] to [8, 32]" in run.stdout  # the row in the table names the input


def test_a_kernel_that_refuses_through_supports_what_it_cannot_take_passes():
    report = check_op(ops.rope_declared, opcheck=False)
    assert report.ok, report.failures
    skipped = {r.variant for r in report.results if r.status == "skip"}
    assert "cos broadcast from [1, 32] to [8, 32]" in skipped
    assert all(r.note == "every input needs its own rows" for r in report.results
               if r.status == "skip" and "broadcast" in r.variant)


# ------------------------------------------------------------------------------ opcheck over every candidate
def _two_configs(name):
    def samples(device="cpu"):
        yield torch.randn(300, device=device), 1.5

    @kg.op(name, impls=[kg.triton(launch_scale, configs=[{"BLOCK": 64}, {"BLOCK": 128}])], sample_inputs=samples)
    def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * alpha

    return scale


def test_opcheck_runs_over_every_candidate_through_a_pinned_plan():
    from kernelgraft.op import select as _select

    op = _two_configs("kgderive::pinned")
    x = torch.randn(100)
    for candidate, launch in zip(op.candidates(x, 1.5), ("scale[64]", "scale[128]")):
        with kg.tune("off"), _select.pinned(op, candidate):
            op.dispatcher.reset()
            LAUNCHES.clear()
            torch.ops.kgderive.pinned(x, 1.5)
            assert LAUNCHES == [launch]
    op.dispatcher.reset()
    LAUNCHES.clear()
    with kg.tune("off"):
        op(x, 1.5)
    assert LAUNCHES == ["scale[64]"]  # outside the block the op chooses as before; no pinned plan was kept
    report = check_op(op, noncontiguous=False)
    rows = {(r.candidate, r.variant): r.status for r in report.results}
    assert rows[("triton:launch_scale[BLOCK=64]", "opcheck")] == rows[("triton:launch_scale[BLOCK=128]", "opcheck")] \
        == rows[("opcheck", "contiguous")] == rows[("trace", "contiguous")] == "pass"


# ------------------------------------------------------------------------------ the trace step
def test_the_trace_step_names_register_meta_for_a_fake_kernel_with_data_dependent_shapes():
    def samples(device="cpu"):
        g = torch.Generator().manual_seed(5)
        yield (torch.randn(64, generator=g).to(device),)

    @kg.op("kgderive::positives", sample_inputs=samples)
    def positives(x: torch.Tensor) -> torch.Tensor:
        return x[x > 0]  # its size depends on the data: no fake kernel can follow it

    report = check_op(positives, noncontiguous=False)
    assert not report.ok
    notes = [r.note for r in report.failures]
    assert any("register_meta" in n and "data" in n for n in notes), notes


def test_an_op_that_returns_none_traces_whatever_its_meta_reads():
    """An op that returns None has nothing to allocate: its fake kernel computes nothing, so even a
    meta function that reads data (or a reference that filters by a mask) traces."""
    def samples(device="cpu"):
        slots = torch.randperm(16, device=device)[:6]
        slots[2] = -1  # padding
        yield torch.randn(16, 2, 8, device=device), torch.randn(6, 2, 8, device=device), slots

    @kg.op("kgderive::pad_append", mutates_args=("k_cache",), sample_inputs=samples)
    def pad_append(k_cache: torch.Tensor, k: torch.Tensor, slots: torch.Tensor) -> None:
        valid = slots >= 0
        k_cache[slots[valid]] = k[valid]

    @pad_append.register_meta
    def _(k_cache, k, slots):  # reads data, but an op returning None never runs it to trace
        slots[slots >= 0].add_(0)

    report = check_op(pad_append, noncontiguous=False)
    assert [r.status for r in report.results if r.candidate == "trace"] == ["pass"]


def test_an_op_that_traces_passes_the_trace_step():
    report = check_op(ops.zeroing_second, noncontiguous=False)
    assert [r.status for r in report.results if r.candidate == "trace"] == ["pass"]


# ------------------------------------------------------------------------------ honest verdicts
_CORRUPTED: list[int] = []


def launch_corrupts(x, alpha, out, *, BLOCK):
    _CORRUPTED.append(1)  # stands for memory a wild store corrupted
    launch_scale(x, alpha, out, BLOCK=BLOCK)


def _samples(device="cpu"):
    for n in (5, 300):
        yield torch.randn(n, device=device), 1.5


def test_a_crash_in_the_reference_step_is_charged_to_the_kernel_that_corrupted_memory():
    # The corrupted process dies when the reference of the second sample runs: the reference alone
    # survives, the kernel that ran before it does not. Before, the reference was blamed and the
    # op's check ended, leaving the other candidate "ok" with its second sample never run.
    @kg.op("kgderive::trips", sample_inputs=_samples, impls=[
        kg.triton(launch_scale, configs=[{"BLOCK": 64}]), kg.triton(launch_corrupts, configs=[{"BLOCK": 64}])])
    def trips(x: torch.Tensor, alpha: float) -> torch.Tensor:
        if _CORRUPTED and x.shape[0] == 300:
            os.abort()
        return x * alpha

    report = check_isolated([trips], CheckOptions(opcheck=False, noncontiguous=False))
    rows = {r["candidate"]: r for r in summarize(report)}
    assert "reference" not in rows
    corrupts = rows["triton:launch_corrupts[BLOCK=64]"]
    assert corrupts["failed"] == 1 and "corrupts memory: the check process died (killed by SIGABRT (signal 6)) " \
                                      "later, on reference float32[300] 1.5 (contiguous)" in corrupts["note"]
    assert rows["triton:launch_scale[BLOCK=64]"]["passed"] == 2 and rows["meta"]["passed"] == 2
    assert not _CORRUPTED


def test_steps_that_never_ran_are_not_run_and_their_candidate_is_not_ok(monkeypatch):
    # A worker that dies between two steps, after announcing steps it never ran.
    from kernelgraft.check import worker as _worker

    key = lambda who: (0, "contiguous", who, RUN)  # noqa: E731

    def dies(conn, ops_, targets, names, options, plans, prepare):
        conn.send(("op", 0))
        conn.send(("planned", [key("a"), key("b"), key("meta")], "float32[5]", "contiguous"))
        conn.send(("step", key("a"), "float32[5]", "contiguous"))
        conn.send(("result", key("a"), _isolate.Result("kgderive::dies", "a", "float32[5]", "contiguous", "pass")))
        os._exit(7)

    monkeypatch.setattr(_worker, "worker", dies)
    monkeypatch.setattr(_worker, "start_method", lambda: "fork")
    op = _two_configs("kgderive::dies")
    report = check_isolated([op], CheckOptions(opcheck=False))
    statuses = {(r.candidate, r.status) for r in report.results}
    assert statuses == {("a", "pass"), ("b", "notrun"), ("meta", "notrun"), ("-", "fail")}
    assert not report.ok and {r.candidate for r in report.failures} == {"b", "meta", "-"}
    rows = {r["candidate"]: r for r in summarize(report)}
    assert rows["b"]["notrun"] == 1 and rows["b"]["note"].startswith("float32[5] (contiguous): not run: ")
