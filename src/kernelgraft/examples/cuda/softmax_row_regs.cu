
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
