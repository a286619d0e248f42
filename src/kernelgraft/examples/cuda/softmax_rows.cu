
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
