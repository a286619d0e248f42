"""Element-level overlap: strided views of one buffer that share no element (interleaved K/V
caches) are accepted without ``allow_overlap=True``; views that share one are still refused, on
the Python path and in the native replay alike."""

from __future__ import annotations

import ctypes
import itertools
import random
import shutil

import pytest
import torch

import kernelgraft as kg
from kernelgraft.op.overlap import modular_rule, overlap_guard
from kernelgraft.examples.kv_append import kv_append


@pytest.fixture(scope="module")
def acc_op():
    @kg.op("toverlap::acc", mutates_args=("acc",))
    def accumulate(x: torch.Tensor, acc: torch.Tensor) -> None:
        acc += x

    return accumulate


def _layout(t: torch.Tensor):
    return tuple(t.shape), tuple(t.stride()), t.element_size()


def test_interleaved_kv_views_have_a_rule_that_proves_them_disjoint():
    kv = torch.zeros(4, 16, 8, 2, 64)  # blocks, block_size, heads, K|V, head_size
    k, v = kv[..., 0, :], kv[..., 1, :]
    m, wa, wb = modular_rule(_layout(k), _layout(v))
    assert (m, wa, wb) == (2 * 64 * 4, 64 * 4, 64 * 4)  # the head stride; each view holds half of it
    split = torch.zeros(4, 2, 16, 8, 64)  # vLLM's [blocks, 2, block_size, heads, head_size]
    assert modular_rule(_layout(split[:, 0]), _layout(split[:, 1])) == (2 * 16 * 8 * 64 * 4, 16 * 8 * 64 * 4,
                                                                       16 * 8 * 64 * 4)
    dense = torch.zeros(8)
    assert modular_rule(_layout(dense[:4]), _layout(dense[2:6])) is None  # unit strides: extents decide


def test_the_guard_accepts_disjoint_elements_and_refuses_shared_ones(acc_op):
    buf = torch.randn(32)
    for x, acc in [(buf[0::2], buf[1::2]), (buf.view(4, 8)[:, :4], buf.view(4, 8)[:, 4:])]:
        guard = overlap_guard(acc_op, (x, acc))
        guard((x, acc))  # disjoint: accepted
        want = acc + x
        acc_op(x, acc)
        assert torch.equal(acc, want)
    for x, acc in [(buf[0:16:2], buf[2:18:2]), (buf.view(4, 8)[:, :5], buf.view(4, 8)[:, 4:])]:
        with pytest.raises(kg.InputError, match=r"'x' overlaps the memory of argument 'acc'"):
            acc_op(x, acc)


def _elements(t: torch.Tensor, base: int) -> set[int]:
    """Every byte address ``t`` covers, counted from ``base``."""
    start = t.data_ptr() - base
    size = t.element_size()
    out = set()
    for index in itertools.product(*(range(n) for n in t.shape)):
        at = start + sum(i * s for i, s in zip(index, t.stride())) * size
        out.update(range(at, at + size))
    return out


def _random_view(buf: torch.Tensor, rng: random.Random) -> torch.Tensor:
    for _ in range(100):
        ndim = rng.randint(1, 3)
        shape = [rng.randint(1, 4) for _ in range(ndim)]
        stride = [rng.choice([1, 2, 3, 4, 6, 8, 12, 16]) for _ in range(ndim)]
        span = sum((n - 1) * s for n, s in zip(shape, stride)) + 1
        if span > buf.numel():
            continue
        offset = rng.randint(0, buf.numel() - span)
        return buf.as_strided(shape, stride, offset)
    return buf[:1]


def _extent(t: torch.Tensor) -> tuple[int, int]:
    span = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
    return t.data_ptr(), t.data_ptr() + span * t.element_size()


def test_the_rule_never_accepts_views_that_share_a_byte(acc_op):
    """Random strided views of one buffer (also of different element sizes): whenever two share
    a byte the guard refuses; the disjoint ones it accepts are counted."""
    rng = random.Random(7)
    raw = torch.zeros(256, dtype=torch.float32)
    accepted_inside_extents = 0
    for trial in range(3000):
        halves = raw.view(torch.float16)  # two elements per float32 one: other element sizes
        x = _random_view(raw if trial % 5 else halves, rng)
        acc = _random_view(raw if trial % 3 else halves, rng)
        shared = _elements(x, raw.data_ptr()) & _elements(acc, raw.data_ptr())
        guard = overlap_guard(acc_op, (x, acc))
        try:
            guard((x, acc))
            refused = False
        except kg.InputError:
            refused = True
        assert refused or not shared, (x.shape, x.stride(), x.storage_offset(), acc.shape, acc.stride(),
                                       acc.storage_offset())
        (a0, a1), (b0, b1) = _extent(x), _extent(acc)
        if not refused and a0 < b1 and b0 < a1:
            accepted_inside_extents += 1
    assert accepted_inside_extents > 50  # the rule does prove interleaved views disjoint


def test_kv_append_takes_interleaved_caches_without_allow_overlap():
    g = torch.Generator().manual_seed(3)
    kv = torch.randn(3, 4, 2, 2, 16, generator=g)  # K and V interleaved per head
    k_cache, v_cache = kv[..., 0, :], kv[..., 1, :]
    key, value = torch.randn(5, 2, 16, generator=g), torch.randn(5, 2, 16, generator=g)
    slots = torch.tensor([3, -1, 0, 11, 7])
    want_k, want_v = k_cache.clone(), v_cache.clone()
    kv_append.run(key, value, want_k, want_v, slots, impl="reference")
    for _ in range(3):  # planning, then the plan again
        kv_append(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    # a value cache that shares rows with the key cache is refused
    shifted = kv.as_strided(k_cache.shape, k_cache.stride(), k_cache.storage_offset() + 1)
    with pytest.raises(kg.InputError, match=r"'value_cache' overlaps the memory of argument 'key_cache'"):
        kv_append(key, value, k_cache, shifted, slots)


# ------------------------------------------------------------------ the native replay agrees
def _strided_accumulate(packed):
    x, acc = (ctypes.c_uint64.from_address(packed[i]).value for i in range(2))
    rows, cols, sx0, sx1, sa0, sa1 = (ctypes.c_int64.from_address(packed[i]).value for i in range(2, 8))
    for r in range(rows):
        for c in range(cols):
            ctypes.c_float.from_address(acc + 4 * (r * sa0 + c * sa1)).value += \
                ctypes.c_float.from_address(x + 4 * (r * sx0 + c * sx1)).value


def test_the_native_replay_accepts_and_refuses_the_same_calls():
    from _host_backend import HOST_FN, HostImpl

    from kernelgraft import native as _native

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler on this machine: the native replay cannot be built")
    assert _native.load() is not None, _native.reason()
    fn = HOST_FN(_strided_accumulate)
    impl = HostImpl(launch=lambda x, acc: [x, acc, *x.shape, *x.stride(), *acc.stride()], configs=({},), fn=fn,
                    kinds=(ctypes.c_void_p,) * 2 + (ctypes.c_int64,) * 6, contiguous=False)

    @kg.op("toverlap::native_acc", mutates_args=("acc",), fallback="error", impls=[impl])
    def accumulate(x: torch.Tensor, acc: torch.Tensor) -> None:
        acc += x

    def halves(buf):  # rows of 16: x the first 8 of each, acc the last 8 (both 16-byte aligned)
        rows = buf[:64].view(4, 16)
        return rows[:, :8], rows[:, 8:]

    for _ in range(4):  # plan, record, replay
        x, acc = halves(torch.randn(68))
        want = acc + x
        accumulate(x, acc)
        assert torch.equal(acc, want)
    replay = accumulate.dispatcher.current_replay()
    assert replay is not None and replay.stats()["misses"] == 0, replay and replay.stats()
    buf = torch.randn(68)
    before = buf.clone()
    shared = buf[4:68].view(4, 16)[:, :8]  # columns 4-11: half of x's, half of acc's
    with pytest.raises(kg.InputError, match=r"'x' overlaps the memory of argument 'acc'"):
        accumulate(halves(buf)[0], shared)  # the same signature and alignment, elements shared
    assert torch.equal(buf, before) and replay.stats()["misses"] >= 1  # handed back to Python, not run
    calls = replay.stats()["calls"]
    x, acc = halves(buf)
    want = acc + x
    accumulate(x, acc)  # disjoint again: replayed
    assert replay.stats()["calls"] == calls + 1 and torch.equal(acc, want)
