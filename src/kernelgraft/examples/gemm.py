"""C = A @ B in bf16 (fp16, fp32 too) with fp32 accumulation: a Triton GEMM with many configs.

The autotuner's showcase: 30 tile/warp/stage configs; which wins depends on the shape (square,
skinny, LLM-like). ``prune_gemm`` is a cheap wave-quantisation model that keeps the few configs
worth timing; with ``nvidia-matmul-heuristics`` installed, ``PRUNE`` asks it instead. Pruning is
used only when turned on (``KERNELGRAFT_PRUNE=1`` or ``kg.tune(prune=True)``).

>>> import torch
>>> from kernelgraft.examples.gemm import gemm
>>> a, b = torch.randn(16, 32), torch.randn(32, 8)
>>> torch.allclose(gemm(a, b), a @ b, atol=1e-4)
True
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

import kernelgraft as kg
from kernelgraft.backends.triton.jit import interpreting

from ._special import nan_inf


@triton.jit
def _gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                 stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, UPCAST: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % group) % size_m)
    pid_n = (pid % group) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :].to(tl.int64) * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < k_left) & (rn[None, :] < N), other=0.0)
        if UPCAST:  # exact: a bf16 product fits float32's mantissa, and acc is float32 anyway
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def launch_gemm(a, b, c, *, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M=8, num_warps=4, num_stages=3):
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    # Triton's CPU interpreter (3.x) multiplies bfloat16 tiles in tl.dot as if their bits were
    # other numbers (errors ~1e10 on every shape; float16/float32 are exact): on the interpreter,
    # bfloat16 tiles are widened to float32 first. A GPU build keeps the bf16 tensor-core dot.
    _gemm_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                       c.stride(0), c.stride(1), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                       GROUP_M=GROUP_M, UPCAST=a.dtype == torch.bfloat16 and interpreting(),
                       num_warps=num_warps, num_stages=num_stages)


def _configs() -> list[dict]:
    out = []
    for bm, bn, bk, warps, stages in [
        # large tiles: compute-bound square and LLM shapes
        (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 64, 4, 4),
        (128, 128, 32, 4, 4), (128, 256, 32, 8, 4), (256, 64, 64, 8, 4), (64, 256, 64, 8, 4),
        (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
        (64, 64, 64, 4, 4), (64, 64, 32, 4, 5), (128, 128, 128, 8, 3), (128, 64, 128, 4, 3),
        # skinny: few rows (decode-like) or few columns
        (16, 64, 128, 4, 4), (16, 128, 64, 4, 4), (16, 256, 64, 4, 3), (32, 64, 128, 4, 4),
        (32, 128, 64, 4, 4), (32, 256, 64, 4, 3), (64, 32, 64, 4, 4), (64, 16, 128, 4, 4),
        (32, 32, 128, 4, 4), (16, 64, 256, 4, 3), (64, 64, 128, 4, 3), (32, 64, 64, 2, 5),
        (128, 32, 64, 4, 4), (16, 32, 128, 2, 4),
    ]:
        out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                    "num_warps": warps, "num_stages": stages})
    return out


CONFIGS = _configs()


@functools.lru_cache(maxsize=None)
def _smem_limit(index: int) -> int:
    return torch.cuda.get_device_properties(index).shared_memory_per_block_optin


def _dims_fit(a, b) -> bool | str:
    if a.shape[1] != b.shape[0]:
        return f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}"
    if a.dtype != b.dtype:
        return f"dtypes differ: {a.dtype} vs {b.dtype}"
    return True


def _shapes_fit(a, b, **config):
    fit = _dims_fit(a, b)
    if fit is not True:
        return fit
    if a.device.type == "cuda":  # the pipeline's A and B tiles, one pair per stage, in shared memory
        need = config["num_stages"] * (config["BLOCK_M"] + config["BLOCK_N"]) * config["BLOCK_K"] * a.element_size()
        limit = _smem_limit(a.device.index if a.device.index is not None else torch.cuda.current_device())
        if need > limit:
            return f"needs {need} bytes of shared memory for {a.dtype} tiles, the GPU has {limit} per block"
    return True


# Both kernels take row strides (the Triton one any strides), so views reach them without a copy.
TRITON = kg.triton(launch_gemm, configs=CONFIGS, supports=_shapes_fit, name="triton_gemm",
                   contiguous=False)

_CUDA_SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;
// C = A @ B on tensor cores (WMMA 16x16x16, float accumulators). A block computes a BM x BN tile of
// C with WARPS_M x WARPS_N warps; each K step of 32 stages A and B tiles in padded shared memory
// (16-byte vector loads where a chunk is in bounds and aligned, zero fill outside). The epilogue
// goes through a per-warp 16x16 staging tile, so any M, N, K and row strides work.
template <typename T>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
gemm_wmma(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N, int K,
          long long lda, long long ldb, long long ldc) {
    constexpr int BK = 32, THREADS = WARPS_M * WARPS_N * 32;
    constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N, FM = WM / 16, FN = WN / 16;
    constexpr int PA = BK + 8, PB = BN + 8;  // padding against shared-memory bank conflicts
    static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile must be a multiple of 16");
    __shared__ __align__(128) T sA[BM * PA];
    __shared__ __align__(128) T sB[BK * PB];
    __shared__ __align__(128) float sC[WARPS_M * WARPS_N][256];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const long long row0 = (long long)blockIdx.y * BM, col0 = (long long)blockIdx.x * BN;
    const T zero = T(0.0f);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int c = threadIdx.x; c < BM * BK / 8; c += THREADS) {
            const int r = c / (BK / 8), kc = (c % (BK / 8)) * 8;
            const long long gr = row0 + r;
            const int gk = k0 + kc;
            T* dst = &sA[r * PA + kc];
            const T* src = A + gr * lda + gk;
            if (gr < M && gk + 8 <= K && (reinterpret_cast<unsigned long long>(src) & 15) == 0) {
                *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
            } else {
                for (int e = 0; e < 8; ++e) dst[e] = (gr < M && gk + e < K) ? src[e] : zero;
            }
        }
        for (int c = threadIdx.x; c < BK * BN / 8; c += THREADS) {
            const int r = c / (BN / 8), nc = (c % (BN / 8)) * 8;
            const int gk = k0 + r;
            const long long gn = col0 + nc;
            T* dst = &sB[r * PB + nc];
            const T* src = B + (long long)gk * ldb + gn;
            if (gk < K && gn + 8 <= N && (reinterpret_cast<unsigned long long>(src) & 15) == 0) {
                *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
            } else {
                for (int e = 0; e < 8; ++e) dst[e] = (gk < K && gn + e < N) ? src[e] : zero;
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[FM];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb[FN];
#pragma unroll
            for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(fa[i], &sA[(wm * WM + i * 16) * PA + kk], PA);
#pragma unroll
            for (int j = 0; j < FN; ++j) wmma::load_matrix_sync(fb[j], &sB[kk * PB + wn * WN + j * 16], PB);
#pragma unroll
            for (int i = 0; i < FM; ++i)
#pragma unroll
                for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
    float* stage = sC[warp];
#pragma unroll
    for (int i = 0; i < FM; ++i) {
#pragma unroll
        for (int j = 0; j < FN; ++j) {
            wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                const long long r = row0 + wm * WM + i * 16 + e / 16, c = col0 + wn * WN + j * 16 + e % 16;
                if (r < M && c < N) C[r * ldc + c] = T(stage[e]);
            }
            __syncwarp();
        }
    }
}
"""


def launch_gemm_cuda(a, b, c, *, BM, BN, WARPS_M, WARPS_N):
    M, K = a.shape
    N = b.shape[1]
    return kg.Launch(
        grid=((N + BN - 1) // BN, (M + BM - 1) // BM),
        block=WARPS_M * WARPS_N * 32,
        args=(a, b, c, kg.driver.i32(M), kg.driver.i32(N), kg.driver.i32(K),
              kg.driver.i64(a.stride(0)), kg.driver.i64(b.stride(0)), kg.driver.i64(c.stride(0))),
        template={"T": kg.ctype(a.dtype)},
    )


def _wmma_fits(a, b, **config):
    fit = _dims_fit(a, b)  # its tiles are static shared memory: no pipeline stages to fit
    if fit is not True:
        return fit
    if a.dtype not in (torch.float16, torch.bfloat16):
        return f"the WMMA kernel takes float16/bfloat16, got {a.dtype}"
    if a.stride(1) != 1 or b.stride(1) != 1:
        return f"needs unit column strides, got a.stride()={a.stride()}, b.stride()={b.stride()}"
    if max(a.shape[0], b.shape[1], a.shape[1]) >= 2**31 or (a.shape[0] + config["BM"] - 1) // config["BM"] > 65535:
        return f"shape {tuple(a.shape)} x {tuple(b.shape)} exceeds the kernel's int32 sizes or grid"
    return True


CUDA = kg.cuda(
    _CUDA_SOURCE,
    "gemm_wmma<{T}>",
    launch=launch_gemm_cuda,
    configs=[
        {"BM": 128, "BN": 128, "WARPS_M": 2, "WARPS_N": 4},
        {"BM": 64, "BN": 128, "WARPS_M": 2, "WARPS_N": 2},
        {"BM": 64, "BN": 64, "WARPS_M": 2, "WARPS_N": 2},
        {"BM": 32, "BN": 64, "WARPS_M": 1, "WARPS_N": 2},
    ],
    supports=_wmma_fits,
    name="cuda_gemm_wmma",
    contiguous=False,
)

IMPLS = [TRITON, CUDA]


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def gemm_score(M: int, N: int, K: int, config: dict, sms: int = 132) -> float:
    """Estimated relative time of one config: wave quantisation over the SMs, padding waste,
    and a per-tile efficiency that favours big tiles (fewer loads per FMA) when there is work."""
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    tiles = math.ceil(M / bm) * math.ceil(N / bn)
    waves = math.ceil(tiles / sms)
    work_per_tile = bm * bn * max(K, bk)
    intensity = (bm * bn) / (bm + bn)  # FMAs per loaded element
    tile_time = work_per_tile / min(intensity, 96.0)
    k_steps = math.ceil(K / bk)
    pipeline = 1.0 + 2.0 / max(1, k_steps)  # short K loops cannot hide the pipeline prologue
    occupancy = min(1.0, tiles / sms)
    return waves * tile_time * pipeline / max(occupancy, 1e-3) ** 0.25


def prune_gemm(candidates: list, a: torch.Tensor, b: torch.Tensor, keep: int = 8) -> list:
    """Keep the ``keep`` Triton candidates the model in ``gemm_score`` ranks best, best first, then
    every other candidate (the WMMA kernel's four configs: the model scores Triton's tiles only).

    ``keep=8`` (of 30): on the H200 sweep of 2026-11-30 (22 shapes, benchmarks/results/) the
    exhaustive best was in the model's top 8 on every shape, in its top 4 on 18 of them (and
    keeping 4 chose a config up to 1.23x slower than the best).
    """
    M, K = a.shape
    N = b.shape[1]
    sms = _sm_count(a.device)
    tiled = [c for c in candidates if "BLOCK_K" in c.config.as_dict()]
    others = [c for c in candidates if "BLOCK_K" not in c.config.as_dict()]
    return sorted(tiled, key=lambda c: gemm_score(M, N, K, c.config.as_dict(), sms))[:keep] + others


PRUNE = kg.tune.matmul_heuristics(lambda a, b: (a.shape[0], b.shape[1], a.shape[1]), keep=8,
                                  fallback=prune_gemm)


def sample_inputs(device: str = "cpu", dtype: torch.dtype = torch.bfloat16):
    """Shapes for ``kernelgraft check``/``tune``: small on the CPU (interpreter), LLM-like on GPU."""
    if device == "cpu":  # every dtype, bf16 included: the interpreter's bf16 path is checked too
        shapes = [(16, 32, 16), (33, 17, 45), (64, 64, 64)]
    else:
        shapes = [(512, 512, 512), (16, 4096, 4096), (4096, 4096, 4096), (2048, 11008, 4096),
                  (128, 4096, 11008), (8192, 1024, 1024), (127, 333, 515)]
    for m, n, k in shapes:
        yield (torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype))
    # a NaN and +-Inf in A: their rows of C are NaN or Inf, the others stay finite
    yield (nan_inf(torch.randn(9, 40, device=device, dtype=dtype)), torch.randn(40, 24, device=device, dtype=dtype))


# Shapes for ``kernelgraft bench`` (kernelgraft.bench.suite): (M, N, K) bf16. Llama-3 8B's
# layers: qkv (6144, 4096), o (4096, 4096), gate+up (28672, 4096), down (4096, 14336); 70B's qkv
# (10240, 8192) and down (8192, 28672).
_LLAMA_NK = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
_LLAMA70_NK = [(10240, 8192), (8192, 28672)]
BENCH_SHAPES = {
    "short": {"skinny": [(16, 4096, 4096)], "gemm": [(128, 4096, 11008), (2048, 11008, 4096), (4096, 4096, 4096),
                                                    (8192, 8192, 8192)]},
    "llm": {
        "skinny": [(m, n, k) for m in (1, 16) for n, k in _LLAMA_NK] + [(16, n, k) for n, k in _LLAMA70_NK],
        "gemm": [(4096, n, k) for n, k in _LLAMA_NK + _LLAMA70_NK],
    },
}


def bench_case(m, n, k, device: str = "cuda"):
    """Sizes for ``kernelgraft bench``: skinny decode GEMMs and Llama projections, bf16 (M, N, K): the
    inputs of one shape of ``BENCH_SHAPES``."""
    return (torch.randn(m, k, device=device, dtype=torch.bfloat16),
            torch.randn(k, n, device=device, dtype=torch.bfloat16))


def cost(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(bytes, flops) of one call for ``kernelgraft bench``: A and B read, C written; 2*M*N*K."""
    M, K = a.shape
    N = b.shape[1]
    return float((M * K + K * N + M * N) * a.element_size()), 2.0 * M * N * K


@kg.op(
    "kgexamples::gemm",
    impls=IMPLS,
    sample_inputs=sample_inputs,
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
    ndim={"a": 2, "b": 2},
    prune=PRUNE,
    cost=cost,
    # float32 inputs run on TF32 tensor cores (tl.dot's default precision): 10 mantissa bits per
    # product, so the float32 rule's default 1e-4 is too tight; TF32 GEMMs land near 1e-3.
    tolerances={torch.float32: 5e-3},
)
def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b, accumulated in float32 (cuBLAS and torch's CPU matmul accumulate bf16 and fp16
    products in float32), returned in a's dtype. Written as PyTorch's own matmul, not an upcast to
    float32, so the PyTorch candidate that competes in tuning is the library GEMM (an upcast
    reference timed a float32 GEMM, 16x slower than cuBLAS in bf16 on an H200); the oracle runs it
    in float64 besides. a and b share one dtype, as torch.matmul requires."""
    if a.dtype != b.dtype:
        raise kg.InputError(f"kgexamples::gemm: arguments 'a' and 'b' must share a dtype, got a {a.dtype} "
                            f"and b {b.dtype} (a @ b does not mix dtypes: convert one of them)")
    return torch.matmul(a, b)
