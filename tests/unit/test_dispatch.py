"""Dispatch: which candidate runs, fallback with one warning, input checks that never reach a kernel."""

import warnings

import numpy as np
import pytest
import torch

import kernelgraft as kg
from kernelgraft.op import candidates as _candidates

from _kernels import LAUNCHES, launch_scale


def make_op(name, **options):
    impls = options.pop("impls", None) or [kg.triton(launch_scale, configs=[{"BLOCK": 64}, {"BLOCK": 256}],
                                                      **options.pop("impl_options", {}))]

    @kg.op(name, impls=impls, **options)
    def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * alpha

    return scale


def test_first_supported_candidate_runs_and_plan_is_cached():
    scale = make_op("kgtest::d_first")
    x = torch.randn(100)
    LAUNCHES.clear()
    scale(x, 2.0)
    scale(x, 2.0)
    assert LAUNCHES == ["scale[64]", "scale[64]"]
    assert len(scale.dispatcher.plans()) == 1
    (plan,) = scale.dispatcher.plans().values()
    assert plan.candidate.config.as_dict() == {"BLOCK": 64}


def test_predicate_rejecting_all_falls_back_with_one_warning_listing_reasons():
    scale = make_op("kgtest::d_pred", impl_options={"supports": lambda x, alpha, BLOCK: "too small" if x.numel() < 10 else True})
    x = torch.randn(5)
    LAUNCHES.clear()
    with pytest.warns(kg.FallbackWarning, match="too small"):
        out = scale(x, 2.0)
    torch.testing.assert_close(out, x * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scale(torch.randn(5), 2.0)  # same reasons: no second warning
    assert LAUNCHES == []
    scale(torch.randn(50), 2.0)
    assert LAUNCHES == ["scale[64]"]


def test_a_predicate_that_raises_skips_its_candidate_and_says_so_once(monkeypatch):
    # A bug in a supports() predicate (the GEMM's WMMA kernel read a config key it is not given,
    # on CUDA only) retired its kernel without a word: the reason sat in op.candidates() alone.
    def buggy(x, alpha, **config):
        return config["num_stages"] > 1 or "one stage"

    monkeypatch.setattr(_candidates, "_RAISED", set())  # warned once per process: start afresh
    scale = make_op("kgtest::d_raise", impls=[
        kg.triton(launch_scale, configs=[{"BLOCK": 64}], supports=buggy, name="buggy"),
        kg.triton(launch_scale, configs=[{"BLOCK": 256}], name="plain")])
    LAUNCHES.clear()
    with pytest.warns(kg.KernelgraftWarning, match=r"kg.triton\(buggy\): its supports\(\) predicate raised "
                                                     r"KeyError: 'num_stages'") as caught:
        out = scale(torch.randn(50), 2.0)
    assert len([w for w in caught if "predicate raised" in str(w.message)]) == 1
    assert LAUNCHES == ["scale[256]"] and out.shape == (50,)
    bad, good = [c for c in scale.candidates(torch.randn(50), 2.0) if c.impl.backend == "triton"]
    assert bad.reason == "supports() raised KeyError: 'num_stages'" and good.supported
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scale.candidates(torch.randn(60), 2.0)  # warned once per impl and exception type


def test_predicate_picks_among_configs():
    scale = make_op("kgtest::d_pick", impl_options={"supports": lambda x, alpha, BLOCK: BLOCK >= x.numel()})
    LAUNCHES.clear()
    scale(torch.randn(200), 1.0)
    assert LAUNCHES == ["scale[256]"]


def test_capability_gate(monkeypatch):
    scale = make_op("kgtest::d_cap", impl_options={"min_capability": "sm_100"})
    x = torch.randn(10)
    monkeypatch.setattr(_candidates, "device_capability", lambda device: (9, 0))
    (c, _, *_) = scale.candidates(x, 1.0)  # two kernels, then torch:eager and torch:compile
    assert not c.supported and "sm_100" in c.reason and "sm_90" in c.reason
    with pytest.warns(kg.FallbackWarning, match="needs sm_100 or newer"):
        scale(x, 1.0)


def test_fallback_error_mode_raises():
    scale = make_op("kgtest::d_err", fallback="error", impl_options={"supports": lambda *a, **k: False})
    with pytest.raises(kg.UnsupportedError, match="supports\\(\\) returned False"):
        scale(torch.randn(4), 1.0)


def test_cpu_without_interpreter_runs_reference_silently(monkeypatch):
    scale = make_op("kgtest::d_ref")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    LAUNCHES.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = scale(torch.ones(3), 4.0)
    assert out.tolist() == [4.0] * 3 and LAUNCHES == []
    (c, _, *_) = scale.candidates(torch.ones(3), 4.0)
    assert "TRITON_INTERPRET" in c.reason


def test_candidates_and_run():
    scale = make_op("kgtest::d_run")
    x = torch.randn(300)
    *cands, eager, compiled = scale.candidates(x, 1.5)
    assert [c.config.as_dict() for c in cands] == [{"BLOCK": 64}, {"BLOCK": 256}]
    assert all(c.supported for c in cands)
    assert (eager.label, compiled.label) == ("torch:eager", "torch:compile")
    LAUNCHES.clear()
    torch.testing.assert_close(scale.run(x, 1.5, config=1), x * 1.5)
    torch.testing.assert_close(scale.run(x, 1.5, impl="triton", config={"BLOCK": 32}), x * 1.5)
    torch.testing.assert_close(scale.run(x, 1.5, impl="reference"), x * 1.5)
    torch.testing.assert_close(scale.run(x, 1.5, impl="torch:eager"), x * 1.5)
    torch.testing.assert_close(scale.run(x, 1.5, impl=eager.index), x * 1.5)
    assert LAUNCHES == ["scale[256]", "scale[32]"]
    with pytest.raises(kg.SpecError, match="not found"):
        scale.run(x, 1.5, impl="cuda")
    with pytest.raises(kg.UnsupportedError, match="needs x contiguous"):
        scale.run(torch.randn(10, 2).t(), 1.5)


# ------------------------------------------------------------------ input checks

def checked_op(name):
    return make_op(name, dtypes=(torch.float32, torch.float16), ndim={"x": (1, 2)})


@pytest.mark.parametrize(
    "args, match",
    [
        pytest.param((torch.randn(4, dtype=torch.float64), 1.0), r"argument 'x' expected dtype in \['torch.float32', 'torch.float16'\], got Tensor\(shape=\(4,\), dtype=torch.float64", id="dtype"),
        pytest.param((torch.randn(2, 2, 2), 1.0), r"argument 'x' expected a \[1, 2\]-dimensional tensor, got Tensor\(shape=\(2, 2, 2\)", id="rank"),
        pytest.param((torch.randn(4), "2"), r"argument 'alpha' expected float, got str '2'", id="scalar-type"),
        pytest.param((torch.randn(4), None), r"argument 'alpha' expected float, got NoneType", id="none-scalar"),
        pytest.param((np.ones(4, dtype=np.float32), 1.0), r"argument 'x' expected a Tensor, got ndarray", id="numpy"),
        pytest.param((torch.randn(8, 4).t(), 1.0), r"needs x contiguous, got strides \(1, 4\)", id="noncontiguous"),
        pytest.param((torch.randn(4),), r"missing argument 'alpha'", id="missing"),
        pytest.param((torch.randn(4), 1.0, 2), r"takes 2 arguments", id="too-many"),
    ],
)
def test_bad_inputs_raise_clear_errors_and_never_launch(args, match):
    scale = checked_op("kgtest::d_checks")
    LAUNCHES.clear()
    with pytest.raises(kg.InputError, match=match) as info:
        scale(*args)
    assert "kgtest::d_checks" in str(info.value)
    assert LAUNCHES == []
    # the same goes through torch.ops (the dispatcher may reject first, with its own message)
    with pytest.raises((kg.InputError, RuntimeError, TypeError)):
        torch.ops.kgtest.d_checks(*args)
    assert LAUNCHES == []
    # and a bad call leaves no plan behind: a good call still works
    torch.testing.assert_close(scale(torch.ones(3), 2.0), torch.full((3,), 2.0))


def test_device_mismatch():
    @kg.op("kgtest::d_dev")
    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    with pytest.raises(kg.InputError, match=r"argument 'y' expected a tensor on cpu \(like 'x'\), got Tensor\(shape=\(3,\), dtype=torch.float32, device=meta"):
        add(torch.ones(3), torch.empty(3, device="meta"))


def test_integer_where_float_expected_is_accepted_but_bool_is_not():
    scale = make_op("kgtest::d_int")
    torch.testing.assert_close(scale(torch.ones(2), 3), torch.full((2,), 3.0))
    with pytest.raises(kg.InputError, match="expected float, got bool"):
        scale(torch.ones(2), True)


def test_launch_errors_are_wrapped_with_op_and_candidate():
    def broken(x, alpha, out, *, BLOCK):
        raise RuntimeError("boom")

    scale = make_op("kgtest::d_broken", impls=[kg.triton(broken, configs=[{"BLOCK": 1}])])
    with pytest.raises(kg.LaunchError, match=r"kgtest::d_broken: triton:broken\[BLOCK=1\] failed: RuntimeError: boom"):
        scale(torch.ones(2), 1.0)


def test_autograd_inputs_go_through_the_dispatcher():
    scale = make_op("kgtest::d_grad")
    x = torch.randn(4, requires_grad=True)
    with torch.no_grad():
        torch.testing.assert_close(scale(x, 2.0), x.detach() * 2)
    scale.register_autograd(lambda ctx, g: (g * ctx.alpha, None),
                            setup_context=lambda ctx, inputs, output: setattr(ctx, "alpha", inputs[1]))
    y = scale(x, 2.0)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4,), 2.0))


def test_alignment_predicate_is_rechecked_for_a_misaligned_view_of_the_same_shape():
    # The plan cache used to key on dtype/device/shape/strides only, so a plan made for an aligned
    # tensor launched a kernel whose supports() rejects the misaligned one.
    def aligned(x, alpha, BLOCK):
        return x.data_ptr() % 16 == 0 or "x must be 16-byte aligned"

    scale = make_op("kgtest::d_align", impls=[kg.triton(launch_scale, configs=[{"BLOCK": 64}], supports=aligned)])
    base = torch.randn(65)
    a, b = base[:64].clone(), base[1:]
    assert a.stride() == b.stride() and b.data_ptr() % 16
    LAUNCHES.clear()
    scale(a, 2.0)
    with pytest.warns(kg.FallbackWarning, match="16-byte aligned"):
        out = scale(b, 2.0)
    assert LAUNCHES == ["scale[64]"]
    torch.testing.assert_close(out, b * 2.0)


def test_a_plan_made_while_another_thread_changes_the_chooser_is_not_kept():
    # Simulates a race: while one call plans, another thread installs a different chooser (as
    # kg.tune(...), kg.tune.clear() or load_bundle do); the plan made under the old settings used
    # to be stored under the new epoch and served from then on.
    from kernelgraft.op import select as _select

    scale = make_op("kgtest::d_race")
    saved = _select._chooser

    def last(op, candidates, args):
        return candidates[-1]

    def first_then_switch(op, candidates, args):
        _select.set_chooser(last)  # "another thread", mid-planning: new settings, and it calls the op
        scale(torch.randn(7), 2.0)
        return candidates[0]

    _select.set_chooser(first_then_switch)
    try:
        x = torch.randn(100)
        LAUNCHES.clear()
        scale(x, 2.0)
        scale(x, 2.0)
        assert LAUNCHES == ["scale[256]", "scale[64]", "scale[256]"]
    finally:
        _select.set_chooser(saved)
