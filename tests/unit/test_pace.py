"""Heavy units of a tuning off the caller's path (``kernelgraft.tune.pace``): a unit that compiles
in this process waits for a pause in serving, for at most a bound, then starts on the duty cycle
anyway (counted); cancellation still stops it while it waits; light units keep the duty cycle;
the trials mark as heavy exactly the gates that compile here (``torch:compile``'s, and a kernel's
the worker pool did not compile for the key). Fake clocks and a fake ``busy()``: nothing sleeps
real seconds and nothing is timed."""

from __future__ import annotations

import pytest
import torch

from kernelgraft.tune import pace as _pace, phases as _phases


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def now(self):
        return self.t

    def sleep(self, s):
        assert s > 0
        self.t += s


def _pacer(clock, busy, **kw):
    return _pace.Pacer(busy, sleep=clock.sleep, now=clock.now, **kw)


def test_a_heavy_unit_waits_for_a_quiet_window_a_light_one_does_not():
    clock = FakeClock()
    busy = lambda: clock.t < 3.0  # noqa: E731  serving pauses at t = 3 s
    light = _pacer(clock, busy, share=0.05, heavy_s=10.0)
    light.before()  # the duty cycle lets it start under load, long before the pause
    assert clock.t < 1.0 and light.busy_units == 1 and light.heavy_under_load == 0
    light.after()

    clock.t = 0.0
    heavy = _pacer(clock, busy, share=0.05, heavy_s=10.0)
    heavy.before(heavy=True)
    assert 3.0 <= clock.t < 3.0 + _pace.HEAVY_POLL_S + 1e-9  # it started in the pause, not before
    assert heavy.busy_units == 0 and heavy.heavy_under_load == 0  # not timed under load
    clock.t += 2.0  # the unit: its start was quiet, so nothing is charged to the duty cycle
    heavy.after()
    assert heavy.tokens >= 0


def test_a_heavy_unit_starts_after_the_bound_and_is_counted():
    clock = FakeClock()
    pace = _pacer(clock, lambda: True, share=0.1, heavy_s=2.0)  # serving never pauses
    rec = _phases.Phases(pace)
    with rec.recording():
        with _phases.phase("gate", "a", heavy=True):
            started = clock.t
            clock.t += 1.0  # a one-second compile, under load
        assert started >= 2.0  # it waited out the bound first
        with _phases.phase("gate", "b", heavy=True):
            second = clock.t
        # the next heavy unit waits the bound again, and the duty cycle's debt of the first one
        # (a full bucket less the unit, refilled to half a bucket at the share)
        assert second - (started + 1.0) >= 2.0
        assert second - (started + 1.0) >= (1.0 - _pace.BURST_S / 2) / 0.1 - 1e-6
    totals = rec.totals()
    assert pace.heavy_under_load == 2 and totals["heavy_under_load"] == 2.0 and totals["units_under_load"] == 2.0
    from kernelgraft.tune.report import KeyReport

    said = str(KeyReport("x: (4,)", "d", "tuned", None, 14.0, totals))
    assert "2 units timed under load" in said and "2 compiles under load" in said


def test_cancellation_is_honoured_while_a_heavy_unit_waits():
    clock = FakeClock()
    pace = _pacer(clock, lambda: True, share=0.05, heavy_s=60.0, cancelled=lambda: clock.t > 1.0)
    with pytest.raises(_pace.Cancelled):
        pace.before(heavy=True)
    assert clock.t < 1.0 + 0.3  # stopped at the next look, not after the bound
    assert pace.busy_units == 0


def test_a_zero_bound_paces_heavy_units_as_light_ones_and_the_knob(monkeypatch):
    starts = []
    for heavy in (False, True):
        clock = FakeClock()
        pace = _pacer(clock, lambda: True, share=0.05, heavy_s=0.0)
        pace.before(heavy=heavy)
        starts.append(clock.t)
    assert starts[0] == starts[1] < 1.0
    for text, want in (("2.5", 2.5), ("0", 0.0), ("", _pace.HEAVY_WAIT_S), ("soon", _pace.HEAVY_WAIT_S),
                       ("-1", _pace.HEAVY_WAIT_S), ("inf", _pace.HEAVY_WAIT_S)):
        monkeypatch.setenv("KERNELGRAFT_TUNE_HEAVY_WAIT", text)
        assert _pace.heavy_wait() == want
        assert _pace.Pacer(lambda: False).heavy_s == want


def test_blocking_mode_is_unchanged():
    """Without a pacer (a tuning on the caller's thread) a heavy unit starts at once."""
    rec = _phases.Phases()
    with rec.recording():
        with _phases.phase("gate", "a", heavy=True):
            pass
    assert set(rec.seconds) == {"gate"} and "heavy_under_load" not in rec.totals()


# ---------------------------------------------------------------- what the trials mark heavy
class _Recorder:
    """A pace that starts everything at once and records whether each unit was heavy."""

    def __init__(self):
        self.heavy = []

    def before(self, heavy=False):
        self.heavy.append(heavy)

    def after(self):
        pass


class _Recording(_phases.Phases):
    """The recording's units, (phase, candidate label), in the order they ran."""

    def __init__(self, pace):
        super().__init__(pace)
        self.units = []

    def add(self, name, seconds, candidate=None):
        super().add(name, seconds, candidate)
        self.units.append((name, getattr(candidate, "label", None)))


@pytest.fixture(scope="module")
def add_relu_case():
    from kernelgraft.examples.add_relu import add_relu
    from kernelgraft.op import compete
    from kernelgraft.op.modes import Settings

    torch.manual_seed(0)
    x, y = torch.randn(1000), torch.randn(1000)
    x[5], y[9] = float("nan"), float("-inf")
    settings = Settings(mode="on", compete=True, timer=lambda trial, s: (trial.run(0), 1.0)[1])
    cands = compete.offered(add_relu, add_relu.candidates(x, y), [("x", x), ("y", y)], settings)
    labels = [c.label for c in cands]
    assert "torch:compile" in labels and "torch:eager" in labels
    assert sum(1 for c in cands if not compete.is_torch(c)) >= 3
    return add_relu, cands, (x, y), settings


def _units(monkeypatch, case, pooled):
    """(phase, label, heavy) of every unit of a real CPU tuning; ``pooled``: the candidates the
    worker pool compiled (None: no pool). Inductor's compile is stood in for (its gate's unit is
    what is marked, not what it runs)."""
    from kernelgraft.tune import compile_pool, trials

    op, cands, args, settings = case
    gate = trials._gate

    def gated(op, cand, *rest):
        if cand.label == "torch:compile":
            return trials.Result(cand, kind="compile", reason="stood in for Inductor")
        return gate(op, cand, *rest)

    def compiling(op, candidates, args, device):
        summary = compile_pool.Summary(jobs=len(pooled) + 1, compiled=len(pooled), failed=1)
        summary.built.update((c.index, tuple(c.config)) for c in pooled)
        return summary

    monkeypatch.setattr(trials, "_gate", gated)
    monkeypatch.setattr(trials, "would_use", lambda op, c, d: pooled is not None)
    monkeypatch.setattr(compile_pool, "compile_ahead", compiling)  # what the pool's thread (Ahead) calls
    monkeypatch.setattr(trials, "compile_ahead", lambda *a: None)  # no pool: everything compiles in its gate
    pace = _Recorder()
    rec = _Recording(pace)
    with rec.recording():
        results = trials.run_trials(op, cands, args, settings)
    assert len(results) == len(cands) and len(rec.units) == len(pace.heavy)
    assert any(r.ms is not None for r in results if r.candidate.label != "torch:compile")
    return [(name, label, heavy) for (name, label), heavy in zip(rec.units, pace.heavy)]


def test_trials_mark_the_gates_that_compile_in_this_process(monkeypatch, add_relu_case):
    from kernelgraft.op import compete

    _, cands, _, _ = add_relu_case
    kernels = [c for c in cands if not compete.is_torch(c)]
    pooled = kernels[:2]  # the pool compiled these two; a third job failed, the rest had none
    units = _units(monkeypatch, add_relu_case, pooled)
    gates = {label: heavy for name, label, heavy in units if name == "gate"}
    assert set(gates) == {c.label for c in cands}  # every candidate gated once
    assert gates["torch:compile"] and not gates["torch:eager"]
    assert [gates[c.label] for c in kernels] == [False, False] + [True] * (len(kernels) - 2)
    assert not any(heavy for name, _, heavy in units if name != "gate")  # prepare, compile, measure, host
    assert units[0][0] == "prepare" and units[2][:2] == ("gate", "torch:compile")  # gated as the pool compiles

    # no pool: every kernel compiles in its gate, and torch:compile's gate comes in the candidates' order
    units = _units(monkeypatch, add_relu_case, None)
    gates = {label: heavy for name, label, heavy in units if name == "gate"}
    assert gates == {c.label: not (compete.is_torch(c) and c.label == "torch:eager") for c in cands}
    assert [label for name, label, _ in units if name == "gate"] == [c.label for c in cands]
