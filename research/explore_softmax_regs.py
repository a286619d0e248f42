"""Round 6: where the last microseconds of softmax over bf16[2048, 32768] go, and two candidates.

The library's ``softmax_row_regs`` (one row per block, the row in registers) runs 2048x32768 in
about 76 us; a copy of the same bytes takes about 69 us and 85% of the measured copy ceiling needs
about 74 us (benchmarks/results/2026-11-30-h200-4/). Variants, each checked against float32
torch.softmax unless it is a diagnostic (``diag``, wrong on purpose):

- ``diag copy-through``: the same loads and stores with no reductions and no math: the floor of
  this access pattern (one burst of loads per row, then one burst of stores).
- ``diag no-exp``: both block reductions, no exponentials (sum of x, output x * inv).
- ``pack cvt``: the library kernel with the two bf16 conversions of a word in one
  ``cvt.rn.bf16x2.f32``.
- ``cluster``: a row split across a cluster of 2 or 4 blocks that exchange their partial max and sum
  through distributed shared memory: finer work units, so a shorter tail.
- the library kernel at several row counts (1980 = 396 x 5 rows: 132 SMs x 3 blocks), against a copy
  of the same bytes: a fixed cost per launch shows up as an offset.

Run on a GPU: ``python research/explore_softmax_regs.py``. (Since the measured run the shared
load, max, sum and store loops are device functions; the operations are the same.)
"""

import json
import sys

import torch

import kernelgraft as kg
from kernelgraft.backends.cuda.jit import CudaRunner
from kernelgraft.examples import _softmax_cuda as C

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from softmax_explore import check_and_time  # noqa: E402

SOURCE = C._ROW_REGS_SOURCE + C._CLUSTER_PRIMITIVES + r"""
// the cluster barrier split in two: arrive when done reading the peers, wait before exiting
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
__device__ __forceinline__ unsigned pack_cvt(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// This thread's max, and sum of exp(x - max) (RAW: of x), over its vectors of bf16 pairs.
template <int THREADS, int CHUNKS>
__device__ __forceinline__ float thread_max(const uint4 (&raw)[CHUNKS], int nvec) {
    constexpr const __nv_bfloat16* tag = nullptr;
    float m = NEG_INF;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k)
        if (threadIdx.x + k * THREADS < nvec)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const unsigned w = word_of(raw[k], q);
                m = fmaxf(m, fmaxf(elem_of(w, 0, tag), elem_of(w, 1, tag)));
            }
    return m;
}
template <int THREADS, int CHUNKS, bool RAW>
__device__ __forceinline__ float thread_sum(const uint4 (&raw)[CHUNKS], int nvec, float ml) {
    constexpr const __nv_bfloat16* tag = nullptr;
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k)
        if (threadIdx.x + k * THREADS < nvec)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const unsigned w = word_of(raw[k], q);
                const float a = elem_of(w, 0, tag), b = elem_of(w, 1, tag);
                s += RAW ? a + b : fast_exp2(fmaf(a, LOG2E, -ml)) + fast_exp2(fmaf(b, LOG2E, -ml));
            }
    return s;
}
// Write exp(x - max) * inv (RAW: x * inv) for this thread's vectors, packed by cvt.rn.bf16x2.
template <int THREADS, int CHUNKS, bool RAW>
__device__ __forceinline__ void store_row(uint4* o, const uint4 (&raw)[CHUNKS], int nvec, float ml, float inv) {
    constexpr const __nv_bfloat16* tag = nullptr;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
        const int j = threadIdx.x + k * THREADS;
        if (j < nvec) {
            unsigned w4[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const unsigned w = word_of(raw[k], q);
                const float a = elem_of(w, 0, tag), b = elem_of(w, 1, tag);
                w4[q] = RAW ? pack_cvt(a * inv, b * inv)
                            : pack_cvt(fast_exp2(fmaf(a, LOG2E, -ml)) * inv, fast_exp2(fmaf(b, LOG2E, -ml)) * inv);
            }
            __stcs(o + j, make_uint4(w4[0], w4[1], w4[2], w4[3]));
        }
    }
}

// MODE 0: copy-through, 1: reductions without exponentials, 2: softmax with cvt.rn.bf16x2 packing
template <int THREADS, int CHUNKS, int MINB, int MODE>
__global__ void __launch_bounds__(THREADS, MINB)
variant(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ out, int n_rows, int n_cols) {
    __shared__ float red[THREADS / 32];
    const int nvec = n_cols / 8;
    const uint4* src = reinterpret_cast<const uint4*>(x) + (long long)blockIdx.x * nvec;
    uint4* o = reinterpret_cast<uint4*>(out) + (long long)blockIdx.x * nvec;
    uint4 raw[CHUNKS];
    load_vectors<THREADS, CHUNKS>(raw, src, nvec);
    if (MODE == 0) {
#pragma unroll
        for (int k = 0; k < CHUNKS; ++k) {
            const int j = threadIdx.x + k * THREADS;
            if (j < nvec) __stcs(o + j, raw[k]);
        }
        return;
    }
    float m = thread_max<THREADS, CHUNKS>(raw, nvec);
    m = block_reduce<THREADS, true>(m, red);
    const float ml = m * LOG2E;
    float s = thread_sum<THREADS, CHUNKS, MODE == 1>(raw, nvec, ml);
    s = block_reduce<THREADS, false>(s, red);
    const float inv = 1.0f / s;
    store_row<THREADS, CHUNKS, MODE == 1>(o, raw, nvec, ml, inv);
}

// A row split over a cluster of CLUSTER blocks; each holds n_cols / CLUSTER elements in registers.
template <int THREADS, int CHUNKS, int MINB, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS, MINB)
cluster_rows(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ out, int n_rows, int n_cols) {
    __shared__ float red[THREADS / 32];
    __shared__ float part[2];
    const unsigned rank = cluster_rank();
    const int nvec = n_cols / CLUSTER / 8;
    const long long base = (long long)(blockIdx.x / CLUSTER) * (n_cols / 8) + (long long)rank * nvec;
    const uint4* src = reinterpret_cast<const uint4*>(x) + base;
    uint4* o = reinterpret_cast<uint4*>(out) + base;
    uint4 raw[CHUNKS];
    load_vectors<THREADS, CHUNKS>(raw, src, nvec);
    float m = thread_max<THREADS, CHUNKS>(raw, nvec);
    m = block_reduce<THREADS, true>(m, red);
    if (threadIdx.x == 0) part[0] = m;
    cluster_sync();
#pragma unroll
    for (unsigned r = 0; r < CLUSTER; ++r)
        if (r != rank) m = fmaxf(m, peer_load(&part[0], r));
    const float ml = m * LOG2E;
    float s = thread_sum<THREADS, CHUNKS, false>(raw, nvec, ml);
    s = block_reduce<THREADS, false>(s, red);
    if (threadIdx.x == 0) part[1] = s;
    cluster_sync();
#pragma unroll
    for (unsigned r = 0; r < CLUSTER; ++r)
        if (r != rank) s += peer_load(&part[1], r);
    cluster_arrive();  // this block is done reading its peers; it waits for them before exiting
    const float inv = 1.0f / s;
    store_row<THREADS, CHUNKS, false>(o, raw, nvec, ml, inv);
    cluster_wait();
}
"""


def launch_variant(x, out, *, THREADS, CHUNKS, MINB, MODE):
    return kg.Launch(grid=x.shape[0], block=THREADS, args=(x, out, kg.driver.i32(x.shape[0]), kg.driver.i32(x.shape[1])))


def launch_cluster(x, out, *, THREADS, CHUNKS, MINB, CLUSTER):
    return kg.Launch(grid=x.shape[0] * CLUSTER, block=THREADS,
                     args=(x, out, kg.driver.i32(x.shape[0]), kg.driver.i32(x.shape[1])))


VARIANT = kg.cuda(SOURCE, "variant<{THREADS}, {CHUNKS}, {MINB}, {MODE}>", launch=launch_variant,
                  configs=[{"THREADS": 256, "CHUNKS": 16, "MINB": 3, "MODE": m} for m in (0, 1, 2)]
                  + [{"THREADS": 512, "CHUNKS": 8, "MINB": 2, "MODE": 2}, {"THREADS": 1024, "CHUNKS": 4, "MINB": 2, "MODE": 2}],
                  min_capability=(8, 0))
CLUSTER = kg.cuda(SOURCE, "cluster_rows<{THREADS}, {CHUNKS}, {MINB}, {CLUSTER}>", launch=launch_cluster,
                  configs=[{"THREADS": 256, "CHUNKS": 8, "MINB": 4, "CLUSTER": 2},
                           {"THREADS": 128, "CHUNKS": 16, "MINB": 6, "CLUSTER": 2},
                           {"THREADS": 512, "CHUNKS": 4, "MINB": 3, "CLUSTER": 2},
                           {"THREADS": 256, "CHUNKS": 4, "MINB": 6, "CLUSTER": 4},
                           {"THREADS": 128, "CHUNKS": 8, "MINB": 8, "CLUSTER": 4}],
                  min_capability=(9, 0))
NAMES = {0: "diag copy-through", 1: "diag no-exp", 2: "pack cvt"}


def main():
    res = {}
    x = torch.randn(2048, 32768, device="cuda", dtype=torch.bfloat16)
    x[1, 100:] = float("-inf")
    out = torch.empty_like(x)
    for c in VARIANT.configs:
        r = CudaRunner(VARIANT, c)
        check_and_time(res, f"{NAMES[c.as_dict()['MODE']]} {c.label()}", lambda r=r: r(x, out), x, out,
                       check=c.as_dict()["MODE"] == 2)
    for c in CLUSTER.configs:
        r = CudaRunner(CLUSTER, c)
        check_and_time(res, f"cluster {c.label()}", lambda r=r: r(x, out), x, out)
    for c in C.CUDA_ROW_REGS.configs:
        r = CudaRunner(C.CUDA_ROW_REGS, c)
        check_and_time(res, f"library row_regs {c.label()}", lambda r=r: r(x, out), x, out)
    y = torch.empty_like(x)
    check_and_time(res, "copy same bytes", lambda: y.copy_(x), x, y, check=False)
    lib = CudaRunner(C.CUDA_ROW_REGS, C.CUDA_ROW_REGS.configs[0])
    for rows in (1980, 2112, 2376, 4096):
        xr = torch.randn(rows, 32768, device="cuda", dtype=torch.bfloat16)
        outr, yr = torch.empty_like(xr), torch.empty_like(xr)
        check_and_time(res, f"rows {rows}: library row_regs {C.CUDA_ROW_REGS.configs[0].label()}",
                       lambda: lib(xr, outr), xr, outr)
        check_and_time(res, f"rows {rows}: copy same bytes", lambda: yr.copy_(xr), xr, yr, check=False)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
