"""Ops with kernels that are right on their samples and wrong on what the samples do not show, as a
user writes them: real Triton kernels (the interpreter runs them on the CPU). Imported by the
tests, and given to ``kernelgraft check`` as a file."""

import torch
import triton
import triton.language as tl

import kernelgraft as kg


# ------------------------------------------------------------------------------ RoPE
@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, H, sxr, sxc, scr, scc, ssr, ssc, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x1 = tl.load(x_ptr + row * sxr + cols * sxc, mask=mask)
    x2 = tl.load(x_ptr + row * sxr + (cols + H) * sxc, mask=mask)
    c = tl.load(cos_ptr + row * scr + cols * scc, mask=mask)
    s = tl.load(sin_ptr + row * ssr + cols * ssc, mask=mask)
    out = out_ptr + row * 2 * H + cols
    tl.store(out, x1 * c - x2 * s, mask=mask)
    tl.store(out + H, x2 * c + x1 * s, mask=mask)


def launch_rope(x, cos, sin, out, *, BLOCK):
    """Right for every call the reference takes: broadcast inputs are read through stride 0."""
    rows, width = out.shape
    x, cos, sin = x.expand(rows, width), cos.expand(rows, width // 2), sin.expand(rows, width // 2)
    _rope_kernel[(rows,)](x, cos, sin, out, width // 2, *x.stride(), *cos.stride(), *sin.stride(), BLOCK=BLOCK)


def launch_rope_rows(x, cos, sin, out, *, BLOCK):
    """The bug: every input is taken to have a row per output row (a broadcast one reads past its end)."""
    rows, width = out.shape
    _rope_kernel[(rows,)](x, cos, sin, out, width // 2, width, 1, width // 2, 1, width // 2, 1, BLOCK=BLOCK)


def rope_samples(device="cpu"):
    for rows, width in ((8, 64), (5, 16)):
        yield (torch.randn(rows, width, device=device), torch.randn(rows, width // 2, device=device),
               torch.randn(rows, width // 2, device=device))


def _rope_reference(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _same_rows(x, cos, sin, **config):
    return (x.dim() == cos.dim() == sin.dim() == 2 and x.shape[0] == cos.shape[0] == sin.shape[0]) or \
        "every input needs its own rows"


@kg.op("kgderive::rope", sample_inputs=rope_samples, impls=[
    kg.triton(launch_rope, configs=[{"BLOCK": 32}], contiguous=False),
    kg.triton(launch_rope_rows, configs=[{"BLOCK": 32}]),
])
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return _rope_reference(x, cos, sin)


@kg.op("kgderive::rope_declared", sample_inputs=rope_samples, impls=[
    kg.triton(launch_rope_rows, configs=[{"BLOCK": 32}], supports=_same_rows),
])
def rope_declared(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The same kernel, refusing through supports what it cannot take."""
    return _rope_reference(x, cos, sin)


# ------------------------------------------------------------------------------ an unmasked store
@triton.jit
def _row_double(x_ptr, out_ptr, cols_n, MASKED: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < cols_n
    x = tl.load(x_ptr + row * cols_n + cols, mask=mask, other=0.0)
    if MASKED:
        tl.store(out_ptr + row * cols_n + cols, x * 2.0, mask=mask)
    else:
        tl.store(out_ptr + row * cols_n + cols, x * 2.0)  # the bug: no column mask


def launch_row_double(x, out, *, BLOCK, MASKED):
    _row_double[(x.shape[0],)](x, out, x.shape[1], MASKED=MASKED, BLOCK=BLOCK)


def row_samples(device="cpu"):
    yield (torch.randn(4, 50, device=device),)
    yield (torch.randn(3, 100, device=device),)


@kg.op("kgguard::row_double", sample_inputs=row_samples, impls=[kg.triton(
    launch_row_double,
    configs=[{"BLOCK": 128, "MASKED": 1}, {"BLOCK": 128, "MASKED": 0}, {"BLOCK": 256, "MASKED": 0}],
    supports=lambda x, **c: x.shape[1] <= c["BLOCK"] or "more columns than BLOCK")])
def row_double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


# ------------------------------------------------------------------------------ a written input
@triton.jit
def _append(cache_ptr, k_ptr, slot_ptr, width, ZERO: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    k = tl.load(k_ptr + t * width + cols, mask=mask)
    tl.store(cache_ptr + slot * width + cols, k, mask=mask)
    if ZERO:
        tl.store(k_ptr + t * width + cols, tl.zeros_like(k), mask=mask)  # the bug: k is not the op's to write


def launch_append(k_cache, k, slots, *, BLOCK, ZERO):
    _append[(k.shape[0],)](k_cache, k, slots, k[0].numel(), ZERO=ZERO, BLOCK=BLOCK)


def append_samples(device="cpu"):
    for slots_n, tokens, heads, dim in ((16, 5, 2, 8), (32, 7, 4, 4)):
        yield (torch.randn(slots_n, heads, dim, device=device), torch.randn(tokens, heads, dim, device=device),
               torch.randperm(slots_n, device=device)[:tokens])


GOOD_APPEND = {"BLOCK": 32, "ZERO": 0}
ZEROING_APPEND = {"BLOCK": 32, "ZERO": 1}


def append_op(name, *configs):
    @kg.op(name, mutates_args=("k_cache",), sample_inputs=append_samples,
           impls=[kg.triton(launch_append, configs=list(configs),
                            supports=lambda k_cache, k, slots, **c: k[0].numel() <= c["BLOCK"] or "too wide")])
    def append(k_cache: torch.Tensor, k: torch.Tensor, slots: torch.Tensor) -> None:
        k_cache.index_copy_(0, slots, k)

    return append


zeroing_alone = append_op("kgguard::zeroing_alone", ZEROING_APPEND)
zeroing_first = append_op("kgguard::zeroing_first", ZEROING_APPEND, GOOD_APPEND)
zeroing_second = append_op("kgguard::zeroing_second", GOOD_APPEND, ZEROING_APPEND)


# ------------------------------------------------------------------------------ a written input, no mutation declared
@triton.jit
def _double_then_zero(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * 2.0, mask=mask)
    tl.store(x_ptr + offs, tl.zeros_like(x), mask=mask)  # the bug: x is not the op's to write


def launch_double_then_zero(x, out, *, BLOCK):
    _double_then_zero[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)


@kg.op("kgguard::double_zeroing", impls=[kg.triton(launch_double_then_zero, configs=[{"BLOCK": 64}])])
def double_zeroing(x: torch.Tensor) -> torch.Tensor:
    return x * 2
