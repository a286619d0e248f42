"""The paged KV-cache append example: check passes it, check fails every broken variant of its
kernel (alone or beside correct configs, with or without opcheck), it compiles with
``fullgraph=True`` and exports with dynamic token counts without ``register_meta``, strided and
interleaved caches work, and its bad inputs are InputErrors."""

from __future__ import annotations

import itertools

import pytest
import torch
import triton
import triton.language as tl
from torch.export import Dim

import kernelgraft as kg
from kernelgraft.check import check_op
from kernelgraft.examples import kv_append as module
from kernelgraft.examples.kv_append import kv_append


def test_check_passes_the_example():
    report = check_op(kv_append, device="cpu")
    assert report.ok, [(r.candidate, r.sample, r.note) for r in report.failures]
    ran = {r.candidate.split("[")[0] for r in report.results if r.status == "pass"}
    assert {"triton:launch_kv_append", "meta", "opcheck"} <= ran
    # the CUDA kernel is compiled for sm_90 (NVRTC) on the samples a bundle would take
    assert any(r.status == "compiled" and r.candidate.startswith("cuda:") for r in report.results)


# ------------------------------------------------------------------ broken kernels
@triton.jit
def _broken_kernel(key_ptr, value_ptr, kc_ptr, vc_ptr, slot_ptr, n_tokens, n_slots, block_size,
                   sk_t, sk_h, sk_d, sv_t, sv_h, sv_d, skc_b, skc_s, skc_h, skc_d, svc_b, svc_s, svc_h, svc_d, s_slot,
                   HEAD: tl.constexpr, HEAD_PAD: tl.constexpr, BUG: tl.constexpr):
    tokens = tl.program_id(0).to(tl.int64) * 4 + tl.arange(0, 4)
    head = tl.program_id(1).to(tl.int64)
    if BUG == "slot_stride":
        slot = tl.load(slot_ptr + tokens, mask=tokens < n_tokens, other=-1)
    else:
        slot = tl.load(slot_ptr + tokens * s_slot, mask=tokens < n_tokens, other=-1)
    if BUG == "padding":
        slot = tl.where((slot < 0) & (tokens < n_tokens), 0, slot)  # a padding token lands in slot 0
    valid = (slot >= 0) & (slot < n_slots)
    block = tl.where(valid, slot // block_size, 0)
    row = tl.where(valid, slot % block_size, 0)
    d = tl.arange(0, HEAD_PAD)
    mask = valid[:, None] & (d[None, :] < HEAD)
    k = tl.load(key_ptr + tokens[:, None] * sk_t + head * sk_h + d[None, :] * sk_d, mask=mask)
    v = tl.load(value_ptr + tokens[:, None] * sv_t + head * sv_h + d[None, :] * sv_d, mask=mask)
    tl.store(kc_ptr + block[:, None] * skc_b + row[:, None] * skc_s + head * skc_h + d[None, :] * skc_d, k, mask=mask)
    if BUG != "no_value_cache":
        tl.store(vc_ptr + block[:, None] * svc_b + row[:, None] * svc_s + head * svc_h + d[None, :] * svc_d, v,
                 mask=mask)
    if BUG == "zero_key":  # writes an input the op does not declare mutated
        tl.store(key_ptr + tokens[:, None] * sk_t + head * sk_h + d[None, :] * sk_d, tl.zeros_like(k), mask=mask)


def _launch_broken(key, value, key_cache, value_cache, slot_mapping, *, BUG):
    n = slot_mapping.shape[0]
    num_blocks, block_size, heads, head = key_cache.shape
    _broken_kernel[(max(triton.cdiv(n, 4), 1), heads)](
        key, value, key_cache, value_cache, slot_mapping, n, num_blocks * block_size, block_size,
        *key.stride(), *value.stride(), *key_cache.stride(), *value_cache.stride(), slot_mapping.stride(0),
        HEAD=head, HEAD_PAD=triton.next_power_of_2(head), BUG=BUG)


def _few_samples(device="cpu"):
    """Two of the example's samples: padding, negative and out-of-range slots, interleaved
    caches, key and value slices of a QKV tensor, fewer slots than tokens."""
    return list(itertools.islice(module.sample_inputs(device), 3, 5))


# "zero_key" writes an input the op does not declare mutated: check's guarded memory compares every
# such input with a copy taken before the call, per candidate, so it fails the candidate that wrote it.
BUGS = ["padding", "no_value_cache", "slot_stride", "zero_key"]


@pytest.mark.parametrize("opcheck", [True, False], ids=["opcheck", "no-opcheck"])
@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside-correct"])
@pytest.mark.parametrize("bug", BUGS)
def test_check_fails_every_broken_variant(bug, beside, opcheck):
    configs = [{"BUG": "none"}, {"BUG": bug}] if beside else [{"BUG": bug}]
    op = kg.op(f"tkvappend::broken_{bug}_{int(beside)}_{int(opcheck)}", mutates_args=("key_cache", "value_cache"),
               impls=[kg.triton(_launch_broken, configs=configs, contiguous=False)],
               sample_inputs=_few_samples)(kv_append.reference)
    # the strided variant of each sample (slot_mapping[::2] among them) only where it is the bug
    report = check_op(op, device="cpu", opcheck=opcheck, noncontiguous=bug == "slot_stride")
    failed = {r.candidate for r in report.failures}
    assert f"triton:_launch_broken[BUG={bug}]" in failed, [(r.candidate, r.status, r.note) for r in report.results]
    assert "triton:_launch_broken[BUG=none]" not in failed  # the correct config beside it passes


# ------------------------------------------------------------------ tracing
def _args(n, *, interleaved=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    if interleaved:
        kv = torch.randn(4, 8, 2, 2, 32, generator=g).to(torch.bfloat16)
        k_cache, v_cache = kv[..., 0, :], kv[..., 1, :]
    else:
        k_cache, v_cache = (torch.randn(4, 8, 2, 32, generator=g).to(torch.bfloat16) for _ in range(2))
    qkv = torch.randn(n, 3, 2, 32, generator=g).to(torch.bfloat16)
    slots = torch.randperm(32, generator=g)[:n]
    slots[0] = -1
    return qkv[:, 1], qkv[:, 2], k_cache, v_cache, slots


class _Layer(torch.nn.Module):
    def forward(self, key, value, k_cache, v_cache, slots):
        kv_append(key, value, k_cache, v_cache, slots)
        return k_cache.float().sum() + v_cache.float().sum()


def _same_as_reference(run, n, interleaved, mark=False):
    args, want = _args(n, interleaved=interleaved, seed=n), _args(n, interleaved=interleaved, seed=n)
    if mark:  # the token count is dynamic, the caches' layout is not
        for t in (args[0], args[1], args[4]):
            torch._dynamo.mark_dynamic(t, 0)
    run(*args)
    kv_append.run(*want, impl="reference")
    return torch.equal(args[2], want[2]) and torch.equal(args[3], want[3])


def test_compiles_fullgraph_with_dynamic_tokens_and_no_register_meta():
    assert not kv_append.has_meta
    compiled = torch.compile(_Layer(), fullgraph=True)
    for n, interleaved in ((3, False), (7, False), (12, False), (5, True), (9, True)):
        assert _same_as_reference(compiled, n, interleaved, mark=True), n


def test_exports_with_dynamic_tokens():
    tokens = Dim("tokens", min=2, max=32)
    program = torch.export.export(_Layer(), _args(5), dynamic_shapes=(
        {0: tokens}, {0: tokens}, None, None, {0: tokens}))
    for n in (2, 9, 17):
        assert _same_as_reference(program.module(), n, False), n


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("change, match", [
    (lambda a: (a[0][:, :, :16], *a[1:]), "'value' has shape"),
    (lambda a: (*a[:2], a[2][..., :16], a[3][..., :16], a[4]), r"the caches hold \(2, 16\)"),
    (lambda a: (*a[:3], a[3][:2], a[4]), "'value_cache' has shape"),
    (lambda a: (*a[:4], torch.arange(9)), "'slot_mapping' has 9 slots for 5 tokens"),
    (lambda a: (*a[:2], a[2].float(), a[3].float(), a[4]), "'key_cache' is torch.float32, expected 'key''s dtype"),
], ids=["value", "head-size", "caches", "slots", "dtype"])
def test_shape_mismatches_are_input_errors_before_any_kernel(change, match):
    with pytest.raises(kg.InputError, match=f"kgexamples::kv_append: {match}"):
        kv_append(*change(_args(5)))


def test_a_cache_that_shares_elements_with_the_other_is_refused():
    key, value, k_cache, _, slots = _args(5)
    with pytest.raises(kg.InputError, match="'value_cache' overlaps the memory of argument 'key_cache'"):
        kv_append(key, value, k_cache, k_cache[..., :], slots)


# ------------------------------------------------------------------ GPU
def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as integers of their width: equal exactly when the bits are."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def test_bits_compare_nan_and_signed_zeros_exactly():
    a = torch.tensor([float("nan"), -0.0, 1.0], dtype=torch.bfloat16)
    assert torch.equal(_bits(a), _bits(a.clone())) and not torch.equal(a, a.clone())
    assert not torch.equal(_bits(a), _bits(torch.tensor([float("nan"), 0.0, 1.0], dtype=torch.bfloat16)))


@pytest.mark.gpu
def test_check_passes_on_cuda_and_every_kernel_matches_on_interleaved_caches():
    report = check_op(kv_append, device="cuda")
    assert report.ok, [(r.candidate, r.sample, r.note) for r in report.failures]
    assert any(r.status == "pass" and r.candidate.startswith("cuda:") for r in report.results)
    for args in module.sample_inputs("cuda"):
        want = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        kv_append.run(*want, impl="reference")
        for cand in kv_append.candidates(*args):
            if cand.supported and not cand.label.startswith("torch:"):
                got = tuple(a.clone() for a in args)
                kv_append.run(*got, impl=cand.index, config=cand.config.as_dict())
                for i in (2, 3):  # bit for bit: the samples carry NaN and Inf, which torch.equal calls unequal
                    assert torch.equal(_bits(got[i]), _bits(want[i])), cand.label
    g = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn(64, 16, 8, 2, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k_cache, v_cache = kv[..., 0, :], kv[..., 1, :]
    key = torch.randn(300, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    slots = torch.randperm(64 * 16, device="cuda", generator=g)[:300]
    want = kv.clone()
    kv_append.run(key, key, want[..., 0, :], want[..., 1, :], slots, impl="reference")
    for _ in range(3):
        kv_append(key, key, k_cache, v_cache, slots)
    assert torch.equal(kv, want)
