"""``kernelgraft check`` survives kernels that kill their process, says what is wrong in every failing
row, names a non-deterministic reference, shows progress as it goes and prints no third-party
warnings."""

from __future__ import annotations

import ctypes
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import kernelgraft as kg
from kernelgraft.check import CheckOptions, Printer, check_isolated, check_op
from kernelgraft.check import worker as _worker
from kernelgraft.check.report import summarize

from _kernels import LAUNCHES, launch_scale
from _paths import TESTS

SRC_DIR = str(Path(kg.__file__).resolve().parents[1])
TESTS_DIR = str(TESTS)


def _env() -> dict:
    path = os.pathsep.join([SRC_DIR, TESTS_DIR, os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "TRITON_INTERPRET": "1"}


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelgraft", *args], capture_output=True, text=True,
                          env=_env(), timeout=timeout)


def samples(device="cpu"):
    for n in (5, 300):
        yield torch.randn(n, device=device), 1.5


# ------------------------------------------------------------------------------ crash isolation
# A module as a user writes it: a good op, and an op with a good candidate and one whose store has no
# mask. BLOCK is far larger than the 5- and 300-element samples: the store runs 4 MB past the
# output, which the interpreter does on the host heap (a segfault, an abort, or a process spinning
# in a corrupted heap: each is the candidate's failure).
CRASHING_OPS = '''
import torch, triton, triton.language as tl
import kernelgraft as kg

@triton.jit
def _double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)

@triton.jit
def _double_unmasked(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, x * 2.0)  # the bug: no mask

def launch_double(x, out, *, BLOCK):
    _double[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)

def launch_unmasked(x, out, *, BLOCK):
    _double_unmasked[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)

def samples(device="cpu"):
    for n in (5, 300):
        yield (torch.randn(n, device=device),)

@kg.op("kgcrash::double", sample_inputs=samples, impls=[
    kg.triton(launch_double, configs=[{"BLOCK": 64}]),
    kg.triton(launch_unmasked, configs=[{"BLOCK": 1 << 20}]),
])
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2

@kg.op("kgcrash::triple", sample_inputs=samples, impls=[kg.triton(launch_double, configs=[{"BLOCK": 64}])])
def triple(x: torch.Tensor) -> torch.Tensor:  # the kernel doubles: a plain wrong-value failure
    return x * 3

@kg.op("kgcrash::good", sample_inputs=samples, impls=[kg.triton(launch_double, configs=[{"BLOCK": 128}])])
def good(x: torch.Tensor) -> torch.Tensor:
    return x + x
'''


def test_check_cli_reports_a_kernel_that_crashes_its_process_and_checks_the_rest(tmp_path):
    module = tmp_path / "crashing_ops.py"
    module.write_text(CRASHING_OPS)
    out = tmp_path / "results.json"
    run = _cli("check", str(module), "--no-opcheck", "--json", str(out), "--step-timeout", "60")
    assert run.returncode == 1, run.stdout + run.stderr
    results = json.loads(out.read_text())
    by = lambda op, cand: [r for r in results if r["op"] == op and r["candidate"] == cand]  # noqa: E731
    # the op after the crash was checked, and passes
    good = by("kgcrash::good", "triton:launch_double[BLOCK=128]")
    assert good and {r["status"] for r in good} <= {"pass", "skip"} and "pass" in {r["status"] for r in good}
    # the crashing op's good candidate passes; its bad one is one failure naming the crash
    assert {r["status"] for r in by("kgcrash::double", "triton:launch_double[BLOCK=64]")} <= {"pass", "skip"}
    bad = by("kgcrash::double", "triton:launch_unmasked[BLOCK=1048576]")
    assert [r["status"] for r in bad] == ["fail"], bad
    assert re.search(r"(crashed|hung) the check process \((killed by SIG\w+ \(signal \d+\)|no result in 60 s)",
                     bad[0]["note"]), bad[0]["note"]
    assert bad[0]["sample"] == "float32[5]" and bad[0]["variant"] == "contiguous"
    # an ordinary failure in another op is still an ordinary failure
    assert any(r["status"] == "fail" and "output 0" in r["note"]
               for r in by("kgcrash::triple", "triton:launch_double[BLOCK=64]"))
    # the table printed, with the crash on the bad candidate's row
    row = next(line for line in run.stdout.splitlines() if "launch_unmasked" in line)
    assert "FAIL" in row and "the check process" in row, run.stdout
    assert "kgcrash::good" in run.stdout


def test_no_isolate_checks_in_the_cli_process_with_the_same_progress(tmp_path):
    module = tmp_path / "inline_ops.py"
    module.write_text(CRASHING_OPS)
    run = _cli("check", str(module), "--op", "good", "--no-opcheck", "--no-isolate")
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[1] == "checking kgcrash::good (1 of 1)", lines
    assert re.fullmatch(r"  kgcrash::good: \d+ passed, 0 failed, \d+ skipped \(\d+\.\d s\)", lines[2]), lines


# Simulated crashes, deterministic: a candidate that kills its process at once, and one that
# "corrupts memory" (sets a flag in its process) which kills whichever step runs next.
_CORRUPTED: list[int] = []


def launch_kills(x, alpha, out, *, BLOCK):
    # a real fault (reading address 0), not os.kill(SIGSEGV): once a compiler in the process (CuTe
    # DSL's LLVM) installs its crash handlers, a sent SIGSEGV is printed and then returns, where a
    # real fault faults again with the default handler and kills the process
    ctypes.string_at(0)


def launch_corrupts(x, alpha, out, *, BLOCK):
    _CORRUPTED.append(1)
    launch_scale(x, alpha, out, BLOCK=BLOCK)


def launch_trips(x, alpha, out, *, BLOCK):
    if _CORRUPTED:
        os.abort()
    launch_scale(x, alpha, out, BLOCK=BLOCK)


def _scale_op(name, *launches):
    @kg.op(name, impls=[kg.triton(f, configs=[{"BLOCK": 64}]) for f in launches], sample_inputs=samples)
    def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * alpha

    return scale


def test_a_candidate_that_kills_the_process_is_its_failure_and_the_check_goes_on():
    op = _scale_op("kgiso::kills", launch_scale, launch_kills)
    after = _scale_op("kgiso::after", launch_scale)
    report = check_isolated([op, after], CheckOptions(opcheck=False, noncontiguous=False))
    rows = {(r["op"], r["candidate"]): r for r in summarize(report)}
    killer = rows[("kgiso::kills", "triton:launch_kills[BLOCK=64]")]
    assert killer["failed"] == 1 and killer["passed"] == 0, killer  # one row: its other sample was not run
    assert "(killed by SIGSEGV (signal 11)), again when run alone in a fresh process" in killer["note"]
    assert killer["note"].startswith("float32[5] 1.5 (contiguous): crashed the check process")
    assert rows[("kgiso::kills", "triton:launch_scale[BLOCK=64]")]["passed"] == 2
    assert rows[("kgiso::after", "triton:launch_scale[BLOCK=64]")]["passed"] == 2
    assert not _CORRUPTED  # nothing ran in this process


def launch_never_ends(x, alpha, out, *, BLOCK):
    while True:
        time.sleep(0.05)


def test_a_candidate_that_never_ends_is_stopped_and_failed():
    op = _scale_op("kgiso::hangs", launch_never_ends, launch_scale)
    # 5 s: what the hang costs twice (in the shared process, then alone); a step of launch_scale on
    # a forked worker (no imports) takes milliseconds
    report = check_isolated([op], CheckOptions(opcheck=False, noncontiguous=False), step_timeout=5)
    rows = {r["candidate"]: r for r in summarize(report)}
    hangs = rows["triton:launch_never_ends[BLOCK=64]"]
    assert hangs["failed"] == 1 and ("hung the check process (no result in 5 s, so it was stopped), again when "
                                     "run alone in a fresh process") in hangs["note"], hangs
    assert rows["triton:launch_scale[BLOCK=64]"]["passed"] == 2


def test_a_crash_in_a_later_step_is_blamed_on_the_candidate_that_corrupted_the_process():
    op = _scale_op("kgiso::corrupts", launch_corrupts, launch_trips)
    report = check_op(op, opcheck=False, noncontiguous=False, isolate=True)
    rows = {r["candidate"]: r for r in summarize(report)}
    corrupts = rows["triton:launch_corrupts[BLOCK=64]"]
    assert corrupts["failed"] == 1 and corrupts["passed"] == 0, corrupts
    assert "corrupts memory: the check process died (killed by SIGABRT (signal 6)) later, on " \
           "triton:launch_trips[BLOCK=64] float32[5] 1.5 (contiguous)" in corrupts["note"]
    # the candidate that tripped is not blamed: alone, it passes every sample
    assert rows["triton:launch_trips[BLOCK=64]"]["passed"] == 2 and not rows["triton:launch_trips[BLOCK=64]"]["failed"]


def test_isolated_results_match_in_process_results_and_in_process_is_the_default():
    op = _scale_op("kgiso::same", launch_scale)
    LAUNCHES.clear()
    inline = check_op(op, opcheck=False)
    assert LAUNCHES  # the API runs kernels in the caller's process unless asked
    LAUNCHES.clear()
    isolated = check_op(op, opcheck=False, isolate=True)
    assert not LAUNCHES
    strip = lambda rep: [(r.candidate, r.sample, r.variant, r.status) for r in rep.results]  # noqa: E731
    assert strip(isolated) == strip(inline) and isolated.ok


def test_a_spawned_worker_imports_the_target_file(tmp_path, monkeypatch):
    # Where a GPU is visible the worker is spawned (fork breaks CUDA in the child), and it imports
    # the targets.
    module = tmp_path / "spawned_ops.py"
    module.write_text(CRASHING_OPS)
    from kernelgraft.cli.common import load_target, ops_of

    ops = [op for op in ops_of(load_target(str(module))) if op.name == "kgcrash::good"]
    monkeypatch.setattr(_worker, "start_method", lambda: "spawn")
    report = check_isolated(ops, CheckOptions(opcheck=False, noncontiguous=False), targets=[str(module)])
    assert report.ok and {r.status for r in report.results} == {"pass"}, report.results


def test_a_worker_that_cannot_import_its_targets_fails_every_op_once(monkeypatch):
    op = _scale_op("kgiso::unimportable", launch_scale)
    monkeypatch.setattr(_worker, "start_method", lambda: "spawn")
    report = check_isolated([op], CheckOptions(opcheck=False), targets=["kg_no_such_module_here"])
    assert [r.status for r in report.results] == ["fail"]
    assert "No module named 'kg_no_such_module_here'" in report.results[0].note


# ------------------------------------------------------------------------------ failure notes
@triton.jit
def _add_one_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    bump = tl.where(offs >= 5, 2, 1)  # the bug: adds 2 from element 5 on
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + bump, mask=mask)


def launch_add_one(x, out, *, BLOCK):
    _add_one_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)


def int_samples(device="cpu"):
    yield (torch.arange(12, dtype=torch.int32, device=device).reshape(3, 4),)


def test_every_failure_note_names_output_index_values_tolerance_and_count():
    from _kernels import launch_scale_half, launch_scale_wrong

    @kg.op("kgiso::add_one", impls=[kg.triton(launch_add_one, configs=[{"BLOCK": 64}])], sample_inputs=int_samples)
    def add_one(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    wrong = _scale_op("kgiso::wrong", launch_scale_wrong)
    half = _scale_op("kgiso::half", launch_scale_half)
    notes = {}
    for op in (add_one, wrong, half):
        report = check_op(op, opcheck=False, noncontiguous=False)
        notes[op.name] = next(r["note"] for r in summarize(report) if r["failed"])
    # bit-exact dtype: which rule, how many, where, got and expected
    assert notes["kgiso::add_one"] == ("int32[3, 4] (contiguous): output 0: 7 of 12 elements differ (bit-exact "
                                       "rule for int32); first at [1, 1]: got 7, expected 6")
    for name in ("kgiso::wrong", "kgiso::half"):
        note = notes[name]
        assert note.startswith("float32[5] 1.5 (contiguous): output 0: "), note
        assert re.search(r"\d+ of 5 elements off by more than rtol=0\.0001", note), note
        assert re.search(r"worst at \[\d\]: got \S+, expected \S+, error \S+ > allowed \S+", note), note
    assert "NaN where the reference has a number" in notes["kgiso::half"]


# ------------------------------------------------------------------------------ non-deterministic reference
def test_a_non_deterministic_reference_fails_the_op_in_one_row_not_its_candidates():
    @kg.op("kgiso::noisy", impls=[kg.triton(launch_scale, configs=[{"BLOCK": 64}])], sample_inputs=samples)
    def noisy(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * alpha + torch.rand_like(x)

    report = check_op(noisy, opcheck=False)
    assert [(r.candidate, r.status) for r in report.failures] == [("reference", "fail")], report.results
    note = report.failures[0].note
    assert note.startswith("the reference of kgiso::noisy is not deterministic: two runs on the same inputs "
                           "differ at output 0: ")
    assert "worst at [" in note and note.endswith("(seed it, or make it a pure function of its inputs)")
    assert not any(r.candidate.startswith("triton") and r.status == "fail" for r in report.results)


def test_a_deterministic_reference_is_not_flagged():
    op = _scale_op("kgiso::steady", launch_scale)
    report = check_op(op, opcheck=False, noncontiguous=False)
    assert report.ok and not any(r.candidate == "reference" for r in report.results)


# ------------------------------------------------------------------------------ progress
def test_check_prints_the_op_it_starts_while_running():
    # The process prints once everything is imported (the target too), then runs `kernelgraft
    # check` as `python -m kernelgraft` would: the op's line must follow within a second, long
    # before the op's checks end. The process is stopped once the line is seen.
    code = textwrap.dedent("""
        import runpy, sys
        import kernelgraft.cli, kernelgraft.examples.add_relu
        print("imported", flush=True)
        sys.argv = ["kernelgraft", "check", "kernelgraft.examples.add_relu"]
        runpy.run_module("kernelgraft", run_name="__main__")
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=_env(), start_new_session=True)
    arrivals: list[tuple[bool, str]] = []  # (the CLI was still running, the line)

    def read() -> None:
        for line in proc.stdout:
            arrivals.append((proc.poll() is None, line.rstrip("\n")))
            if line.startswith("checking "):
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        reader.join(timeout=300)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its check worker
        proc.wait()
    lines = [line for _, line in arrivals]
    assert lines[:3] == ["imported", "kernelgraft check: importing kernelgraft.examples.add_relu",
                         "checking kgexamples::add_relu (1 of 1)"], lines
    assert arrivals[2][0], arrivals  # printed as it happened, not when the check ended


def test_progress_on_a_terminal_counts_checks_and_piped_prints_plain_lines():
    from kernelgraft.check import Result

    def drive(console):
        printer = Printer(console)
        printer.op_started("kgiso::p", 0, 2)
        printer.result(Result("kgiso::p", "triton:k", "float32[5]", "contiguous", "pass"))
        printer.result(Result("kgiso::p", "triton:k", "float32[7]", "contiguous", "fail", note="x"))
        printer.op_finished("kgiso::p", [Result("kgiso::p", "t", "s", "v", "pass"),
                                         Result("kgiso::p", "t", "s", "v", "fail")])
        printer.close()

    from rich.console import Console

    piped = io.StringIO()
    drive(Console(file=piped, width=120))
    assert piped.getvalue().splitlines()[0] == "checking kgiso::p (1 of 2)"
    assert re.fullmatch(r"  kgiso::p: 1 passed, 1 failed \(\d+\.\d s\)", piped.getvalue().splitlines()[1])
    assert len(piped.getvalue().splitlines()) == 2  # no live display when piped
    live = io.StringIO()
    drive(Console(file=live, width=120, force_terminal=True))
    assert "2 checks, 1 failed" in live.getvalue()  # the live count after the second result


# ------------------------------------------------------------------------------ warnings
_THIRD_PARTY_WARNING = re.compile(r"(site-packages|dist-packages)/(torch|triton|numpy)/\S+:\d+: \w*Warning")


def _warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if _THIRD_PARTY_WARNING.search(line)]


# A user's op whose Triton kernel, like the softmax example, leaves whole rows of a block masked
# off: the interpreter computes -inf - -inf there (NaN, never stored) and numpy warns about it.
QUIET_OPS = '''
import warnings
import torch, triton, triton.language as tl
import kernelgraft as kg

warnings.warn("kgquiet: the user's own warning")

@triton.jit
def _row_shift(x_ptr, out_ptr, rows, cols, ROWS: tl.constexpr, COLS: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, COLS)[None, :]
    mask = (r < rows) & (c < cols)
    x = tl.load(x_ptr + r * cols + c, mask=mask, other=float("-inf"))
    tl.store(out_ptr + r * cols + c, x - tl.max(x, axis=1)[:, None], mask=mask)

def launch_row_shift(x, out, *, ROWS):
    _row_shift[(triton.cdiv(x.shape[0], ROWS),)](x, out, x.shape[0], x.shape[1], ROWS=ROWS, COLS=8)

def samples(device="cpu"):
    yield (torch.randn(3, 5, device=device),)

@kg.op("kgquiet::row_shift", sample_inputs=samples, impls=[kg.triton(
    launch_row_shift, configs=[{"ROWS": 4}], supports=lambda x, **c: x.shape[1] <= 8 or "more than 8 columns")])
def row_shift(x: torch.Tensor) -> torch.Tensor:
    return x - x.amax(dim=1, keepdim=True)
'''


def test_check_cli_prints_no_third_party_warnings_but_keeps_the_users(tmp_path):
    module = tmp_path / "quiet_ops.py"
    module.write_text(QUIET_OPS)
    # without the CLI's filters the kernel does make the interpreter warn
    bare = subprocess.run([sys.executable, "-c", (
        "import runpy; from kernelgraft.check import check_op; "
        f"check_op(runpy.run_path({str(module)!r})['row_shift'], opcheck=False)")],
        capture_output=True, text=True, env=_env(), timeout=600)
    assert bare.returncode == 0, bare.stderr
    assert any("triton/runtime/interpreter.py" in line for line in _warning_lines(bare.stderr)), bare.stderr
    run = _cli("check", str(module), "--no-opcheck")
    assert run.returncode == 0, run.stdout + run.stderr
    assert _warning_lines(run.stderr) == [], run.stderr
    assert "UserWarning: kgquiet: the user's own warning" in run.stderr  # the user's warnings stay


def test_the_cli_filters_are_narrow():
    import warnings

    from kernelgraft.cli.common import quiet_third_party_warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_party_warnings()
        warnings.warn("the user's own", RuntimeWarning)
        warnings.warn_explicit("invalid value encountered in subtract", RuntimeWarning, "interpreter.py", 599,
                               module="triton.runtime.interpreter")
        warnings.warn_explicit("TRITON_DEFAULT_FP_FUSION is unset: ...", UserWarning, "knobs.py", 504,
                               module="triton.knobs")
        warnings.warn_explicit("something else from triton", UserWarning, "knobs.py", 1, module="triton.knobs")
    assert [str(w.message) for w in caught] == ["the user's own", "something else from triton"]


@pytest.mark.slow
def test_check_cli_over_all_examples_prints_no_third_party_warnings():
    from kernelgraft.examples import MODULES

    run = _cli("check", *[f"kernelgraft.examples.{m}" for m in MODULES], "--no-opcheck", timeout=1800)
    assert _warning_lines(run.stderr) == [], run.stderr
    assert "checking kgexamples::add_relu" in run.stdout


# ------------------------------------------------------------------------------ GPU: a sticky CUDA error
@triton.jit
def _wild_store_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # far outside any allocation: an illegal address, which leaves the CUDA context unusable
    tl.store(out_ptr + offs.to(tl.int64) + (1 << 40), tl.load(x_ptr + offs, mask=mask), mask=mask)


def launch_wild_store(x, alpha, out, *, BLOCK):
    _wild_store_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)


# Module level: a spawned worker (a GPU is visible) finds them by importing this module.
GPU_WILD = _scale_op("kgisogpu::wild", launch_scale, launch_wild_store)
GPU_AFTER = _scale_op("kgisogpu::after", launch_scale)


@pytest.mark.gpu
def test_gpu_an_illegal_address_is_the_candidates_failure_and_later_candidates_get_a_fresh_context():
    torch.zeros(1, device="cuda")  # this process has a CUDA context, and keeps it usable
    assert _worker.start_method() == "spawn"  # a GPU is visible: fork would break CUDA in the worker
    report = check_isolated([GPU_WILD, GPU_AFTER], CheckOptions(device="cuda", opcheck=False))
    rows = {(r["op"], r["candidate"]): r for r in summarize(report)}
    wild = rows[("kgisogpu::wild", "triton:launch_wild_store[BLOCK=64]")]
    assert wild["failed"] == 1 and "CUDA context unusable" in wild["note"], wild
    assert rows[("kgisogpu::wild", "triton:launch_scale[BLOCK=64]")]["passed"] >= 2
    assert rows[("kgisogpu::wild", "meta")]["failed"] == 0
    assert rows[("kgisogpu::after", "triton:launch_scale[BLOCK=64]")]["passed"] >= 2
    torch.cuda.synchronize()  # this process's own context is untouched


@pytest.mark.gpu
def test_gpu_check_cli_survives_an_illegal_address(tmp_path):
    module = tmp_path / "wild_ops.py"
    # a wild address, in blocks of 1024: the CPU tests' block of 2**20 elements (one program
    # overruns any buffer) takes Triton minutes to compile for a GPU, and a run's budget ran out in it
    module.write_text(CRASHING_OPS.replace("tl.store(out_ptr + offs, x * 2.0)  # the bug: no mask",
                                           "tl.store(out_ptr + offs.to(tl.int64) + (1 << 40), x * 2.0, "
                                           "mask=offs < n)  # the bug: a wild address")
                      .replace('kg.triton(launch_unmasked, configs=[{"BLOCK": 1 << 20}])',
                               'kg.triton(launch_unmasked, configs=[{"BLOCK": 1024}])'))
    env = {k: v for k, v in _env().items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "results.json"
    # a step bounded at 2 minutes (the default is 10): a wild store that hung the worker would
    # otherwise hold the GPU run's whole budget before the test could say so
    run = subprocess.run([sys.executable, "-m", "kernelgraft", "check", str(module), "--no-opcheck",
                          "--json", str(out), "--step-timeout", "120"], capture_output=True, text=True, env=env,
                         timeout=900)
    assert run.returncode == 1, run.stdout + run.stderr
    results = json.loads(out.read_text())
    bad = [r for r in results if r["candidate"] == "triton:launch_unmasked[BLOCK=1024]"]
    assert [r["status"] for r in bad] == ["fail"] and "CUDA" in bad[0]["note"], bad
    good = [r for r in results if r["op"] == "kgcrash::good" and r["candidate"].startswith("triton")]
    # every contiguous sample passes in the fresh process after the crash; the kernel takes
    # contiguous inputs only, so a strided sample is skipped, as on the CPU
    seen = [(r["sample"], r["variant"], r["status"], r["note"]) for r in good]
    assert good and all(r["status"] == "pass" for r in good if r["variant"] == "contiguous"), seen
    assert all(r["status"] == "pass" or (r["status"] == "skip" and "contiguous" in r["note"]) for r in good), seen
    assert len([r for r in good if r["variant"] == "contiguous"]) == 2, seen
