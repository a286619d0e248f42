"""Guarded memory: a kernel that writes past its output, or into an input the op does not declare
mutated, fails ``kernelgraft check`` (in process and isolated, no crash), is never chosen by the
tuner, and fails graft verification: one rule (``kernelgraft.verify.guard``), three callers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernelgraft as kg
from kernelgraft.verify import guard as _guard
from kernelgraft.check import CheckOptions, check_in_process, check_op

import _check_ops as ops
from _check_ops import GOOD_APPEND, ZEROING_APPEND
from _paths import TESTS

OPS_FILE = str(Path(ops.__file__).resolve())
SRC_DIR = str(Path(kg.__file__).resolve().parents[1])
TESTS_DIR = str(TESTS)
GOOD_ROW = "triton:launch_row_double[BLOCK=128,MASKED=1]"
BAD_ROWS = {"triton:launch_row_double[BLOCK=128,MASKED=0]", "triton:launch_row_double[BLOCK=256,MASKED=0]"}
ZEROING = f"triton:launch_append[{','.join(f'{k}={v}' for k, v in ZEROING_APPEND.items())}]"
GOOD = f"triton:launch_append[{','.join(f'{k}={v}' for k, v in GOOD_APPEND.items())}]"


def _cli(*args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join([SRC_DIR, TESTS_DIR, os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, "-m", "kernelgraft", "check", *args], capture_output=True, text=True,
                          env=env, timeout=900)


class _Op:
    """The part of an op a ``Call`` reads: parameter names and which are mutated."""

    class signature:
        params = [type("P", (), {"name": "x"}), type("P", (), {"name": "k"})]
        mutated = (1,)

    impls = ()


# ------------------------------------------------------------------------------ the rule itself
@pytest.fixture(params=["mapped", "allocated"])
def buffers(request, monkeypatch):
    """Host buffers between inaccessible pages, and plain allocations (as on a GPU)."""
    if request.param == "allocated":
        def refuse(nbytes):
            raise OSError("no mapping")

        monkeypatch.setattr(_guard, "_host_buffer", refuse)
    return request.param


def test_every_write_outside_outputs_and_mutated_elements_is_named(buffers):
    x = torch.randn(4, 6)[:, ::2]  # strided: its gaps are guarded too
    call = _guard.Call(_Op, (x, torch.randn(5)), [((3,), torch.float32, torch.device("cpu"))])
    assert call.args[0].stride() == x.stride() and torch.equal(call.args[0], x)
    assert call.args[0].data_ptr() % 256 == x.data_ptr() % 256  # the alignment is the original's
    call.args[1].mul_(2)  # mutated: allowed
    call.outs[0].fill_(1.0)
    assert call.damage() is None
    out = call.outs[0]
    torch.empty(0).set_(out.untyped_storage(), out.storage_offset(), (5,), (1,)).fill_(2.0)  # 2 past
    arg = call.args[0]
    arg.as_strided((2,), (1,)).fill_(0.0)  # element 0 and the gap after it
    torch.empty(0).set_(arg.untyped_storage(), arg.storage_offset() - 2, (1,), (1,)).fill_(0.0)
    assert call.damage() == (
        "changed 1 of 12 elements of input 'x', which the op does not declare mutated (mutates_args); "
        "wrote 4 bytes before input 'x'; wrote 4 bytes between the elements of input 'x' (its strided view); "
        "wrote 8 bytes past output 0")


def test_inputs_are_compared_bit_for_bit_nan_payloads_and_signed_zeros_included(buffers):
    x = torch.tensor([float("nan"), 0.0, 1.0])
    call = _guard.Call(_Op, (x, torch.randn(2)))
    assert torch.equal(call.args[0].view(torch.int32), x.view(torch.int32))
    call.args[0].view(torch.int32)[0] = torch.tensor([float("nan")]).view(torch.int32)[0] ^ 1  # another NaN
    call.args[0][1] = -0.0
    assert call.damage().startswith("changed 2 of 3 elements of input 'x'")


def test_an_expanded_input_is_guarded_without_copying_its_repeats():
    x = torch.randn(1, 8).expand(4, 8)
    call = _guard.Call(_Op, (x, torch.randn(2)))
    assert call.args[0].stride() == (0, 1) and torch.equal(call.args[0], x) and call.damage() is None


# ------------------------------------------------------------------------------ check: an unmasked store
def _failing(report) -> set[str]:
    return {r.candidate for r in report.failures}


def test_check_fails_exactly_the_configs_whose_store_has_no_mask_in_process():
    # Before guarded memory the stores landed on the heap: the process died later (double free).
    report = check_op(ops.row_double, opcheck=False)
    assert _failing(report) == BAD_ROWS, report.failures
    bad = [r for r in report.failures if r.variant == "contiguous" and r.sample == "float32[4, 50]"]
    assert {r.note for r in bad} == {"wrote 312 bytes past output 0", "wrote 824 bytes past output 0"}
    good = [r for r in report.results if r.candidate == GOOD_ROW]
    assert good and {r.status for r in good} <= {"pass", "skip"} and "pass" in {r.status for r in good}
    again = check_in_process([ops.row_double], CheckOptions(opcheck=False, noncontiguous=False))
    assert _failing(again) == BAD_ROWS


def test_a_failure_whose_guards_cannot_be_read_stays_the_candidates_row(monkeypatch):
    """After a sticky CUDA error (an illegal address) every later GPU call fails, reading the guards
    too: the candidate still gets its own failure row, and the op's check goes on, rather than the
    error escaping the step (it ended the whole op's check, its rows 'not run')."""
    real = _guard.Call

    class Sticky(real):
        def damage(self):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(_guard, "Call", Sticky)
    report = check_in_process([ops.row_double], CheckOptions(opcheck=False, noncontiguous=False))
    kernels = [r for r in report.results if r.candidate.startswith("triton:")]
    assert kernels and all(r.status == "fail" for r in kernels), kernels
    assert all("guards could not be read afterwards (RuntimeError: CUDA error" in r.note for r in kernels), kernels
    assert {r.candidate for r in kernels} == BAD_ROWS | {GOOD_ROW}  # each its own row, every sample run
    assert not [r for r in report.results if r.candidate == "-" or r.status == "notrun"], report.results


def test_check_cli_isolated_fails_exactly_the_configs_whose_store_has_no_mask(tmp_path):
    out = tmp_path / "results.json"
    run = _cli(OPS_FILE, "--op", "kgguard::row_double", "--no-opcheck", "--json", str(out))
    assert run.returncode == 1, run.stdout + run.stderr
    results = json.loads(out.read_text())
    assert {r["candidate"] for r in results if r["status"] in ("fail", "notrun")} == BAD_ROWS
    assert not any("check process" in r["note"] for r in results), results  # caught, not crashed
    assert all("bytes past output 0" in r["note"] for r in results if r["status"] == "fail")
    assert {r["status"] for r in results if r["candidate"] == GOOD_ROW} == {"pass", "skip"}


# ------------------------------------------------------------------------------ check: a written input
@pytest.mark.parametrize("opcheck", [False, True], ids=["no-opcheck", "opcheck"])
@pytest.mark.parametrize("name", ["zeroing_alone", "zeroing_first", "zeroing_second"])
def test_a_config_that_zeroes_an_undeclared_input_fails_alone_or_beside_correct_ones(name, opcheck):
    report = check_op(getattr(ops, name), opcheck=opcheck, noncontiguous=opcheck)
    assert _failing(report) == {ZEROING}, report.failures
    assert all("elements of input 'k', which the op does not declare mutated" in r.note for r in report.failures)
    if name != "zeroing_alone":
        assert {r.status for r in report.results if r.candidate == GOOD} == {"pass"} | ({"skip"} if opcheck else set())
    if opcheck:  # torch's checks ran over the op (its reference) and over the correct kernel
        assert {(r.candidate, r.variant) for r in report.results if "opcheck" in (r.candidate, r.variant)} == (
            {("opcheck", "contiguous")} | ({(GOOD, "opcheck")} if name != "zeroing_alone" else set()))
        assert all(r.status == "pass" for r in report.results if r.candidate in ("opcheck", "trace"))


# ------------------------------------------------------------------------------ the tuner's gate
@pytest.fixture
def fresh_tuner(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "cache"))
    kg.tune.clear()
    yield
    kg.tune.clear()


def _fastest(config):
    """A timer under which ``config`` is the fastest candidate."""
    return lambda trial, settings: 0.1 if trial.candidate.config.as_dict() == config else 1.0


def test_the_gate_never_chooses_a_kernel_that_writes_an_input_nor_lets_it_touch_the_callers(fresh_tuner):
    k_cache, k, slots = next(ops.append_samples())
    k_before, cache_before = k.clone(), k_cache.clone()
    with kg.tune("on", timer=_fastest(ZEROING_APPEND)):
        ops.zeroing_second(k_cache, k, slots)
    assert torch.equal(k, k_before)  # the zeroing kernel ran on a guarded copy, then lost
    expected = cache_before.index_copy(0, slots, k_before)
    assert torch.equal(k_cache, expected)
    decision = kg.tune.decision(ops.zeroing_second, k_cache, k, slots)
    assert decision.winner["config"] == GOOD_APPEND
    (excluded,) = decision.excluded
    assert excluded["config"] == ZEROING_APPEND and excluded["kind"] == "wrong"
    assert excluded["reason"].startswith("writes memory that is not its own: changed 80 of 80 elements of input 'k'")


def test_the_gate_never_chooses_a_kernel_that_writes_past_its_output(fresh_tuner):
    x = torch.randn(4, 50)
    with kg.tune("on", timer=_fastest({"BLOCK": 256, "MASKED": 0})):
        torch.testing.assert_close(ops.row_double(x), x * 2)
    decision = kg.tune.decision(ops.row_double, x)
    assert decision.winner["config"] == {"BLOCK": 128, "MASKED": 1}
    reasons = {json.dumps(e["config"], sort_keys=True): e["reason"] for e in decision.excluded}
    assert reasons == {'{"BLOCK": 128, "MASKED": 0}': "writes memory that is not its own: wrote 312 bytes past output 0",
                       '{"BLOCK": 256, "MASKED": 0}': "writes memory that is not its own: wrote 824 bytes past output 0"}


# ------------------------------------------------------------------------------ graft verification
def test_graft_verification_fails_a_kernel_that_writes_an_input():
    from kernelgraft.graft.verify import call_op

    k_cache, k, slots = next(ops.append_samples())
    before = k.clone()
    _, damage = call_op(ops.zeroing_alone, (k_cache, k, slots))
    assert damage == "changed 80 of 80 elements of input 'k', which the op does not declare mutated (mutates_args)"
    assert torch.equal(k, before)
    _, clean = call_op(ops.zeroing_second, (k_cache, k, slots))  # its default kernel is the correct one
    assert clean is None


def test_graft_refuses_a_match_whose_kernel_writes_an_input():
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x * 2)

    x = torch.randn(3, 4)
    ep = torch.export.export(Model(), (x,))
    with pytest.warns(kg.GraftWarning, match="matched nothing"):
        report = kg.graft(ep, pattern=lambda t: t * 2, replacement=ops.double_zeroing, example_inputs=(x,),
                          pattern_inputs=(torch.randn(3, 4),))
    assert report.count == 0
    assert ("kgguard::double_zeroing writes memory that is not its own at ranks 2, float32 with "
            "['float32[3, 4]']: changed 12 of 12 elements of input 'x'") in report.reason


# ------------------------------------------------------------------------------ on a GPU
@pytest.mark.gpu
def test_gpu_check_fails_exactly_the_unmasked_configs_and_a_broadcast_read():
    report = check_op(ops.row_double, device="cuda", opcheck=False)
    assert _failing(report) == BAD_ROWS, report.failures
    assert all("bytes past output 0" in r.note for r in report.failures)
    rope = check_op(ops.rope, device="cuda", opcheck=False)
    assert _failing(rope) == {"triton:launch_rope_rows[BLOCK=32]"}
    assert any(r.variant.startswith("cos broadcast from [1, 32]") for r in rope.failures)


@pytest.mark.gpu
def test_gpu_gate_never_chooses_a_kernel_that_writes_an_input(fresh_tuner):
    k_cache, k, slots = next(ops.append_samples("cuda"))
    before = k.clone()
    # the zeroing kernel fastest, the good one next: on a GPU PyTorch's candidates compete too
    timer = lambda trial, settings: {str(ZEROING_APPEND): 0.1, str(GOOD_APPEND): 0.2}.get(  # noqa: E731
        str(trial.candidate.config.as_dict()), 1.0)
    with kg.tune("on", timer=timer):
        ops.zeroing_second(k_cache, k, slots)
    assert torch.equal(k, before)
    assert kg.tune.decision(ops.zeroing_second, k_cache, k, slots).winner["config"] == GOOD_APPEND
