"""The softmax example's CUDA C++ kernels (NVRTC), for ``kernelgraft.examples.softmax``.

- ``CUDA``: one block per row, an online (max, sum) per thread merged across the block.
- ``CUDA_CLUSTER``: one Hopper thread-block cluster per row; each block holds a slice of the row in
  registers and the blocks exchange partial max and sum through distributed shared memory.
- ``CUDA_STREAM``: persistent blocks that walk rows through a ring of row buffers in shared memory,
  filled by ``cp.async`` ahead of the row being normalised (vocab-wide rows).
- ``CUDA_ROW_REGS``: one block per row, the whole row loaded into registers in
  one burst of 16-byte loads, several rows in flight per SM (vocab-wide rows; measured in
  benchmarks/results/2026-11-30-h200-4/explore_round5.txt).
- ``CUDA_ROW_TMA``: one block per row in shared memory, loaded by Hopper bulk copies (TMA) that
  complete on an mbarrier (vocab-wide rows; explore_round7.txt there).

All compute in float32 and return the input's dtype; a row that is all ``-inf``, or holds a NaN or
``+inf``, gives NaN throughout, as the reference does.
"""

from __future__ import annotations

import functools

import torch

import kernelgraft as kg


def _rows_cols(x):
    n_cols = x.shape[-1]
    return (x.numel() // n_cols if n_cols else 0), n_cols


def _nonempty(x):
    if x.dim() == 0 or x.shape[-1] == 0:
        return "x needs a non-empty last dimension"
    return None


def _fits_nonempty(x, **config):
    return _nonempty(x) or True


def _aligned16(t) -> bool:
    """16-byte aligned, for the kernels' vector loads. Fake tensors (an AOT trace) count as aligned:
    bundles check alignment at run time and fall back for a misaligned pointer."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor) or t.data_ptr() % 16 == 0


_CUDA_SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define NEG_INF (-__int_as_float(0x7f800000))
// One block of THREADS threads per row. Pass 1: each thread keeps an online (max, sum of exp);
// the block merges them. Pass 2 writes exp(x - max) / sum. All arithmetic in float32.
// While every element seen is -inf, subtract 0 rather than the max (exp(-inf) = 0, not
// exp(-inf - -inf) = nan). A NaN still adds NaN: fmaxf skips it, so a NaN among -inf leaves the max
// at -inf, and a shortcut on the max alone ("all -inf so far: the sum is 0") dropped it, leaving a
// row with one NaN finite everywhere else.
__device__ __forceinline__ void merge(float& m, float& d, float m2, float d2) {
    const float mn = fmaxf(m, m2);
    const float shift = mn == NEG_INF ? 0.0f : mn;
    d = d * expf(m - shift) + d2 * expf(m2 - shift);
    m = mn;
}

template <typename T>
__global__ void softmax_rows(const T* __restrict__ x, T* __restrict__ out, int n_cols) {
    const long long base = (long long)blockIdx.x * n_cols;
    float m = NEG_INF, d = 0.0f;
    for (int c = threadIdx.x; c < n_cols; c += THREADS) merge(m, d, (float)x[base + c], 1.0f);
    for (int off = 16; off > 0; off >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, off), d2 = __shfl_xor_sync(0xffffffffu, d, off);
        merge(m, d, m2, d2);
    }
    __shared__ float pm[THREADS / 32], pd[THREADS / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { pm[warp] = m; pd[warp] = d; }
    __syncthreads();
    if (warp == 0) {
        m = lane < THREADS / 32 ? pm[lane] : NEG_INF;
        d = lane < THREADS / 32 ? pd[lane] : 0.0f;
        for (int off = 16; off > 0; off >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffffu, m, off), d2 = __shfl_xor_sync(0xffffffffu, d, off);
            merge(m, d, m2, d2);
        }
        if (lane == 0) { pm[0] = m; pd[0] = d; }
    }
    __syncthreads();
    m = pm[0];
    const float inv = 1.0f / pd[0];
    for (int c = threadIdx.x; c < n_cols; c += THREADS)
        out[base + c] = (T)(expf((float)x[base + c] - m) * inv);
}
"""


def launch_softmax_cuda(x, out, *, THREADS):
    n_rows, n_cols = _rows_cols(x)
    return kg.Launch(grid=n_rows, block=THREADS, args=(x, out, kg.driver.i32(n_cols)),
                     template={"T": kg.ctype(x.dtype)})


CUDA = kg.cuda(
    _CUDA_SOURCE,
    "softmax_rows<{T}>",
    launch=launch_softmax_cuda,
    configs=[{"THREADS": 128}, {"THREADS": 256}, {"THREADS": 1024}],
    supports=_fits_nonempty,
)

# Shared by the cluster and streaming kernels: types, constants and a block-wide reduction.
_CUDA_PRELUDE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define NEG_INF (-__int_as_float(0x7f800000))
#define LOG2E 1.4426950408889634f

// Sum (or max) over the block; every thread gets the result. ``red`` holds one float per warp.
template <int THREADS, bool MAX>
__device__ __forceinline__ float block_reduce(float v, float* red) {
    for (int off = 16; off > 0; off >>= 1) {
        float o = __shfl_xor_sync(0xffffffffu, v, off);
        v = MAX ? fmaxf(v, o) : v + o;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // the previous reduction's readers are done with red
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < THREADS / 32 ? red[lane] : (MAX ? NEG_INF : 0.0f);
    for (int off = 16; off > 0; off >>= 1) {
        float o = __shfl_xor_sync(0xffffffffu, v, off);
        v = MAX ? fmaxf(v, o) : v + o;
    }
    return v;
}
"""

_CLUSTER_PRIMITIVES = r"""
// Cluster primitives in PTX (cooperative_groups' cluster API needs libcu++ headers NVRTC may lack).
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// ``*p`` in the shared memory of the cluster's block ``rank`` (distributed shared memory)
__device__ __forceinline__ float peer_load(const float* p, unsigned rank) {
    unsigned local = (unsigned)__cvta_generic_to_shared(p), remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}

"""

_CLUSTER_SOURCE = _CUDA_PRELUDE + _CLUSTER_PRIMITIVES + r"""
// One row per thread-block cluster (Hopper): each of the CLUSTER blocks holds a contiguous
// 1/CLUSTER of the row in registers (CHUNKS 16-byte vectors per thread), and the blocks swap their
// partial max and sum through distributed shared memory. The row is read once and written once,
// and a 32K-wide row is spread over CLUSTER SMs' worth of loads instead of one block's.
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif
template <typename T, int CLUSTER, int THREADS, int CHUNKS>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS, MIN_BLOCKS)
softmax_cluster(const T* __restrict__ x, T* __restrict__ out, int n_cols) {
    constexpr int VEC = 16 / sizeof(T);
    const int rank = (int)cluster_rank();
    const int slice = n_cols / CLUSTER;  // a multiple of VEC (the op's supports() checks)
    const long long start = (long long)(blockIdx.x / CLUSTER) * n_cols + (long long)rank * slice;
    const uint4* src = reinterpret_cast<const uint4*>(x + start);
    uint4* dst = reinterpret_cast<uint4*>(out + start);
    const int nvec = slice / VEC;
    float v[CHUNKS][VEC];
    float m = NEG_INF;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
        const int j = threadIdx.x + k * THREADS;
        if (j < nvec) {
            uint4 raw = src[j];
            const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
            for (int i = 0; i < VEC; ++i) { v[k][i] = (float)e[i]; m = fmaxf(m, v[k][i]); }
        } else {
#pragma unroll
            for (int i = 0; i < VEC; ++i) v[k][i] = NEG_INF;
        }
    }
    __shared__ float red[THREADS / 32];
    __shared__ float mine[2];  // this block's max and sum, read by the whole cluster
    m = block_reduce<THREADS, true>(m, red);
    if (threadIdx.x == 0) mine[0] = m;
    cluster_sync();
    m = NEG_INF;
#pragma unroll
    for (int r = 0; r < CLUSTER; ++r) m = fmaxf(m, peer_load(&mine[0], r));
    // an all -inf row gives nan here (-inf - -inf), as the reference does
    const float ml = m * LOG2E;
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k)
#pragma unroll
        for (int i = 0; i < VEC; ++i) { v[k][i] = exp2f(fmaf(v[k][i], LOG2E, -ml)); s += v[k][i]; }
    s = block_reduce<THREADS, false>(s, red);
    if (threadIdx.x == 0) mine[1] = s;
    cluster_sync();
    s = 0.0f;
#pragma unroll
    for (int r = 0; r < CLUSTER; ++r) s += peer_load(&mine[1], r);
    cluster_sync();  // no block leaves (freeing its shared memory) while another still reads it
    const float inv = 1.0f / s;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
        const int j = threadIdx.x + k * THREADS;
        if (j < nvec) {
            uint4 raw;
            T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
            for (int i = 0; i < VEC; ++i) e[i] = (T)(v[k][i] * inv);
            dst[j] = raw;
        }
    }
}
"""


def launch_softmax_cluster(x, out, *, CLUSTER, THREADS, CHUNKS, MIN_BLOCKS=1):
    n_rows, n_cols = _rows_cols(x)
    return kg.Launch(grid=n_rows * CLUSTER, block=THREADS, args=(x, out, kg.driver.i32(n_cols)),
                     template={"T": kg.ctype(x.dtype)})


def _fits_cluster(x, *, CLUSTER, THREADS, CHUNKS, MIN_BLOCKS=1):
    why = _nonempty(x)
    if why:
        return why
    vec = 16 // x.element_size()
    n_cols = x.shape[-1]
    if n_cols % (CLUSTER * vec):
        return f"rows of {n_cols} elements do not split into {CLUSTER} slices of 16-byte vectors"
    if n_cols > CLUSTER * THREADS * CHUNKS * vec:
        return f"rows of {n_cols} elements exceed this config's {CLUSTER * THREADS * CHUNKS * vec}"
    if n_cols < CLUSTER * THREADS * CHUNKS * vec // 2:
        return "rows this short leave half of this config's threads idle"
    if not _aligned16(x):
        return "x is not 16-byte aligned"
    return True


CUDA_CLUSTER = kg.cuda(
    _CLUSTER_SOURCE,
    "softmax_cluster<{T}, {CLUSTER}, {THREADS}, {CHUNKS}>",
    launch=launch_softmax_cluster,
    # 32K bf16 columns: 4 blocks of 256 threads x 32 elements, or 8 x 128 x 32, or 2 x 512 x 32
    configs=[{"CLUSTER": 4, "THREADS": 256, "CHUNKS": 4}, {"CLUSTER": 8, "THREADS": 128, "CHUNKS": 4},
             {"CLUSTER": 2, "THREADS": 512, "CHUNKS": 4}, {"CLUSTER": 2, "THREADS": 256, "CHUNKS": 2}],
    supports=_fits_cluster,
    min_capability=(9, 0),  # thread-block clusters and distributed shared memory
    name="softmax_cluster",
)

_STREAM_SOURCE = _CUDA_PRELUDE + r"""
// 2^x in one MUFU instruction (relative error ~2^-22): the accurate exp2f is a dozen instructions,
// and at two exponentials per element it made this kernel bound by instruction issue, not memory.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Start copying one row (nvec 16-byte vectors) into shared memory, asynchronously (cp.async).
__device__ __forceinline__ void prefetch_row(uint4* dst, const uint4* src, int nvec) {
    for (int j = threadIdx.x; j < nvec; j += blockDim.x) {
        unsigned s = (unsigned)__cvta_generic_to_shared(dst + j);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(s), "l"(src + j) : "memory");
    }
}

// Persistent blocks, one per SM, each walking rows with a STAGES-deep ring of row buffers in
// shared memory: while a block normalises row i, rows i+1 .. i+STAGES-1 are already on their
// way, so the memory system sees one continuous stream of loads (a block that loads, then
// computes, then loads again leaves it idle in between; with a 32K-wide row only one such block
// fits an SM).
template <typename T, int THREADS, int STAGES>
__global__ void __launch_bounds__(THREADS, 1)
softmax_stream(const T* __restrict__ x, T* __restrict__ out, int n_rows, int n_cols) {
    constexpr int VEC = 16 / sizeof(T);
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float red[THREADS / 32];
    const int nvec = n_cols / VEC;  // n_cols is a multiple of VEC (the op's supports() checks)
    uint4* ring = reinterpret_cast<uint4*>(smem);
    const uint4* src = reinterpret_cast<const uint4*>(x);
    int row = blockIdx.x;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        const int r = row + s * gridDim.x;
        if (r < n_rows) prefetch_row(ring + s * nvec, src + (long long)r * nvec, nvec);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    for (int it = 0; row < n_rows; ++it, row += gridDim.x) {
        const int ahead = row + (STAGES - 1) * gridDim.x;
        if (ahead < n_rows) prefetch_row(ring + ((it + STAGES - 1) % STAGES) * nvec, src + (long long)ahead * nvec, nvec);
        asm volatile("cp.async.commit_group;" ::: "memory");  // one group per iteration, maybe empty
        asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 1) : "memory");  // this row's group is done
        __syncthreads();  // ... for every thread's copies
        const uint4* cur = ring + (it % STAGES) * nvec;
        float m = NEG_INF;
        for (int j = threadIdx.x; j < nvec; j += THREADS) {
            uint4 raw = cur[j];
            const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
            for (int i = 0; i < VEC; ++i) m = fmaxf(m, (float)e[i]);
        }
        m = block_reduce<THREADS, true>(m, red);
        const float ml = m * LOG2E;  // an all -inf row gives nan, as the reference does
        float s = 0.0f;
        for (int j = threadIdx.x; j < nvec; j += THREADS) {
            uint4 raw = cur[j];
            const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
            for (int i = 0; i < VEC; ++i) s += fast_exp2(fmaf((float)e[i], LOG2E, -ml));
        }
        s = block_reduce<THREADS, false>(s, red);
        const float shift = ml + log2f(s);  // y = 2^(x log2e - max log2e - log2 sum)
        uint4* dst = reinterpret_cast<uint4*>(out + (long long)row * n_cols);
        for (int j = threadIdx.x; j < nvec; j += THREADS) {
            uint4 raw = cur[j], packed;
            const T* e = reinterpret_cast<const T*>(&raw);
            T* o = reinterpret_cast<T*>(&packed);
#pragma unroll
            for (int i = 0; i < VEC; ++i) o[i] = (T)fast_exp2(fmaf((float)e[i], LOG2E, -shift));
            dst[j] = packed;
        }
        __syncthreads();  // every thread is done with this buffer before it is refilled
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}
"""

_SMEM_LIMIT = 227 * 1024  # Hopper's opt-in dynamic shared memory per block


def _sm_count(device: torch.device) -> int:
    if not torch.cuda.is_available():
        raise kg.UnsupportedError(
            "softmax_stream launches one block per SM of the device, which is not known without a "
            "GPU (so it is left out of bundles built on a CPU machine)")
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def launch_softmax_stream(x, out, *, THREADS, STAGES):
    n_rows, n_cols = _rows_cols(x)
    grid = min(n_rows, _sm_count(x.device))
    return kg.Launch(grid=grid, block=THREADS,
                     args=(x, out, kg.driver.i32(n_rows), kg.driver.i32(n_cols)),
                     shared_mem=STAGES * n_cols * x.element_size(), template={"T": kg.ctype(x.dtype)})


def _fits_stream(x, *, THREADS, STAGES):
    why = _nonempty(x)
    if why:
        return why
    n_cols = x.shape[-1]
    if n_cols % (16 // x.element_size()):
        return f"rows of {n_cols} elements are not whole 16-byte vectors"
    if STAGES * n_cols * x.element_size() > _SMEM_LIMIT:
        return f"{STAGES} rows of {n_cols} {x.dtype} elements exceed 227 KiB of shared memory"
    if n_cols < 8192:
        return "rows under 8192 elements: the one-pass kernels keep them in registers"
    if not _aligned16(x):
        return "x is not 16-byte aligned"
    return True


CUDA_STREAM = kg.cuda(
    _STREAM_SOURCE,
    "softmax_stream<{T}, {THREADS}, {STAGES}>",
    launch=launch_softmax_stream,
    configs=[{"THREADS": 1024, "STAGES": 3}, {"THREADS": 512, "STAGES": 3}, {"THREADS": 1024, "STAGES": 2}],
    supports=_fits_stream,
    min_capability=(8, 0),  # cp.async, and dynamic shared memory above 48 KiB
    name="softmax_stream",
)


_ROW_REGS_SOURCE = _STREAM_SOURCE + r"""
// One row per block, no shared-memory ring: each thread loads its whole share of the row as raw
// 16-byte vectors into registers in one burst (CHUNKS loads in flight per thread), so the SM keeps
// MINB rows in flight; max, sum and the write read the registers (the exponential is recomputed
// for the write instead of keeping 32-bit values). The elements of each 32-bit word are unpacked
// with bit operations: taking the address of a register array would send it to the stack.
__device__ __forceinline__ float elem_of(unsigned w, int, const float*) { return __uint_as_float(w); }
__device__ __forceinline__ float elem_of(unsigned w, int i, const __nv_bfloat16*) {
    return __uint_as_float(i ? (w & 0xffff0000u) : (w << 16));
}
__device__ __forceinline__ float elem_of(unsigned w, int i, const __half*) {
    return __half2float(__ushort_as_half((unsigned short)(i ? (w >> 16) : (w & 0xffffu))));
}
__device__ __forceinline__ unsigned pack_of(float a, float, const float*) { return __float_as_uint(a); }
__device__ __forceinline__ unsigned pack_of(float a, float b, const __nv_bfloat16*) {
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(a)) |
           ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16);
}
__device__ __forceinline__ unsigned pack_of(float a, float b, const __half*) {
    return (unsigned)__half_as_ushort(__float2half_rn(a)) | ((unsigned)__half_as_ushort(__float2half_rn(b)) << 16);
}
__device__ __forceinline__ unsigned word_of(const uint4& r, int q) { return q == 0 ? r.x : q == 1 ? r.y : q == 2 ? r.z : r.w; }
// CHUNKS 16-byte vectors per thread (vector threadIdx.x + k * THREADS of the row), read-only and
// not kept in L1, all issued before any is used; vectors past nvec are zero.
template <int THREADS, int CHUNKS>
__device__ __forceinline__ void load_vectors(uint4 (&raw)[CHUNKS], const uint4* src, int nvec) {
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
        const int j = threadIdx.x + k * THREADS;
        raw[k] = make_uint4(0, 0, 0, 0);
        if (j < nvec) {
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(raw[k].x), "=r"(raw[k].y), "=r"(raw[k].z), "=r"(raw[k].w) : "l"(src + j));
        }
    }
}

template <typename T, int THREADS, int CHUNKS, int MINB>
__global__ void __launch_bounds__(THREADS, MINB)
softmax_row_direct(const T* __restrict__ x, T* __restrict__ out, int n_rows, int n_cols) {
    constexpr int PER_WORD = 4 / sizeof(T);
    constexpr const T* tag = nullptr;
    __shared__ float red[THREADS / 32];
    const int nvec = n_cols / (4 * PER_WORD);  // <= THREADS * CHUNKS (checked by the caller)
    const uint4* src = reinterpret_cast<const uint4*>(x) + (long long)blockIdx.x * nvec;
    uint4 raw[CHUNKS];
    load_vectors<THREADS, CHUNKS>(raw, src, nvec);
    float m = NEG_INF;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
        if (threadIdx.x + k * THREADS < nvec) {
#pragma unroll
            for (int q = 0; q < 4; ++q)
#pragma unroll
                for (int i = 0; i < PER_WORD; ++i) m = fmaxf(m, elem_of(word_of(raw[k], q), i, tag));
        }
    }
    m = block_reduce<THREADS, true>(m, red);
    const float ml = m * LOG2E;  // an all -inf row gives nan, as the reference does
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
        if (threadIdx.x + k * THREADS < nvec) {
#pragma unroll
            for (int q = 0; q < 4; ++q)
#pragma unroll
                for (int i = 0; i < PER_WORD; ++i)
                    s += fast_exp2(fmaf(elem_of(word_of(raw[k], q), i, tag), LOG2E, -ml));
        }
    }
    s = block_reduce<THREADS, false>(s, red);
    const float inv = 1.0f / s;
    uint4* o = reinterpret_cast<uint4*>(out) + (long long)blockIdx.x * nvec;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
        const int j = threadIdx.x + k * THREADS;
        if (j < nvec) {
            unsigned w4[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const unsigned w = word_of(raw[k], q);
                const float y0 = fast_exp2(fmaf(elem_of(w, 0, tag), LOG2E, -ml)) * inv;
                const float y1 = PER_WORD == 2 ? fast_exp2(fmaf(elem_of(w, 1, tag), LOG2E, -ml)) * inv : 0.0f;
                w4[q] = pack_of(y0, y1, tag);
            }
            __stcs(o + j, make_uint4(w4[0], w4[1], w4[2], w4[3]));
        }
    }
}
"""


def launch_softmax_row_regs(x, out, *, THREADS, CHUNKS, MINB):
    n_rows, n_cols = _rows_cols(x)
    return kg.Launch(grid=n_rows, block=THREADS, args=(x, out, kg.driver.i32(n_rows), kg.driver.i32(n_cols)),
                     template={"T": kg.ctype(x.dtype)})


def _fits_row_regs(x, *, THREADS, CHUNKS, MINB):
    why = _nonempty(x)
    if why:
        return why
    n_cols, vec = x.shape[-1], 16 // x.element_size()
    if n_cols % vec:
        return f"rows of {n_cols} elements are not whole 16-byte vectors"
    if n_cols > THREADS * CHUNKS * vec:
        return f"rows over {THREADS * CHUNKS * vec} {x.dtype} elements do not fit the registers of {THREADS} threads"
    if n_cols < 8192:
        return "rows under 8192 elements: the one-pass kernels keep them in registers"
    if not _aligned16(x):
        return "x is not 16-byte aligned"
    return True


CUDA_ROW_REGS = kg.cuda(
    _ROW_REGS_SOURCE,
    "softmax_row_direct<{T}, {THREADS}, {CHUNKS}, {MINB}>",
    launch=launch_softmax_row_regs,
    # rows up to 64 KiB (32768 2-byte elements); MINB rows in flight per SM (no spills at sm_90)
    configs=[{"THREADS": 256, "CHUNKS": 16, "MINB": 3}, {"THREADS": 512, "CHUNKS": 8, "MINB": 2},
             {"THREADS": 1024, "CHUNKS": 4, "MINB": 2}],
    supports=_fits_row_regs,
    min_capability=(8, 0),
    name="softmax_row_regs",
)


_ROW_TMA_SOURCE = _ROW_REGS_SOURCE + r"""
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// One row per block in shared memory, moved by the Hopper bulk-copy engine: cp.async.bulk copies of
// up to CHUNK bytes complete on an mbarrier, the block normalises the row from shared memory, and
// writes it with 16-byte streaming stores (STORE 0) or bulk copies back (STORE 1). A 64 KiB row
// leaves room for three blocks per SM. Per-thread loads of the same rows were bound by their
// access pattern (benchmarks/results/2026-11-30-h200-4/explore_round6.txt and round7.txt).
template <typename T, int THREADS, int STORE, int CHUNK>
__global__ void __launch_bounds__(THREADS)
softmax_row_tma(const T* __restrict__ x, T* __restrict__ out, int n_rows, int n_cols) {
    constexpr int PER_WORD = 4 / sizeof(T);
    constexpr const T* tag = nullptr;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bar;
    __shared__ float red[THREADS / 32];
    const unsigned bytes = (unsigned)n_cols * (unsigned)sizeof(T);  // a multiple of 16 (checked by the caller)
    const char* src = reinterpret_cast<const char*>(x) + (long long)blockIdx.x * bytes;
    char* dst = reinterpret_cast<char*>(out) + (long long)blockIdx.x * bytes;
    const unsigned b = smem_addr(&bar), s0 = smem_addr(smem);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(bytes) : "memory");
        for (unsigned off = 0; off < bytes; off += CHUNK) {
            const unsigned n = bytes - off < CHUNK ? bytes - off : CHUNK;
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         :: "r"(s0 + off), "l"(src + off), "r"(n), "r"(b) : "memory");
        }
    }
    __syncthreads();  // the barrier is initialised before anyone waits on it
    unsigned done = 0;
    while (!done) {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"(b) : "memory");
    }
    uint4* row = reinterpret_cast<uint4*>(smem);
    const int nvec = (int)(bytes / 16);
    float m = NEG_INF;
    for (int j = threadIdx.x; j < nvec; j += THREADS) {
        const uint4 r = row[j];
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int i = 0; i < PER_WORD; ++i) m = fmaxf(m, elem_of(word_of(r, q), i, tag));
    }
    m = block_reduce<THREADS, true>(m, red);
    const float ml = m * LOG2E;  // an all -inf row gives nan, as the reference does
    float s = 0.0f;
    for (int j = threadIdx.x; j < nvec; j += THREADS) {
        const uint4 r = row[j];
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int i = 0; i < PER_WORD; ++i) s += fast_exp2(fmaf(elem_of(word_of(r, q), i, tag), LOG2E, -ml));
    }
    s = block_reduce<THREADS, false>(s, red);
    const float inv = 1.0f / s;
    uint4* o = reinterpret_cast<uint4*>(dst);
    for (int j = threadIdx.x; j < nvec; j += THREADS) {
        const uint4 r = row[j];
        unsigned w4[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const unsigned w = word_of(r, q);
            const float y0 = fast_exp2(fmaf(elem_of(w, 0, tag), LOG2E, -ml)) * inv;
            const float y1 = PER_WORD == 2 ? fast_exp2(fmaf(elem_of(w, 1, tag), LOG2E, -ml)) * inv : 0.0f;
            w4[q] = pack_of(y0, y1, tag);
        }
        if (STORE) row[j] = make_uint4(w4[0], w4[1], w4[2], w4[3]);
        else __stcs(o + j, make_uint4(w4[0], w4[1], w4[2], w4[3]));
    }
    if (STORE) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the threads' writes, seen by the bulk copy
        __syncthreads();
        if (threadIdx.x == 0) {
            for (unsigned off = 0; off < bytes; off += CHUNK) {
                const unsigned n = bytes - off < CHUNK ? bytes - off : CHUNK;
                asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                             :: "l"(dst + off), "r"(s0 + off), "r"(n) : "memory");
            }
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // shared memory stays until read
        }
    }
}
"""
_ROW_TMA_SMEM = _SMEM_LIMIT - 2048  # the row, under the opt-in limit less the static shared memory


def launch_softmax_row_tma(x, out, *, THREADS, STORE, CHUNK):
    n_rows, n_cols = _rows_cols(x)
    return kg.Launch(grid=n_rows, block=THREADS, shared_mem=n_cols * x.element_size(),
                     args=(x, out, kg.driver.i32(n_rows), kg.driver.i32(n_cols)), template={"T": kg.ctype(x.dtype)})


def _fits_row_tma(x, *, THREADS, STORE, CHUNK):
    why = _nonempty(x)
    if why:
        return why
    n_cols = x.shape[-1]
    if (n_cols * x.element_size()) % 16:
        return f"rows of {n_cols} {x.dtype} elements are not whole 16-byte vectors"
    if n_cols * x.element_size() > _ROW_TMA_SMEM:
        return f"a row of {n_cols} {x.dtype} elements exceeds the shared memory of a block"
    if n_cols < 8192:
        return "rows under 8192 elements: the one-pass kernels keep them in registers"
    if not _aligned16(x):
        return "x is not 16-byte aligned"
    return True


CUDA_ROW_TMA = kg.cuda(
    _ROW_TMA_SOURCE,
    "softmax_row_tma<{T}, {THREADS}, {STORE}, {CHUNK}>",
    launch=launch_softmax_row_tma,
    configs=[{"THREADS": 256, "STORE": 0, "CHUNK": 65536}, {"THREADS": 512, "STORE": 0, "CHUNK": 65536},
             {"THREADS": 256, "STORE": 1, "CHUNK": 65536}],
    supports=_fits_row_tma,
    min_capability=(9, 0),  # cp.async.bulk and mbarrier transaction counts
    name="softmax_row_tma",
)
