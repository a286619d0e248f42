
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
