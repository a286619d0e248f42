"""Tuning off the caller's path, on the CPU: a first call is served at once by a provisional
choice (the reference, or the nearest tuned bucket's winner, never an unverified kernel), one
background job per key tunes it, the decision swaps in for the next call and equals the blocking
decision; jobs of a replaced op are dropped, the queue is bounded, capture and compile never start
a tuning, ``blocking=True`` keeps tuning inside the call. Timing is faked (an injected timer);
kernels run through Triton's interpreter. The tests hold the worker with events, never with time."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import types
import warnings

import pytest
import torch

import kernelgraft as kg
from kernelgraft import TuneWarning
from kernelgraft.tune import (
    inputs as _inputs,
    meanwhile as _meanwhile,
    offpath as _offpath,
    pace as _pace,
    phases as _phases,
)

from _tune_ops import FAKE_MS, launch_scale, make_scale  # noqa: E402
from _paths import ROOT, TESTS

HOLD_S = 120  # what a held timer waits at most (a test that forgets to release fails, not hangs)


@pytest.fixture(autouse=True)
def _fresh_tuner(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("KERNELGRAFT_TUNE", "KERNELGRAFT_PRUNE", "KERNELGRAFT_MAX_CANDIDATES", "KERNELGRAFT_TUNE_QUEUE",
                "KERNELGRAFT_TUNE_QUEUE_MB"):
        monkeypatch.delenv(var, raising=False)
    kg.tune.clear()
    kg.tune.TUNER.stats.clear()
    kg.tune.TUNER.background.stats.clear()
    yield
    assert kg.tune.wait(HOLD_S)
    kg.tune.clear()


class HeldTimer:
    """A fake timer (FAKE_MS, or ``ms`` by BLOCK) that waits for ``release`` first, counting the
    calls per BLOCK; ``entered`` is set once the worker is inside it."""

    def __init__(self, ms=None):
        self.ms = ms or FAKE_MS
        self.release = threading.Event()
        self.entered = threading.Event()
        self.calls: dict[int, int] = {}
        self.lock = threading.Lock()

    def __call__(self, trial, settings):
        self.entered.set()
        assert self.release.wait(HOLD_S), "the test never released the held timer"
        block = trial.candidate.config.as_dict()["BLOCK"]
        with self.lock:
            self.calls[block] = self.calls.get(block, 0) + 1
        trial.run(0)
        return self.ms[block]


def served(op, *args):
    """What the op's plan for these inputs runs (after calling it): a BLOCK, or 'reference'."""
    out = op(*args)
    torch.testing.assert_close(out, args[0] * 2)
    plan = op.dispatcher.plan_for(tuple(args))
    return "reference" if plan.candidate is None else plan.candidate.config.as_dict()["BLOCK"]


def ranking(d):
    return [(e["config"]["BLOCK"], e["ms"]) for e in d.ranking]


# ---------------------------------------------------------------- the background path
def test_first_call_is_served_by_the_reference_and_the_decision_swaps_in():
    op = make_scale("toff::first")
    x, y = torch.randn(1000), torch.randn(1010)  # one bucket (1024): one job
    timer = HeldTimer()
    with kg.tune("on", timer=timer, blocking=False):
        try:
            assert served(op, x) == "reference"  # at once: no kernel is verified yet
            assert served(op, y) == "reference"
            assert kg.tune.pending() == 1
            assert kg.tune.decision(op, x) is None
        finally:
            timer.release.set()
        assert kg.tune.wait(HOLD_S)
        assert served(op, x) == 256 and served(op, y) == 256  # both shapes' plans swapped
    background = ranking(kg.tune.decision(op, x))
    assert kg.tune.stats()["background_queued"] == 1
    kg.tune.clear(disk=True)
    with kg.tune("on", timer=HeldTimer(), blocking=True) as s:
        s.timer.release.set()
        assert served(op, x) == 256  # inside the first call, as before
    assert ranking(kg.tune.decision(op, x)) == background


def _labels(d):
    from kernelgraft.tune.tuner import entry_label

    return [(entry_label(e), e["ms"]) for e in d.ranking]


def _torch_timer(trial, settings):
    """FAKE_MS for the kernels; torch:compile fastest of all, torch:eager slowest."""
    label = trial.candidate.label
    trial.run(0)
    if label.startswith("torch:"):
        return 0.5 if label == "torch:compile" else 9.0
    return FAKE_MS[trial.candidate.config.as_dict()["BLOCK"]]


def test_a_first_decision_serves_while_torch_compile_compiles_then_the_whole_one_replaces_it(monkeypatch):
    """With ``torch:compile`` among the candidates (its gate is Inductor compiling the reference:
    seconds on a GPU, most of a new key's tuning), a key tuned off the path lands twice: first the
    decision among the others, which serves at once and is not saved, while the gate runs; then the
    whole tuning, which replaces it, is saved, and equals blocking mode's decision."""
    from kernelgraft.op import compete as _compete
    from kernelgraft.tune.cache import DiskCache
    from kernelgraft.tune.tuner import entry_label

    entered, release = threading.Event(), threading.Event()

    def compile_reference(fn):  # Inductor, held: its first call is the compile
        def compiled(*args):
            entered.set()
            assert release.wait(HOLD_S), "the test never released the compile"
            return fn(*args)
        return compiled

    monkeypatch.setattr(_compete, "compile_reference", compile_reference)
    op = make_scale("toff::twice")
    x = torch.randn(1000)
    with kg.tune("on", timer=_torch_timer, blocking=False, compete=True):
        try:
            assert served(op, x) == "reference"  # at once: nothing verified yet
            assert entered.wait(HOLD_S)  # the second pass is in torch:compile's gate...
            first = kg.tune.decision(op, x)  # ...and the first decision serves meanwhile
            assert first is not None and _labels(first)[0] == ("triton:launch_scale[BLOCK=256]", 1.0)
            assert not any(label == "torch:compile" for label, _ in _labels(first))
            assert served(op, x) == 256
            assert not DiskCache().entries()  # a decision over part of the candidates is not saved
            report = kg.tune.report(op)
            assert report.keys[0].state == "refining" and kg.tune.pending() == 1
            got = []

            def inside_a_call():  # blocking mode wants the whole decision: it waits for the tuning
                with kg.tune("on", timer=_torch_timer, blocking=True, compete=True):
                    op(x)
                    got.append(op.dispatcher.plan_for((x,)).candidate.label)

            blocking = threading.Thread(target=inside_a_call)
            blocking.start()
            blocking.join(0.5)
            assert blocking.is_alive() and not got  # held behind torch:compile's gate, not served the first
        finally:
            release.set()
        blocking.join(HOLD_S)
        assert got == ["torch:compile"]
        assert kg.tune.wait(HOLD_S)
        final = kg.tune.decision(op, x)
        assert _labels(final)[0][0] == "torch:compile"
        torch.testing.assert_close(op(x), x * 2)
        assert op.dispatcher.plan_for((x,)).candidate.label == "torch:compile"  # the plans swapped again
        saved = list(DiskCache().entries().values())
        assert len(saved) == 1 and entry_label(saved[0]["ranking"][0]) == "torch:compile"
        text = str(kg.tune.report(op))
        assert "tuned, winner torch:compile" in text and "a first decision landed" in text
    whole = _labels(final)
    kg.tune.clear(disk=True)
    with kg.tune("on", timer=_torch_timer, blocking=True, compete=True):
        op(x)  # inside the call: one pass over every candidate
        assert _labels(kg.tune.decision(op, x)) == whole  # (the key names the torch candidates)


def test_a_failed_second_pass_keeps_the_first_decision(monkeypatch):
    """The whole tuning failing after a first decision landed leaves that first decision serving
    (it passed the gate), not the default candidate; nothing is saved."""
    from kernelgraft.op import compete as _compete
    from kernelgraft.tune import tuner as _tuner
    from kernelgraft.tune.cache import DiskCache

    calls = []
    real = _tuner.run_trials

    def second_fails(op, candidates, *args, **kwargs):
        calls.append(len(candidates))
        if len(calls) == 2:
            raise RuntimeError("the second pass broke")
        return real(op, candidates, *args, **kwargs)

    monkeypatch.setattr(_compete, "compile_reference", lambda fn: fn)
    monkeypatch.setattr(_tuner, "run_trials", second_fails)
    op = make_scale("toff::secondfails")
    x = torch.randn(1000)
    with kg.tune("on", timer=_torch_timer, blocking=False, compete=True), \
            pytest.warns(TuneWarning, match="the second pass broke"):
        assert served(op, x) == "reference"
        assert kg.tune.wait(HOLD_S)
        assert calls[0] == calls[1] - 1  # the first pass left torch:compile out
        assert served(op, x) == 256 and _labels(kg.tune.decision(op, x))[0] == ("triton:launch_scale[BLOCK=256]", 1.0)
    assert not DiskCache().entries()


def test_nearest_bucket_serves_while_a_new_bucket_is_tuned_never_an_unverified_kernel():
    op = make_scale("toff::near", bug=True)  # BLOCK=1024 with BUG: fastest, and wrong
    timer = HeldTimer()
    timer.release.set()
    with kg.tune("on", timer=timer, blocking=True):
        assert served(op, torch.randn(1000)) == 256
    later = HeldTimer(ms={64: 4.0, 128: 3.0, 256: 2.0, 512: 1.0})  # the new bucket is won by 512
    with kg.tune("on", timer=later, blocking=False):
        try:
            big = torch.randn(5000)  # bucket 8192: not tuned; nearest tuned is 1024
            assert served(op, big) == 256  # the nearest bucket's winner, not BUG, not the default 64
        finally:
            later.release.set()
        assert kg.tune.wait(HOLD_S)
        assert served(op, big) == 512


@pytest.mark.parametrize("change,same", [
    ("sizes", True), ("dtype", False), ("layout", False), ("value", False), ("env", False), ("fingerprint", False),
], ids=lambda v: str(v))
def test_nearest_bucket_only_differs_in_tensor_sizes(change, same):
    key = {"schema": 2, "op": "a", "fingerprint": "f", "env": {"device": "cpu"}, "tolerances": {},
           "args": [["T", "torch.float32", [1024, 64], "ca16"], ["I", 8], ["V", True]]}
    other = {**key, "args": [list(a) for a in key["args"]]}
    if change == "sizes":
        other["args"][0] = ["T", "torch.float32", [4096, 64], "ca16"]
    elif change == "dtype":
        other["args"][0] = ["T", "torch.float16", [1024, 64], "ca16"]
    elif change == "layout":
        other["args"][0] = ["T", "torch.float32", [1024, 64], "ta16"]
    elif change == "value":
        other["args"][1] = ["I", 16]
    elif change == "env":
        other["env"] = {"device": "NVIDIA H200"}
    else:
        other["fingerprint"] = "g"
    gap = _meanwhile.distance(key, other)
    assert (gap is not None) is same
    if same:
        assert gap == 2.0


def test_one_job_per_key_under_eight_threads():
    op = make_scale("toff::threads")
    timer = HeldTimer()
    start = threading.Barrier(8)
    outs, errors = [], []

    def call(i):
        try:
            x = torch.randn(1000 + i)  # one bucket, eight shapes
            with kg.tune("on", timer=timer, blocking=False):
                start.wait(HOLD_S)
                outs.append((x, op(x)))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(HOLD_S)
    finally:
        timer.release.set()
    assert not errors and len(outs) == 8
    for x, out in outs:
        torch.testing.assert_close(out, x * 2)
    assert kg.tune.wait(HOLD_S)
    assert kg.tune.stats()["background_queued"] == 1
    assert timer.calls == {64: 1, 128: 1, 256: 1, 512: 1}  # each candidate timed once: one tuning
    with kg.tune("on", timer=timer, blocking=False):
        assert served(op, torch.randn(1000)) == 256


def _declare(name, configs, replace=False):
    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    return kg.op(scale, name=name, impls=[kg.triton(launch_scale, configs=configs)], replace=replace)


def test_a_replaced_ops_job_is_dropped():
    first = make_scale("toff::hold")
    other = _declare("toff::replaced", [{"BLOCK": 64}, {"BLOCK": 128}])
    timer = HeldTimer()
    with kg.tune("on", timer=timer, blocking=False):
        try:
            first(torch.randn(1000))
            assert timer.entered.wait(HOLD_S)  # the worker is inside the first job
            x = torch.randn(700)
            assert served(other, x) == "reference"  # queued behind it
            assert kg.tune.pending() == 2
            _declare("toff::replaced", [{"BLOCK": 256}, {"BLOCK": 512}], replace=True)
            assert kg.tune.pending() == 1  # the replaced op's job is gone
        finally:
            timer.release.set()
        assert kg.tune.wait(HOLD_S)
    assert set(timer.calls) == {64, 128, 256, 512}  # only the first op's candidates were timed
    assert kg.tune.stats()["background_dropped"] == 1
    assert not [d for d in kg.tune.TUNER.memory.values() if d.key["op"] == "toff::replaced"]


def test_the_queue_is_bounded_and_a_skipped_key_asks_again(monkeypatch):
    monkeypatch.setenv("KERNELGRAFT_TUNE_QUEUE", "1")
    monkeypatch.setattr(_offpath, "SKIP_RETRY_S", 0.0)  # a skipped key asks again on its next call
    op = make_scale("toff::cap")
    timer = HeldTimer()
    third = torch.randn(5000)
    with kg.tune("on", timer=timer, blocking=False):
        try:
            op(torch.randn(100))  # running
            assert timer.entered.wait(HOLD_S)
            op(torch.randn(1000))  # queued: the queue is full now
            torch.testing.assert_close(op(third), third * 2)  # skipped: served meanwhile, not queued,
            assert op.dispatcher.plan_for((third,)) is None  # and the next call asks again
            assert kg.tune.pending() == 2 and kg.tune.stats()["background_skipped"] == 1
        finally:
            timer.release.set()
        assert kg.tune.wait(HOLD_S)
        assert kg.tune.decision(op, third) is None
        assert served(op, third) == 256  # asked again, queued now; the nearest bucket serves meanwhile
        assert kg.tune.wait(HOLD_S)
        assert kg.tune.decision(op, third) is not None and kg.tune.stats()["background_queued"] == 3
    monkeypatch.setenv("KERNELGRAFT_TUNE_QUEUE_MB", "1")
    with kg.tune("on", timer=timer, blocking=False):
        big = torch.randn(300_000)  # 1.2 MB of inputs: over the limit
        torch.testing.assert_close(op(big), big * 2)
        assert kg.tune.pending() == 0 and kg.tune.stats()["background_skipped"] == 2


def test_blocking_switch_and_environment(monkeypatch):
    op = make_scale("toff::switch")
    timer = HeldTimer()
    timer.release.set()
    monkeypatch.delenv("KERNELGRAFT_TUNE_BLOCKING", raising=False)
    assert kg.tune.settings().blocking is None  # off the path on CUDA, inside the call elsewhere
    with kg.tune("on", timer=timer):
        assert served(op, torch.randn(100)) == 256  # CPU tensors: tuned inside the call
    monkeypatch.setenv("KERNELGRAFT_TUNE_BLOCKING", "0")
    with kg.tune("on", timer=timer):
        assert kg.tune.settings().blocking is False
        assert served(op, torch.randn(1000)) == 256  # the nearest bucket's, while a job tunes it
        assert kg.tune.wait(HOLD_S)
    assert kg.tune.stats()["background_queued"] == 1
    monkeypatch.setenv("KERNELGRAFT_TUNE_BLOCKING", "1")
    with kg.tune("on", timer=timer, blocking=None):  # None in a block: the environment's default
        assert kg.tune.settings().blocking is None
        assert served(op, torch.randn(3000)) == 256
    with kg.tune("on", timer=timer):
        assert kg.tune.settings().blocking is True
        assert served(op, torch.randn(9000)) == 256
    assert kg.tune.stats()["background_queued"] == 1 and kg.tune.stats()["tuned"] == 4
    with pytest.raises(kg.SpecError, match="blocking must be"):
        kg.tune(blocking=1)


@pytest.mark.parametrize("why", ["compile", "capture"])
def test_capture_and_compile_never_start_a_tuning(why, monkeypatch):
    from kernelgraft.op import modes as _modes

    monkeypatch.setattr(_modes, "_warned", set())
    op = make_scale(f"toff::{why}")
    x = torch.randn(1000)
    timer = HeldTimer()
    timer.release.set()
    with kg.tune("on", timer=timer, blocking=False), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with monkeypatch.context() as m:
            if why == "compile":
                m.setattr(torch.compiler, "is_compiling", lambda: True)
            else:
                m.setattr(torch.cuda, "is_available", lambda: True)
                m.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
            op.dispatcher.execute((x,), op.dispatcher.key((x,), False))
        assert kg.tune.pending() == 0 and not timer.calls
        assert any(issubclass(w.category, TuneWarning) for w in caught)
    assert kg.tune.stats().get("background_queued", 0) == 0


def test_report_says_what_was_tried_where_time_went_and_why_each_lost():
    op = make_scale("toff::report", bug=True, crash=True)
    timer = HeldTimer()
    with kg.tune("on", timer=timer, blocking=False):
        op(torch.randn(1000))
        pending = kg.tune.report(op)
        assert [k.state for k in pending.keys] == ["pending"]
        timer.release.set()
        assert kg.tune.wait(HOLD_S)
    report = kg.tune.report(op)
    (key,) = report.keys
    outcomes = {t.label: (t.outcome, t.why) for t in key.tried}
    assert outcomes["triton:launch_scale[BLOCK=256]"][0] == "won"
    assert outcomes["triton:launch_scale[BLOCK=512]"] == ("lost", "100.0% slower than the winner")
    assert outcomes["triton:launch_scale[BLOCK=1024,BUG=True]"][0] == "excluded"
    assert "wrong result" in outcomes["triton:launch_scale[BLOCK=1024,BUG=True]"][1]
    assert outcomes["triton:launch_crash[BLOCK=32]"][1].startswith("launch:")
    assert key.phases["gate"] > 0 and key.phases["measure"] > 0 and "queued" in key.phases
    assert report.compile_s > 0 and report.measure_s > 0
    assert all(t.gate_s is not None for t in key.tried)
    text = str(report)
    assert "toff::report: 1 key(s)" in text and "compile+gate" in text and "slower than the winner" in text


def test_cli_tune_prints_the_report(tmp_path, capsys):
    from kernelgraft.cli import main

    op = make_scale("toff::cli")
    timer = HeldTimer()
    timer.release.set()
    with kg.tune("on", timer=timer, blocking=True):
        op(torch.randn(100))  # on disk now; the command finds it there (the CPU measures nothing)
    kg.tune.clear()
    target = tmp_path / "ops.py"
    target.write_text(
        "import sys; sys.path.insert(0, %r)\n"
        "from _tune_ops import make_scale\n"
        "import torch\n"
        "op = make_scale('toff::cli')\n"
        "op.sample_inputs = lambda device='cpu': [(torch.randn(100, device=device),)]\n"
        % str(TESTS))
    assert main(["tune", str(target)]) == 0
    out = capsys.readouterr().out
    assert "toff::cli: 1 key(s)" in out and "won" in out and "slower than the winner" in out


# ---------------------------------------------------------------- the parts
class FakeClock:
    def __init__(self):
        self.t = 0.0
        self.slept = 0.0

    def now(self):
        return self.t

    def sleep(self, s):
        self.t += s
        self.slept += s


def test_pacer_runs_at_once_when_quiet_and_at_its_duty_cycle_when_busy():
    clock = FakeClock()
    busy = [False]
    pacer = _pace.Pacer(lambda: busy[0], share=0.1, sleep=clock.sleep, now=clock.now)
    for _ in range(5):  # quiet: no waiting, nothing charged
        pacer.before()
        clock.t += 0.2
        pacer.after()
    assert clock.slept == 0.0 and pacer.busy_units == 0
    busy[0] = True
    work = 0.0
    started = clock.t
    for _ in range(20):
        pacer.before()
        clock.t += 0.1  # a unit of work
        work += 0.1
        pacer.after()
    assert pacer.busy_units == 20
    # busy throughout: the work stays within the duty cycle, plus the unit in flight and a burst
    assert work <= 0.1 * (clock.t - started) + 0.1 + _pace.BURST_S
    cancelled = _pace.Pacer(lambda: True, cancelled=lambda: True, sleep=clock.sleep, now=clock.now)
    with pytest.raises(_pace.Cancelled):
        cancelled.before()


def test_phases_record_units_and_a_paused_clock():
    class Pace:
        def __init__(self):
            self.events = []

        def before(self, heavy=False):
            self.events.append("before")

        def after(self):
            self.events.append("after")

    pace = Pace()
    rec = _phases.Phases(pace)
    with rec.recording():
        with _phases.phase("gate", "a"):
            with _phases.phase("measure", "a"):  # inside a unit: part of it, not paced again
                pass
        with _phases.phase("measure", "a"):
            pass
    assert pace.events == ["before", "after", "before", "after"]
    assert set(rec.seconds) == {"gate", "measure"} and set(rec.of("a")) == {"gate", "measure"}
    assert _phases.current() is None
    with _phases.phase("gate"):  # no recording: nothing happens
        pass


@pytest.mark.parametrize("make", [
    lambda: torch.randn(6, 5).t(),                      # transposed
    lambda: torch.randn(8, 10)[:, 2:7],                 # a view with gaps
    lambda: torch.randn(1, 7).expand(4, 7),             # overlapping (stride 0)
    lambda: torch.randn(33)[1:],                        # 4 bytes off 16-byte alignment
    lambda: torch.randint(0, 9, (5,), dtype=torch.int64),
    lambda: torch.empty(0, 3),
], ids=["transposed", "gaps", "expanded", "misaligned", "int64", "empty"])
def test_input_copies_keep_layout_alignment_and_values(make):
    t = make()
    with torch.inference_mode():
        inf = t.clone() if t.numel() else t
    for src in (t, inf):
        (copy, listed, n), ready = _inputs.clone_args((src, [src], 3))
        assert ready is None and n == 3
        for c in (copy, listed[0]):
            assert c.shape == src.shape and c.stride() == src.stride() and c.dtype == src.dtype
            assert c.data_ptr() % 16 == src.data_ptr() % 16 or not src.numel()
            assert not c.is_inference()
            torch.testing.assert_close(c, src)
            if src.numel():
                assert c.untyped_storage().data_ptr() != src.untyped_storage().data_ptr()


def test_the_provisional_reference_refuses_what_the_kernels_refuse():
    import triton
    import triton.language as tl

    @triton.jit
    def _add_into(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)

    def launch(x, y, *, BLOCK):
        _add_into[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK)

    def add_into_(x: torch.Tensor, y: torch.Tensor) -> None:
        x.add_(y)

    op = kg.op(add_into_, name="toff::into", mutates_args=("x",),
               impls=[kg.triton(launch, configs=[{"BLOCK": 64}, {"BLOCK": 128}])])
    x = torch.randn(2000)
    timer = HeldTimer(ms={64: 2.0, 128: 1.0})
    with kg.tune("on", timer=timer, blocking=False):
        try:
            with pytest.raises(kg.InputError, match="overlaps the memory"):
                op(x[1:], x[:-1])  # served meanwhile by the reference: refused as a kernel would be
            y = torch.randn(2000)
            before = x.clone()
            op(x, y)
            torch.testing.assert_close(x, before + y)
        finally:
            timer.release.set()
        assert kg.tune.wait(HOLD_S)


def test_bench_first_call_smoke(tmp_path):
    from _bench_scripts import bench_script

    with bench_script("bench_first_call") as bench:
        result = bench.main(["--smoke", "--serve-seconds", "0.2", "--sample-landing", "--warm", "--out", str(tmp_path)])
    rows = {r["case"]: r for r in result["rows"]}
    assert set(rows) == {"add_relu", "rmsnorm"}
    for r in rows.values():
        assert "error" not in r, r
        assert r["landed"] and r["meanwhile"] == "reference" and r["choice"] == "equal"
        assert "fake_tensors" in r["warm"]["seconds"]  # kg.tune.warm() ran first, as at a server's start-up
        samples = r["landing_samples"]  # the sampler ran from the first call until the landing
        assert samples["span_s"] >= r["land_s"] and isinstance(samples["threads"], dict)
        for entry in samples["threads"].values():
            assert entry["samples"] >= 5 and entry["inclusive_s"] and entry["innermost_s"] and entry["by_caller_s"]
    assert result["serving"]["landed"] and result["serving"]["queued"] == 1
    assert "serving during tuning" in result["table"] and (tmp_path / "bench_first_call.json").exists()


# ---------------------------------------------------------------- on the GPU
@pytest.fixture
def default_blocking(monkeypatch):
    """The default settings (conftest pins blocking=1 for the other GPU tests)."""
    monkeypatch.delenv("KERNELGRAFT_TUNE_BLOCKING", raising=False)


def _label(op, args):
    plan = op.dispatcher.plan_for(tuple(args))
    return "reference" if plan.candidate is None else plan.candidate.label


@pytest.mark.gpu
def test_gpu_first_call_served_at_once_and_decision_matches_blocking(default_blocking, monkeypatch):
    from kernelgraft.examples.softmax import softmax
    from kernelgraft.op import outputs
    from kernelgraft.tune.tuner import TIE_MARGIN, entry_label

    threads = []
    specs = outputs.output_specs
    monkeypatch.setattr(outputs, "output_specs", lambda op, args: threads.append(threading.get_ident()) or specs(op, args))
    x = torch.randn(48, 6000, device="cuda", dtype=torch.bfloat16)
    want = torch.softmax(x.float(), -1).to(x.dtype)
    torch.testing.assert_close(softmax(x), want)
    assert _label(softmax, (x,)) in ("reference", "torch:eager")  # never an unverified kernel
    if _label(softmax, (x,)) == "reference":  # served meanwhile: no output shapes on the caller's thread
        assert threading.get_ident() not in threads
    assert kg.tune.wait(600)
    torch.testing.assert_close(softmax(x), want)
    background = kg.tune.decision(softmax, x)
    assert background is not None and _label(softmax, (x,)) == entry_label(background.winner)
    assert background.phases["measure"] > 0 and background.phases["gate"] > 0
    kg.tune.clear(disk=True)
    with kg.tune(blocking=True):
        softmax(x)
    blocking = kg.tune.decision(softmax, x)
    times = {entry_label(e): e["ms"] for e in blocking.ranking}
    ours = times.get(entry_label(background.winner))
    # the same choice, or one the blocking run itself timed within a few tie margins of its winner
    # (two tunings of one shape are two timings: a near-tie can fall either way)
    assert ours is not None and ours <= blocking.winner["ms"] * (1 + 5 * TIE_MARGIN), (background.winner, blocking.winner)


@pytest.mark.gpu
def test_gpu_a_users_global_capture_while_a_tuning_runs(default_blocking):
    from kernelgraft.examples.gemm import gemm
    from kernelgraft.examples.rmsnorm import rmsnorm

    x, w = torch.randn(64, 4096, device="cuda"), torch.randn(4096, device="cuda")
    with kg.tune(blocking=True):
        rmsnorm(x, w, 1e-6)  # tuned before
    a = torch.randn(777, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    gemm(a, b)  # a new shape: its 36 candidates tuned off the path, for seconds
    assert kg.tune.pending() == 1
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        rmsnorm(x, w, 1e-6)
        gemm(a, b)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # the default global mode, beside the worker's timings and captures
        y = rmsnorm(x, w, 1e-6)
        c = gemm(a, b)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, rmsnorm.reference(x, w, 1e-6))
    torch.testing.assert_close(c.float(), (a.float() @ b.float()), rtol=2e-2, atol=2e-1)
    assert kg.tune.wait(900)
    d = kg.tune.decision(gemm, a, b)
    assert d is not None and d.ranking  # the tuning it ran beside was not broken either
    assert torch.randn(4, device="cuda").isfinite().all()  # random numbers still work


def test_the_workers_own_cpu_time_is_not_counted_as_serving():
    import time as _time

    tid = threading.get_native_id()
    _pace.register_worker(tid)
    try:
        start, own = _pace._workers_cpu(), _time.thread_time()
        sum(i * i for i in range(200_000))  # some CPU on this (now a worker's) thread
        spent, own_spent = _pace._workers_cpu() - start, _time.thread_time() - own
    finally:
        _pace.unregister_worker(tid)
    assert abs(spent - own_spent) < 0.005  # (an idle worker of an earlier test adds nothing)


def test_a_device_whose_worker_cannot_start_tunes_inside_the_call(monkeypatch):
    from kernelgraft.tune import background as _background

    background = _background.Background()  # a process of its own: its workers fail to start
    monkeypatch.setattr(kg.tune.TUNER, "background", background)

    def broken(*args, **kwargs):
        raise RuntimeError("no worker here")

    monkeypatch.setattr(_pace.Pacer, "before", broken)
    op = make_scale("toff::broken")
    timer = HeldTimer()
    timer.release.set()
    with kg.tune("on", timer=timer, blocking=False):
        assert served(op, torch.randn(100)) == "reference"  # queued; its worker then fails
        assert background.wait(HOLD_S) and not background.usable(torch.device("cpu"))
        assert served(op, torch.randn(1000)) == 256  # tuned inside the call now
    assert background.stats["skipped"] == 1


# ---------------------------------------------------------------- the first call's output shapes
def test_output_shapes_wait_only_for_a_key_tuned_off_the_path():
    """The first call of a key tuned off the path (CUDA tensors, tuning on, not blocking) is
    spared the output shapes (a process's first fake tensors cost a second or two); every other
    call, and every call on CPU tensors, is refused on them first."""
    from types import SimpleNamespace

    from kernelgraft.op import outputs
    from kernelgraft.op.modes import Settings

    def on(device):
        return [("x", SimpleNamespace(device=torch.device(device)))]

    assert outputs.may_defer(Settings(mode="on"), on("cuda"))
    assert outputs.may_defer(Settings(mode="on", blocking=False), on("cuda"))
    assert not outputs.may_defer(Settings(mode="on", blocking=True), on("cuda"))
    assert not outputs.may_defer(Settings(mode="off"), on("cuda"))
    assert not outputs.may_defer(Settings(mode="on", blocking=False), on("cpu"))
    assert not outputs.may_defer(Settings(mode="on"), [])


def test_a_deferred_reference_failure_is_worded_by_the_output_shapes():
    from kernelgraft.op import outputs

    asked = []

    def specs(args):
        asked.append(args)
        raise kg.InputError("toff::x: argument 'w' expected shape (4,), got (5,)")

    def failing(args):
        raise RuntimeError("The size of tensor a (4) must match the size of tensor b (5)")

    plan = outputs.deferred(lambda args: args[0] * 2, specs)
    assert plan((3,)) == 6 and not asked and plan.candidate is None  # served: no shapes asked
    with pytest.raises(kg.InputError, match="expected shape"):
        outputs.deferred(failing, specs)((1,))
    with pytest.raises(RuntimeError, match="must match"):  # shapes that fit: the failure itself
        outputs.deferred(failing, lambda args: None)((1,))


def test_a_job_whose_inputs_are_refused_ends_quietly_and_its_key_queues_no_more(caplog):
    """The call served meanwhile was spared its output shapes; its job works them out first, and
    inputs that do not fit end the job with an INFO line (not a traceback) and keep its key from
    queuing a job per call (each would copy the inputs and fail again)."""
    from kernelgraft.tune.background import Background

    bg = Background()
    ran = []

    def refuse(job):
        ran.append(job.digest)
        raise kg.InputError("toff::x: argument 'w' expected shape (4,), got (5,)")

    try:
        with caplog.at_level("INFO", logger="kernelgraft.tune.background"):
            pending = bg.submit("d1", "f", torch.device("cpu"), (torch.randn(3),), refuse, "toff::x (3)")
            assert pending is not None and bg.wait(HOLD_S) and pending.landed and ran == ["d1"]
            assert bg.submit("d1", "f", torch.device("cpu"), (torch.randn(3),), refuse, "toff::x (3)") is None
            assert bg.stats["refused_inputs"] == 1 and bg.stats["refused"] == 1
            other = bg.submit("d2", "f", torch.device("cpu"), (torch.randn(3),), lambda job: ran.append(job.digest), "ok")
            assert other is not None and bg.wait(HOLD_S) and ran == ["d1", "d2"]  # other keys are queued
            # the same bucket with inputs of other shapes is tuned: the refusal is the shapes'
            fits = bg.submit("d1", "f", torch.device("cpu"), (torch.randn(4),), lambda job: ran.append("d1 (4)"), "ok")
            assert fits is not None and bg.wait(HOLD_S) and ran[-1] == "d1 (4)"
            # the op itself cannot plan them (a SpecError: data-dependent shapes): refused alike, quietly

            def spec(job):
                raise kg.SpecError("toff::y: the meta function has data-dependent shapes")

            assert bg.submit("d3", "f", torch.device("cpu"), (torch.randn(3),), spec, "toff::y (3)") is not None
            assert bg.wait(HOLD_S) and bg.submit("d3", "f", torch.device("cpu"), (torch.randn(3),), spec, "y") is None
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
        assert any("not tuning toff::x (3)" in r.getMessage() for r in caplog.records)
        bg.clear()  # clearing the decisions forgets the refusals too
        assert bg.submit("d1", "f", torch.device("cpu"), (torch.randn(3),), refuse, "toff::x (3)") is not None
        assert bg.wait(HOLD_S)
    finally:
        bg.stop()


def test_the_job_works_out_output_shapes_before_it_tunes():
    """A job's first step is the check planning spared the call served meanwhile: inputs whose
    output shapes do not fit raise the op's InputError before any candidate is compiled or timed."""
    from kernelgraft.examples.rmsnorm import rmsnorm
    from kernelgraft.op.modes import Settings
    from kernelgraft.tune import offpath
    from kernelgraft.tune.background import Job

    class Tuner:
        background = kg.tune.TUNER.background
        stats = {"background_tuned": 0}

        def resolve(self, *a):
            raise AssertionError("tuned inputs that do not fit")

    bad = (torch.randn(4, 64), torch.randn(32), 1e-6)
    run = offpath._job(Tuner(), rmsnorm, rmsnorm.candidates(torch.randn(4, 64), torch.randn(64), 1e-6), None,
                       Settings(mode="on"))
    job = Job("d", "f", "cpu", run, "rmsnorm", 0, args=bad)
    with pytest.raises(kg.InputError, match="kgexamples::rmsnorm"):
        run(job)


def test_a_job_starts_the_compile_workers_while_it_prepares(monkeypatch):
    """A key tuned off the path whose compiles would go to the worker pool starts the pool when
    its job starts (the workers import torch and Triton while the job prepares), not when its
    compile phase begins; a key whose compiles would not (CPU tensors, fewer than two workers or
    two candidates that compile ahead) starts nothing."""
    from kernelgraft.examples.rmsnorm import rmsnorm
    from kernelgraft.op.modes import Settings
    from kernelgraft.tune import compile_pool, offpath
    from kernelgraft.tune.background import Job

    x, w = torch.randn(4, 64), torch.randn(64)
    # without torch:compile: one pass (a first decision before its gate is another test's)
    cands = [c for c in rmsnorm.candidates(x, w, 1e-6) if c.label != "torch:compile"]
    ahead = [c for c in cands if compile_pool.compiles_ahead(c.impl.backend)]
    assert len(ahead) >= 2
    monkeypatch.setenv("KERNELGRAFT_COMPILE_WORKERS", "4")
    assert compile_pool.would_use(rmsnorm, cands, torch.device("cuda", 0))
    assert not compile_pool.would_use(rmsnorm, cands, torch.device("cpu"))
    assert not compile_pool.would_use(rmsnorm, ahead[:1], torch.device("cuda", 0))
    monkeypatch.setenv("KERNELGRAFT_COMPILE_WORKERS", "0")
    assert not compile_pool.would_use(rmsnorm, cands, torch.device("cuda", 0))

    started, resolved = [], []
    monkeypatch.setattr(compile_pool, "prestart", lambda ops=(): started.append(list(ops)))

    class Tuner:
        background = kg.tune.TUNER.background
        stats = {"background_tuned": 0}

        def resolve(self, *a):
            resolved.append(bool(started))

    for use in (True, False):
        started.clear()
        monkeypatch.setattr(compile_pool, "would_use", lambda op, c, d, use=use: use)
        run = offpath._job(Tuner(), rmsnorm, cands, None, Settings(mode="on"))
        run(Job("d", "f", "cpu", run, "rmsnorm", 0, args=(x, w, 1e-6)))
        assert started == ([[rmsnorm]] if use else []) and resolved[-1] == use  # started before the tuning ran, naming the op


def test_a_key_whose_kernels_the_workers_compile_lands_once(monkeypatch):
    """Where the compile workers build the kernels, ``torch:compile``'s gate runs while they start
    and compile (the next test), so the job decides among all the candidates in one pass, in a
    cold process as in a warmed one; where the kernels compile in their gates it first decides
    without ``torch:compile`` (a first decision that does not wait for Inductor), then with it."""
    from kernelgraft.examples.rmsnorm import rmsnorm
    from kernelgraft.op.modes import Settings
    from kernelgraft.tune import compile_pool, offpath
    from kernelgraft.tune.background import Job

    x, w = torch.randn(4, 64), torch.randn(64)
    with kg.tune("on", compete=True):
        cands = rmsnorm.candidates(x, w, 1e-6)
    assert "torch:compile" in [c.label for c in cands] and len(cands) > 3
    monkeypatch.setattr(compile_pool, "prestart", lambda ops=(): None)
    calls: list[tuple[str, list[str]]] = []

    class Tuner:
        background = kg.tune.TUNER.background
        stats = {"background_tuned": 0}
        memory: dict = {}

        def measure_first(self, op, first, *rest):
            calls.append(("first", [c.label for c in first]))

        def resolve(self, op, candidates, *rest):
            calls.append(("whole", [c.label for c in candidates]))
            return types.SimpleNamespace(source="tuned")

    everyone = [c.label for c in cands]
    two = [("first", [c for c in everyone if c != "torch:compile"]), ("whole", everyone)]
    for use, want in ((True, [("whole", everyone)]), (False, two)):
        calls.clear()
        monkeypatch.setattr(compile_pool, "would_use", lambda op, c, d, use=use: use)
        run = offpath._job(Tuner(), rmsnorm, cands, None, Settings(mode="on"))
        run(Job("d", "f", "cpu", run, "rmsnorm", 0, args=(x, w, 1e-6)))
        assert calls == want


def test_inductor_compiles_the_reference_while_the_workers_compile_the_kernels(monkeypatch):
    """When the kernels compile in the worker pool and ``torch:compile`` competes, its gate (Inductor
    compiling the reference: seconds a shape) runs on the tuning's thread while the pool's compile
    waits on a thread of its own; every candidate still gets exactly one result, in order."""
    import threading as _threading

    from kernelgraft.examples.add_relu import add_relu
    from kernelgraft.op import compete
    from kernelgraft.op.modes import Settings
    from kernelgraft.tune import compile_pool, trials

    x, y = torch.randn(1000), torch.randn(1000)
    settings = Settings(mode="on", compete=True, timer=lambda trial, s: (trial.run(0), 1.0)[1])
    cands = compete.offered(add_relu, add_relu.candidates(x, y), [("x", x), ("y", y)], settings)
    labels = [c.label for c in cands]
    assert "torch:compile" in labels and labels.index("torch:compile") > 0
    gate, order, seen = trials._gate, [], {}
    inductor_gating = _threading.Event()

    def gated(op, cand, *rest):
        order.append(cand.label)
        if cand.label == "torch:compile":
            seen["gate"] = _threading.get_ident()
            inductor_gating.set()
            return trials.Result(cand, kind="compile", reason="stood in for Inductor")
        return gate(op, cand, *rest)

    def compiling(op, candidates, args, device):
        seen["pool"] = _threading.get_ident()
        seen["overlapped"] = inductor_gating.wait(HOLD_S)  # the gate ran meanwhile
        return None

    monkeypatch.setattr(trials, "_gate", gated)
    monkeypatch.setattr(compile_pool, "compile_ahead", compiling)
    monkeypatch.setattr(trials, "would_use", lambda op, c, d: True)
    results = trials.run_trials(add_relu, cands, (x, y), settings)
    assert [r.candidate.label for r in results] == labels
    assert order[0] == "torch:compile" and sorted(order) == sorted(labels)  # gated once each
    assert seen["overlapped"] and seen["pool"] != seen["gate"] == _threading.get_ident()
    assert next(r for r in results if r.candidate.label == "torch:compile").reason == "stood in for Inductor"
    assert all(r.ms is not None for r in results if r.candidate.label != "torch:compile")

    # without the pool, as before: compiles inline, then every gate in the candidates' order
    order.clear()
    inline = []
    monkeypatch.setattr(trials, "compile_ahead", lambda *a: inline.append(_threading.get_ident()))
    monkeypatch.setattr(trials, "would_use", lambda op, c, d: False)
    trials.run_trials(add_relu, cands, (x, y), settings)
    assert order == labels and inline == [_threading.get_ident()]


def test_the_report_says_what_the_workers_compiled(monkeypatch):
    """A key's record counts the compile jobs sent to the workers, compiled and failed (a failed
    one compiles again in its gate): ``kg.tune.report`` says so beside the seconds."""
    from kernelgraft.examples.add_relu import add_relu
    from kernelgraft.op.modes import Settings
    from kernelgraft.tune import compile_pool, phases as _phases, trials
    from kernelgraft.tune.report import KeyReport

    x, y = torch.randn(1000), torch.randn(1000)
    settings = Settings(mode="on", compete=False, timer=lambda trial, s: (trial.run(0), 1.0)[1])
    cands = [c for c in add_relu.candidates(x, y) if c.supported and c.index >= 0]
    assert len(cands) >= 2

    def compiling(op, candidates, args, device):
        return compile_pool.Summary(jobs=len(candidates) + 1, compiled=len(candidates), failed=1,
                                    failures=["one: boom"],
                                    built={(c.index, tuple(c.config)) for c in candidates})

    monkeypatch.setattr(trials, "compile_ahead", compiling)
    rec = _phases.Phases()
    with rec.recording():
        results = trials.run_trials(add_relu, cands, (x, y), settings)
    assert all(r.ms is not None for r in results)
    totals = rec.totals()
    n = len(cands)
    assert (totals["ahead_jobs"], totals["ahead_compiled"], totals["ahead_failed"]) == (n + 1, n, 1)
    said = str(KeyReport("x", "d", "tuned", None, 1.0, totals))
    assert f"{n} of {n + 1} candidates compiled ahead (1 failed, compiled in their gates)" in said
    assert "compiled_here" not in totals  # the interpreter compiles nothing: no count, no words
    assert "Triton kernels compiled in the gates" not in said
    said = str(KeyReport("x", "d", "tuned", None, 1.0, {**totals, "compiled_here": 3.0}))
    assert "3 Triton kernels compiled in the gates" in said


# ---------------------------------------------------------------- planning with the shapes deferred
@pytest.fixture
def deferring(monkeypatch):
    """Planning as on CUDA with the default settings: a new key's first call served by the
    reference while a job tunes it skips the output shapes (``op.outputs.may_defer``)."""
    from kernelgraft.op import outputs

    monkeypatch.setattr(outputs, "may_defer", lambda s, t: s.mode == "on" and s.blocking is not True and bool(t))


def _add_op(name):
    from _tune_ops import CONFIGS

    def add2(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x + y) * 2

    def launch(x, y, out, *, BLOCK):
        launch_scale(x + y, out, BLOCK=BLOCK)

    return kg.op(add2, name=name, impls=[kg.triton(launch, configs=CONFIGS)])  # no dtypes=: judged by the reference


def test_a_deferred_first_call_that_does_not_fit_leaves_the_op_serving_the_next(deferring):
    """The first call of an op without ``dtypes=`` has shapes that do not fit: it is refused in the
    shapes' words, and the dtypes are not judged by it, so a later call that fits is served and
    tuned as ever (the zero-filled dtype probe's refusal is kept only where the shapes fit)."""
    op = _add_op("toff::add2")
    timer = HeldTimer()
    with kg.tune("on", timer=timer, blocking=False):
        try:
            with pytest.raises(kg.InputError, match="toff::add2"):
                op(torch.randn(1000), torch.randn(900))
            x, y = torch.randn(1000), torch.randn(1000)
            torch.testing.assert_close(op(x, y), (x + y) * 2)  # served (the reference, meanwhile)
        finally:
            timer.release.set()
        assert kg.tune.wait(HOLD_S)
        x, y = torch.randn(1000), torch.randn(1000)
        torch.testing.assert_close(op(x, y), (x + y) * 2)
        assert op.dispatcher.plan_for((x, y)).candidate is not None  # the tuned kernel serves


def test_a_deferred_reference_with_data_dependent_shapes_is_told_on_the_next_call(deferring):
    """A reference whose output shapes depend on the data (no ``register_meta``) serves its first
    call meanwhile (its values are right); the job cannot plan it and ends quietly; the next call,
    with no job for those shapes, works the output shapes out first and raises the op's error."""

    def launch(x, out, *, BLOCK):
        launch_scale(x, out, BLOCK=BLOCK)

    def positive(x: torch.Tensor) -> torch.Tensor:
        return x[x > 0] * 2

    op = kg.op(positive, name="toff::positive", impls=[kg.triton(launch, configs=[{"BLOCK": 64}, {"BLOCK": 128}])])
    x = torch.randn(1000)
    with kg.tune("on", timer=HeldTimer(), blocking=False) as s:
        s.timer.release.set()
        torch.testing.assert_close(op(x), x[x > 0] * 2)
        assert kg.tune.wait(HOLD_S)
        with pytest.raises(kg.KernelgraftError, match="data"):
            op(x)


def test_a_jobs_output_shapes_run_in_a_paced_unit(monkeypatch):
    """The job's first work, the output shapes the served call skipped (a process's first fake
    tensors import much of torch: seconds of Python holding the GIL), is a unit its pacer lets
    start, not work done beside the call that queued it."""
    from kernelgraft.op import outputs
    from kernelgraft.tune import phases as _phases

    seen = []
    specs = outputs.output_specs

    def watched(op, args):
        if threading.current_thread().name.startswith("kernelgraft-tune-"):  # the job's, not the call's
            rec = _phases.current()
            seen.append(rec is not None and rec._depth == 1 and rec.pace is not None)
        return specs(op, args)

    monkeypatch.setattr(outputs, "output_specs", watched)
    op = make_scale("toff::paced_specs")
    timer = HeldTimer()
    timer.release.set()
    with kg.tune("on", timer=timer, blocking=False):
        assert served(op, torch.randn(300)) == "reference"
        assert kg.tune.wait(HOLD_S)
    assert seen and all(seen), seen  # the job's calls, each inside a paced unit


def test_a_jobs_first_fake_tensors_are_a_heavy_unit(monkeypatch):
    """Until torch's fake tensors were imported (``torch._dynamo``), working the output shapes
    out runs seconds of Python: a heavy unit, which waits for a pause in serving; later, a light
    one."""
    from kernelgraft.tune import offpath, phases as _phases

    units = []
    phase = _phases.phase

    def spy(name, candidate=None, heavy=False):
        units.append((name, heavy))
        return phase(name, candidate, heavy=heavy)

    monkeypatch.setattr(_phases, "phase", spy)  # offpath's units (the trials hold their own name)
    timer = HeldTimer()
    timer.release.set()
    for first, n in ((True, 300), (False, 400)):
        monkeypatch.setattr(offpath, "_first_fake_tensors", lambda first=first: first)
        units.clear()
        with kg.tune("on", timer=timer, blocking=False):
            assert served(make_scale(f"toff::heavy_specs_{n}"), torch.randn(n)) == "reference"
            assert kg.tune.wait(HOLD_S)
        assert units == [("prepare", first)], units
    assert not offpath._first_fake_tensors()  # this process made fake tensors long ago


def test_a_job_whose_kernels_the_workers_compile_warms_their_launches_beside_the_output_shapes(monkeypatch):
    """What a process's first launch of a kernel computes once (``compile_jobs.warm_launches``: a
    subprocess and file hashes, a second on the H200) runs on a thread of its own while the job
    works out the output shapes (a cold process's first fake tensors: seconds of imports), and is
    done before any candidate is tuned; a job whose kernels compile in their gates warms nothing."""
    from kernelgraft.examples.rmsnorm import rmsnorm
    from kernelgraft.op.modes import Settings
    from kernelgraft.tune import compile_jobs, compile_pool, offpath
    from kernelgraft.tune.background import Job

    x, w = torch.randn(4, 64), torch.randn(64)
    cands = [c for c in rmsnorm.candidates(x, w, 1e-6) if c.label != "torch:compile"]
    monkeypatch.setattr(compile_pool, "prestart", lambda ops=(): None)
    main = threading.get_ident()
    specs_started, warmed, seen = threading.Event(), threading.Event(), {}

    def warm_launches(candidates, device):
        seen["thread"] = threading.get_ident()
        seen["overlapped"] = specs_started.wait(HOLD_S)  # the output shapes are being worked out
        warmed.set()

    specs = rmsnorm.dispatcher.output_specs

    def output_specs(args):
        specs_started.set()
        seen["warmed_meanwhile"] = warmed.wait(HOLD_S)
        return specs(args)

    monkeypatch.setattr(compile_jobs, "warm_launches", warm_launches)
    monkeypatch.setattr(rmsnorm.dispatcher, "output_specs", output_specs)
    # Inductor's compile workers start in the same unit, before the output shapes are worked out
    monkeypatch.setattr(offpath, "start_for_inductor",
                        lambda op, c, d: seen.setdefault("inductor_before_specs", not specs_started.is_set()))

    class Tuner:
        background = kg.tune.TUNER.background
        stats = {"background_tuned": 0}

        def resolve(self, *a):
            seen["done_before_tuning"] = warmed.is_set()

    monkeypatch.setattr(compile_pool, "would_use", lambda op, c, d: True)
    run = offpath._job(Tuner(), rmsnorm, cands, None, Settings(mode="on"))
    run(Job("d", "f", "cpu", run, "rmsnorm", 0, args=(x, w, 1e-6)))
    assert seen == {"thread": seen["thread"], "overlapped": True, "warmed_meanwhile": True,
                    "done_before_tuning": True, "inductor_before_specs": True}
    assert seen["thread"] != main

    seen.clear()
    warmed.clear()
    specs_started.clear()
    monkeypatch.setattr(compile_pool, "would_use", lambda op, c, d: False)
    monkeypatch.setattr(rmsnorm.dispatcher, "output_specs", specs)
    run = offpath._job(Tuner(), rmsnorm, cands, None, Settings(mode="on"))
    run(Job("d", "f", "cpu", run, "rmsnorm", 0, args=(x, w, 1e-6)))
    assert seen == {"done_before_tuning": False, "inductor_before_specs": True}


def test_a_job_queued_by_a_call_starts_after_that_call_returned(monkeypatch):
    """The call that queues a key's job runs the reference meanwhile; the job (whose first tuning
    imports for seconds, on the GIL) starts once that call's plan returned, or after a bound when
    it never does. A job not queued by a call does not wait."""
    from kernelgraft.examples.rmsnorm import rmsnorm
    from kernelgraft.op import provisional
    from kernelgraft.op.modes import Settings
    from kernelgraft.op.select import Pending
    from kernelgraft.tune import compile_pool, offpath
    from kernelgraft.tune.background import Job

    monkeypatch.setattr(compile_pool, "would_use", lambda *a: False)
    x, w = torch.randn(4, 64), torch.randn(64)
    cands = [c for c in rmsnorm.candidates(x, w, 1e-6) if c.label != "torch:compile"]
    order: list[str] = []

    class Tuner:
        background = kg.tune.TUNER.background
        stats = {"background_tuned": 0}

        def resolve(self, *a):
            order.append("tuned")

    # the call's side: the plan kept while the key is pending marks it served when it returns
    landing = Pending()
    release = threading.Event()

    def reference_plan(args):
        release.wait(30)
        order.append("served")
        return "out"

    waiting = provisional.pending(reference_plan, {}, ("k",), landing, lambda args, key: None)
    run = offpath._job(Tuner(), rmsnorm, cands, None, Settings(mode="on"), queued_by_a_call=True)
    job = Job("d", "f", "cpu", run, "rmsnorm", 0, args=(x, w, 1e-6), pending=landing)
    call = threading.Thread(target=waiting, args=((x, w, 1e-6),))
    tune = threading.Thread(target=run, args=(job,))
    call.start()
    tune.start()
    tune.join(0.2)
    assert order == [] and tune.is_alive()  # the job waits while the call is in its plan
    release.set()
    call.join(30)
    tune.join(30)
    assert order == ["served", "tuned"] and landing.served

    # a call whose plan raises has returned too
    raised = Pending()
    failing = provisional.pending(lambda args: 1 / 0, {}, ("k",), raised, lambda args, key: None)
    with pytest.raises(ZeroDivisionError):
        failing((x,))
    assert raised.served
    # never served (the call failed before its plan ran): the job starts after the bound
    monkeypatch.setattr(offpath, "FIRST_CALL_WAIT_S", 0.05)
    order.clear()
    job = Job("d", "f", "cpu", run, "rmsnorm", 0, args=(x, w, 1e-6), pending=Pending())
    run(job)
    assert order == ["tuned"] and not job.pending.served
    # not queued by a call: no wait for one
    monkeypatch.setattr(offpath, "FIRST_CALL_WAIT_S", 3600.0)
    order.clear()
    direct = offpath._job(Tuner(), rmsnorm, cands, None, Settings(mode="on"))
    direct(Job("d", "f", "cpu", direct, "rmsnorm", 0, args=(x, w, 1e-6)))
    assert order == ["tuned"]
