"""Paged FP8 K-cache scatter: the write side of DeepSeek-V3.2's sparse-attention indexer.

Semantics and layout follow vLLM's ``indexer_k_quant_and_cache`` (csrc/cache_kernels.cu):

- ``k``: ``[num_tokens, head_dim]`` keys (bf16, fp16 or fp32). Each token's row is cut into
  ``head_dim // quant_block_size`` quantisation blocks; each gets one float32 scale
  ``max(amax(|block|), 1e-4) / 448`` (448 = largest e4m3 value), or with ``scale_fmt="ue8m0"``
  that scale rounded *up* to a power of two. Values are stored as ``float8_e4m3fn(x / scale)``
  (IEEE division, round to nearest even).
- ``kv_cache``: ``uint8 [num_blocks, block_size, cache_stride]`` with
  ``cache_stride >= head_dim + 4 * head_dim // quant_block_size``. The row shape only sizes the
  page: inside page ``b`` the bytes are laid out as vLLM does, *not* per row:
  ``block_size * head_dim`` fp8 bytes (token-major), then ``block_size * head_dim/quant_block_size``
  little-endian float32 scales (token-major).
- ``slot_mapping``: ``int64 [num_tokens]``; token ``t`` goes to page ``slot // block_size``, row
  ``slot % block_size``; ``slot < 0`` marks a padding token that writes nothing. A slot at or past
  ``num_blocks * block_size`` is out of range and never written out of bounds: on CPU the call
  raises ``kg.InputError`` before writing anything (the reference does too); on CUDA the kernels
  skip that token like a padding token (no write, no error), because finding it would cost a host
  synchronisation per call. Validate slots upstream, or run the CPU path, to get the error.
- NaN and Inf follow the reference bit for bit: a block holding a NaN gets a NaN scale and NaN
  values (0x7F, or 0xFF for a NaN with the sign bit), a block holding +-Inf an Inf scale, so its
  infinite values become NaN (Inf / Inf) and its finite ones zero; the NaN's sign is the one the
  device's division gives (x86 CPUs set it, NVIDIA GPUs do not), in the kernel and the reference alike.

The op only mutates ``kv_cache`` (returns None); every byte it does not own must stay untouched,
and results must match the reference byte for byte. ``kv_cache`` may be a non-contiguous view
(e.g. one layer of a ``[num_blocks, num_layers, ...]`` allocation, or rows padded for alignment):
byte ``i`` of page ``b`` lives at ``kv_cache[b, i // cache_stride, i % cache_stride]``, whatever the
strides. The ue8m0 rounding is done on the float's bits (exactly ``2**ceil(log2(s))`` for normal
``s``) so no backend depends on a ``log2`` approximation.

>>> import torch
>>> from kernelgraft.examples.fp8_kcache_scatter import fp8_kcache_scatter
>>> k = torch.randn(3, 128)
>>> cache = torch.zeros(2, 4, 132, dtype=torch.uint8)
>>> fp8_kcache_scatter(k, cache, torch.tensor([5, -1, 0]), 128, "")
>>> page = cache[1].flatten()
>>> scale = page[4 * 128 + 4:4 * 128 + 8].view(torch.float32)   # row 1 of page 1 = slot 5
>>> torch.allclose(scale, k[0].abs().max() / 448)
True
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import FakeTensor

import kernelgraft as kg
from kernelgraft.backends.triton.jit import interpreting
from kernelgraft.examples._cuda_sources import cuda_source

FP8_MAX = 448.0
MIN_AMAX = 1e-4


# ------------------------------------------------------------------ reference
def _ue8m0(scale: torch.Tensor) -> torch.Tensor:
    """Round positive normal float32 values up to a power of two, on the bits; NaN and Inf stay
    (rounding their bits would give -0.0 or 0.0, and a hardware fp8 conversion saturates the
    Inf a division by those makes, where torch's gives NaN)."""
    bits = scale.view(torch.int32)
    exponent = (bits >> 23) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return torch.where(torch.isfinite(scale), (exponent << 23).view(torch.float32), scale)


def _check_layout(k, kv_cache, quant_block_size):
    head_dim = k.shape[1]
    if quant_block_size <= 0 or head_dim % quant_block_size:
        return (f"argument 'quant_block_size' is {quant_block_size}, expected a positive divisor of "
                f"head_dim: head_dim {head_dim} (k.shape[1]) is not a multiple of quant_block_size "
                f"{quant_block_size}")
    need = head_dim + 4 * (head_dim // quant_block_size)
    if kv_cache.shape[2] < need:
        return (
            f"kv_cache rows of {kv_cache.shape[2]} bytes are too short; head_dim {head_dim} with "
            f"quant_block_size {quant_block_size} needs cache_stride >= {need}"
        )
    return None


def _check_args(k, slot_mapping, scale_fmt):
    if slot_mapping.shape[0] != k.shape[0]:
        return (f"argument 'slot_mapping' has {slot_mapping.shape[0]} entries, expected one per token "
                f"of 'k' ({k.shape[0]})")
    if scale_fmt not in ("", "ue8m0"):
        return f"argument 'scale_fmt' is {scale_fmt!r}, expected '' (float32 scales) or 'ue8m0'"
    return None


def _check_slots(kv_cache, slot_mapping):
    """InputError for a slot past the cache (one pass over the slots: used on CPU, where it costs
    no device synchronisation, and by the reference)."""
    n_slots = kv_cache.shape[0] * kv_cache.shape[1]
    if slot_mapping.numel() == 0:
        return
    top = int(slot_mapping.max())
    if top >= n_slots:
        token = int(torch.argmax(slot_mapping))
        raise kg.InputError(
            f"kgexamples::fp8_kcache_scatter: argument 'slot_mapping' holds slot {top} (token {token}), "
            f"expected a slot below num_blocks * block_size = {kv_cache.shape[0]} * {kv_cache.shape[1]} "
            f"= {n_slots}, or a negative slot for a padding token"
        )


def _page_index(flat: torch.Tensor, cache_stride: int):
    return flat // cache_stride, flat % cache_stride


# ------------------------------------------------------------------ Triton
@triton.jit
def _e4m3_bits(x):
    """float32 -> float8_e4m3fn bits, round to nearest even, saturating at 448, on integers.

    Used under Triton's CPU interpreter, whose float8 cast mis-rounds values that carry into the
    next exponent (-127.2 became -64); GPUs use the hardware ``cvt.rn.satfinite`` instead."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    # Normal e4m3 (|x| >= 2^-6): round the fp32 pattern to 3 mantissa bits, rebias 127 -> 7.
    normal = (mag + 0x7FFFF + ((mag >> 20) & 1)) >> 20
    normal = tl.minimum(normal - (120 << 3), 0x7E)
    # Subnormal e4m3: round |x| * 2^9 to an integer (8 lands on the smallest normal, as it should).
    exponent = (mag >> 23) - 127
    mant = (mag & 0x7FFFFF) | 0x800000
    shift = tl.minimum(tl.maximum(14 - exponent, 1), 31)
    sub = (mant + ((1 << (shift - 1)) - 1) + ((mant >> shift) & 1)) >> shift
    sub = tl.where(mag < 0x00800000, 0, sub)
    code = tl.where(mag >= 0x3C800000, normal, sub)
    # NaN stays NaN (torch's 0x7F, with the sign); Inf saturates to 448 through the clamp above.
    code = tl.where(mag > 0x7F800000, 0x7F, code)
    return (sign | code).to(tl.uint8)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _fp8_kcache_scatter_kernel(
    k_ptr, cache_ptr, slot_ptr, n_tokens, n_slots, cache_stride,
    stride_page, stride_row, stride_col,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    QBLOCK: tl.constexpr, QPAD: tl.constexpr, TOKENS: tl.constexpr,
    UE8M0: tl.constexpr, PAGE_CONTIGUOUS: tl.constexpr, SCALE32: tl.constexpr, SOFT_FP8: tl.constexpr,
    EVICT: tl.constexpr,
):
    # Program (i, j): TOKENS tokens x quantisation block j. The head size and page size are
    # compile-time (a model has one of each): slot // BLOCK_SIZE is then a shift, not a 64-bit
    # division per token, and row offsets are known multiples of 16 for vector stores.
    tokens = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS)
    qb = tl.program_id(1)
    lane = tl.arange(0, QPAD)
    in_range = tokens < n_tokens
    col = qb * QBLOCK + lane
    slot = tl.load(slot_ptr + tokens, mask=in_range, other=-1)
    # The keys' load does not wait for the slots (masking it by them made every program two
    # dependent DRAM round trips); a padding token's row is read and dropped at the store.
    # EVICT="evict_first" (a config's choice) leaves L2 to the cache lines being written: it paid
    # at 131072 tokens and cost at 524288 on the H200 (research/NOTES.md).
    x = tl.load(k_ptr + tokens[:, None] * HEAD_DIM + col[None, :],
                mask=in_range[:, None] & (lane[None, :] < QBLOCK), other=0.0,
                eviction_policy=EVICT).to(tl.float32)
    # Padding (negative) and out-of-range slots write nothing: never a store outside the cache.
    valid = (slot >= 0) & (slot < n_slots)
    mask = valid[:, None] & (lane[None, :] < QBLOCK)
    # amax and the 1e-4 floor propagate NaN as torch's amax and clamp_min do (tl.max drops it):
    # a block holding a NaN gets a NaN scale, as in the reference. One NaN-propagating max per
    # element (max.NaN.f32) instead of a max and a separate NaN test.
    amax = tl.reduce(tl.abs(x), 1, _max_nan)
    amax = tl.where(amax != amax, float("nan"), amax)  # one NaN, whatever the input's payload
    amax = tl.where(amax < 1e-4, 1e-4, amax)
    # correctly rounded, like CUDA's '/' (a plain '/' may become a multiply by 1/448)
    scale = tl.math.div_rn(amax, tl.full([TOKENS], 448.0, tl.float32))
    if UE8M0:
        bits = scale.to(tl.int32, bitcast=True)
        exponent = (bits >> 23) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        finite = (bits & 0x7F800000) != 0x7F800000  # a NaN or Inf scale stays as it is
        scale = tl.where(finite, (exponent << 23).to(tl.float32, bitcast=True), scale)
        # x / 2^e is exactly x * 2^-e, rounded once: the same bits as a correctly rounded
        # division at a fraction of its cost. A finite scale is a normal power of two (amax is at
        # least 1e-4), 2^127 at most, whose inverse 2^-127 is the subnormal 0x00400000; an Inf
        # scale's inverse is 0 and a NaN's is that NaN, as 1 / scale gives, with no division.
        inv = tl.where(exponent < 254, ((254 - exponent) << 23).to(tl.float32, bitcast=True),
                       tl.full([TOKENS], 0x00400000, tl.int32).to(tl.float32, bitcast=True))
        inv = tl.where(finite, inv, tl.where(scale != scale, scale, 0.0))
        y = x * inv[:, None]
    else:
        y = tl.math.div_rn(x, scale[:, None])
    if SOFT_FP8:
        q = _e4m3_bits(y)
    else:
        q = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    page = tl.where(valid, slot // BLOCK_SIZE, 0)
    row = tl.where(valid, slot % BLOCK_SIZE, 0)
    flat = row[:, None] * HEAD_DIM + col[None, :]
    if PAGE_CONTIGUOUS:
        dst = page[:, None] * stride_page + flat
    else:
        dst = page[:, None] * stride_page + (flat // cache_stride) * stride_row + (flat % cache_stride) * stride_col
    tl.store(cache_ptr + dst, q, mask=mask)
    # The scale's four bytes, little-endian, after the page's fp8 values.
    nqb = HEAD_DIM // QBLOCK
    sbits = scale.to(tl.int32, bitcast=True)
    if SCALE32:  # dense, 4-byte aligned pages: one 32-bit store per scale (GPUs are little-endian)
        sword = (page * stride_page + BLOCK_SIZE * HEAD_DIM + (row * nqb + qb) * 4) // 4
        tl.store(cache_ptr.to(tl.pointer_type(tl.int32)) + sword, sbits, mask=valid)
    else:
        byte = tl.arange(0, 4)
        sbytes = ((sbits[:, None] >> (byte[None, :] * 8)) & 0xFF).to(tl.uint8)
        sflat = BLOCK_SIZE * HEAD_DIM + (row[:, None] * nqb + qb) * 4 + byte[None, :]
        if PAGE_CONTIGUOUS:
            sdst = page[:, None] * stride_page + sflat
        else:
            sdst = (page[:, None] * stride_page + (sflat // cache_stride) * stride_row
                    + (sflat % cache_stride) * stride_col)
        tl.store(cache_ptr + sdst, sbytes, mask=valid[:, None])


def launch_fp8_kcache_scatter(k, kv_cache, slot_mapping, quant_block_size, scale_fmt, *, TOKENS, num_warps,
                              EVICT_FIRST=False):
    n_tokens, head_dim = k.shape
    num_blocks, block_size, cache_stride = kv_cache.shape
    # On GPUs the kernel masks out-of-range slots (see the module docstring); fake tensors are an
    # AOT trace of the GPU launch (kernelgraft aot on a machine without one), which has no values.
    if slot_mapping.device.type == "cpu" and not isinstance(slot_mapping, FakeTensor):
        _check_slots(kv_cache, slot_mapping)
    s_page, s_row, s_col = kv_cache.stride()
    grid = (triton.cdiv(n_tokens, TOKENS), head_dim // quant_block_size)
    dense = s_col == 1 and s_row == cache_stride
    _fp8_kcache_scatter_kernel[grid](
        k, kv_cache, slot_mapping, n_tokens, num_blocks * block_size, cache_stride,
        s_page, s_row, s_col,
        HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        QBLOCK=quant_block_size, QPAD=triton.next_power_of_2(quant_block_size), TOKENS=TOKENS,
        UE8M0=scale_fmt == "ue8m0", PAGE_CONTIGUOUS=dense,
        SCALE32=(dense and kv_cache.data_ptr() % 4 == 0 and s_page % 4 == 0
                 and block_size * head_dim % 4 == 0),
        SOFT_FP8=interpreting(), EVICT="evict_first" if EVICT_FIRST else "",
        num_warps=num_warps,
    )


def _fits(k, kv_cache, slot_mapping, quant_block_size, scale_fmt, **config):
    return _check_layout(k, kv_cache, quant_block_size) or _check_args(k, slot_mapping, scale_fmt) or True


# k and slot_mapping must be dense; the cache may be any strided view.
_DENSE = ("k", "slot_mapping")

TRITON = kg.triton(
    launch_fp8_kcache_scatter,
    configs=[
        {"TOKENS": 4, "num_warps": 4},
        {"TOKENS": 16, "num_warps": 4},
        {"TOKENS": 1, "num_warps": 1},
        {"TOKENS": 32, "num_warps": 4},  # prefill-sized scatters: fewer, larger programs
        {"TOKENS": 64, "num_warps": 8},
        {"TOKENS": 16, "num_warps": 2},  # 64 elements a thread: the fastest at 524288 tokens
        # keys evicted first from L2: the fastest at 131072 tokens, slower at 524288
        {"TOKENS": 16, "num_warps": 4, "EVICT_FIRST": True},
        {"TOKENS": 32, "num_warps": 4, "EVICT_FIRST": True},
    ],
    supports=_fits,
    contiguous=_DENSE,
)

_CUDA_SOURCE = cuda_source("fp8_kcache_scatter.cu")


def _vectorised(k, kv_cache, quant_block_size, vec):
    """scatter_vec's conditions: a dense cache and keys with 16-byte aligned rows and pages, and
    quantisation blocks of ``vec`` * (a power of two up to 32) elements."""
    head_dim = k.shape[1]
    _, s_row, s_col = kv_cache.stride()
    groups = quant_block_size // vec
    return (s_col == 1 and s_row == kv_cache.shape[2] and kv_cache.stride(0) % 16 == 0
            and head_dim % 16 == 0 and quant_block_size % vec == 0 and groups <= 32
            and groups & (groups - 1) == 0
            and kv_cache.data_ptr() % 16 == 0 and k.data_ptr() % 16 == 0)


def launch_fp8_kcache_scatter_cuda(k, kv_cache, slot_mapping, quant_block_size, scale_fmt, *, WARPS, VEC):
    n_tokens, head_dim = k.shape
    num_blocks, block_size, cache_stride = kv_cache.shape
    pairs = n_tokens * (head_dim // quant_block_size)
    vec = _vectorised(k, kv_cache, quant_block_size, VEC)
    threads = pairs * (quant_block_size // VEC) if vec else pairs * 32
    i32, i64 = kg.driver.i32, kg.driver.i64
    return kg.Launch(
        grid=max(1, (threads + 32 * WARPS - 1) // (32 * WARPS)),
        block=32 * WARPS,
        args=(k, kv_cache, slot_mapping, i32(n_tokens), i64(num_blocks * block_size), i32(head_dim),
              i32(quant_block_size),
              i32(block_size), i32(cache_stride), *(i64(s) for s in kv_cache.stride()),
              i32(scale_fmt == "ue8m0"), i32(head_dim // quant_block_size),
              i32((quant_block_size // VEC).bit_length() if vec else 0)),
        template={"T": kg.ctype(k.dtype)},
    )


CUDA = kg.cuda(
    _CUDA_SOURCE,
    "fp8_kcache_scatter<{T}>",
    launch=launch_fp8_kcache_scatter_cuda,
    # VEC 32 was faster than 16 at every prefill size on the H200; 16 serves quant blocks of 16
    configs=[{"WARPS": 4, "VEC": 32}, {"WARPS": 8, "VEC": 32}, {"WARPS": 4, "VEC": 16}],
    supports=_fits,
    contiguous=_DENSE,
)

IMPLS = [TRITON, CUDA]


# ------------------------------------------------------------------ inputs
def _case(device, dtype, n_tokens, head_dim, qbs, block_size, num_blocks, *, layout="dense",
          pad=0, generator=None):
    """k, a randomly filled cache (so untouched bytes are checked) and unique random slots."""
    g = generator
    cs = head_dim + 4 * (head_dim // qbs) + pad
    if layout == "layer_view":  # one layer of a [num_blocks, 2 layers, block_size, cs] allocation
        big = torch.randint(0, 256, (num_blocks, 2, block_size, cs), dtype=torch.uint8, generator=g)
        cache = big.to(device)[:, 1]
    elif layout == "padded_rows":  # rows padded to 16 bytes: stride(1) != shape(2)
        width = (cs + 15) // 16 * 16 + 16
        big = torch.randint(0, 256, (num_blocks, block_size, width), dtype=torch.uint8, generator=g)
        cache = big.to(device)[:, :, :cs]
    else:
        cache = torch.randint(0, 256, (num_blocks, block_size, cs), dtype=torch.uint8, generator=g).to(device)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:n_tokens]
    if n_tokens > 2:
        slots[1] = -1  # a padding token
    k = (torch.randn(n_tokens, head_dim, generator=g) * 3).to(device=device, dtype=dtype)
    if n_tokens > 3:
        k[2, :qbs] = 0  # an all-zero block: the 1e-4 floor on amax
    return k, cache, slots.to(device)


def sample_inputs(device: str = "cpu", dtype: torch.dtype = torch.bfloat16):
    """DeepSeek-V3.2's shape (head_dim 128, one scale per token), several scales per token,
    a head_dim that is not a power of two, padding slots, ue8m0, and non-contiguous caches."""
    cases = [
        (dict(n_tokens=1, head_dim=128, qbs=128, block_size=64, num_blocks=2), ""),
        (dict(n_tokens=37, head_dim=128, qbs=128, block_size=64, num_blocks=3), ""),
        (dict(n_tokens=37, head_dim=128, qbs=128, block_size=64, num_blocks=3), "ue8m0"),
        (dict(n_tokens=20, head_dim=64, qbs=32, block_size=16, num_blocks=4), ""),
        (dict(n_tokens=9, head_dim=96, qbs=32, block_size=8, num_blocks=3, pad=4), "ue8m0"),
        (dict(n_tokens=21, head_dim=128, qbs=64, block_size=16, num_blocks=4, layout="layer_view"), ""),
        (dict(n_tokens=13, head_dim=64, qbs=64, block_size=16, num_blocks=2, layout="padded_rows"), "ue8m0"),
    ]
    for kwargs, fmt in cases:
        k, cache, slots = _case(device, dtype, **kwargs)
        yield (k, cache, slots, kwargs["qbs"], fmt)
    k, cache, slots = _case(device, torch.float32, 11, 128, 128, 16, 2)
    yield (k, cache, slots, 128, "")


# Shapes for ``kernelgraft bench`` (kernelgraft.bench.suite): tokens scattered per call.
BENCH_SHAPES = {
    "short": {"prefill": [(256,), (4096,), (32768,), (131072,), (524288,)]},
    "llm": {"decode": [(1,), (16,), (64,)], "prefill": [(4096,), (32768,), (131072,)]},
}


def _bench_case(n_tokens, device="cuda"):
    """DeepSeek-V3.2 indexer keys (head_dim 128, pages of 64 tokens) in a cache of at least 1024
    pages. A prefill fills each sequence's pages in order, the pages from anywhere in the cache (a
    random block table); a decode batch writes one token to each of several sequences' pages."""
    num_blocks = max(2 * n_tokens // 64, 1024)
    cache = torch.zeros(num_blocks, 64, 132, dtype=torch.uint8, device=device)
    if n_tokens >= 256:  # a prefill's tokens
        pages = torch.randperm(num_blocks, device=device)[: n_tokens // 64]
        t = torch.arange(n_tokens, device=device)
        slots = pages[t // 64] * 64 + t % 64
    else:  # a decode batch: one token for each of n_tokens sequences
        pages = torch.randperm(num_blocks, device=device)[:n_tokens]
        slots = pages * 64 + torch.randint(0, 64, (n_tokens,), device=device)
    k = torch.randn(n_tokens, 128, device=device, dtype=torch.bfloat16)
    return (k, cache, slots, 128, "ue8m0")


def bench_case(n, device: str = "cuda"):
    """Decode- and prefill-sized scatters of DeepSeek-V3.2 indexer keys: the inputs of one shape of
    ``BENCH_SHAPES``."""
    return _bench_case(n, device)


def cost(k, kv_cache, slot_mapping, quant_block_size, scale_fmt):
    """Bytes moved: k and slot_mapping read, fp8 values and scales written (not the whole cache)."""
    n, head_dim = k.shape
    written = n * (head_dim + 4 * (head_dim // quant_block_size))
    return k.numel() * k.element_size() + slot_mapping.numel() * 8 + written, 0


@kg.op(
    "kgexamples::fp8_kcache_scatter",
    mutates_args=("kv_cache",),
    dtypes={
        "k": (torch.bfloat16, torch.float16, torch.float32),
        "kv_cache": (torch.uint8,),
        "slot_mapping": (torch.int64,),
    },
    ndim={"k": 2, "kv_cache": 3, "slot_mapping": 1},
    tolerances={torch.uint8: 0.0},
    impls=IMPLS,
    sample_inputs=sample_inputs,
    cost=cost,
)
def fp8_kcache_scatter(
    k: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    quant_block_size: int,
    scale_fmt: str,
) -> None:
    """Quantise ``k`` to FP8 per block and scatter values and scales into the paged cache."""
    why = _check_layout(k, kv_cache, quant_block_size) or _check_args(k, slot_mapping, scale_fmt)
    if why:
        raise kg.InputError(f"kgexamples::fp8_kcache_scatter: {why}")
    _check_slots(kv_cache, slot_mapping)
    head_dim, (_, block_size, cache_stride) = k.shape[1], kv_cache.shape
    keep = slot_mapping >= 0
    slots, k = slot_mapping[keep], k[keep]
    if not slots.numel():  # no tokens, or only padding: nothing to write
        return
    n, nqb = k.shape[0], head_dim // quant_block_size
    x = k.float().reshape(n, nqb, quant_block_size)
    amax = x.abs().amax(-1).clamp_min(MIN_AMAX)
    # tensor / tensor: correctly rounded on every device (torch on CUDA turns '/ python_scalar'
    # into a multiply by the reciprocal, 1 ulp off vLLM's CUDA '/' for some values: seen on H200)
    scale = amax / torch.full_like(amax, FP8_MAX)
    if scale_fmt == "ue8m0":
        scale = _ue8m0(scale)
    values = (x / scale[..., None]).to(torch.float8_e4m3fn).view(torch.uint8).reshape(n, head_dim)
    page, row = (slots // block_size)[:, None], (slots % block_size)[:, None]
    flat = row * head_dim + torch.arange(head_dim, device=k.device)
    kv_cache[(page, *_page_index(flat, cache_stride))] = values
    scale_bytes = scale.contiguous().view(torch.uint8).reshape(n, 4 * nqb)
    flat = block_size * head_dim + row * (4 * nqb) + torch.arange(4 * nqb, device=k.device)
    kv_cache[(page, *_page_index(flat, cache_stride))] = scale_bytes


@fp8_kcache_scatter.register_meta
def _meta(k, kv_cache, slot_mapping, quant_block_size, scale_fmt):
    # The reference filters padding slots (a data-dependent shape); the op returns nothing anyway.
    return None
