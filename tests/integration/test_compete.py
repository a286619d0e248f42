"""PyTorch competing in tuning (``torch:eager``, ``torch:compile``) on the CPU: forced with
``kg.tune(compete=True)`` and a fake timer (on CPU tensors they do not compete by default), kernels
through Triton's interpreter, ``torch:compile`` through Dynamo with the eager backend (Inductor's CPU
codegen would need a C++ compiler and minutes here). GPU: tests/gpu/test_tune_gpu.py's compete tests."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
import torch

import kernelgraft as kg
from kernelgraft.op import compete as _compete
from kernelgraft.tune.cache import DiskCache
from kernelgraft.op.modes import Settings
from kernelgraft.tune.tuner import Decision

from _tune_ops import CONFIGS, FAKE_MS, launch_scale, make_scale  # noqa: E402
from _paths import TESTS

EAGER, COMPILE = "torch:eager", "torch:compile"


@pytest.fixture(autouse=True)
def _fresh_tuner(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("KERNELGRAFT_TUNE", "KERNELGRAFT_PRUNE", "KERNELGRAFT_MAX_CANDIDATES", "KERNELGRAFT_COMPETE"):
        monkeypatch.delenv(var, raising=False)
    # Dynamo only: the compile path (tracing, guards, recompiles) without Inductor's C++ build.
    monkeypatch.setattr(_compete, "compile_reference", lambda fn: torch.compile(fn, backend="eager"))
    kg.tune.clear()
    kg.tune.TUNER.stats.clear()
    yield
    kg.tune.clear()


def timer_with(torch_ms: dict[str, float], seen: list | None = None):
    """Fake timings: kernels by BLOCK (256 fastest, 1.0 ms), torch candidates from ``torch_ms``.
    Every trial is run once, so what would be timed really runs."""

    def timer(trial, settings):
        trial.run(0)
        label = trial.candidate.label
        if seen is not None:
            seen.append(label)
        if _compete.is_torch(trial.candidate):
            return torch_ms[trial.candidate.impl.name]
        return FAKE_MS[trial.candidate.config.as_dict()["BLOCK"]]

    return timer


def served(op, *args) -> str | None:
    """The label of what the op's plan for these inputs runs (after calling it)."""
    op(*args)
    plan = op.dispatcher.plan_for(tuple(args))
    return None if plan.candidate is None else plan.candidate.label


# ---------------------------------------------------------------- listing
def test_candidates_list_torch_last_with_reasons():
    op = make_scale("tcp::list")
    x = torch.randn(1000)
    cands = op.candidates(x)
    assert [c.label for c in cands[-2:]] == [EAGER, COMPILE]
    assert all(c.supported for c in cands[:-2])  # the kernels come first, unchanged
    for c in cands[-2:]:  # CPU tensors: off unless forced, and the reason says how to force it
        assert not c.supported and "on cpu" in c.reason and "compete=True" in c.reason
    with kg.tune(compete=True):
        assert [c.label for c in op.candidates(x) if c.supported][-2:] == [EAGER, COMPILE]
    with kg.tune(compete=False):
        assert "compete=False" in op.candidates(x)[-1].reason


def test_per_op_switch_and_validation():
    x = torch.randn(1000)

    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    only_eager = kg.op(twice, name="tcp::eager_only", impls=[kg.triton(launch_scale, configs=CONFIGS)],
                       compete=("eager",))
    off = kg.op(twice, name="tcp::off", impls=[kg.triton(launch_scale, configs=CONFIGS)], compete=False)
    with kg.tune(compete=True):
        by_label = {c.label: c for c in only_eager.candidates(x)}
        assert by_label[EAGER].supported
        assert by_label[COMPILE].reason == "off: kg.op(..., compete=('eager',))"
        assert not any(c.supported for c in off.candidates(x) if _compete.is_torch(c))
    for bad in (("jit",), None, 0):  # None: "the default" in kg.tune, so refused here
        with pytest.raises(kg.SpecError, match=r"compete must be True, False or a tuple of \('eager', 'compile'\)"):
            kg.op(twice, name="tcp::bad", compete=bad)
    # compete is part of the op's identity only when it is not the default
    assert "compete" in off.identity and "compete" not in make_scale("tcp::plain").identity


# ---------------------------------------------------------------- winning and losing
def test_reference_wins_when_fastest_and_runs_without_replay():
    op = make_scale("tcp::win")
    x = torch.randn(1000)
    seen: list[str] = []
    with kg.tune("on", timer=timer_with({"eager": 0.5, "compile": 0.7}, seen), compete=True):
        assert served(op, x) == EAGER
        for _ in range(3):  # the plan is the Python path: no native replay gets installed
            torch.testing.assert_close(op(x), x * 2)
        assert op.dispatcher.current_replay() is None
        assert not hasattr(op.dispatcher.plan_for((x,)), "native")
        d = kg.tune.decision(op, x)
    assert {EAGER, COMPILE} <= set(seen)  # both measured through the same timer as the kernels
    assert d.winner == {"impl": -1, "impl_name": "eager", "backend": "torch", "config": {}, "ms": 0.5,
                        "gpu_ms": 0.5}  # no host_ms: this timer does not measure the host
    assert [(e["backend"], e["impl_name"]) for e in d.ranking[:2]] == [("torch", "eager"), ("torch", "compile")]
    assert d.ranking[2]["config"] == {"BLOCK": 256}


def test_compile_wins_and_serves_through_dynamo():
    op = make_scale("tcp::compile")
    x = torch.randn(1000)
    with kg.tune("on", timer=timer_with({"eager": 5.0, "compile": 0.2}), compete=True):
        assert served(op, x) == COMPILE
        torch.testing.assert_close(op(x), x * 2)
        y = torch.randn(3000)  # a new shape: tuned again; Dynamo recompiles (dims marked dynamic)
        assert served(op, y) == COMPILE
        torch.testing.assert_close(op(y), y * 2)


def test_reference_loses_when_slower():
    op = make_scale("tcp::lose")
    x = torch.randn(1000)
    with kg.tune("on", timer=timer_with({"eager": 9.0, "compile": 8.0}), compete=True):
        assert served(op, x) == "triton:launch_scale[BLOCK=256]"
    with kg.tune(compete=True):
        d = kg.tune.decision(op, x)
    assert d.ranking[0]["config"] == {"BLOCK": 256}
    assert [e["impl_name"] for e in d.ranking if e["backend"] == "torch"] == ["compile", "eager"]


def test_a_reference_fast_on_the_gpu_but_costly_to_call_loses_to_the_kernel():
    """A timer that also measures the host's cost per call (the CUDA timer does) scores PyTorch
    candidates by max(GPU, host) for torch:compile: at 0.2 ms of GPU time but 3 ms of Dynamo and
    wrapper per call loses to a 1 ms kernel. Kernels' host time is measured too, but not scored
    (Inductor's in-graph choice weighs it: tests/unit/test_inline.py)."""
    op = make_scale("tcp::hostcost")
    x = torch.randn(1000)
    asked: list[str] = []
    timer = timer_with({"eager": 5.0, "compile": 0.2})

    def host_ms(trial):
        asked.append(trial.candidate.label)
        return 3.0

    timer.host_ms = host_ms
    with kg.tune("on", timer=timer, compete=True):
        assert served(op, x) == "triton:launch_scale[BLOCK=256]"
        d = kg.tune.decision(op, x)
    assert {e["impl_name"]: e["ms"] for e in d.ranking if e["backend"] == "torch"} == {"compile": 3.0, "eager": 5.0}
    # torch:compile's host time is scored; the eager reference's (5 ms, far behind) is not asked for
    assert COMPILE in asked and EAGER not in asked
    kernel = d.ranking[0]
    assert (kernel["ms"], kernel["gpu_ms"], kernel["host_ms"]) == (1.0, 1.0, 3.0)
    timer.host_ms = lambda trial: 0.1  # cheap to call: the GPU time decides, as before
    with kg.tune("on", timer=timer, compete=True):
        assert served(make_scale("tcp::hostcheap"), x) == COMPILE


def test_tie_goes_to_the_eager_reference():
    """Within the 1% tie margin the eager reference serves: a kernel must beat PyTorch by more than
    timing noise (the LLM suite's "never slower than PyTorch"), whichever was faster by the noise."""
    op = make_scale("tcp::tie")
    x = torch.randn(1000)
    with kg.tune("on", timer=timer_with({"eager": 1.005, "compile": 1.5}), compete=True):
        assert served(op, x) == EAGER
    with kg.tune("on", timer=timer_with({"eager": 0.995, "compile": 1.5}), compete=True):
        assert served(make_scale("tcp::tie2"), x) == EAGER


def test_a_compiled_reference_tie_goes_to_the_kernel():
    """torch:compile gets no such preference: near a tie the kernel serves (no Dynamo in the call)."""
    op = make_scale("tcp::tiecompile")
    x = torch.randn(1000)
    with kg.tune("on", timer=timer_with({"eager": 5.0, "compile": 0.995}), compete=True):
        assert served(op, x) == "triton:launch_scale[BLOCK=256]"


def test_the_eager_reference_is_ranked_by_gpu_time_its_host_time_recorded():
    """torch:eager is scored like a kernel, by GPU time; its host time per call is recorded, not
    scored (on the H200 the host score lost cuBLAS to Triton GEMMs up to 24% slower on the GPU)."""
    op = make_scale("tcp::eagerhost")
    x = torch.randn(1000)
    timer = timer_with({"eager": 0.5, "compile": 5.0})
    timer.host_ms = lambda trial: 3.0
    with kg.tune("on", timer=timer, compete=True):
        assert served(op, x) == EAGER
        d = kg.tune.decision(op, x)
    assert {k: d.winner[k] for k in ("ms", "gpu_ms", "host_ms")} == {"ms": 0.5, "gpu_ms": 0.5, "host_ms": 3.0}


def test_mode_off_runs_a_kernel_not_pytorch():
    op = make_scale("tcp::modeoff")
    with kg.tune("off", compete=True):
        assert served(op, torch.randn(1000)) == "triton:launch_scale[BLOCK=64]"


# ---------------------------------------------------------------- the gate
def test_compile_with_a_wrong_result_is_rejected_by_the_gate(monkeypatch):
    monkeypatch.setattr(_compete, "compile_reference", lambda fn: (lambda x: x * 2.5))
    op = make_scale("tcp::wrongcompile")
    x = torch.randn(1000)
    with kg.tune("on", timer=timer_with({"eager": 3.0, "compile": 0.01}), compete=True):
        assert served(op, x) == "triton:launch_scale[BLOCK=256]"
        d = kg.tune.decision(op, x)
    (excluded,) = [e for e in d.excluded if e["backend"] == "torch"]
    assert excluded["impl_name"] == "compile" and excluded["kind"] == "wrong"
    assert "wrong result" in excluded["reason"]


def test_reference_dynamo_cannot_compile_is_marked_unsupported_once(monkeypatch):
    calls = []

    def refusing(fn):
        def compiled(*args):
            calls.append(1)
            raise RuntimeError("dynamo says no: data-dependent control flow")
        return compiled

    monkeypatch.setattr(_compete, "compile_reference", refusing)
    op = make_scale("tcp::nocompile")
    x = torch.randn(1000)
    with kg.tune("on", timer=timer_with({"eager": 0.5, "compile": 0.1}), compete=True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the one log line; the reason below is the contract
            assert served(op, x) == EAGER
        d = kg.tune.decision(op, x)
        (compile_cand,) = [c for c in op.candidates(x) if c.label == COMPILE]
        assert not compile_cand.supported
        assert compile_cand.reason == ("torch.compile failed: RuntimeError: dynamo says no: "
                                       "data-dependent control flow")
        assert served(op, torch.randn(5000)) == EAGER  # a new shape: compile is not offered again
    assert len(calls) == 1
    assert [e["kind"] for e in d.excluded] == ["compile"]


def test_mutating_reference_competes_judged_on_its_mutation():
    def launch_double(x, *, BLOCK):
        launch_scale(x, x, BLOCK=BLOCK)

    def double_(x: torch.Tensor) -> None:
        x.mul_(2)

    op = kg.op(double_, name="tcp::inplace", mutates_args=("x",),
               impls=[kg.triton(launch_double, configs=CONFIGS)])
    assert op.signature.returns == "none"
    x = torch.randn(1000)
    before = x.clone()
    with kg.tune("on", timer=timer_with({"eager": 0.5, "compile": 0.6}), compete=True):
        op(x)
        assert op.dispatcher.plan_for((x,)).candidate.label == EAGER
    torch.testing.assert_close(x, before * 2)  # tuning ran on private copies: one doubling, the call's


# ---------------------------------------------------------------- failing while serving
def _failing_after_first_shape(calls: list):
    """A compile_reference whose compiled function works on the first shape it sees and raises on
    any other: a recompile that Dynamo/Inductor fails inside the user's call."""

    def compile_reference(fn):
        inner = torch.compile(fn, backend="eager")
        first: list = []

        def compiled(*args):
            calls.append(tuple(args[0].shape))
            first.append(first[0] if first else tuple(args[0].shape))
            if tuple(args[0].shape) != first[0]:
                raise RuntimeError("InductorError: boom at recompile")
            return inner(*args)

        return compiled

    return compile_reference


def test_compile_failing_while_serving_runs_eager_and_is_never_served_again(monkeypatch, caplog):
    calls: list = []
    monkeypatch.setattr(_compete, "compile_reference", _failing_after_first_shape(calls))
    op = make_scale("tcp::servefail")
    x, y = torch.randn(1000), torch.randn(1001)  # one bucket: one decision, two plans
    with kg.tune("on", timer=timer_with({"eager": 0.9, "compile": 0.5}), compete=True):
        assert served(op, x) == COMPILE
        with caplog.at_level("WARNING", logger="kernelgraft.op.compete"):
            torch.testing.assert_close(op(y), y * 2)  # the recompile fails: eager serves this call
        assert "torch:compile no longer competes" in caplog.text
        assert op.dispatcher.compile_state.error == "torch.compile failed: RuntimeError: InductorError: boom at recompile"
        assert op.dispatcher.plan_for((x,)) is None  # every torch:compile plan dropped
        n = len(calls)
        # The cached decision still names torch:compile first: its next-ranked candidate serves.
        assert served(op, y) == EAGER and served(op, x) == EAGER
        assert len(calls) == n  # the failed compile is not called again
        (compile_cand,) = [c for c in op.candidates(x) if c.label == COMPILE]
        assert not compile_cand.supported and "boom at recompile" in compile_cand.reason


def test_reference_failing_while_serving_names_the_op(monkeypatch):
    calls: list = []
    monkeypatch.setattr(_compete, "compile_reference", _failing_after_first_shape(calls))

    from torch._subclasses.fake_tensor import is_fake

    def picky(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1001 and not is_fake(x):  # the output shapes (fake tensors) are fine
            raise ValueError("the reference refuses 1001 elements")
        return x * 2

    op = kg.op(picky, name="tcp::picky", impls=[kg.triton(launch_scale, configs=CONFIGS)])
    with kg.tune("on", timer=timer_with({"eager": 0.9, "compile": 0.5}), compete=True):
        assert served(op, torch.randn(1000)) == COMPILE
        # Both fail on 1001: the reference's own error, named, and the compile is not blamed.
        with pytest.raises(kg.LaunchError, match=r"tcp::picky: torch:compile failed: ValueError: the reference refuses"):
            op(torch.randn(1001))
        assert op.dispatcher.compile_state.error is None
    eager_only = kg.op(picky, name="tcp::picky_eager", impls=[kg.triton(launch_scale, configs=CONFIGS)],
                       compete=("eager",))
    with kg.tune("on", timer=timer_with({"eager": 0.1}), compete=True):
        assert served(eager_only, torch.randn(1000)) == EAGER
        with pytest.raises(kg.LaunchError, match=r"tcp::picky_eager: torch:eager failed: ValueError"):
            eager_only(torch.randn(1001))


# ---------------------------------------------------------------- CUDA-graph capture
def test_torch_candidate_that_cannot_be_captured_is_excluded():
    """The timer raises CaptureRefused for a PyTorch candidate whose capture failed (the real one
    does on the GPU: test_gpu_reference_that_syncs_never_wins_over_a_kernel): it is excluded with
    kind 'capture', however fast, and a kernel serves."""
    from kernelgraft.tune.timing import CaptureRefused

    op = make_scale("tcp::capture")
    x = torch.randn(1000)
    base = timer_with({"eager": 0.1, "compile": 0.2})

    def timer(trial, settings):
        assert trial.must_capture == _compete.is_torch(trial.candidate)
        if trial.candidate.label == EAGER:
            raise CaptureRefused("RuntimeError: operation not permitted when stream is capturing")
        return base(trial, settings)

    with kg.tune("on", timer=timer, compete=True):
        assert served(op, x) == COMPILE
        d = kg.tune.decision(op, x)
    (excluded,) = d.excluded
    assert (excluded["impl_name"], excluded["kind"]) == ("eager", "capture")
    assert excluded["reason"] == ("cannot be captured in a CUDA graph: RuntimeError: operation not "
                                  "permitted when stream is capturing")


# ---------------------------------------------------------------- switches
def test_global_switch_off_in_a_block_and_by_env(monkeypatch):
    op = make_scale("tcp::switches")
    x = torch.randn(1000)
    seen: list[str] = []
    timer = timer_with({"eager": 0.5, "compile": 0.5}, seen)
    with kg.tune("on", timer=timer, compete=False):
        assert served(op, x) == "triton:launch_scale[BLOCK=256]"
    assert not any(s.startswith("torch:") for s in seen)
    monkeypatch.setenv("KERNELGRAFT_COMPETE", "1")
    assert kg.tune.settings().compete is True
    with kg.tune("on", timer=timer):  # the env forces it on the CPU: a new key, measured
        assert served(op, x) == EAGER
    monkeypatch.setenv("KERNELGRAFT_COMPETE", "0")
    assert kg.tune.settings().compete is False
    with pytest.raises(kg.SpecError, match="kg.tune: compete must be True, False or None"):
        kg.tune(compete="eager")
    for bad in (0, 1, "eager", ("eager",)):  # 0 == False: it turned competing on
        with pytest.raises(kg.SpecError, match=f"compete must be True, False or None .*got {type(bad).__name__}"):
            kg.tune(compete=bad)
    with pytest.raises(kg.SpecError, match="compete must be True, False or None"):
        Settings(compete=0)  # interned equal to compete=False otherwise
    with pytest.warns(kg.TuneWarning, match="KERNELGRAFT_COMPETE='maybe' is not 0 or 1"):
        monkeypatch.setenv("KERNELGRAFT_COMPETE", "maybe")
        assert kg.tune.settings().compete is None


def test_decision_with_and_without_pytorch_are_separate_keys():
    op = make_scale("tcp::keys")
    x = torch.randn(1000)
    with kg.tune("on", timer=timer_with({"eager": 0.5, "compile": 0.5}), compete=True):
        assert served(op, x) == EAGER
        assert kg.tune.decision(op, x).winner["backend"] == "torch"
    with kg.tune(compete=False):
        assert kg.tune.decision(op, x) is None  # never tuned without PyTorch
    with kg.tune("on", timer=timer_with({"eager": 0.5, "compile": 0.5}), compete=False):
        assert served(op, x) == "triton:launch_scale[BLOCK=256]"


# ---------------------------------------------------------------- the cache
def test_torch_decision_persists_and_reloads_without_measuring():
    op = make_scale("tcp::persist")
    x = torch.randn(1000)
    with kg.tune("on", timer=timer_with({"eager": 2.0, "compile": 0.3}), compete=True):
        assert served(op, x) == COMPILE
    kg.tune.clear()  # memory only: the decision is on disk
    kg.tune.TUNER.stats.clear()

    def no_timing(trial, settings):
        raise AssertionError("a cached decision must not be measured again")

    with kg.tune("on", timer=no_timing, compete=True):
        assert served(op, x) == COMPILE
    assert kg.tune.stats().get("disk_hit") == 1 and not kg.tune.stats().get("tuned")


@pytest.mark.parametrize("entry", [
    {"impl": -3, "impl_name": "jit", "backend": "torch", "config": {}, "ms": 0.1},
    {"impl": -2, "impl_name": "eager", "backend": "torch", "config": {}, "ms": 0.1},
    {"impl": -1, "impl_name": "launch_scale", "backend": "triton", "config": {"BLOCK": 64}, "ms": 0.1},
], ids=["unknown-name", "name-index-mismatch", "negative-kernel-index"])
def test_stale_or_unknown_torch_entry_is_a_clean_miss(entry):
    op = make_scale(f"tcp::stale{abs(hash(json.dumps(entry))) % 1000}")
    x = torch.randn(1000)
    with pytest.raises(ValueError):
        Decision.from_json({"key": {}, "ranking": [entry], "excluded": []}, "disk")
    with kg.tune(compete=True):
        supported = [c for c in op.candidates(x) if c.supported]
        key = kg.tune.build_key(op, (x,), _compete.key_backends(supported))
    DiskCache().put({key.digest: {"key": key.as_json(), "ranking": [entry], "excluded": []}})
    with kg.tune("on", timer=timer_with({"eager": 0.5, "compile": 0.6}), compete=True):
        assert served(op, x) == EAGER  # measured afresh, not served from the stale entry
    assert kg.tune.stats().get("tuned") == 1


# ---------------------------------------------------------------- bundles
def _cuda_tune_json(path: Path, op, x, ranking: list[dict]) -> Path:
    """A tune.json as a GPU machine writes it: one decision for ``op`` at ``x``'s key, tuned on an
    H200 (sm_90), with ``ranking``."""
    with kg.tune(compete=True):
        supported = [c for c in op.candidates(x) if c.supported]
    key = kg.tune.build_key(op, (x,), _compete.key_backends(supported)).as_json()
    key["env"] = {**key["env"], "device": "NVIDIA H200", "capability": "9.0"}
    DiskCache(path).put({"gpu-decision": {"key": key, "ranking": ranking, "excluded": [], "created": 1.0}})
    return path


EAGER_WON = [{"impl": -1, "impl_name": "eager", "backend": "torch", "config": {}, "ms": 0.5},
             {"impl": 0, "impl_name": "launch_scale", "backend": "triton", "config": {"BLOCK": 256}, "ms": 1.0}]


def test_aot_records_where_pytorch_won_from_the_gpu_decisions(tmp_path):
    """The wins come from --decisions (what the decision table reads), not from this process's
    tuning cache: a GPU decision is keyed on the GPU and never matches a CPU sample here."""
    from kernelgraft.aot import build_bundle

    op = make_scale("tcp::aot")
    small = torch.randn(1000)
    tune_json = _cuda_tune_json(tmp_path / "tune.json", op, small, EAGER_WON)
    with kg.tune(compete=True):
        (entry,) = build_bundle([op], tmp_path / "bundle", archs=["sm_90"], inputs={op.name: [(small,)]},
                                decisions=tune_json)["ops"]
    (win,) = entry["torch_wins"]
    assert win == {"signature": "float32[513..1024]", "arch": "sm_90", "device": "NVIDIA H200",
                   "winner": EAGER, "ms": 0.5, "best_kernel": "triton:launch_scale[BLOCK=256]",
                   "best_kernel_ms": 1.0}
    assert json.loads((tmp_path / "bundle" / "manifest.json").read_text())["ops"][0]["torch_wins"] == [win]
    labels = [c["label"] for c in entry["candidates"]] + [s["candidate"] for s in entry["skipped"]]
    assert not any(label.startswith("torch") for label in labels)  # bundles hold kernels only
    assert all(c["index"] >= 0 for c in entry["candidates"])
    # another arch, or no decisions: nothing to report
    with kg.tune(compete=True):
        (other,) = build_bundle([op], tmp_path / "b2", archs=["sm_100"], inputs={op.name: [(small,)]},
                                decisions=tune_json)["ops"]
        (none,) = build_bundle([op], tmp_path / "b3", archs=["sm_90"], inputs={op.name: [(small,)]})["ops"]
    assert other["torch_wins"] == [] and none["torch_wins"] == []


def test_aot_kernel_won_is_no_note(tmp_path):
    from kernelgraft.aot import build_bundle

    op = make_scale("tcp::aotkernel")
    x = torch.randn(1000)
    tune_json = _cuda_tune_json(tmp_path / "tune.json", op, x, EAGER_WON[::-1])
    with kg.tune(compete=True):
        (entry,) = build_bundle([op], tmp_path / "bundle", archs=["sm_90"], inputs={op.name: [(x,)]},
                                decisions=tune_json)["ops"]
    assert entry["torch_wins"] == []


# ---------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_pytorch_competes_by_default_and_serves_its_shape():
    """On CUDA: compete is on by default, both torch candidates are gated and timed by CUDA-graph
    replay (torch:compile through Inductor, compiled in the gate before capture), and whatever
    wins serves the shape correctly, under CUDA-graph capture too."""
    from kernelgraft.examples.rmsnorm import rmsnorm

    kg.tune.clear()
    x = torch.randn(65536, 128, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    labels = [c.label for c in rmsnorm.candidates(x, w, 1e-6) if c.supported]
    assert labels[-2:] == [EAGER, COMPILE]
    out = rmsnorm(x, w, 1e-6)
    torch.testing.assert_close(out, rmsnorm.reference(x, w, 1e-6), rtol=2e-2, atol=2e-2)
    d = kg.tune.decision(rmsnorm, x, w, 1e-6)
    measured = {(e["backend"], e["impl_name"]) for e in d.ranking + d.excluded}
    assert {("torch", "eager"), ("torch", "compile")} <= measured
    assert all(e["ms"] > 0 for e in d.ranking)
    served_label = rmsnorm.dispatcher.plan_for((x, w, 1e-6)).candidate.label
    assert served_label.startswith("torch:") == (d.winner["backend"] == "torch")
    if d.winner["backend"] == "torch":
        assert served_label == f"torch:{d.winner['impl_name']}"
        assert rmsnorm.dispatcher.current_replay() is None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = rmsnorm(x, w, 1e-6)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, out)


@pytest.mark.gpu
def test_gpu_reference_that_syncs_never_wins_over_a_kernel():
    """A reference that reads a value on the host (``.item()``) cannot be captured in a CUDA
    graph: its torch candidates are excluded (kind 'capture'), however fast, and the kernel
    serves, under capture too. The CUDA RNG still works after the failed captures."""
    from kernelgraft.tune.timing import cuda_timer

    def scale_synced(x: torch.Tensor) -> torch.Tensor:
        return x * (2.0 if x.abs().max().item() >= 0 else 0.0)  # host sync: not capturable

    op = kg.op(scale_synced, name="tcp::gpu_synced", impls=[kg.triton(launch_scale, configs=[{"BLOCK": 256}])])
    op.register_meta(torch.empty_like, shape_only=True)  # .item() cannot run on fake tensors
    x = torch.randn(4096, device="cuda")

    def timer(trial, settings):  # the real timer (it captures), but PyTorch would win on time
        ms = cuda_timer(trial, settings)
        return ms / 1000 if _compete.is_torch(trial.candidate) else ms

    with kg.tune("on", timer=timer, compete=True):
        assert served(op, x) == "triton:launch_scale[BLOCK=256]"
        d = kg.tune.decision(op, x)
    by_name = {e["impl_name"]: e for e in d.excluded if e["backend"] == "torch"}
    assert by_name["eager"]["kind"] == "capture"
    assert "cannot be captured in a CUDA graph" in by_name["eager"]["reason"]
    assert all(e["backend"] != "torch" for e in d.ranking)
    torch.randn(8, device="cuda")  # the generators were restored after the failed captures
    graph = torch.cuda.CUDAGraph()
    with kg.tune("on", timer=timer, compete=True), torch.cuda.graph(graph):
        captured = op(x)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, x * 2)


@pytest.mark.gpu
def test_gpu_mutating_reference_that_syncs_is_probed_and_excluded():
    """A mutating op is timed eagerly (its inputs restored before each launch), so no graph is
    replayed: the capture is probed on its own, and the argument holds one doubling afterwards."""
    from kernelgraft.tune.timing import cuda_timer

    def launch_double(x, *, BLOCK):
        launch_scale(x, x, BLOCK=BLOCK)

    def double_synced_(x: torch.Tensor) -> None:
        if x.numel() and x.abs().max().item() >= 0:  # host sync: not capturable
            x.mul_(2)

    op = kg.op(double_synced_, name="tcp::gpu_synced_inplace", mutates_args=("x",),
               impls=[kg.triton(launch_double, configs=[{"BLOCK": 256}])])
    x = torch.randn(4096, device="cuda")
    before = x.clone()

    def timer(trial, settings):
        ms = cuda_timer(trial, settings)
        return ms / 1000 if _compete.is_torch(trial.candidate) else ms

    with kg.tune("on", timer=timer, compete=True):
        op(x)
        assert op.dispatcher.plan_for((x,)).candidate.label == "triton:launch_double[BLOCK=256]"
        d = kg.tune.decision(op, x)
    assert {e["impl_name"]: e["kind"] for e in d.excluded if e["backend"] == "torch"}["eager"] == "capture"
    torch.testing.assert_close(x, before * 2)


# ---------------------------------------------------------------- running one candidate
def test_torch_candidates_run_like_any_candidate():
    op = make_scale("tcp::run")
    x = torch.randn(300)
    with kg.tune(compete=True):
        eager, compiled = op.candidates(x)[-2:]
    torch.testing.assert_close(op.run(x, impl="torch:compile"), x * 2)
    torch.testing.assert_close(op.run(x, impl=eager.index), x * 2)
    out = torch.full_like(x, float("nan"))
    op.dispatcher.runner(compiled)(x, out)  # the kernels' protocol: outputs written in place
    torch.testing.assert_close(out, x * 2)
    for c in (eager, compiled):  # as op.candidates() gives them: index or impl, with its config
        torch.testing.assert_close(op.run(x, impl=c.index, config=c.config), x * 2)
        torch.testing.assert_close(op.run(x, impl=c.impl, config=c.config), x * 2)
    with pytest.raises(kg.SpecError, match="torch:eager takes no config"):
        op.run(x, impl="torch:eager", config={"BLOCK": 64})
    with pytest.raises(kg.SpecError, match="'torch:eager' and 'torch:compile'"):
        op.run(x, impl="torch:jit")


def test_cache_listing_names_the_torch_winner():
    from kernelgraft.cli.cache import _row

    op = make_scale("tcp::listing")
    x = torch.randn(1000)
    with kg.tune("on", timer=timer_with({"eager": 0.5, "compile": 0.7}), compete=True):
        served(op, x)
    (entry,) = [e for e in DiskCache().entries().values() if e["key"]["op"] == "tcp::listing"]
    assert _row(entry, entry["created"])[3] == EAGER


def test_compiled_reference_is_not_recompiled_across_call_paths(monkeypatch):
    """The op's fast path and torch.ops (below autograd, inputs requiring grad) call the compiled
    reference in one state: Dynamo compiles it once per shape, not once per path."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    monkeypatch.setattr(_compete, "compile_reference", lambda fn: torch.compile(fn, backend=counter))
    op = make_scale("tcp::paths")
    x = torch.randn(1000)
    with kg.tune("on", timer=timer_with({"eager": 2.0, "compile": 0.3}), compete=True):
        assert served(op, x) == COMPILE
        frames = counter.frame_count
        op(x)
        torch.testing.assert_close(torch.ops.tcp.paths(x.clone().requires_grad_()).detach(), x * 2)
    assert counter.frame_count == frames == 1


def test_aot_cli_notes_where_pytorch_won(tmp_path, capsys, monkeypatch):
    from kernelgraft.cli import main

    target = tmp_path / "ops_aot_note.py"
    target.write_text(
        "import sys; sys.path.insert(0, %r)\n"
        "from _tune_ops import make_scale\n"
        "op = make_scale('tcp::aotcli')\n"
        "op.sample_inputs = lambda: [(__import__('torch').randn(1000),)]\n" % str(TESTS))
    sys.path.insert(0, str(tmp_path))
    try:
        import ops_aot_note  # the module the CLI loads
    finally:
        sys.path.remove(str(tmp_path))
    tune_json = _cuda_tune_json(tmp_path / "tune.json", ops_aot_note.op, torch.randn(1000), EAGER_WON)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the CLI turns it off: put back after the test
    main(["aot", str(target), "-o", str(tmp_path / "bundle"), "--allow-partial", "--decisions", str(tune_json)])
    out = capsys.readouterr().out
    assert "note: on float32[513..1024] torch:eager won tuning on NVIDIA H200 (0.5 ms); bundles hold " \
           "kernels only, so the bundle serves its best kernel triton:launch_scale[BLOCK=256] (1 ms) there" in out


_NOISY_REFERENCE = r"""
import sys, torch
from kernelgraft.op.compete import CompileState

def reference(x, slots):  # a graph break (.item()) and a meta failure Dynamo logs at ERROR
    top = int(slots.max())
    return x.view(torch.uint8).sum() + top

x, slots = torch.randn(4, 8)[:, ::2], torch.arange(3)
call = CompileState(reference).call if sys.argv[1] == "kernelgraft" else torch.compile(reference)
try:
    call(x, slots)
except Exception as exc:
    print("raised", type(exc).__name__)
import logging
logging.getLogger("torch._dynamo").warning("after the call: %s", "shown")
"""


@pytest.mark.parametrize("caller", ["kernelgraft", "torch"])
def test_torch_logs_while_compiling_the_reference_stay_quiet(tmp_path, caller):
    """kernelgraft compiles the reference to compete; Dynamo's graph-break warnings and the ERROR
    lines it logs before falling back are not the user's to read (a failure becomes kernelgraft's
    own warning). The same script through torch.compile shows them (the test sees them), and torch's
    records outside the compiled call still pass."""
    import subprocess

    script = tmp_path / "noisy.py"
    script.write_text(_NOISY_REFERENCE)
    proc = subprocess.run([sys.executable, str(script), caller], capture_output=True, text=True, timeout=300)
    assert "raised" in proc.stdout, proc.stdout + proc.stderr
    noisy = "Graph break" in proc.stderr or "failed while attempting to run meta" in proc.stderr
    assert noisy == (caller == "torch"), proc.stderr[-3000:]
    assert "after the call: shown" in proc.stderr
