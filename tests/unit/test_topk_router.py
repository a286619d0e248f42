"""The MoE top-k router example: check passes it (its samples tie, often across the top-k cut, and
its kernels break ties their own way), it compiles with ``fullgraph=True`` and exports with dynamic
token counts, and bad inputs are InputErrors."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import kernelgraft as kg
from kernelgraft.verify import oracle as _verify
from kernelgraft.check import check_op
from kernelgraft.examples import topk_router as module
from kernelgraft.examples.topk_router import topk_router


def test_check_passes_the_example():
    report = check_op(topk_router, device="cpu", opcheck_samples=1)
    assert report.ok, [(r.candidate, r.sample, r.note) for r in report.failures]
    assert any(r.status == "compiled" and r.candidate.startswith("cuda:") for r in report.results)


def test_the_samples_tie_and_the_kernel_orders_ties_otherwise_than_torch():
    """What makes the rule necessary: on these samples the kernel's indices differ from torch's
    somewhere, and the oracle still passes them, by the probabilities they select."""
    differ = 0
    for args in module.sample_inputs("cpu"):
        weights, indices = topk_router(*args)
        ref = _verify.reference(topk_router, args)
        assert _verify.verify(ref, [weights, indices]).ok
        differ += int(not torch.equal(indices, ref.expected[1].native))
    assert differ >= 2


def test_a_wrong_expert_fails_and_a_tied_one_passes():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.5, 2.0]], dtype=torch.bfloat16)
    weights, indices = topk_router(x, 3, True)
    assert sorted(indices[0, :2].tolist()) == [1, 2] and indices[0, 2] == 4
    ref = _verify.reference(topk_router, (x, 3, True))
    assert _verify.verify(ref, [weights, indices[:, [1, 0, 2]]]).ok  # the tied pair swapped
    wrong = indices.clone()
    wrong[0, 2] = 3  # 0.5 instead of 2.0
    verdict = _verify.verify(ref, [weights, wrong])
    assert not verdict.ok and str(verdict).startswith("indices: 1 of 3 indices select other values")


class _Router(torch.nn.Module):
    def forward(self, logits):
        weights, indices = topk_router(logits, 2, True)
        return weights * 2, indices


def test_compiles_fullgraph_and_exports_with_dynamic_tokens():
    compiled = torch.compile(_Router(), fullgraph=True, dynamic=True)
    for n in (3, 10):
        x = torch.randn(n, 8, dtype=torch.bfloat16)
        (w, i), (w2, i2) = compiled(x), _Router()(x)
        assert torch.allclose(w, w2) and torch.equal(i, i2)
    program = torch.export.export(_Router(), (torch.randn(5, 8, dtype=torch.bfloat16),),
                                  dynamic_shapes=({0: Dim("tokens", min=1, max=64)},))
    x = torch.randn(17, 8, dtype=torch.bfloat16)
    (w, i), (w2, i2) = program.module()(x), _Router()(x)
    assert torch.allclose(w, w2) and torch.equal(i, i2)


@pytest.mark.parametrize("args, match", [
    ((torch.randn(8), 2, True), r"argument 'router_logits' expected a 2-dimensional tensor"),
    ((torch.randn(3, 8), 9, True), r"argument 'top_k' is 9, expected 1 to the number of experts \(8"),
    ((torch.randn(3, 8), 0, True), r"argument 'top_k' is 0"),
    ((torch.randn(3, 8).double(), 2, True), r"argument 'router_logits' expected dtype in"),
], ids=["1-d", "k-too-large", "k-zero", "dtype"])
def test_bad_inputs_are_input_errors(args, match):
    with pytest.raises(kg.InputError, match=f"kgexamples::topk_router: {match}"):
        topk_router(*args)


@pytest.mark.gpu
def test_check_passes_on_cuda_with_ties_and_cuda_agrees_with_cpu():
    report = check_op(topk_router, device="cuda")
    assert report.ok, [(r.candidate, r.sample, r.note) for r in report.failures]
    assert any(r.status == "pass" and r.candidate.startswith("cuda:") for r in report.results)
    # every kernel, on tied bf16 logits of the LLM shapes' expert counts, against the CPU reference
    g = torch.Generator().manual_seed(0)
    for experts, k in ((8, 2), (60, 4), (128, 8), (256, 8)):
        x = (torch.randint(-8, 9, (333, experts), generator=g) / 4).to(torch.bfloat16)
        ref = _verify.reference(topk_router, (x, k, True))
        for cand in topk_router.candidates(x.cuda(), k, True):
            if cand.supported and not cand.label.startswith("torch:"):
                w, i = topk_router.run(x.cuda(), k, True, impl=cand.index, config=cand.config.as_dict())
                assert _verify.verify(ref, [w.cpu(), i.cpu()]).ok, cand.label
