
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
