"""Round 5: register-resident variants of the streaming softmax kernel.

The streaming kernel in ``kernelgraft.examples._softmax_cuda`` reads each row from shared memory
three times (max, sum, write) and spends about 5.4 us per row and block on bf16[2048, 32768], where
moving the row's bytes takes about 4 us at the copy rate (benchmarks/results/2026-11-30-h200-3/).
This variant reads the row from shared memory once into registers (CHUNKS 16-byte vectors per
thread, so rows up to THREADS * CHUNKS * 16 bytes) and keeps the exponentials there between the
sum and the write. Run on a GPU: ``python research/explore_softmax_stream.py``; it checks every
variant against float32 torch.softmax before timing it, and times the library's kernels beside it.
"""
import json
import sys

import torch

import kernelgraft as kg
from kernelgraft.backends.cuda.jit import CudaRunner
from kernelgraft.examples import _softmax_cuda as C

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from softmax_explore import check_and_time  # noqa: E402

# the library's streaming source brings block_reduce, fast_exp2 and prefetch_row
SOURCE = C._STREAM_SOURCE + r"""

template <typename T, int THREADS, int STAGES, int CHUNKS>
__global__ void __launch_bounds__(THREADS, 1)
softmax_stream_regs(const T* __restrict__ x, T* __restrict__ out, int n_rows, int n_cols) {
    constexpr int VEC = 16 / sizeof(T);
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float red[THREADS / 32];
    const int nvec = n_cols / VEC;  // <= THREADS * CHUNKS (checked by the caller)
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
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 1) : "memory");
        __syncthreads();
        const uint4* cur = ring + (it % STAGES) * nvec;
        float v[CHUNKS][VEC];
        float m = NEG_INF;
#pragma unroll
        for (int k = 0; k < CHUNKS; ++k) {
            const int j = threadIdx.x + k * THREADS;
            uint4 raw = j < nvec ? cur[j] : make_uint4(0, 0, 0, 0);
            const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
            for (int i = 0; i < VEC; ++i) {
                v[k][i] = j < nvec ? (float)e[i] : NEG_INF;
                m = fmaxf(m, v[k][i]);
            }
        }
        __syncthreads();  // the buffer is in registers now: the next prefetch may refill it
        m = block_reduce<THREADS, true>(m, red);
        const float ml = m * LOG2E;
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < CHUNKS; ++k)
#pragma unroll
            for (int i = 0; i < VEC; ++i) { v[k][i] = fast_exp2(fmaf(v[k][i], LOG2E, -ml)); s += v[k][i]; }
        s = block_reduce<THREADS, false>(s, red);
        const float inv = 1.0f / s;
        uint4* o = reinterpret_cast<uint4*>(out + (long long)row * n_cols);
#pragma unroll
        for (int k = 0; k < CHUNKS; ++k) {
            const int j = threadIdx.x + k * THREADS;
            if (j < nvec) {
                uint4 packed;
                T* e = reinterpret_cast<T*>(&packed);
#pragma unroll
                for (int i = 0; i < VEC; ++i) e[i] = (T)(v[k][i] * inv);
                o[j] = packed;
            }
        }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

"""


def launch(x, out, *, THREADS, STAGES, CHUNKS):
    n_rows, n_cols = x.shape
    grid = min(n_rows, torch.cuda.get_device_properties(x.device).multi_processor_count)
    return kg.Launch(grid=grid, block=THREADS, args=(x, out, kg.driver.i32(n_rows), kg.driver.i32(n_cols)),
                     shared_mem=STAGES * n_cols * x.element_size(), template={"T": kg.ctype(x.dtype)})


CONFIGS = [{"THREADS": t, "STAGES": s, "CHUNKS": 4096 // t} for t in (512, 1024) for s in (2, 3)]
SPEC = kg.cuda(SOURCE, "softmax_stream_regs<{T}, {THREADS}, {STAGES}, {CHUNKS}>", launch=launch,
               configs=CONFIGS, min_capability=(8, 0))


def launch_direct(x, out, *, THREADS, CHUNKS, MINB):
    n_rows, n_cols = x.shape
    return kg.Launch(grid=n_rows, block=THREADS, args=(x, out, kg.driver.i32(n_rows), kg.driver.i32(n_cols)),
                     template={"T": kg.ctype(x.dtype)})


# bf16[., 32768]: 4096 16-byte vectors per row
DIRECT_CONFIGS = [{"THREADS": t, "CHUNKS": 4096 // t, "MINB": b} for t, b in ((256, 2), (256, 3), (512, 2), (512, 3), (1024, 1), (1024, 2))]
# The one-row-per-block register kernel, now the library's softmax_row_regs (for 2-byte types the
# same operations as the bf16-only version that ran in round 5).
DIRECT = kg.cuda(C._ROW_REGS_SOURCE, "softmax_row_direct<{T}, {THREADS}, {CHUNKS}, {MINB}>", launch=launch_direct,
                 configs=DIRECT_CONFIGS, min_capability=(8, 0))


def main():
    x = torch.randn(2048, 32768, device="cuda", dtype=torch.bfloat16)
    x[1, 100:] = float("-inf")
    out = torch.empty_like(x)
    runners = {f"regs {c.label()}": CudaRunner(SPEC, c) for c in SPEC.configs}
    runners.update({f"direct {c.label()}": CudaRunner(DIRECT, c) for c in DIRECT.configs})
    runners.update({f"library stream {c.label()}": CudaRunner(C.CUDA_STREAM, c) for c in C.CUDA_STREAM.configs})
    res = {}
    for name, r in runners.items():
        check_and_time(res, name, lambda r=r: r(x, out), x, out, rep=200)
    y = torch.empty_like(x)
    check_and_time(res, "copy same bytes", lambda: y.copy_(x), x, y, check=False, rep=200)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
