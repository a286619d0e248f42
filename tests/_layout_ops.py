"""Ops of tests/integration/test_aot_layouts.py (also a ``kernelgraft aot`` target): kernels that take strides.

- ``kglayout::scatter_rows(x, cache, slot_mapping)``: ``cache[slot_mapping[i]] = x[i]`` for every
  token ``i`` whose slot is in range (-1 pads and writes nothing), mutating ``cache``. Two Triton
  candidates: ``scatter_dense`` assumes every tensor contiguous (``contiguous=True``) and comes
  first; ``scatter_strided`` takes every stride (``contiguous=False``), so a cache that is a strided
  view (interleaved K/V: ``kv[:, 0, :]``) is written in place.
- ``kglayout::rope(q, cos, sin)``: rotary embedding (rotate-half form) of ``q`` ``[B, H, T, D]``
  with ``cos``/``sin`` ``[T, D/2]``; the kernel takes ``q``'s strides (a transposed q, as HF Llama
  passes it, reaches it without a copy) and needs ``cos`` and ``sin`` contiguous.
- ``kglayout::copy_first(x)``: ``x * 2`` whose launch copies a strided ``x`` into a contiguous
  tensor first: that copy is no input of the op, so a bundle cannot serve strided calls of it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernelgraft as kg

# ------------------------------------------------------------------ scatter_rows


@triton.jit
def _scatter_dense_kernel(x_ptr, cache_ptr, slot_ptr, n_slots, D, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    offs = tl.arange(0, BLOCK)
    mask = (offs < D) & (slot >= 0) & (slot < n_slots)
    v = tl.load(x_ptr + t * D + offs, mask=mask)
    tl.store(cache_ptr + slot * D + offs, v, mask=mask)


@triton.jit
def _scatter_strided_kernel(x_ptr, cache_ptr, slot_ptr, n_slots, D, sx0, sx1, sc0, sc1, ss0,
                            BLOCK: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t * ss0)
    offs = tl.arange(0, BLOCK)
    mask = (offs < D) & (slot >= 0) & (slot < n_slots)
    v = tl.load(x_ptr + t * sx0 + offs * sx1, mask=mask)
    tl.store(cache_ptr + slot * sc0 + offs * sc1, v, mask=mask)


def scatter_dense(x, cache, slot_mapping, *, BLOCK):
    _scatter_dense_kernel[(x.shape[0],)](x, cache, slot_mapping, cache.shape[0], x.shape[1], BLOCK=BLOCK)


def scatter_strided(x, cache, slot_mapping, *, BLOCK):
    _scatter_strided_kernel[(x.shape[0],)](
        x, cache, slot_mapping, cache.shape[0], x.shape[1], x.stride(0), x.stride(1),
        cache.stride(0), cache.stride(1), slot_mapping.stride(0), BLOCK=BLOCK)


def _fits(x, cache, slot_mapping, **config):
    return x.shape[1] <= config["BLOCK"] or f"rows of {x.shape[1]} > BLOCK {config['BLOCK']}"


def scatter_inputs(device: str = "cpu"):
    """A contiguous cache, and the K half of an interleaved K/V cache (``kv[:, 0, :]``)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 16, generator=g)
    slots = torch.tensor([3, -1, 0, 6, 2])
    yield x.to(device), torch.randn(8, 16, generator=g).to(device), slots.to(device)
    kv = torch.randn(8, 2, 16, generator=g).to(device)
    yield x.to(device), kv[:, 0, :], slots.to(device)


@kg.op("kglayout::scatter_rows", mutates_args=("cache",), sample_inputs=scatter_inputs, impls=[
    kg.triton(scatter_dense, configs=[{"BLOCK": 16}], supports=_fits, contiguous=True),
    kg.triton(scatter_strided, configs=[{"BLOCK": 16}], supports=_fits, contiguous=False),
])
def scatter_rows(x: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """cache[slot_mapping[i]] = x[i] where 0 <= slot_mapping[i] < cache.shape[0]."""
    keep = (slot_mapping >= 0) & (slot_mapping < cache.shape[0])
    cache[slot_mapping[keep]] = x[keep].to(cache.dtype)


scatter_rows.register_meta(lambda x, cache, slot_mapping: None)

# ------------------------------------------------------------------ rope


@triton.jit
def _rope_kernel(q_ptr, cos_ptr, sin_ptr, out_ptr, H, T, HALF, sq0, sq1, sq2, sq3, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    t = row % T
    h = (row // T) % H
    b = row // (T * H)
    offs = tl.arange(0, BLOCK)
    m = offs < HALF
    base = q_ptr + b * sq0 + h * sq1 + t * sq2
    q1 = tl.load(base + offs * sq3, mask=m).to(tl.float32)
    q2 = tl.load(base + (offs + HALF) * sq3, mask=m).to(tl.float32)
    c = tl.load(cos_ptr + t * HALF + offs, mask=m).to(tl.float32)
    s = tl.load(sin_ptr + t * HALF + offs, mask=m).to(tl.float32)
    o = out_ptr + row * 2 * HALF
    tl.store(o + offs, (q1 * c - q2 * s).to(out_ptr.dtype.element_ty), mask=m)
    tl.store(o + HALF + offs, (q2 * c + q1 * s).to(out_ptr.dtype.element_ty), mask=m)


def rope_strided(q, cos, sin, out, *, BLOCK):
    B, H, T, D = q.shape
    _rope_kernel[(B * H * T,)](q, cos, sin, out, H, T, D // 2, q.stride(0), q.stride(1), q.stride(2),
                               q.stride(3), BLOCK=BLOCK)


def _rope_fits(q, cos, sin, **config):
    return q.shape[3] // 2 <= config["BLOCK"] and q.shape[3] % 2 == 0


def rope_inputs(device: str = "cpu"):
    """A contiguous q, a transposed one (``[B, T, H, D].transpose(1, 2)``, as HF Llama has it), and
    a strided ``cos``, which the kernel declines (it needs ``cos`` contiguous): no kernel serves it."""
    g = torch.Generator().manual_seed(1)
    cos, sin = torch.randn(5, 8, generator=g).to(device), torch.randn(5, 8, generator=g).to(device)
    yield torch.randn(2, 3, 5, 16, generator=g).to(device), cos, sin
    yield torch.randn(2, 5, 3, 16, generator=g).to(device).transpose(1, 2), cos, sin
    yield torch.randn(2, 3, 5, 16, generator=g).to(device), torch.randn(5, 16, generator=g).to(device)[:, ::2], sin


@kg.op("kglayout::rope", sample_inputs=rope_inputs, impls=[
    kg.triton(rope_strided, configs=[{"BLOCK": 8}], supports=_rope_fits, contiguous=("cos", "sin")),
])
def rope(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """q * cos + rotate_half(q) * sin, on the last dimension."""
    half = q.shape[-1] // 2
    q1, q2 = q[..., :half], q[..., half:]
    return torch.cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin], dim=-1)

# ------------------------------------------------------------------ copy_first


@triton.jit
def _double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)


def double_copying(x, out, *, BLOCK):
    if not x.is_contiguous():
        x = x.contiguous()  # a tensor the op never sees: no bundle can hand it to the kernel
    _double_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)


def double_inputs(device: str = "cpu"):
    yield (torch.randn(4, 8).to(device),)


@kg.op("kglayout::copy_first", sample_inputs=double_inputs, impls=[
    kg.triton(double_copying, configs=[{"BLOCK": 64}], contiguous=False),
])
def copy_first(x: torch.Tensor) -> torch.Tensor:
    """x * 2."""
    return x * 2
