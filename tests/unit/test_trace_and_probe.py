"""Ops written as a new user writes them, without ``dtypes=`` or ``register_meta``: fake kernels
never trace data (a mutate-only op compiles and exports; a data-dependent meta is a SpecError
naming ``register_meta``), validation does not depend on the call's values or on history, and
errors say what to do (shape mismatches are InputErrors, a failed shape unpack suggests ``ndim=``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.export import Dim

import kernelgraft as kg


@triton.jit
def _append_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, n, n_slots, ROW: tl.constexpr, TOKENS: tl.constexpr,
                   BLOCK: tl.constexpr):
    tokens = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    slot = tl.load(slot_ptr + tokens, mask=tokens < n, other=-1)
    ok = (slot >= 0) & (slot < n_slots)  # padding and out-of-range slots: skipped
    cols = tl.arange(0, BLOCK)
    mask = ok[:, None] & (cols[None, :] < ROW)
    src = tokens[:, None] * ROW + cols[None, :]
    dst = slot[:, None] * ROW + cols[None, :]
    tl.store(kc_ptr + dst, tl.load(k_ptr + src, mask=mask), mask=mask)
    tl.store(vc_ptr + dst, tl.load(v_ptr + src, mask=mask), mask=mask)


def _launch_append(k, v, k_cache, v_cache, slot_mapping):
    n, heads, dim = k.shape
    row = heads * dim
    _append_kernel[(triton.cdiv(n, 4),)](k, v, k_cache, v_cache, slot_mapping, n,
                                         k_cache.shape[0] * k_cache.shape[1], ROW=row, TOKENS=4,
                                         BLOCK=triton.next_power_of_2(row))


def _kv_samples(device="cpu"):
    yield _kv_args(5, device)


def _kv_args(n, device="cpu", slots=None):
    g = torch.Generator().manual_seed(n)
    k, v = torch.randn(n, 2, 16, generator=g), torch.randn(n, 2, 16, generator=g)
    k_cache, v_cache = torch.randn(3, 4, 2, 16, generator=g), torch.randn(3, 4, 2, 16, generator=g)
    s = torch.randperm(12, generator=g)[:n] if slots is None else torch.tensor(slots)
    if slots is None and n > 1:
        s[1] = -1
    return tuple(t.to(device) for t in (k, v, k_cache, v_cache, s))


def _user_kv_append(name, impls=None):
    """The op as the README leads a user to write it: the reference filters padding with a mask."""

    @kg.op(name, mutates_args=("k_cache", "v_cache"), sample_inputs=_kv_samples,
           impls=[kg.triton(_launch_append, configs=[{}])] if impls is None else impls)
    def kv_append(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
        keep = slot_mapping >= 0
        slots = slot_mapping[keep]
        k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep]
        v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep]

    return kv_append


class _Append(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, k, v, k_cache, v_cache, slots):
        self.op(k, v, k_cache, v_cache, slots)
        return k_cache.sum() + v_cache.sum()


def _expected(op, args):
    want = tuple(t.clone() for t in args)
    op.run(*want, impl="reference")
    return want


# ------------------------------------------------------------------ fake kernels never trace data
def test_a_mutate_only_op_compiles_fullgraph_and_exports_with_dynamic_tokens():
    op = _user_kv_append("ttrace::kv_append")
    compiled = torch.compile(_Append(op), fullgraph=True, dynamic=True)
    for n in (3, 5, 8):
        args, want = _kv_args(n), _expected(op, _kv_args(n))
        compiled(*args)
        assert torch.equal(args[2], want[2]) and torch.equal(args[3], want[3])
    tokens = Dim("tokens", min=2, max=12)
    program = torch.export.export(_Append(op), _kv_args(5),
                                  dynamic_shapes=({0: tokens}, {0: tokens}, None, None, {0: tokens}))
    args, want = _kv_args(9), _expected(op, _kv_args(9))
    program.module()(*args)
    assert torch.equal(args[2], want[2]) and torch.equal(args[3], want[3])


def _positive_sum(name):
    @kg.op(name)
    def positive_sum(x: torch.Tensor) -> torch.Tensor:
        return x[x > 0].sum().reshape(1)

    return positive_sum


def _spec_error_in(exc: BaseException) -> kg.SpecError | None:
    while exc is not None:
        if isinstance(exc, kg.SpecError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def test_a_data_dependent_reference_is_a_spec_error_naming_register_meta():
    op = _positive_sum("ttrace::positive_sum")
    x = torch.randn(6, 3)
    with pytest.raises(Exception) as info:
        torch.compile(lambda t: op(t) * 2, fullgraph=True)(x)
    error = _spec_error_in(info.value)
    assert error is not None, info.value
    assert "ttrace::positive_sum" in str(error) and "op.register_meta(fn)" in str(error)
    with pytest.raises(kg.SpecError, match=r"ttrace::positive_sum: the reference has data-dependent shapes.*"
                                           r"op\.register_meta\(fn\)"):
        op(x)
    # the fix the message names
    op.register_meta(lambda t: t.new_empty(1))
    torch._dynamo.reset()
    got = torch.compile(lambda t: op(t) * 2, fullgraph=True, backend="aot_eager")(x)
    assert torch.allclose(got, x.clamp_min(0).sum().reshape(1) * 2)


# ------------------------------------------------------------------ validation without values
def test_an_out_of_range_slot_gets_the_same_treatment_on_the_1st_and_the_100th_call():
    """The kernel skips it; before, the first call with a new dtype combination ran the reference
    on these very slots and raised, and every later call ran the kernel silently."""
    op = _user_kv_append("ttrace::kv_oob")
    outcomes = []
    for call in range(100):
        if call == 1:
            op(*_kv_args(4))  # a good call in between
        k, v, k_cache, v_cache, slots = _kv_args(3, slots=[2, 99, 7])  # 12 slots: 99 is past them
        want = k_cache.clone().view(12, 2, 16)
        want[2], want[7] = k[0], k[2]
        try:
            op(k, v, k_cache, v_cache, slots)
            outcomes.append(("ran", torch.equal(k_cache.view(12, 2, 16), want)))
        except kg.InputError as exc:
            outcomes.append(("refused", str(exc)[:60]))
    assert set(outcomes) == {("ran", True)}, outcomes[:2]


def test_the_example_skips_out_of_range_slots_on_every_call():
    from kernelgraft.examples.kv_append import kv_append

    key, value = torch.randn(3, 1, 8), torch.randn(3, 1, 8)
    for call in range(100):
        caches = torch.randn(2, 2, 4, 1, 8)  # K and V of 2 blocks of 4 slots
        want = caches.clone()
        want[0, 1, 1], want[1, 1, 1] = key[0], value[0]  # slot 5; slot 8 is out of range, -1 padding
        kv_append(key, value, caches[0], caches[1], torch.tensor([5, 8, -1]))
        assert torch.equal(caches, want), call


def _kernel_copy(x, y, out):
    out.copy_(x * y)


def test_a_reference_that_refuses_some_values_does_not_refuse_calls_by_their_values():
    """The dtype probe runs the reference on zeros: a reference that raises on negative values
    neither refuses the first call that has them nor lets later ones through differently."""
    from _torch_backend import kg_torch

    @kg.op("ttrace::positive_only", impls=[kg_torch(_kernel_copy)])
    def positive_only(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if bool((x < 0).any()):
            raise ValueError("negative input")
        return x * y

    positive_only.register_meta(lambda x, y: torch.empty_like(x))  # its branch on values cannot run on fake tensors
    negative = -torch.ones(4)
    first = positive_only(negative, negative)  # the kernel runs: values are not the probe's business
    assert all(torch.equal(positive_only(negative, negative), first) for _ in range(5))


def test_a_dtype_the_reference_refuses_is_refused_on_every_call():
    from _torch_backend import kg_torch

    @kg.op("ttrace::gelu_mul", impls=[kg_torch(_kernel_copy)])
    def gelu_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.gelu(x) * y

    a = torch.arange(6, dtype=torch.int64)
    for _ in range(3):  # the verdict is kept: the same words each time, without running again
        with pytest.raises(kg.InputError, match=r"ttrace::gelu_mul: the reference does not accept these "
                                                r"inputs \(x=int64, y=int64\) \(judged once for these dtypes, on "
                                                r"zero-filled tensors\): it raised NotImplementedError"):
            gelu_mul(a, a)


# ------------------------------------------------------------------ clear errors
def test_shape_mismatches_of_a_mutating_op_are_input_errors():
    op = _user_kv_append("ttrace::kv_shapes")
    k, v, k_cache, v_cache, slots = _kv_args(5)
    # slot_mapping of another length: refused on fake tensors, before the kernel
    with pytest.raises(kg.InputError, match=r"ttrace::kv_shapes: the reference does not accept these inputs"):
        op(k, v, k_cache, v_cache, slots[:4])
    # the reference serving the call (no kernel): torch's broadcast error becomes an InputError
    plain = _user_kv_append("ttrace::kv_shapes_ref", impls=[])
    with pytest.raises(kg.InputError, match=r"ttrace::kv_shapes_ref: the reference does not accept these "
                                            r"inputs \(k=float32\[5, 2, 16\], .*it raised RuntimeError: "
                                            r"shape mismatch"):
        plain(k, v, k_cache[..., :8], v_cache[..., :8], slots)


@triton.jit
def _top1_kernel(x_ptr, i_ptr, E: tl.constexpr):
    row = tl.program_id(0)
    x = tl.load(x_ptr + row * E + tl.arange(0, E))
    tl.store(i_ptr + row, tl.argmax(x, 0).to(tl.int64))


def _launch_top1(x, out):
    n, e = x.shape  # a 1-D input does not unpack
    _top1_kernel[(n,)](x, out, E=e)


def test_a_launch_that_cannot_unpack_a_shape_suggests_ndim():
    @kg.op("ttrace::top1", impls=[kg.triton(_launch_top1, configs=[{}])])
    def top1(x: torch.Tensor) -> torch.Tensor:
        return x.argmax(-1)

    x = torch.randn(3, 8)
    assert torch.equal(top1(x), x.argmax(-1))
    with pytest.raises(kg.LaunchError, match=r"not enough values to unpack.*declare it with kg\.op\(\.\.\., "
                                             r"ndim=\{'x': 2\}\)"):
        top1(torch.randn(8))
