"""The check harness finds real bugs: unwritten outputs, wrong values; and passes good kernels."""

import subprocess
import sys

import pytest
import torch

import kernelgraft as kg
from kernelgraft.check import check_op
from kernelgraft.verify import oracle as _verify

from _kernels import launch_scale, launch_scale_half, launch_scale_wrong
from _paths import TESTS


def samples(device="cpu"):
    for n in (1, 7, 257, 1000):
        yield torch.randn(n, device=device), 1.5


def make(name, launch):
    @kg.op(name, impls=[kg.triton(launch, configs=[{"BLOCK": 64}, {"BLOCK": 128}])], sample_inputs=samples)
    def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * alpha

    return scale


def test_good_kernel_passes_every_check():
    report = check_op(make("kgtest::k_good", launch_scale))
    assert report.ok
    statuses = {(r.candidate, r.status) for r in report.results}
    assert ("opcheck", "pass") in statuses and ("meta", "pass") in statuses
    assert sum(r.status == "pass" and r.candidate.startswith("triton") and r.variant == "contiguous"
               for r in report.results) == 8  # the samples as given; derived inputs add their own rows
    # non-contiguous variants are skipped with the reason, not silently dropped
    assert any(r.variant == "noncontiguous" and r.status == "skip" and "contiguous" in r.note for r in report.results)


def test_unwritten_outputs_are_caught_by_poison():
    report = check_op(make("kgtest::k_half", launch_scale_half), opcheck=False)
    fails = [r for r in report.failures if r.candidate.startswith("triton")]
    assert fails and all("NaN" in r.note for r in fails if r.sample != "float32[1] 1.5")


def test_wrong_values_are_caught_by_tolerance():
    report = check_op(make("kgtest::k_wrong", launch_scale_wrong), opcheck=False)
    fails = [r for r in report.failures if r.candidate.startswith("triton")]
    assert len([r for r in fails if r.variant == "contiguous"]) == 8 and all(r.error > r.tol for r in fails)


def test_missing_sample_inputs_is_a_failure():
    @kg.op("kgtest::k_nosamples")
    def f(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    report = check_op(f)
    assert not report.ok and "sample_inputs" in report.failures[0].note


def test_failure_note_names_output_index_got_expected_and_tolerance():
    report = check_op(make("kgtest::k_wrong_note", launch_scale_wrong), opcheck=False, noncontiguous=False)
    fail = next(r for r in report.failures if r.candidate.startswith("triton"))
    assert "output 0" in fail.note and "got" in fail.note and "expected" in fail.note
    assert "rtol=0.0001" in fail.note and "worst at [" in fail.note
    from kernelgraft.check.report import summarize

    row = next(r for r in summarize(report) if r["candidate"] == fail.candidate)
    assert row["failed"] and "output 0" in row["note"] and row["worst"] > 1


def test_cli_exit_codes(tmp_path):
    good = tmp_path / "good_ops.py"
    good.write_text(
        "import torch, kernelgraft as kg\n"
        "from kernelgraft.examples.add_relu import add_relu\n"
    )
    bad = tmp_path / "bad_ops.py"
    bad.write_text(
        "import sys, torch, kernelgraft as kg\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        "from _kernels import launch_scale_wrong\n"
        "def samples(device='cpu'):\n    yield torch.randn(100, device=device), 2.0\n"
        "@kg.op('kgcli::bad', impls=[kg.triton(launch_scale_wrong, configs=[{'BLOCK': 64}])], sample_inputs=samples)\n"
        "def bad(x: torch.Tensor, alpha: float) -> torch.Tensor:\n    return x * alpha\n"
    )
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1"}
    ok = subprocess.run([sys.executable, "-m", "kernelgraft", "check", str(good), "--no-opcheck"],
                        capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "kgexamples::add_relu" in ok.stdout and "0 failed" in ok.stdout
    fail = subprocess.run([sys.executable, "-m", "kernelgraft", "check", str(bad), "--no-opcheck"],
                          capture_output=True, text=True, env=env)
    assert fail.returncode == 1 and "FAIL" in fail.stdout


def test_broadcast_sample_inputs_are_checked_not_crashed():
    # clone_args copied into empty_strided(..., stride 0), which torch refuses ("more than one
    # element of the written-to tensor refers to a single memory location"): check_op crashed.
    def expanded(device="cpu"):
        yield torch.randn(1, 8, device=device).expand(4, 8), 1.5

    dense = kg.triton(launch_scale, configs=[{"BLOCK": 64}], contiguous=False,
                      supports=lambda x, alpha, BLOCK: x.is_contiguous() or "x is not contiguous")

    @kg.op("kgtest::k_expand", impls=[dense], sample_inputs=expanded)
    def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * alpha

    with pytest.warns(kg.FallbackWarning):
        report = check_op(scale, opcheck=False, noncontiguous=False)
    assert report.ok, report.results
    assert {r.candidate: r.status for r in report.results} == {"triton:launch_scale[BLOCK=64]": "skip",
                                                               "meta": "pass"}


def test_a_reference_that_raises_on_a_sample_is_a_failure_not_a_crash():
    def bad(device="cpu"):
        yield torch.randn(8, device=device), 1.5

    @kg.op("kgtest::k_refraise", impls=[kg.triton(launch_scale, configs=[{"BLOCK": 64}])], sample_inputs=bad)
    def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
        if not torch._C._get_tracing_state() and x.device.type != "meta" and not isinstance(
                x, torch._subclasses.FakeTensor):
            raise RuntimeError("reference blew up")
        return x * alpha

    report = check_op(scale, opcheck=False, noncontiguous=False)
    assert not report.ok
    assert any("reference blew up" in r.note for r in report.failures), report.results
