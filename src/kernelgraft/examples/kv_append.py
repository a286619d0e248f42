"""Paged KV-cache append: the write side of paged attention, as vLLM's ``reshape_and_cache_flash``.

Layout and semantics follow vLLM (csrc/cache_kernels.cu):

- ``key``, ``value``: ``[num_tokens, num_heads, head_size]`` (any strides: a slice of a fused QKV
  projection is fine).
- ``key_cache``, ``value_cache``: ``[num_blocks, block_size, num_heads, head_size]``, the same dtype
  as ``key``, any strides: one layer of a larger allocation, ``kv[:, 0]`` and ``kv[:, 1]`` of a
  ``[num_blocks, 2, block_size, ...]`` tensor, or K and V interleaved per head (``kv[..., 0, :]``
  and ``kv[..., 1, :]`` of ``[..., num_heads, 2, head_size]``). Such views share one buffer
  without sharing an element, which the op accepts.
- ``slot_mapping``: ``int64 [n]`` with ``n <= num_tokens``; token ``t < n`` goes to block
  ``slot // block_size``, row ``slot % block_size``. Tokens past ``n`` are not written (vLLM pads
  ``key`` for CUDA graphs).

Slots that write nothing, the same way on every device and every call (the reference, the Triton
and the CUDA kernel alike): a negative slot (padding, conventionally -1), and a slot at or past
``num_blocks * block_size``, which is out of range and skipped rather than written out of bounds.
Finding it would cost a host synchronisation per call on a GPU, and refusing it only on the
devices where that is free would make a call's outcome depend on where it runs. Validate slots
upstream if out-of-range ones are a bug in your program. Two tokens with the same slot leave either
one's row (the reference and the kernels may differ): slots are meant to be distinct.

Every other element of the caches stays untouched; rows are copied bit for bit.

>>> import torch
>>> from kernelgraft.examples.kv_append import kv_append
>>> key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
>>> k_cache, v_cache = torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8)
>>> kv_append(key, value, k_cache, v_cache, torch.tensor([5, -1, 0]))
>>> torch.equal(k_cache[1, 1], key[0]), torch.equal(v_cache[0, 0], value[2]), bool(k_cache[0, 1].any())
(True, True, False)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import FakeTensor

import kernelgraft as kg

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
NAME = "kgexamples::kv_append"


# ------------------------------------------------------------------ reference
def _check(key, value, key_cache, value_cache, slot_mapping) -> str | None:
    """Why the shapes do not fit together (shapes and dtypes only: it runs on fake tensors too)."""
    if value.shape != key.shape:
        return f"'value' has shape {tuple(value.shape)}, expected 'key''s {tuple(key.shape)}"
    if key_cache.shape != value_cache.shape:
        return (f"'value_cache' has shape {tuple(value_cache.shape)}, expected 'key_cache''s "
                f"{tuple(key_cache.shape)}")
    if tuple(key_cache.shape[2:]) != tuple(key.shape[1:]):
        return (f"the caches hold {tuple(key_cache.shape[2:])} (num_heads, head_size) per row, but 'key' "
                f"has {tuple(key.shape[1:])}")
    for name, t in (("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.dtype != key.dtype:
            return f"'{name}' is {t.dtype}, expected 'key''s dtype {key.dtype}"
    if slot_mapping.shape[0] > key.shape[0]:
        return (f"'slot_mapping' has {slot_mapping.shape[0]} slots for {key.shape[0]} tokens of 'key'; "
                "expected at most one per token")
    return None


def sample_inputs(device: str = "cpu"):
    """Decode and prefill sizes, head sizes that are and are not powers of two, each dtype,
    padding, negative and out-of-range slots, a slot_mapping shorter than key, and every cache
    layout vLLM uses: dense, one of two layers, kv[:, 0] / kv[:, 1], K and V interleaved per head."""
    g = torch.Generator().manual_seed(0)
    cases = [  # tokens, slots, heads, head_size, blocks, block_size, dtype, layout
        (1, 1, 1, 64, 2, 16, torch.bfloat16, "contiguous"),
        (7, 7, 2, 128, 3, 4, torch.float16, "contiguous"),
        (6, 6, 2, 64, 2, 4, torch.bfloat16, "dense"),
        (33, 30, 2, 80, 4, 16, torch.bfloat16, "interleaved"),
        (12, 12, 4, 64, 4, 8, torch.float32, "split"),
        (9, 9, 1, 256, 2, 8, torch.bfloat16, "layer"),
        (5, 5, 3, 32, 2, 4, torch.float16, "interleaved"),
    ]
    for tokens, n, heads, hd, blocks, bs, dtype, layout in cases:
        yield _case(device, tokens, n, heads, hd, blocks, bs, dtype, layout, g)


def _case(device, tokens, n, heads, hd, blocks, bs, dtype, layout, g):
    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    if layout == "interleaved":  # [blocks, bs, heads, 2, hd]: K and V alternate per head
        kv = rand(blocks, bs, heads, 2, hd)
        k_cache, v_cache = kv[..., 0, :], kv[..., 1, :]
    elif layout == "split":  # vLLM's [blocks, 2, bs, heads, hd]
        kv = rand(blocks, 2, bs, heads, hd)
        k_cache, v_cache = kv[:, 0], kv[:, 1]
    elif layout == "layer":  # layer 1 of a [2 layers, blocks, ...] allocation per cache
        k_cache, v_cache = rand(2, blocks, bs, heads, hd)[1], rand(2, blocks, bs, heads, hd)[1]
    else:
        k_cache, v_cache = rand(blocks, bs, heads, hd), rand(blocks, bs, heads, hd)
    # the output of a fused QKV projection: key and value are strided slices of it
    qkv = torch.randn(tokens, 3, heads, hd, generator=g).to(dtype)
    qkv[0, 1, 0, :2] = torch.tensor([float("inf"), float("nan")])  # copied bit for bit
    qkv[-1, 2, -1, -1] = float("-inf")
    qkv = qkv.to(device)
    key, value = qkv[:, 1], qkv[:, 2]
    if layout == "contiguous":  # every tensor dense, as a bundle's kernels take them
        key, value = key.contiguous(), value.contiguous()
    slots = torch.randperm(blocks * bs, generator=g)[:n]
    if n > 2:
        slots[1] = -1  # padding
    if n > 4:
        slots[3] = blocks * bs + 3  # out of range: skipped like padding
    if n > 5:
        slots[5] = -7
    return key, value, k_cache, v_cache, slots.to(device)


# Shapes for ``kernelgraft bench`` (kernelgraft.bench.suite): tokens appended per call.
BENCH_SHAPES = {
    "short": {"decode": [(64,)], "prefill": [(4096,)]},
    "llm": {"decode": [(1,), (16,), (64,), (256,)], "prefill": [(4096,), (16384,), (32768,)]},
}


def _bench_case(n_tokens, device="cuda"):
    """Llama-3-8B's KV (8 heads of 128, bf16) into pages of 16 tokens from a cache of at least
    4096 pages: a prefill fills each sequence's pages in order, the pages from anywhere (a random
    block table); a decode batch appends one token to each of several sequences."""
    blocks, bs, heads, hd = max(2 * n_tokens // 16, 4096), 16, 8, 128
    k_cache = torch.zeros(blocks, bs, heads, hd, device=device, dtype=torch.bfloat16)
    v_cache = torch.zeros(blocks, bs, heads, hd, device=device, dtype=torch.bfloat16)
    if n_tokens >= 1024:
        pages = torch.randperm(blocks, device=device)[: n_tokens // bs]
        t = torch.arange(n_tokens, device=device)
        slots = pages[t // bs] * bs + t % bs
    else:
        pages = torch.randperm(blocks, device=device)[:n_tokens]
        slots = pages * bs + torch.randint(0, bs, (n_tokens,), device=device)
    qkv = torch.randn(n_tokens, 3, heads, hd, device=device, dtype=torch.bfloat16)
    return (qkv[:, 1], qkv[:, 2], k_cache, v_cache, slots)


def bench_case(n, device: str = "cuda"):
    """Decode- and prefill-sized appends of Llama-3-8B keys and values, by regime: the inputs of one shape
    of ``BENCH_SHAPES``."""
    return _bench_case(n, device)


def cost(key, value, key_cache, value_cache, slot_mapping):
    """Bytes moved: the appended keys and values read and written once, and the slots read."""
    n = slot_mapping.shape[0]
    row = key[0].numel() * key.element_size() if key.shape[0] else 0
    return 4 * n * row + n * 8, 0


# ------------------------------------------------------------------ Triton
@triton.jit
def _kv_append_kernel(
    key_ptr, value_ptr, kc_ptr, vc_ptr, slot_ptr, n_tokens, n_slots, block_size,
    sk_t, sk_h, sk_d, sv_t, sv_h, sv_d,
    skc_b, skc_s, skc_h, skc_d, svc_b, svc_s, svc_h, svc_d, s_slot,
    HEAD: tl.constexpr, HEAD_PAD: tl.constexpr, TOKENS: tl.constexpr,
):
    # Program (i, h): TOKENS tokens x head h. Strides are plain integer arguments (Triton
    # specialises those equal to 1), so one kernel serves every cache layout.
    tokens = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS)
    head = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_ptr + tokens * s_slot, mask=tokens < n_tokens, other=-1)
    # padding (negative) and out-of-range slots write nothing: never a store outside the caches
    valid = (slot >= 0) & (slot < n_slots)
    block = tl.where(valid, slot // block_size, 0)
    row = tl.where(valid, slot % block_size, 0)
    d = tl.arange(0, HEAD_PAD)
    mask = valid[:, None] & (d[None, :] < HEAD)
    k = tl.load(key_ptr + tokens[:, None] * sk_t + head * sk_h + d[None, :] * sk_d, mask=mask)
    v = tl.load(value_ptr + tokens[:, None] * sv_t + head * sv_h + d[None, :] * sv_d, mask=mask)
    tl.store(kc_ptr + block[:, None] * skc_b + row[:, None] * skc_s + head * skc_h + d[None, :] * skc_d, k, mask=mask)
    tl.store(vc_ptr + block[:, None] * svc_b + row[:, None] * svc_s + head * svc_h + d[None, :] * svc_d, v, mask=mask)


def launch_kv_append(key, value, key_cache, value_cache, slot_mapping, *, TOKENS, num_warps):
    n = slot_mapping.shape[0]
    num_blocks, block_size, heads, head = key_cache.shape
    _kv_append_kernel[(max(triton.cdiv(n, TOKENS), 1), heads)](
        key, value, key_cache, value_cache, slot_mapping, n, num_blocks * block_size, block_size,
        *key.stride(), *value.stride(), *key_cache.stride(), *value_cache.stride(), slot_mapping.stride(0),
        HEAD=head, HEAD_PAD=triton.next_power_of_2(head), TOKENS=TOKENS, num_warps=num_warps,
    )


def _fits(key, value, key_cache, value_cache, slot_mapping, **config):
    if key_cache.shape[0] * key_cache.shape[1] >= 2**62:
        return "more than 2^62 slots"
    if key.shape[-1] > 1024:
        return f"head_size {key.shape[-1]} exceeds the kernels' 1024"
    return True


TRITON = kg.triton(
    launch_kv_append,
    configs=[{"TOKENS": 1, "num_warps": 1}, {"TOKENS": 4, "num_warps": 2}, {"TOKENS": 16, "num_warps": 4}],
    supports=_fits,
    contiguous=False,  # every tensor is read and written through its strides
)


# ------------------------------------------------------------------ CUDA C++
_CUDA_SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
// One thread block per token, as vLLM's reshape_and_cache_flash. vec = 1: every row's elements
// are contiguous and 16-byte aligned, and each thread copies 16 bytes at a time; vec = 0: any
// strides, one element at a time.
template <typename T>
__global__ void kv_append(const T* __restrict__ key, const T* __restrict__ value, T* __restrict__ kc,
                          T* __restrict__ vc, const long long* __restrict__ slots, int n_tokens,
                          long long n_slots, int block_size, int heads, int head,
                          long long sk_t, long long sk_h, long long sk_d,
                          long long sv_t, long long sv_h, long long sv_d,
                          long long skc_b, long long skc_s, long long skc_h, long long skc_d,
                          long long svc_b, long long svc_s, long long svc_h, long long svc_d,
                          long long s_slot, int vec) {
    const long long t = blockIdx.x;
    if (t >= n_tokens) return;
    const long long slot = slots[t * s_slot];
    if (slot < 0 || slot >= n_slots) return;  // padding or out of range: never written
    const long long b = slot / block_size, r = slot % block_size;
    const T* k = key + t * sk_t;
    const T* v = value + t * sv_t;
    T* kd = kc + b * skc_b + r * skc_s;
    T* vd = vc + b * svc_b + r * svc_s;
    if (vec) {
        constexpr int E = 16 / sizeof(T);
        const int per_head = head / E, n = heads * per_head;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const int h = i / per_head, e = (i % per_head) * E;
            *reinterpret_cast<uint4*>(kd + h * skc_h + e) = *reinterpret_cast<const uint4*>(k + h * sk_h + e);
            *reinterpret_cast<uint4*>(vd + h * svc_h + e) = *reinterpret_cast<const uint4*>(v + h * sv_h + e);
        }
        return;
    }
    const int n = heads * head;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int h = i / head, d = i % head;
        kd[h * skc_h + d * skc_d] = k[h * sk_h + d * sk_d];
        vd[h * svc_h + d * svc_d] = v[h * sv_h + d * sv_d];
    }
}
"""


def _vectorised(key, value, key_cache, value_cache) -> bool:
    """Rows of 16-byte vectors: unit last strides, every other stride and pointer 16-byte aligned.
    Fake tensors (an AOT trace) have no address: the strided path, right for any alignment."""
    per = 16 // key.element_size()
    tensors = (key, value, key_cache, value_cache)
    return (not any(isinstance(t, FakeTensor) for t in tensors)
            and key.shape[-1] % per == 0
            and all(t.stride(-1) == 1 or t.shape[-1] == 1 for t in tensors)
            and all(s % per == 0 for t in tensors for s in t.stride()[:-1])
            and all(t.data_ptr() % 16 == 0 for t in tensors))


def launch_kv_append_cuda(key, value, key_cache, value_cache, slot_mapping, *, THREADS):
    n = slot_mapping.shape[0]
    num_blocks, block_size, heads, head = key_cache.shape
    i32, i64 = kg.driver.i32, kg.driver.i64
    strides = [*key.stride(), *value.stride(), *key_cache.stride(), *value_cache.stride(), slot_mapping.stride(0)]
    return kg.Launch(
        grid=max(n, 1),
        block=THREADS,
        args=(key, value, key_cache, value_cache, slot_mapping, i32(n), i64(num_blocks * block_size),
              i32(block_size), i32(heads), i32(head), *(i64(s) for s in strides),
              i32(int(_vectorised(key, value, key_cache, value_cache)))),
        template={"T": kg.ctype(key.dtype)},
    )


CUDA = kg.cuda(
    _CUDA_SOURCE,
    "kv_append<{T}>",
    launch=launch_kv_append_cuda,
    configs=[{"THREADS": 128}, {"THREADS": 256}],
    supports=_fits,
    contiguous=False,
)

IMPLS = [TRITON, CUDA]


@kg.op(
    NAME,
    mutates_args=("key_cache", "value_cache"),
    dtypes={"key": DTYPES, "value": DTYPES, "key_cache": DTYPES, "value_cache": DTYPES,
            "slot_mapping": (torch.int64,)},
    ndim={"key": 3, "value": 3, "key_cache": 4, "value_cache": 4, "slot_mapping": 1},
    impls=IMPLS,
    sample_inputs=sample_inputs,
    cost=cost,
)
def kv_append(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write token ``t``'s key and value into the caches' row ``slot_mapping[t]``."""
    why = _check(key, value, key_cache, value_cache, slot_mapping)
    if why:
        raise kg.InputError(f"{NAME}: {why}")
    n = slot_mapping.shape[0]
    num_blocks, block_size = key_cache.shape[:2]
    keep = (slot_mapping >= 0) & (slot_mapping < num_blocks * block_size)  # padding and out of range: skipped
    slots = slot_mapping[keep]
    blocks, rows = slots // block_size, slots % block_size
    # indexing by (block, row) writes through any strides: the caches need not be viewable as rows
    key_cache[blocks, rows] = key[:n][keep]
    value_cache[blocks, rows] = value[:n][keep]
