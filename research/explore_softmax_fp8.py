"""Variant timings for the two memory-bound examples under 85% of copy bandwidth (one-off
exploration; the chosen variants live in kernelgraft/examples). Rounds 1 and 2 swept the
examples' own kernels by config plus two variants that lost and were not kept (a rows kernel that
recomputes exp instead of holding it, a persistent scatter); their numbers are in
benchmarks/results/2026-11-30-h200-3/explore_round1.txt and explore_round2.txt. This file runs
round 3."""
import json
import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from kernelgraft.examples import fp8_kcache_scatter as F

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
