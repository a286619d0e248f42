"""Output semantics for the oracle (``kg.op(..., outputs=..., compare=...)``, ``kg.ties_by``): index
outputs with ties are judged by the values they select, in the one oracle that check, the tuner's
gate and graft verification share; a general hook; declaration errors."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import kernelgraft as kg
from kernelgraft.verify import oracle as _verify
from kernelgraft.check import check_op
from kernelgraft.tune import gate as _gate


def _tied_logits(tokens: int, experts: int, seed: int) -> torch.Tensor:
    """bf16 logits on a coarse grid: many exact ties, some across the top-k cut."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-4, 5, (tokens, experts), generator=g) / 2).to(torch.bfloat16)


def _samples(device="cpu"):
    yield _tied_logits(9, 8, 1).to(device), 2
    yield _tied_logits(5, 16, 2).to(device), 4
    yield _tied_logits(3, 32, 3).to(device), 1


@triton.jit
def _top_kernel(x_ptr, v_ptr, i_ptr, n, E: tl.constexpr, K: tl.constexpr, WRONG: tl.constexpr):
    # One row per program; ties go to the lower index (argmax's left tie break), which is not
    # torch.topk's order on the CPU.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, E)
    x = tl.load(x_ptr + row * E + cols).to(tl.float32)
    for j in tl.static_range(K):
        best = tl.argmax(x, 0, tie_break_left=True)
        value = tl.max(x, 0)
        if WRONG and j == 0:
            best = (best + 1) % E  # the right value, a neighbour's index
        tl.store(v_ptr + row * K + j, value)
        tl.store(i_ptr + row * K + j, best.to(tl.int64))
        x = tl.where(cols == tl.argmax(x, 0, tie_break_left=True), float("-inf"), x)


def _launch(x, k, values, indices, *, WRONG):
    _top_kernel[(x.shape[0],)](x, values, indices, x.shape[0], E=x.shape[1], K=k, WRONG=WRONG)


def _power_of_two_experts(x, k, **config):
    # the kernel loads a whole row with tl.arange(0, E): E must be a power of two
    return (x.shape[-1] & (x.shape[-1] - 1)) == 0 or f"experts must be a power of two, got {x.shape[-1]}"


def _top_op(name, configs, **options):
    @kg.op(name, impls=[kg.triton(_launch, configs=configs, supports=_power_of_two_experts)],
           sample_inputs=_samples, **options)
    def top(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = torch.topk(x.float(), k)
        return values, indices

    return top


TIES = dict(outputs=("values", "indices"), compare={"indices": kg.ties_by("x")})


def test_a_correct_kernel_that_breaks_ties_its_own_way_passes_check():
    op = _top_op("tcompare::top_ties", [{"WRONG": False}], **TIES)
    report = check_op(op, device="cpu", opcheck=False)
    assert report.ok, [(r.sample, r.note) for r in report.failures]
    # the samples do tie, and the kernel does order them otherwise than torch (so the rule matters)
    x, k = next(iter(_samples()))
    _, got = op(x, k)
    _, want = torch.topk(x.float(), k)
    assert not torch.equal(got, want)


def test_without_the_rule_the_same_kernel_fails_on_ties():
    op = _top_op("tcompare::top_plain", [{"WRONG": False}])
    report = check_op(op, device="cpu", opcheck=False)
    assert not report.ok
    assert any("bit-exact rule for int64" in r.note for r in report.failures)


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside-correct"])
def test_a_wrong_index_that_is_not_tied_fails(beside):
    configs = [{"WRONG": False}, {"WRONG": True}] if beside else [{"WRONG": True}]
    op = _top_op(f"tcompare::top_wrong_{beside}", configs, **TIES)
    report = check_op(op, device="cpu", opcheck=False)
    bad = {r.candidate for r in report.failures}
    assert bad == {"triton:_launch[WRONG=True]"}, [(r.candidate, r.note) for r in report.results]
    assert all("select other values than the reference's" in r.note for r in report.failures)


def _verdict(op, args, outs):
    return _verify.verify(_verify.reference(op, args), list(outs), op.tolerances)


def test_one_rule_for_check_the_gate_and_graft_verification():
    op = _top_op("tcompare::top_one_rule", [{"WRONG": False}], **TIES)
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    values = torch.tensor([[3.0, 3.0], [2.0, 2.0]])
    tied = torch.tensor([[2, 1], [3, 0]])  # other tied items, in another order
    wrong = torch.tensor([[2, 0], [3, 0]])  # index 0 holds 1.0, not 3.0
    repeated = torch.tensor([[2, 2], [3, 0]])
    ref = _verify.reference(op, (x, 2))
    assert _verify.verify(ref, [values, tied]).ok
    assert _gate.judge(op, ref, [values, tied], (x, 2)) is None
    assert _verify.compare_trees((values, tied.flip(1).flip(1)), (values, tied),
                                 rules=(op, _verify.op_rules(op, (x, 2)))) is None
    for bad, words in ((wrong, "select other values"), (repeated, "repeats an index")):
        assert words in str(_verify.verify(ref, [values, bad]))
        assert words in _gate.judge(op, ref, [values, bad], (x, 2))
        want = torch.topk(x, 2)
        assert words in _verify.compare_trees(tuple(want), (values, bad), rules=(op, _verify.op_rules(op, (x, 2))))
    # without the op's rules, graft's comparison of two computations stays bit-exact for indices
    assert "bit-exact" in _verify.compare_trees((values, torch.tensor([[1, 2], [0, 1]])), (values, tied))


def test_graft_verification_applies_the_ops_rules():
    from kernelgraft.graft import verify as graft_verify

    op = _top_op("tcompare::top_graft", [{"WRONG": False}], **TIES)
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    want = torch.topk(x, 2)
    got = (want.values, want.indices.flip(1))
    assert graft_verify.compare(tuple(want), got, ops=[op], inputs=(x, 2)) is None
    assert "bit-exact" in graft_verify.compare(tuple(want), got, ops=[op])


def test_an_index_outside_the_values_fails_without_raising():
    op = _top_op("tcompare::top_outside", [{"WRONG": False}], **TIES)
    x = torch.randn(2, 4)
    v, i = torch.topk(x, 2)
    bad = i.clone()
    bad[1, 1] = -0x5A5A5A5A  # poison
    verdict = _verdict(op, (x, 2), (v, bad))
    assert not verdict.ok and "outside x's last dimension of 4" in str(verdict)


def test_ties_by_a_key_ranks_what_the_reference_ranks():
    """The router ranks softmax probabilities: logits far below the max underflow to the same 0,
    so a kernel ranking by logits may pick another of them, which is right."""
    key = lambda x: torch.softmax(x.float(), -1)  # noqa: E731

    @kg.op("tcompare::router", outputs=("weights", "indices"), compare={"indices": kg.ties_by("x", key=key)})
    def router(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.topk(torch.softmax(x.float(), -1), k)

    x = torch.tensor([[0.0, -200.0, -300.0, -250.0]])
    w, want = router.run(x, 3, impl="reference")
    by_logits = torch.tensor([[0, 1, 3]])  # -200 then -250: both probability 0 in float32
    assert _verdict(router, (x, 3), (w, by_logits)).ok
    assert not _verdict(router, (x, 3), (w, torch.tensor([[1, 0, 3]]))).ok


def test_a_nan_row_ties_every_expert():
    key = lambda x: torch.softmax(x.float(), -1)  # noqa: E731

    @kg.op("tcompare::router_nan", outputs=("weights", "indices"), compare={"indices": kg.ties_by("x", key=key)})
    def router(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.topk(torch.softmax(x.float(), -1), k)

    x = torch.tensor([[0.0, float("inf"), 1.0, 2.0], [float("nan"), 0.0, 1.0, 2.0]])
    w, _ = router.run(x, 2, impl="reference")
    assert torch.isnan(w).all()
    assert _verdict(router, (x, 2), (w, torch.tensor([[3, 0], [1, 2]]))).ok


def test_a_general_hook_sees_got_want_and_inputs():
    seen = {}

    def same_rows(got, want, inputs):
        seen.update(got=set(got), want=set(want), inputs=set(inputs))
        if not torch.equal(got["indices"].sort(-1).values, want["indices"].sort(-1).values):
            return "other experts"
        return None

    @kg.op("tcompare::hooked", outputs=("values", "indices"), compare={"indices": same_rows})
    def hooked(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.topk(x, k)

    x = torch.tensor([[1.0, 4.0, 2.0, 3.0]])
    v, i = torch.topk(x, 2)
    assert _verdict(hooked, (x, 2), (v, i.flip(1))).ok
    assert seen == {"got": {"values", "indices"}, "want": {"values", "indices"}, "inputs": {"x", "k"}}
    verdict = _verdict(hooked, (x, 2), (v, torch.tensor([[1, 2]])))
    assert not verdict.ok and str(verdict).startswith("indices: other experts")
    # the values keep the default rule
    assert "values" in str(_verdict(hooked, (x, 2), (v + 1, i)))


def test_a_whole_op_hook_and_a_mutated_argument_by_name():
    def whole(got, want, inputs):
        assert inputs["acc"].tolist() == [1.0, 1.0]  # the argument before the call
        return None if torch.allclose(got["acc"], want["acc"], atol=0.5) else "acc is off"

    @kg.op("tcompare::whole", mutates_args=("acc",), compare=whole)
    def accumulate(x: torch.Tensor, acc: torch.Tensor) -> None:
        acc.add_(x)

    x, acc = torch.tensor([1.0, 2.0]), torch.ones(2)
    ref = _verify.reference(accumulate, (x, acc))
    assert [e.name for e in ref.expected] == ["acc"]
    assert _verify.verify(ref, [torch.tensor([2.2, 3.1])]).ok
    assert "outputs: acc is off" in str(_verify.verify(ref, [torch.tensor([9.0, 3.0])]))


def test_a_hook_that_raises_fails_the_candidate():
    def broken(got, want, inputs):
        raise KeyError("nope")

    @kg.op("tcompare::broken_hook", compare={"out0": broken})
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    x = torch.ones(3)
    verdict = _verdict(double, (x,), (x * 2,))
    assert not verdict.ok and "the compare rule raised KeyError" in str(verdict)


def _ref2(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.topk(x, 1)


@pytest.mark.parametrize("options, match", [
    (dict(compare={"indices": kg.ties_by("x")}), r"compare names 'indices', which the op does not produce; it "
                                                 r"produces \['out0', 'out1'\]"),
    (dict(outputs=("values",)), "outputs names 1 outputs"),
    (dict(outputs=("values", "values")), "repeat a name"),
    (dict(outputs=("values", "not a name")), "not a Python identifier"),
    (dict(outputs=("values", "indices"), compare={"indices": kg.ties_by("values")}),
     "'values' is not a Tensor parameter.*cannot say which tied items"),
    (dict(compare={"out1": 3}), r"compare\['out1'\] must be kg.ties_by"),
    (dict(compare=[1]), "compare must be a function"),
], ids=["unknown-name", "count", "repeat", "identifier", "ties-by-output", "bad-rule", "bad-compare"])
def test_declaration_errors(options, match):
    with pytest.raises(kg.SpecError, match=match):
        kg.op("tcompare::bad", **options)(_ref2)


def test_rules_are_part_of_the_ops_identity():
    a = kg.op("tcompare::ident_a")(_ref2)
    b = kg.op("tcompare::ident_b", compare={"out1": kg.ties_by("x")})(_ref2)
    c = kg.op("tcompare::ident_c", outputs=("v", "i"), compare={"i": kg.ties_by("x")})(_ref2)
    assert len({a.fingerprint, b.fingerprint, c.fingerprint}) == 3
    assert "compare" not in a.identity and "outputs" not in a.identity  # unchanged for other ops


@pytest.mark.gpu
def test_cpu_and_cuda_give_the_same_verdict_on_ties():
    """torch's tie order differs between devices; the rule makes the verdict the same on both."""
    op = _top_op("tcompare::top_devices", [{"WRONG": False}], **TIES)
    for args in _samples():
        values, want = torch.topk(args[0].float(), args[1])
        _, lower = torch.sort(-args[0].float(), dim=-1, stable=True)  # ties toward the lower index
        lower = lower[:, : args[1]]
        for device in ("cpu", "cuda"):
            moved = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
            ref = _verify.reference(op, moved)
            assert _verify.verify(ref, [values.to(device), lower.to(device)]).ok
            bad = lower.clone()
            bad[:, 0] = args[0].float().argmin(-1)  # the smallest value: never tied with the largest
            assert not _verify.verify(ref, [values.to(device), bad.to(device)]).ok
