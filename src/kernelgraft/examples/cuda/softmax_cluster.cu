
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
