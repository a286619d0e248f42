"""The one correctness oracle (kernelgraft.verify.oracle): the rule per dtype at its boundary, NaN and
Inf, exact dtypes, tolerances, the float64 reference and its fallback, and the planted test: the
tuner never chooses a candidate that kernelgraft check fails on the same inputs."""

from __future__ import annotations

import json

import pytest
import torch
import triton
import triton.language as tl

import kernelgraft as kg
from kernelgraft import SpecError
from kernelgraft.verify import oracle as _verify
from kernelgraft.check import check_op
from kernelgraft.graft import verify as graft_verify

WIDE = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
EXACT = [torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2]


def _want(dtype, n=512, seed=0):
    """Expected values exactly representable in ``dtype``, as float64."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype).double()


# ------------------------------------------------------------------ the rule, per dtype
@pytest.mark.parametrize("dtype", WIDE, ids=str)
@pytest.mark.parametrize("factor,ok", [(0.5, True), (2.0, False)], ids=["inside", "outside"])
def test_elementwise_rule_at_the_boundary(dtype, factor, ok):
    want = _want(dtype)
    rtol = _verify.rtol_for(dtype)
    rms = want.pow(2).mean().sqrt()
    got = want.clone()
    got[17] += factor * rtol * (want[17].abs() + rms)  # one element; rounding to dtype is < rtol/2
    outcome = _verify.compare(got.to(dtype), want, what="output 0", rtol=rtol)
    assert outcome.ok is ok, outcome
    if not ok:
        assert outcome.problem.startswith("output 0: 1 of 512 elements") and "worst at [17]" in outcome.problem
        assert outcome.ratio > 1.5


@pytest.mark.parametrize("dtype", WIDE, ids=str)
def test_near_zero_elements_of_a_reduction_are_judged_at_the_output_scale(dtype):
    want = _want(dtype)
    want[3] = 0.0  # a sum that cancelled: its rounding error follows the other elements' scale
    got = want.clone()
    got[3] = 0.5 * _verify.rtol_for(dtype) * want.pow(2).mean().sqrt()
    assert _verify.compare(got.to(dtype), want, what="o", rtol=_verify.rtol_for(dtype)).ok


def test_defaults_are_documented_values():
    assert _verify.rtol_for(torch.float32) == 1e-4 and _verify.rtol_for(torch.float64) == 1e-9
    assert _verify.rtol_for(torch.float16) == 8 * 2.0**-11 and _verify.rtol_for(torch.bfloat16) == 8 * 2.0**-8
    for dtype in EXACT:
        assert _verify.is_exact(dtype) and _verify.rtol_for(dtype) == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_tolerances_override_moves_the_boundary(dtype):
    want = _want(dtype)
    rtol = _verify.rtol_for(dtype)
    got = want.clone()
    got[5] += 3 * rtol * (want[5].abs() + want.pow(2).mean().sqrt())
    ref = _verify.Reference((_verify.Expected("output 0", want.to(dtype), want),))
    assert not _verify.verify(ref, [got.to(dtype)]).ok
    assert _verify.verify(ref, [got.to(dtype)], {dtype: 10 * rtol}).ok
    assert not _verify.verify(ref, [got.to(dtype)], {dtype: 2 * rtol}).ok


def test_zero_tolerance_means_bit_exact_against_the_native_reference():
    native = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16)
    wide = native.double() + 1e-6  # what float64 math gives; the native run rounded it
    ref = _verify.Reference((_verify.Expected("output 0", native, wide),))
    assert _verify.verify(ref, [native.clone()], {torch.float16: 0.0}).ok
    bumped = native.clone()
    bumped[1] = torch.nextafter(bumped[1], torch.tensor(9.0, dtype=torch.float16))
    verdict = _verify.verify(ref, [bumped], {torch.float16: 0.0})
    assert not verdict.ok and "bit-exact" in str(verdict) and "[1]" in str(verdict)


@pytest.mark.parametrize("bad", [{"x": 1e-3}, {torch.float32: -1.0}, {torch.float32: float("nan")},
                                 {torch.float32: "1e-3"}, [1e-3]], ids=["key", "negative", "nan", "str", "list"])
def test_malformed_tolerances_are_named(bad):
    with pytest.raises(SpecError, match="kgtest::t"):
        _verify.check_tolerances(bad, "kgtest::t")


# ---------------------------------------------------------------------- NaN and Inf
INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("want,got,ok", [
    ([1.0, NAN], [1.0, NAN], True),
    ([1.0, 2.0], [1.0, NAN], False),
    ([1.0, NAN], [1.0, 2.0], False),
    ([1.0, INF, -INF], [1.0, INF, -INF], True),
    ([1.0, INF], [1.0, -INF], False),
    ([1.0, 2.0], [1.0, INF], False),
    ([1.0, INF], [1.0, NAN], False),
    ([1.0, 7e4], [1.0, INF], True),       # float64 70000 overflows float16: expected as inf
    ([1.0, 7e4], [1.0, 65504.0], False),
], ids=["nan-nan", "nan-where-number", "number-where-nan", "inf-equal", "inf-sign", "inf-where-number",
        "nan-where-inf", "overflow-inf", "overflow-finite"])
def test_nan_and_inf(want, got, ok):
    outcome = _verify.compare(torch.tensor(got, dtype=torch.float16), torch.tensor(want, dtype=torch.float64),
                              what="output 0", rtol=_verify.rtol_for(torch.float16))
    assert outcome.ok is ok, outcome
    if not ok:
        assert "worst at [1]" in outcome.problem and outcome.error == INF


def test_unwritten_elements_are_reported_as_nan_from_poison():
    got = _verify.poisoned((8,), torch.float32, "cpu")
    got[:4] = 1.0
    outcome = _verify.compare(got, torch.ones(8, dtype=torch.float64), what="output 0", rtol=1e-4)
    assert not outcome.ok and "4 NaN where the reference has a number" in outcome.problem


# ------------------------------------------------------------------------- exact dtypes
def _exact_sample(dtype):
    values = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7], dtype=torch.float32)
    return (values > 3) if dtype == torch.bool else values.to(dtype)


@pytest.mark.parametrize("dtype", EXACT, ids=str)
def test_exact_dtypes_compare_bits(dtype):
    want = _exact_sample(dtype)
    assert _verify.compare(want.clone(), want, what="o", rtol=0.0).ok
    got = want.clone()
    got[2] = _exact_sample(dtype)[5]
    outcome = _verify.compare(got, want, what="o", rtol=0.0)
    assert not outcome.ok and "first at [2]" in outcome.problem and "bit-exact" in outcome.problem
    assert outcome.ratio == INF


def test_exact_dtype_with_a_tolerance_is_judged_by_value():
    want = torch.tensor([10, 20, 30, 40], dtype=torch.int32)
    off_by_one = want + torch.tensor([0, 1, 0, 0], dtype=torch.int32)
    ref = _verify.Reference((_verify.Expected("output 0", want, want),))
    assert not _verify.verify(ref, [off_by_one]).ok
    assert _verify.verify(ref, [off_by_one], {torch.int32: 0.05}).ok


def test_dtype_and_shape_mismatches_are_failures():
    want = torch.ones(4, dtype=torch.float32)
    ref = _verify.Reference((_verify.Expected("output 0", want, want.double()),))
    assert "dtype float16, expected float32" in str(_verify.verify(ref, [want.half()]))
    assert "shape (2, 2), expected (4,)" in str(_verify.verify(ref, [want.reshape(2, 2)]))
    assert "1 tensors, the reference gives 2" in str(_verify.verify(
        _verify.Reference(ref.expected * 2), [want]))


# --------------------------------------------------------------- the reference and helpers
def test_reference_runs_in_float64_and_exact_outputs_natively():
    seen = []

    @kg.op("kgtest::v_ref")
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append(x.dtype)
        return x * 3, (x * 3).argmax().reshape(1)

    x = torch.randn(64, dtype=torch.float16)
    ref = _verify.reference(f, (x,))
    assert ref.precise and seen[-2:] == [torch.float16, torch.float64]
    assert ref.expected[0].wide.dtype == torch.float64 and ref.expected[1].native.dtype == torch.int64
    assert _verify.verify(ref, [(x.float() * 3).half(), (x * 3).argmax().reshape(1)]).ok


def test_a_reference_that_refuses_float64_is_compared_natively_and_widened():
    @kg.op("kgtest::v_native")
    def g(x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float64:
            raise TypeError("no float64 here")
        return x * 3

    x = _want(torch.float32).float()
    ref = _verify.reference(g, (x,))
    assert not ref.precise and "float64 reference failed (TypeError" in ref.note and "x4" in ref.note
    rtol, rms = _verify.rtol_for(torch.float32), (3 * x.double()).pow(2).mean().sqrt()
    got = 3 * x.double()
    got[9] += 3 * rtol * (got[9].abs() + rms)  # outside rtol, inside rtol * NATIVE_WIDEN
    verdict = _verify.verify(ref, [got.float()])
    assert verdict.ok and "x4" in str(verdict)
    beyond = 3 * x.double()
    beyond[9] += 5 * rtol * (beyond[9].abs() + rms)  # outside rtol * NATIVE_WIDEN too
    assert "worst at [9]" in str(_verify.verify(ref, [beyond.float()]))


def test_mutated_arguments_are_named_and_the_callers_tensors_untouched():
    @kg.op("kgtest::v_mut", mutates_args=("buf",))
    def h(x: torch.Tensor, buf: torch.Tensor) -> None:
        buf.add_(x)

    x, buf = torch.ones(4), torch.zeros(4)
    ref = _verify.reference(h, (x, buf))
    assert buf.eq(0).all() and [e.what for e in ref.expected] == ["mutated argument 'buf'"]
    assert "mutated argument 'buf'" in str(_verify.verify(ref, [torch.zeros(4)]))


def test_poison_clone_upcast():
    assert torch.isnan(_verify.poisoned((3,), torch.bfloat16, "cpu")).all()
    assert _verify.poisoned((3,), torch.bool, "cpu").all()
    assert (_verify.poisoned((3,), torch.int32, "cpu").view(torch.uint8) == 0xA5).all()
    assert (_verify.poisoned((3,), torch.float8_e4m3fn, "cpu").view(torch.uint8) == 0xA5).all()
    base = torch.arange(12.0).reshape(3, 4)
    view = base[:, ::2]
    nested = {"a": [view, 2], "b": (torch.ones(1, 4).expand(3, 4),)}
    copy = _verify.clone(nested)
    assert copy["a"][0].stride() == view.stride() and torch.equal(copy["a"][0], view)
    assert copy["a"][0].data_ptr() != view.data_ptr() and copy["a"][1] == 2
    copy["a"][0].zero_()
    assert base.sum() == 66 and torch.equal(copy["b"][0], torch.ones(3, 4))
    up = _verify.upcast((torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.int8), 1.5))
    assert up[0].dtype == torch.float64 and up[1].dtype == torch.int8 and up[2] == 1.5


def test_sync_names_the_device(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    _verify.sync("cuda:1")
    _verify.sync(torch.device("cpu"))
    assert calls == [torch.device("cuda:1")]


# ------------------------------------------------------------------------- graft
def test_graft_tolerance_is_an_rtol_in_the_same_rule():
    with pytest.raises(SpecError, match=r"\(atol, rtol\) pair is no longer accepted"):
        graft_verify.check_override((1e-3, 1e-3), "kg.graft")
    assert graft_verify.check_override(1e-2, "kg.graft")[torch.bfloat16] == 1e-2
    want = torch.ones(16)
    got = want.clone()
    got[3] += 0.01
    assert "output: 1 of 16 elements" in graft_verify.compare(want, got)
    assert graft_verify.compare(want, got, override=graft_verify.check_override(1e-2, "t")) is None

    @kg.op("kgtest::v_loose", tolerances={torch.float32: 1e-2})
    def loose(x: torch.Tensor) -> torch.Tensor:
        return x

    assert graft_verify.compare((want, {"k": want}), (got, {"k": want}), ops=[loose]) is None
    assert "output leaf 0" in graft_verify.compare((want, {"k": want}), (got, {"k": want}))


# ----------------------------------------------------------- the planted candidates
@triton.jit
def _planted_kernel(x_ptr, out_ptr, n, factor, bump, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(x_ptr + offs, mask=mask).to(tl.float32) * factor
    y = tl.where(offs == 7, y + bump, y)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def launch_planted(x, out, *, BLOCK, FACTOR=2.0, BUMP=0.0):
    n = x.numel()
    _planted_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, FACTOR, BUMP, BLOCK=BLOCK)


GOOD = {"BLOCK": 256}
# Off by 1e-3 relative everywhere: the old gate accepted it (elementwise, fp32 rtol 5e-3), old
# check rejected it (norm-relative, fp32 1e-5).
GATE_ONLY = {"BLOCK": 512, "FACTOR": 2.0 * (1 + 1e-3)}
# One element of 4096 off by 0.1: old check accepted it (fp16 norm-relative error 0.1 / ||2x||
# = 8e-4 < 2e-3), the old gate rejected it (elementwise 8e-3 * (|want| + rms)).
CHECK_ONLY = {"BLOCK": 1024, "BUMP": 0.1}
FAKE_MS = {256: 1.0, 512: 0.2, 1024: 0.1}  # each planted candidate is "faster" than the good one


def planted_samples(device="cpu"):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(4096, generator=g)
    yield (x.to(device),)
    yield (x.to(device=device, dtype=torch.float16),)


def _old_check_accepts(got, want, tol):  # the deleted check/_compare.py rule, for the record
    return float(torch.linalg.vector_norm(got.double() - want) / torch.linalg.vector_norm(want)) <= tol


def _old_gate_accepts(got, want, rtol):  # the old tune/_gate.py rule
    rms = want.pow(2).mean().sqrt()
    return bool(((got.double() - want).abs() <= rtol * (want.abs() + rms)).all())


def _planted_op(name):
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    return kg.op(double, name=name, sample_inputs=planted_samples,
                 impls=[kg.triton(launch_planted, configs=[GOOD, GATE_ONLY, CHECK_ONLY])])


def test_planted_amounts_sit_between_the_old_rules():
    x32, x16 = (s[0] for s in planted_samples())
    want32, want16 = 2 * x32.double(), 2 * x16.double()
    gate_only = (x32.double() * GATE_ONLY["FACTOR"]).float()
    assert _old_gate_accepts(gate_only, want32, 5e-3) and not _old_check_accepts(gate_only, want32, 1e-5)
    check_only = want16.clone()
    check_only[7] += CHECK_ONLY["BUMP"]
    check_only = check_only.half()
    assert _old_check_accepts(check_only, want16, 2e-3) and not _old_gate_accepts(check_only, want16, 8e-3)


def _label(config):
    return json.dumps(config, sort_keys=True)


@pytest.fixture
def fresh_tuner(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("KERNELGRAFT_TUNE", "KERNELGRAFT_PRUNE", "KERNELGRAFT_MAX_CANDIDATES"):
        monkeypatch.delenv(var, raising=False)
    kg.tune.clear()
    yield
    kg.tune.clear()


def test_tuner_never_chooses_a_candidate_check_fails(fresh_tuner):
    op = _planted_op("kgtest::planted")
    report = check_op(op, opcheck=False, noncontiguous=False)
    by = {(r.candidate, r.sample): r for r in report.results if r.candidate.startswith("triton")}
    failed = {(c, s) for (c, s), r in by.items() if r.status == "fail"}
    assert all(r.note for r in report.failures)  # the table says why
    assert {c for c, _ in failed} == {c for c, _ in by if "FACTOR" in c or "BUMP" in c}
    assert any("FACTOR" in c and s.startswith("float32") for c, s in failed)
    assert any("BUMP" in c and s.startswith("float16") for c, s in failed)
    assert all(r.status == "pass" for (c, _), r in by.items() if "FACTOR" not in c and "BUMP" not in c)

    def timer(trial, settings):
        trial.run(0)
        return FAKE_MS[trial.candidate.config.as_dict()["BLOCK"]]

    for (x,) in planted_samples():
        sample = f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
        labels = {_label(c.config.as_dict()): c.label for c in op.candidates(x)}
        with kg.tune("on", timer=timer):
            d = kg.tune.pretune(op, x, force=True)
            out = op(x)
        assert _verify.verify(_verify.reference(op, (x,)), [out]).ok
        assert d is not None and kg.tune.decision(op, x).winner == d.winner
        passing = [cfg for cfg in (GOOD, GATE_ONLY, CHECK_ONLY)
                   if by[(labels[_label(cfg)], sample)].status == "pass"]
        # the tuner's choice is the fastest candidate check passes; every one check fails is excluded
        assert d.winner["config"] == min(passing, key=lambda cfg: FAKE_MS[cfg["BLOCK"]])
        excluded = {_label(e["config"]): e for e in d.excluded}
        for cfg in (GOOD, GATE_ONLY, CHECK_ONLY):
            if cfg not in passing:
                assert excluded[_label(cfg)]["kind"] == "wrong" and "output 0" in excluded[_label(cfg)]["reason"]
        assert len(passing) < 3  # each sample plants at least one wrong candidate


# ------------------------------------------------------------------------------ on a GPU
EXAMPLES = ["add_relu", "rmsnorm", "rmsnorm_residual", "softmax", "swiglu", "gemm", "fp8_kcache_scatter",
            "kv_append", "topk_router"]


@pytest.mark.gpu
@pytest.mark.parametrize("module", EXAMPLES)
def test_every_example_candidate_passes_the_oracle_on_gpu(module):
    """The default tolerances hold real kernels (float32 1e-4, 8 roundoffs for half types)."""
    import importlib

    from kernelgraft.op.operator import KernelOp

    mod = importlib.import_module(f"kernelgraft.examples.{module}")
    ops = {id(v): v for v in vars(mod).values() if isinstance(v, KernelOp)}.values()
    assert ops
    for op in ops:
        report = check_op(op, opcheck=False)
        assert report.ok, [(r.candidate, r.sample, r.variant, r.note) for r in report.failures][:4]


@pytest.mark.gpu
def test_oracle_on_a_gpu_that_is_not_the_current_one():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")

    @kg.op("kgtest::v_gpu1")
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1)

    with torch.cuda.device(0):
        x = torch.randn(64, 1000, device="cuda:1", dtype=torch.bfloat16)
        ref = _verify.reference(f, (x,))
        assert ref.expected[0].wide.device == x.device
        got = torch.softmax(x.float(), -1).to(torch.bfloat16)
        _verify.sync(x.device)
        assert _verify.verify(ref, [got]).ok
        assert not _verify.verify(ref, [_verify.poisoned(got.shape, got.dtype, got.device)]).ok
