"""MoE top-k router: softmax over experts in float32, the top ``k``, optionally renormalised.

What Mixtral and Qwen-MoE compute from a router's logits::

    probs = softmax(router_logits.float(), dim=-1)
    weights, indices = topk(probs, top_k)          # largest first
    if renormalize: weights /= weights.sum(-1, keepdim=True)

- ``router_logits``: ``[num_tokens, num_experts]`` in bf16, fp16 or fp32, any strides.
- Returns ``weights`` (float32 ``[num_tokens, top_k]``) and ``indices`` (int32 ``[num_tokens,
  top_k]``), largest probability first.
- Ties. Experts whose probabilities are equal may come in any order, and where a tie straddles the
  ``top_k`` cut any of the tied experts may be chosen: torch's own order among equal values is
  implementation-defined and differs between devices. The op declares it
  (``compare={"indices": kg.ties_by("router_logits", key=softmax)}``), so ``kernelgraft check``, the
  tuner's gate and graft verification judge the indices by the probabilities they select. The
  kernels rank experts by their logits (exact; the probabilities are a monotone function of them)
  and break ties toward the lower index.
- NaN and Inf follow torch's softmax: a row holding a NaN or +Inf, or only -Inf, has NaN
  probabilities everywhere, so NaN weights and any ``top_k`` distinct experts. A -Inf logit (a
  masked expert) has probability 0.

>>> import torch
>>> from kernelgraft.examples.topk_router import topk_router
>>> w, i = topk_router(torch.tensor([[0.0, 2.0, 1.0, -1.0]]), 2, True)
>>> i.tolist(), [round(v, 4) for v in w[0].tolist()]
([[1, 2]], [0.7311, 0.2689])
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernelgraft as kg

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
NAME = "kgexamples::topk_router"
MAX_K = 16  # the kernels keep the chosen experts in registers
_LOWEST = tl.constexpr(-2147483648)  # below every logit's ordered bits: padding and chosen experts


def _probs(router_logits: torch.Tensor) -> torch.Tensor:
    """What the reference ranks: the float32 softmax (the tie rule's key, too)."""
    return torch.softmax(router_logits.float(), dim=-1)


# ------------------------------------------------------------------ Triton
@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _topk_router_kernel(
    x_ptr, w_ptr, i_ptr, n_tokens, n_experts, s_t, s_e,
    K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, TOKENS: tl.constexpr, RENORM: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS)
    cols = tl.arange(0, E_PAD)
    live = rows < n_tokens
    real = cols < n_experts
    x = tl.load(x_ptr + rows[:, None] * s_t + cols[None, :] * s_e, mask=live[:, None] & real[None, :],
                other=float("-inf")).to(tl.float32)
    # softmax as torch computes it: a NaN (or a max of +-Inf) makes the whole row NaN
    m = tl.reduce(x, 1, _max_nan)
    p = tl.where(real[None, :], tl.exp(x - m[:, None]), 0.0)
    p = p / tl.sum(p, 1)[:, None]
    # Rank by the logits' bits as ordered integers: exact, ties broken toward the lower index by
    # argmax, a NaN above everything (as torch.topk puts it), and padding and experts already
    # chosen below every real logit, -Inf included.
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    key = tl.where(x != x, 0x7FFFFFFF, key)
    key = tl.where(real[None, :], key, _LOWEST)
    ks = tl.arange(0, K_PAD)
    weights = tl.zeros([TOKENS, K_PAD], tl.float32)
    chosen = tl.zeros([TOKENS, K_PAD], tl.int32)
    for j in tl.static_range(K):
        best = tl.argmax(key, 1, tie_break_left=True)
        hit = cols[None, :] == best[:, None]
        w = tl.sum(tl.where(hit, p, 0.0), 1)
        key = tl.where(hit, _LOWEST, key)
        weights = tl.where(ks[None, :] == j, w[:, None], weights)
        chosen = tl.where(ks[None, :] == j, best[:, None].to(tl.int32), chosen)
    if RENORM:
        weights = weights / tl.sum(weights, 1)[:, None]
    out = rows[:, None] * K + ks[None, :]
    mask = live[:, None] & (ks[None, :] < K)
    tl.store(w_ptr + out, weights, mask=mask)
    tl.store(i_ptr + out, chosen, mask=mask)


def launch_topk_router(router_logits, top_k, renormalize, weights, indices, *, TOKENS, num_warps):
    n_tokens, n_experts = router_logits.shape
    _topk_router_kernel[(max(triton.cdiv(n_tokens, TOKENS), 1),)](
        router_logits, weights, indices, n_tokens, n_experts, *router_logits.stride(),
        K=top_k, K_PAD=triton.next_power_of_2(top_k), E_PAD=triton.next_power_of_2(n_experts),
        TOKENS=TOKENS, RENORM=renormalize, num_warps=num_warps,
    )


def _fits(router_logits, top_k, renormalize, *, TOKENS=1, **config):
    n_experts = router_logits.shape[-1]
    if top_k > MAX_K:
        return f"top_k {top_k} exceeds the kernels' {MAX_K}"
    if TOKENS * triton.next_power_of_2(max(n_experts, 1)) > 8192:
        return f"{TOKENS} rows of {n_experts} experts exceed this config's tile of 8192"
    return True


TRITON = kg.triton(
    launch_topk_router,
    configs=[{"TOKENS": 1, "num_warps": 1}, {"TOKENS": 4, "num_warps": 2}, {"TOKENS": 16, "num_warps": 4}],
    supports=_fits,
    contiguous=False,  # the logits are read through their strides
)


# ------------------------------------------------------------------ CUDA C++
_CUDA_SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define EPL 8      // experts per lane: 256 experts at most
#define MAX_K 16
#define LOWEST (-2147483647 - 1)
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float max_nan(float a, float b) {
    return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

// One warp per token. The logits' bits as ordered integers rank the experts exactly (a NaN above
// everything, as torch.topk puts it); the warp's argmax breaks ties toward the lower index.
template <typename T>
__global__ void topk_router(const T* __restrict__ logits, float* __restrict__ weights, int* __restrict__ indices,
                            int n_tokens, int n_experts, long long s_t, long long s_e, int k, int renorm) {
    const long long token = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (token >= n_tokens) return;  // the whole warp leaves together
    float x[EPL], p[EPL];
    int key[EPL];
    float m = NEG_INF;
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
        const int e = lane + 32 * i;
        x[i] = e < n_experts ? (float)logits[token * s_t + e * s_e] : NEG_INF;
        if (e < n_experts) m = max_nan(m, x[i]);
    }
    for (int off = 16; off > 0; off >>= 1) m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, off));
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
        const int e = lane + 32 * i;
        p[i] = e < n_experts ? expf(x[i] - m) : 0.0f;
        s += p[i];
        const int b = __float_as_int(x[i]);
        key[i] = e >= n_experts ? LOWEST : x[i] != x[i] ? 2147483647 : b >= 0 ? b : b ^ 0x7FFFFFFF;
    }
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
#pragma unroll
    for (int i = 0; i < EPL; ++i) p[i] = p[i] / s;
    float w[MAX_K];
    int chosen[MAX_K];
    float total = 0.0f;
    for (int j = 0; j < k; ++j) {
        int best_key = LOWEST, best = 0x7FFFFFFF;
#pragma unroll
        for (int i = 0; i < EPL; ++i) {
            const int e = lane + 32 * i;
            if (key[i] > best_key || (key[i] == best_key && e < best)) { best_key = key[i]; best = e; }
        }
        for (int off = 16; off > 0; off >>= 1) {
            const int ok = __shfl_xor_sync(0xffffffffu, best_key, off);
            const int oe = __shfl_xor_sync(0xffffffffu, best, off);
            if (ok > best_key || (ok == best_key && oe < best)) { best_key = ok; best = oe; }
        }
        float mine = 0.0f;
#pragma unroll
        for (int i = 0; i < EPL; ++i) {
            if (lane + 32 * i == best) { mine = p[i]; key[i] = LOWEST; }
        }
        const float wj = __shfl_sync(0xffffffffu, mine, best % 32);
        w[j] = wj;
        chosen[j] = best;
        total += wj;
    }
    if (lane == 0) {
        for (int j = 0; j < k; ++j) {
            weights[token * k + j] = renorm ? w[j] / total : w[j];
            indices[token * k + j] = chosen[j];
        }
    }
}
"""


def launch_topk_router_cuda(router_logits, top_k, renormalize, weights, indices, *, WARPS):
    n_tokens, n_experts = router_logits.shape
    i32, i64 = kg.driver.i32, kg.driver.i64
    return kg.Launch(
        grid=max((n_tokens + WARPS - 1) // WARPS, 1),
        block=32 * WARPS,
        args=(router_logits, weights, indices, i32(n_tokens), i32(n_experts),
              *(i64(s) for s in router_logits.stride()), i32(top_k), i32(int(renormalize))),
        template={"T": kg.ctype(router_logits.dtype)},
    )


def _fits_cuda(router_logits, top_k, renormalize, **config):
    if router_logits.shape[-1] > 256:
        return f"{router_logits.shape[-1]} experts exceed the CUDA kernel's 256 (8 per lane)"
    if top_k > MAX_K:
        return f"top_k {top_k} exceeds the kernels' {MAX_K}"
    return True


CUDA = kg.cuda(
    _CUDA_SOURCE,
    "topk_router<{T}>",
    launch=launch_topk_router_cuda,
    configs=[{"WARPS": 4}, {"WARPS": 8}],
    supports=_fits_cuda,
    contiguous=False,
)

IMPLS = [TRITON, CUDA]


# ------------------------------------------------------------------ inputs
def _tied(tokens, experts, dtype, g):
    """Logits on a coarse grid (steps of 0.25 in [-2, 2]): many exact ties, some at the cut."""
    return (torch.randint(-8, 9, (tokens, experts), generator=g) / 4).to(dtype)


def sample_inputs(device: str = "cpu"):
    """Mixtral (8 experts, top 2), Qwen1.5-MoE (60, top 4), 64-256 experts with top 8, top 1;
    each dtype; logits with many ties; masked (-Inf) experts; rows that are NaN under softmax; and
    a strided view of a larger tensor."""
    g = torch.Generator().manual_seed(0)

    def put(t):
        return t.to(device)

    yield put(torch.randn(5, 8, generator=g).to(torch.bfloat16)), 2, True
    yield put(_tied(37, 8, torch.bfloat16, g)), 2, True
    yield put(_tied(19, 60, torch.bfloat16, g)), 4, False
    yield put(_tied(9, 64, torch.float16, g)), 8, True
    yield put(_tied(6, 256, torch.bfloat16, g)), 8, True
    yield put(torch.randn(1, 128, generator=g)), 1, True
    yield put(_tied(7, 16, torch.bfloat16, g)), 1, False
    special = torch.randn(6, 16, generator=g)
    special[0, 3] = float("nan")  # a NaN row
    special[1, 5] = float("inf")  # an +Inf row: NaN under softmax
    special[2] = float("-inf")  # every expert masked: NaN
    special[3, ::2] = float("-inf")  # half masked: probability 0, tied at the cut
    special[4, :12] = float("-inf")
    yield put(special.to(torch.float16)), 6, True
    wide = put(torch.randn(11, 2 * 32, generator=g).to(torch.bfloat16))
    yield wide[:, ::2], 4, True  # strided: every other column


# Shapes for ``kernelgraft bench`` (kernelgraft.bench.suite): (tokens, experts, top_k), bf16.
BENCH_SHAPES = {
    "short": {"decode": [(64, 64, 8)], "prefill": [(4096, 8, 2), (4096, 128, 8)]},
    "llm": {
        "decode": [(1, 8, 2), (16, 64, 8), (64, 128, 8), (64, 256, 8)],
        "prefill": [(4096, 8, 2), (4096, 60, 4), (4096, 128, 8), (16384, 64, 8)],
        "narrow": [(32768, 128, 8), (65536, 8, 2), (65536, 256, 8)],
    },
}


def bench_case(t, e, k, device: str = "cuda"):
    """Router logits of Mixtral (8 experts, top 2), Qwen-MoE (60-128, top 4-8) and
    DeepSeek-V3-sized (256, top 8) routers at decode and prefill token counts: the inputs of one
    shape of ``BENCH_SHAPES``."""
    return (torch.randn(t, e, device=device, dtype=torch.bfloat16), k, True)


def cost(router_logits, top_k, renormalize):
    """Bytes moved: the logits read, the weights and indices written."""
    n = router_logits.shape[0]
    return router_logits.numel() * router_logits.element_size() + n * top_k * 8, 0


@kg.op(
    NAME,
    outputs=("weights", "indices"),
    compare={"indices": kg.ties_by("router_logits", key=_probs)},
    dtypes={"router_logits": DTYPES},
    ndim={"router_logits": 2},
    impls=IMPLS,
    sample_inputs=sample_inputs,
    cost=cost,
)
def topk_router(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 routing weights and int32 expert indices of the ``top_k`` experts per token."""
    n_experts = router_logits.shape[-1]
    if not 1 <= top_k <= n_experts:
        raise kg.InputError(f"{NAME}: argument 'top_k' is {top_k}, expected 1 to the number of experts "
                            f"({n_experts}, router_logits.shape[-1])")
    weights, indices = torch.topk(_probs(router_logits), top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, indices.to(torch.int32)
