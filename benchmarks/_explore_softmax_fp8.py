"""Variant timings for the two memory-bound examples under 85% of copy bandwidth (one-off
exploration; the chosen variants live in kernelgraft/examples). Rounds 1 and 2 (softmax variants,
FP8 scatter tile sizes, a persistent FP8 kernel) are recorded in
benchmarks/results/2026-11-30-h200-s3/explore_*.txt; this file runs round 3."""
import json
import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from kernelgraft.examples import softmax as S
from kernelgraft.examples import fp8_kcache_scatter as F

LOG2E = 1.4426950408889634


@triton.jit
def _rows_recompute(x_ptr, out_ptr, n_rows, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"))
    m = tl.max(x, axis=1).to(tl.float32) * 1.4426950408889634
    s = tl.sum(tl.exp2(x.to(tl.float32) * 1.4426950408889634 - m[:, None]), axis=1)
    c = m + tl.log2(s)
    y = tl.exp2(x.to(tl.float32) * 1.4426950408889634 - c[:, None])
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fp8_persistent(k_ptr, cache_ptr, slot_ptr, n_tokens, head_dim, block_size, stride_page,
                    QBLOCK: tl.constexpr, TOKENS: tl.constexpr, EVICT: tl.constexpr):
    n_tiles = tl.cdiv(n_tokens, TOKENS)
    lane = tl.arange(0, QBLOCK)
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        tokens = tile.to(tl.int64) * TOKENS + tl.arange(0, TOKENS)
        slot = tl.load(slot_ptr + tokens, mask=tokens < n_tokens, other=-1)
        valid = slot >= 0
        mask = valid[:, None]
        if EVICT:
            x = tl.load(k_ptr + tokens[:, None] * head_dim + lane[None, :], mask=mask, other=0.0,
                        eviction_policy="evict_first").to(tl.float32)
        else:
            x = tl.load(k_ptr + tokens[:, None] * head_dim + lane[None, :], mask=mask, other=0.0).to(tl.float32)
        scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4), tl.full([TOKENS], 448.0, tl.float32))
        bits = scale.to(tl.int32, bitcast=True)
        exponent = (bits >> 23) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        scale = (exponent << 23).to(tl.float32, bitcast=True)
        inv = ((254 - exponent) << 23).to(tl.float32, bitcast=True)
        q = (x * inv[:, None]).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        page = tl.where(valid, slot // block_size, 0)
        row = tl.where(valid, slot % block_size, 0)
        tl.store(cache_ptr + page[:, None] * stride_page + row[:, None] * head_dim + lane[None, :], q, mask=mask)
        byte = tl.arange(0, 4)
        sbytes = ((bits[:, None] * 0 + (exponent << 23)[:, None]) >> (byte[None, :] * 8)) & 0xFF
        sflat = block_size * head_dim + row[:, None] * 4 + byte[None, :]
        tl.store(cache_ptr + page[:, None] * stride_page + sflat, sbytes.to(tl.uint8), mask=mask)


@triton.jit
def _cast_fp8(k_ptr, q_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(k_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(q_ptr + offs, x.to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=offs < n)


def main():
    """Round 3: is the FP8 scatter at the roofline of its traffic (read bf16, write a byte per
    element)? Dense casts with the same bytes, a same-bytes copy, and the scatter, side by side."""
    res = {}
    k, cache, slots, qbs, fmt = list(F.bench_inputs())[-1]
    fb = F.cost(k, cache, slots, qbs, fmt)[0]
    q = torch.empty(k.shape, device="cuda", dtype=torch.uint8)
    src = torch.empty(fb // 2, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    n = k.numel()
    cases = {
        "scatter T32 nw4": lambda: F.launch_fp8_kcache_scatter(k, cache, slots, qbs, fmt, TOKENS=32, num_warps=4),
        "torch cast bf16->fp8 (dense)": lambda: k.to(torch.float8_e4m3fn),
        "triton cast bf16->fp8 B4096": lambda: _cast_fp8[(triton.cdiv(n, 4096),)](k, q, n, BLOCK=4096, num_warps=4),
        "triton cast bf16->fp8 B8192": lambda: _cast_fp8[(triton.cdiv(n, 8192),)](k, q, n, BLOCK=8192, num_warps=8),
        "copy of the same bytes": lambda: dst.copy_(src),
    }
    for name, fn in cases.items():
        ms = do_bench(fn, warmup=50, rep=300)
        res[name] = {"us": ms * 1e3, "gbps": fb / ms / 1e6}
        print(name, res[name], flush=True)
    print(json.dumps(res))


main()
