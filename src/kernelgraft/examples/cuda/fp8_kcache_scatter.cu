
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
__device__ __forceinline__ float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }
// the same in one instruction on sm_80+ (a canonical NaN for any NaN: the scale's division makes
// every NaN the canonical one anyway)
__device__ __forceinline__ float max_nan(float a, float b) {
#if __CUDA_ARCH__ >= 800
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return nan_max(a, b);
#endif
}

// The scale and its exact inverse: vLLM's max(amax, 1e-4) / 448, with ue8m0 rounded up to a power
// of two on the bits (exact 2^ceil(log2(scale))). inv != 0: x * inv == x / scale correctly rounded.
__device__ __forceinline__ void block_scale(float amax, int ue8m0, float& scale, float& inv) {
    scale = __fdiv_rn(amax < 1e-4f ? 1e-4f : amax, 448.0f);
    inv = 0.0f;
    if (ue8m0 && isfinite(scale)) {
        int bits = __float_as_int(scale);
        int e = (bits >> 23) + ((bits & 0x7FFFFF) != 0);
        scale = __int_as_float(e << 23);
        if (e >= 1 && e < 254) inv = __int_as_float((254 - e) << 23);
    }
}

__device__ __forceinline__ __nv_fp8_storage_t quantise(float x, float scale, float inv) {
    return __nv_cvt_float_to_fp8(inv != 0.0f ? x * inv : __fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3);
}

// Dense, 16-byte aligned pages and keys, quant_block_size = VEC * 2^log2g elements (log2g <= 5):
// G = 2^log2g threads per (token, quantisation block), VEC (16 or 32) elements each, so every
// thread makes 16-byte loads of k and 16-byte stores of fp8 values (the warp-per-block path below
// loads 2 bytes and stores 1 per instruction). The keys' loads do not wait for the slot.
template <typename T>
__device__ __forceinline__ void scatter_vec(const T* __restrict__ k, unsigned char* __restrict__ cache,
                                            const long long* __restrict__ slots, int n_tokens,
                                            long long n_slots, int head_dim, int nqb, int log2g,
                                            int block_size, long long s_page, int ue8m0) {
    constexpr int E = VEC, LOADS = E * sizeof(T) / 16;
    const int G = 1 << log2g, qbs = E << log2g;
    const long long pair = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> log2g;
    const int lane = threadIdx.x & (G - 1);
    const bool active = pair < (long long)n_tokens * nqb;
    const long long token = nqb == 1 ? pair : pair / nqb;
    const int qb = nqb == 1 ? 0 : (int)(pair % nqb);
    long long slot = -1;
    alignas(16) T v[E];
    if (active) {
        slot = slots[token];
        const uint4* src = reinterpret_cast<const uint4*>(k + token * head_dim + (long long)qb * qbs + lane * E);
#pragma unroll
        for (int i = 0; i < LOADS; ++i) reinterpret_cast<uint4*>(v)[i] = src[i];
    } else {
#pragma unroll
        for (int i = 0; i < LOADS; ++i) reinterpret_cast<uint4*>(v)[i] = make_uint4(0, 0, 0, 0);
    }
    float x[E];
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        x[e] = (float)v[e];
        amax = max_nan(amax, fabsf(x[e]));
    }
    // G divides 32: the xor partners stay inside the group; every lane takes part
    for (int off = G / 2; off > 0; off >>= 1) amax = max_nan(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    if (!active || slot < 0 || slot >= n_slots) return;  // padding token, or out of range: never written
    float scale, inv;
    block_scale(amax, ue8m0, scale, inv);
    alignas(16) __nv_fp8x2_storage_t q[E / 2];
#pragma unroll
    for (int e = 0; e < E; e += 2) {
        if (inv != 0.0f) {
            q[e / 2] = __nv_cvt_float2_to_fp8x2(make_float2(x[e] * inv, x[e + 1] * inv), __NV_SATFINITE, __NV_E4M3);
        } else {
            q[e / 2] = (__nv_fp8x2_storage_t)(quantise(x[e], scale, inv) | (quantise(x[e + 1], scale, inv) << 8));
        }
    }
    const long long page = slot / block_size, row = slot % block_size;
    unsigned char* pg = cache + page * s_page;
    uint4* dst = reinterpret_cast<uint4*>(pg + row * head_dim + (long long)qb * qbs + lane * E);
#pragma unroll
    for (int i = 0; i < E / 16; ++i) dst[i] = reinterpret_cast<uint4*>(q)[i];
    if (lane == 0)
        *reinterpret_cast<unsigned int*>(pg + (long long)block_size * head_dim + (row * nqb + qb) * 4) =
            (unsigned int)__float_as_int(scale);
}

// vec = 1 + log2(quant_block_size / VEC): scatter_vec's layout (the launch checks its conditions),
// nqb = head_dim / quant_block_size. vec = 0: one warp per
// (token, quantisation block), WARPS warps per thread block, any strides: byte i of page b is at
// cache + b*s_page + (i / cache_stride)*s_row + (i % cache_stride)*s_col.
template <typename T>
__global__ void fp8_kcache_scatter(const T* __restrict__ k, unsigned char* __restrict__ cache,
                                   const long long* __restrict__ slots, int n_tokens, long long n_slots,
                                   int head_dim,
                                   int qbs, int block_size, int cache_stride, long long s_page,
                                   long long s_row, long long s_col, int ue8m0, int nqb, int vec) {
    if (vec) {
        scatter_vec(k, cache, slots, n_tokens, n_slots, head_dim, nqb, vec - 1, block_size, s_page, ue8m0);
        return;
    }
    const long long pair = (long long)blockIdx.x * WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (pair >= (long long)n_tokens * nqb) return;
    const long long token = pair / nqb;
    const int qb = (int)(pair % nqb);
    const long long slot = slots[token];
    if (slot < 0 || slot >= n_slots) return;  // padding token, or out of range: never written
    const T* src = k + token * head_dim + (long long)qb * qbs;
    float amax = 0.0f;
    // NaN-propagating max, as torch's amax and clamp_min (fmaxf would drop a NaN).
    for (int e = lane; e < qbs; e += 32) amax = nan_max(amax, fabsf((float)src[e]));
    for (int off = 16; off > 0; off >>= 1) amax = nan_max(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    float scale, inv;
    block_scale(amax, ue8m0, scale, inv);
    const long long page = slot / block_size, row = slot % block_size;
    unsigned char* pg = cache + page * s_page;
    // the usual dense page: byte i at pg + i, no 64-bit division per byte
    const bool dense = s_col == 1 && s_row == cache_stride;
    for (int e = lane; e < qbs; e += 32) {
        long long flat = row * head_dim + (long long)qb * qbs + e;
        pg[dense ? flat : (flat / cache_stride) * s_row + (flat % cache_stride) * s_col] =
            (unsigned char)quantise((float)src[e], scale, inv);
    }
    if (lane < 4) {
        long long flat = (long long)block_size * head_dim + (row * nqb + qb) * 4 + lane;
        unsigned int bits = (unsigned int)__float_as_int(scale);
        pg[dense ? flat : (flat / cache_stride) * s_row + (flat % cache_stride) * s_col] =
            (unsigned char)(bits >> (8 * lane));
    }
}
