"""Softmax over the last dimension, accumulated in float32, returned in the input's dtype.

Three Triton kernels: a one-pass kernel that holds whole rows in registers (several rows per program
for narrow rows), an online-softmax kernel that streams rows of any length in chunks, and a
split-row kernel pair that spreads each of a few very wide rows (one token's logits over a 152K
vocabulary) across many programs. Three
CUDA C++ kernels live in ``_softmax_cuda``: one block per row, a Hopper thread-block cluster per
row, and persistent blocks streaming rows through shared memory (for vocab-wide rows).

>>> import torch
>>> from kernelgraft.examples.softmax import softmax
>>> x = torch.randn(3, 10)
>>> torch.allclose(softmax(x), torch.softmax(x, -1))
True
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernelgraft as kg

from ._softmax_cuda import CUDA, CUDA_CLUSTER, CUDA_ROW_REGS, CUDA_ROW_TMA, CUDA_STREAM, _fits_nonempty, _nonempty, _rows_cols
from ._special import nan_inf


@triton.jit
def _shift(m):
    # The max to subtract while accumulating sum(exp(x - max)): 0 while every element seen is -inf,
    # so those add exp(-inf) = 0 instead of exp(-inf - -inf) = nan. A NaN still adds NaN: tl.max
    # and tl.maximum skip NaN (on the GPU and in the interpreter), so a NaN among -inf leaves the
    # max at -inf, and a test of the max alone ("all seen are -inf, add 0") drops it.
    return tl.where(m == -float("inf"), 0.0, m)


@triton.jit
def _softmax_rows_kernel(x_ptr, out_ptr, n_rows, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=1)
    # Rows that are all -inf would give nan - nan; the reference gives nan too, keep it consistent.
    e = tl.exp(x - m[:, None])
    y = e * (1.0 / tl.sum(e, axis=1))[:, None]
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_online_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    # Pass 1 keeps one running max per row (a scalar) and per-lane sums rescaled to it: one exp per
    # element. A running max per lane would need two (rescale and add) and, on the H200, made this
    # kernel bound by the exp unit rather than memory. Pass 2 re-reads the row (from L2).
    row = tl.program_id(0).to(tl.int64)
    base = row * n_cols
    cols = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], -float("inf"), tl.float32), axis=0)
    d = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + base + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        shift = _shift(m_new)
        d = d * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
    # an all -inf row: 1 / 0 and exp(nan) give nan, as the reference does
    inv = 1.0 / tl.sum(d, axis=0)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + base + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - m) * inv
        tl.store(out_ptr + base + start + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_split_stats_kernel(x_ptr, stats_ptr, n_cols, CHUNK, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    # Pass 1 of the split-row softmax: program (row, split) reduces columns
    # [split * CHUNK, (split + 1) * CHUNK) to its max m and sum(exp(x - m)), both float32.
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    base = row * n_cols
    cols = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], -float("inf"), tl.float32), axis=0)
    d = tl.zeros([BLOCK], tl.float32)
    for start in range(split * CHUNK, tl.minimum((split + 1) * CHUNK, n_cols), BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + base + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        shift = _shift(m_new)
        d = d * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
    # stats[row, split] = (m, sum): a split past the row's end stores (-inf, 0)
    tl.store(stats_ptr + (row * SPLITS + split) * 2, m)
    tl.store(stats_ptr + (row * SPLITS + split) * 2 + 1, tl.sum(d, axis=0))


@triton.jit
def _softmax_split_write_kernel(x_ptr, stats_ptr, out_ptr, n_cols, CHUNK, SPLITS: tl.constexpr,
                                BLOCK: tl.constexpr):
    # Pass 2: every program combines its row's SPLITS partial results in the same order (so the
    # result does not depend on which program ran first: deterministic, no atomics) and writes its
    # own chunk.
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    parts = tl.arange(0, SPLITS)
    pm = tl.load(stats_ptr + (row * SPLITS + parts) * 2)
    ps = tl.load(stats_ptr + (row * SPLITS + parts) * 2 + 1)
    m = tl.max(pm, axis=0)
    # A split of only -inf (or past the row's end) has the sum 0 and adds 0; a split with a NaN has
    # the sum NaN and must add it (a `ps > 0` test dropped it). An all -inf row gives m = -inf,
    # the sum 0 and exp(-inf - -inf) = nan below, as the reference does.
    inv = 1.0 / tl.sum(tl.where(ps == 0, 0.0, ps * tl.exp(pm - m)), axis=0)
    base = row * n_cols
    cols = tl.arange(0, BLOCK)
    for start in range(split * CHUNK, tl.minimum((split + 1) * CHUNK, n_cols), BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + base + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - m) * inv
        tl.store(out_ptr + base + start + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def launch_softmax_split(x, out, *, splits, BLOCK, num_warps):
    n_rows, n_cols = _rows_cols(x)
    # chunks of whole BLOCKs, so only a row's last block is masked
    chunk = triton.cdiv(triton.cdiv(n_cols, splits), BLOCK) * BLOCK
    # Two launches and a small float32 workspace (rows x splits x 2): stream-ordered, so safe to
    # capture in a CUDA graph; the plan stays in Python (kernelgraft.native replays one launch).
    stats = torch.empty(n_rows * splits * 2, device=x.device, dtype=torch.float32)
    grid = (n_rows, splits)
    _softmax_split_stats_kernel[grid](x, stats, n_cols, chunk, SPLITS=splits, BLOCK=BLOCK, num_warps=num_warps)
    _softmax_split_write_kernel[grid](x, stats, out, n_cols, chunk, SPLITS=splits, BLOCK=BLOCK, num_warps=num_warps)


SPLIT_MAX_ROWS = 64


def _fits_split(x, *, splits=1, BLOCK=1024, **config):
    """Few, wide rows: rows x splits programs only pay off while the rows alone cannot fill the
    GPU (at most SPLIT_MAX_ROWS rows) and each split gets at least one full BLOCK."""
    why = _nonempty(x)
    if why:
        return why
    n_rows, n_cols = _rows_cols(x)
    if n_rows > SPLIT_MAX_ROWS:
        return f"{n_rows} rows: the split-row kernel serves at most {SPLIT_MAX_ROWS} rows (more fill the GPU one per program)"
    if n_cols < splits * BLOCK:
        return f"rows of {n_cols} elements are shorter than {splits} splits of {BLOCK}"
    return True


def launch_softmax_rows(x, out, *, rows_per_program, num_warps):
    n_rows, n_cols = _rows_cols(x)
    block = triton.next_power_of_2(max(n_cols, 1))
    _softmax_rows_kernel[(triton.cdiv(n_rows, rows_per_program),)](
        x, out, n_rows, n_cols, ROWS=rows_per_program, BLOCK=block, num_warps=num_warps
    )


def launch_softmax_online(x, out, *, BLOCK, num_warps):
    n_rows, n_cols = _rows_cols(x)
    _softmax_online_kernel[(n_rows,)](x, out, n_cols, BLOCK=BLOCK, num_warps=num_warps)


def _fits_rows(x, *, rows_per_program=1, **config):
    why = _nonempty(x)
    if why:
        return why
    tile = rows_per_program * triton.next_power_of_2(x.shape[-1])
    if tile > 32768:
        return f"{rows_per_program} rows of {x.shape[-1]} elements exceed this config's tile of 32768"
    return True


TRITON_ROWS = kg.triton(
    launch_softmax_rows,
    configs=[
        {"rows_per_program": 1, "num_warps": 4},
        {"rows_per_program": 1, "num_warps": 16},
        {"rows_per_program": 4, "num_warps": 4},
        {"rows_per_program": 16, "num_warps": 4},
        {"rows_per_program": 1, "num_warps": 32},  # long rows (32K): 32 elements per thread
    ],
    supports=_fits_rows,
    name="softmax_rows",
)

TRITON_ONLINE = kg.triton(
    launch_softmax_online,
    configs=[{"BLOCK": 1024, "num_warps": 4}, {"BLOCK": 2048, "num_warps": 4}, {"BLOCK": 4096, "num_warps": 8},
             {"BLOCK": 8192, "num_warps": 16}],
    supports=_fits_nonempty,
    name="softmax_online",
)

TRITON_SPLIT = kg.triton(
    launch_softmax_split,
    # 4-8 splits for tens of rows (decode attention scores of 4K-32K keys, a batch's logits), up to
    # 256 for a single row: the H200's 132 SMs want ~100+ programs
    configs=[{"splits": 4, "BLOCK": 1024, "num_warps": 4}, {"splits": 8, "BLOCK": 1024, "num_warps": 4},
             {"splits": 4, "BLOCK": 4096, "num_warps": 8}, {"splits": 8, "BLOCK": 2048, "num_warps": 8},
             {"splits": 16, "BLOCK": 2048, "num_warps": 8}, {"splits": 32, "BLOCK": 1024, "num_warps": 4},
             {"splits": 64, "BLOCK": 1024, "num_warps": 4}, {"splits": 128, "BLOCK": 512, "num_warps": 4},
             {"splits": 256, "BLOCK": 512, "num_warps": 4}],
    supports=_fits_split,
    name="softmax_split",
)

# Within the tuner's 1% tie margin the impl listed first wins: the bulk-copy kernel before the
# register one. It is 5-7% faster per launch from a cold L2 on the H200, yet the tuner, which
# replays launches back to back, once chose the register kernel (benchmarks/results/
# 2026-11-30-h200-4/SUMMARY.md).
IMPLS = [TRITON_ROWS, TRITON_ONLINE, CUDA, CUDA_CLUSTER, CUDA_STREAM, CUDA_ROW_TMA, CUDA_ROW_REGS, TRITON_SPLIT]


def sample_inputs(device: str = "cpu", dtype: torch.dtype = torch.float32):
    """Edge shapes: one element, odd widths, rows longer than one chunk, large magnitudes, -inf,
    NaN and Inf (in narrow rows and in rows wide enough for every kernel)."""
    for rows, cols in [(1, 1), (1, 7), (5, 64), (3, 1000), (17, 4097), (2, 131)]:
        yield (torch.randn(rows, cols, device=device, dtype=dtype),)
    yield (torch.randn(2, 3, 256, device=device, dtype=dtype) * 30,)
    masked = torch.randn(4, 300, device=device, dtype=dtype)
    masked[:, 100:] = float("-inf")  # causal-mask style rows
    yield (masked,)
    for dt in (torch.float16, torch.bfloat16):
        yield (torch.randn(9, 768, device=device, dtype=dt),)
        yield (nan_inf(torch.randn(4, 300, device=device, dtype=dt)),)
    # vocab-wide rows (the cluster kernel's shapes), one masked across its slices, and a width
    # that leaves some of its threads without a vector
    wide = torch.randn(3, 32768, device=device, dtype=torch.bfloat16)
    wide[1, 5000:] = float("-inf")
    yield (wide,)
    # one very wide row split across programs, more splits than the row fills (empty chunks)
    yield (torch.randn(1, 40000, device=device, dtype=dtype) * 5,)
    yield (torch.randn(4, 6144, device=device, dtype=torch.float16) * 10,)
    # more rows than an H200 has SMs: the streaming kernel's blocks each walk several rows
    yield (torch.randn(140, 8200, device=device, dtype=torch.float32),)
    yield (wide_nan_inf(device, dtype),)


def wide_nan_inf(device: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows wide enough for every kernel (the split, streaming, cluster and register ones too) with
    the reference's NaN cases: a row with one NaN, or a +inf, or only -inf is NaN throughout.
    Row 2 hides its NaN among -inf: a max that skips NaN (tl.max, fmaxf) stays -inf there, so a
    kernel that adds nothing while the max is -inf drops the NaN. Row 4 stays finite."""
    x = torch.randn(5, 8192, device=device, dtype=dtype) * 5
    x[0, 5000] = float("nan")  # in a later split than the first
    x[1, 7] = float("inf")
    x[2, :2048] = float("-inf")
    x[2, 5] = float("nan")
    x[3] = float("-inf")
    x[4, 4096:] = float("-inf")
    return x


# Shapes for ``kernelgraft bench`` (kernelgraft.bench.suite): (rows, cols) bf16.
BENCH_SHAPES = {
    "short": {"attention": [(64, 4096), (512, 4096), (4096, 4096), (32768, 4096)], "vocab": [(2048, 32768)]},
    "llm": {
        # one decode token: heads x KV length; a prefill: heads x queries rows
        "attention": [(32, 4096), (64, 32768), (4096, 4096), (32768, 1024), (32768, 4096)],
        # MoE routers and short score rows
        "narrow": [(4096, 128), (32768, 128), (16384, 256)],
        # sampling over a vocabulary: Llama-2 32000, Llama-3 128256, Qwen 151936, Gemma 256000
        "vocab": [(1, 32000), (1, 128256), (1, 151936), (1, 256000), (16, 151936), (64, 128256),
                  (2048, 32768), (1024, 128256)],
    },
}


def bench_case(rows, cols, device: str = "cuda"):
    """Attention-score, router and vocabulary rows in bf16 for ``kernelgraft bench``, by regime: the inputs
    of one shape of ``BENCH_SHAPES``."""
    return (torch.randn(rows, cols, device=device, dtype=torch.bfloat16),)


@kg.op(
    "kgexamples::softmax",
    impls=IMPLS,
    sample_inputs=sample_inputs,
    dtypes=(torch.float32, torch.float16, torch.bfloat16),
)
def softmax(x: torch.Tensor) -> torch.Tensor:
    """softmax(x, dim=-1) computed in float32, returned in x's dtype."""
    return torch.softmax(x.float(), dim=-1).to(x.dtype)
