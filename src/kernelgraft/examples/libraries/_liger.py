"""Liger-Kernel's Triton kernels as ``kg.triton`` launches: each launch calls the library's own
``@triton.jit`` kernel with the launch settings its Python function picks (``calculate_settings``:
the block is the row's next power of two, the warps by block size), on outputs kernelgraft
allocated. Where Liger picks between two kernels by a size heuristic (RMSNorm's row and
block-of-rows kernels), both are candidates and the tuner picks per shape.

RMSNorm runs in Liger's "gemma" casting mode (everything in float32, cast back once), as the
references compute; its kernels store each row's 1/rms, which these ops return. Liger's RMSNorm
kernels call libdevice's ``rsqrt`` and convert scalar arguments with ``.to``, neither of which
Triton's CPU interpreter runs: on CPU tensors under ``TRITON_INTERPRET=1`` they say so and stay
out (``kernelgraft aot`` and a GPU run them).
"""

from __future__ import annotations

import os

import torch

import kernelgraft as kg

from ._sources import library, unavailable

__all__ = ["LIGER", "REASON", "rmsnorm_row", "rmsnorm_block", "add_rmsnorm", "softmax_single", "softmax_multi",
           "swiglu", "rope"]

LIGER, REASON = library("liger-kernel")
_GEMMA = 1  # Liger's _CASTING_MODE_GEMMA
# What in a kernel Triton's CPU interpreter (3.9) does not run; such a kernel stays out on CPU tensors
# under TRITON_INTERPRET=1 (kernelgraft aot compiles it, a GPU runs it)
_NO_INTERPRETER = {
    "rmsnorm": "calls libdevice's rsqrt and converts float arguments with .to, which the interpreter does not run",
    "softmax_multi": "calls tl.float32(...) as a constructor, which the interpreter does not run",
    "swiglu": "converts a float argument with .to, which the interpreter does not run",
    "rope": "gets NaN from the interpreter's bfloat16 arithmetic (float16 and float32 match)",
}


def _rows(x) -> tuple[int, int]:
    cols = x.shape[-1] if x.dim() else 1
    return (x.numel() // cols if cols else 0), cols


def _width(cols: int) -> str | None:
    if cols > 65536:
        return f"rows of {cols} elements: Liger's kernels hold one row in one block of at most 65536"
    return None


def _interpreted(x, kernel: str) -> str | None:
    if x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return f"Liger's {kernel} kernel {_NO_INTERPRETER[kernel]}: Triton's CPU interpreter cannot check it"
    return None


if LIGER is not None:
    import triton
    import triton.language as tl
    from liger_kernel.ops.fused_add_rms_norm import _fused_add_rms_norm_forward_kernel
    from liger_kernel.ops.rms_norm import _block_rms_norm_forward_kernel, _rms_norm_forward_kernel
    from liger_kernel.ops.rope import _triton_rope
    from liger_kernel.ops.softmax import _softmax_multi_block_forward_kernel, _softmax_single_block_forward_kernel
    from liger_kernel.ops.swiglu import _swiglu_forward_kernel
    from liger_kernel.ops.utils import calculate_settings

    def launch_liger_rmsnorm(x, weight, eps, out, rstd):
        rows, cols = _rows(x)
        block, warps = calculate_settings(cols)
        _rms_norm_forward_kernel[(rows,)](
            out, cols, x, cols, weight, 1, rstd, 1, cols, eps, 0.0, _GEMMA,
            elementwise_affine=True, BLOCK_SIZE=block, num_warps=warps,
        )

    def launch_liger_rmsnorm_block(x, weight, eps, out, rstd, *, BLOCK_ROW):
        rows, cols = _rows(x)
        block, warps = calculate_settings(cols)
        _block_rms_norm_forward_kernel[(triton.cdiv(rows, BLOCK_ROW),)](
            out, cols, x, cols, weight, 1, rstd, 1, rows, cols, eps, 0.0, _GEMMA,
            elementwise_affine=True, BLOCK_SIZE=block, BLOCK_ROW=BLOCK_ROW, num_warps=warps,
        )

    def launch_liger_add_rmsnorm(x, residual, weight, eps, out, summed, rstd):
        rows, cols = _rows(x)
        block, warps = calculate_settings(cols)
        _fused_add_rms_norm_forward_kernel[(rows,)](
            out, cols, summed, cols, x, cols, residual, cols, weight, 1, rstd, 1, cols, eps, 0.0, _GEMMA,
            BLOCK_SIZE=block, num_warps=warps,
        )

    def launch_liger_softmax(x, out):
        rows, cols = _rows(x)
        block, warps = calculate_settings(cols)
        _softmax_single_block_forward_kernel[(rows,)](out, cols, x, cols, cols, BLOCK_SIZE=block, num_warps=warps)

    def launch_liger_softmax_multi(x, out):
        rows, cols = _rows(x)
        block, warps = calculate_settings(cols)
        _softmax_multi_block_forward_kernel[(rows,)](out, cols, x, cols, cols, BLOCK_SIZE=block, num_warps=warps)

    def launch_liger_swiglu(gate, up, out):
        rows, cols = _rows(gate)
        block, warps = calculate_settings(cols)
        _swiglu_forward_kernel[(rows,)](gate, up, out, cols, 1.0, n_cols=cols, BLOCK_SIZE=block, num_warps=warps)

    def launch_liger_rope(q, k, cos, sin):
        # q (batch, seq, q_heads, head_dim), k (batch, seq, kv_heads, head_dim), rotated in place as
        # Liger's rope_forward does on the same memory; cos/sin (1 or batch, seq, head_dim)
        batch, seq, q_heads, dim = q.shape
        kv_heads = k.shape[2]
        pad_q, pad_k = triton.next_power_of_2(q_heads), triton.next_power_of_2(kv_heads)
        pad_d = triton.next_power_of_2(dim)
        _triton_rope[(batch * seq,)](
            q, q_heads * dim, k, kv_heads * dim, cos, dim, sin, dim, seq, batch, cos.shape[0], q_heads, kv_heads,
            dim, pad_q, pad_k, pad_d, pad_d, dim, BLOCK_SIZE=max(pad_q, pad_k),
        )

    def _rms_fits(x, weight, eps, **config):
        if weight.shape != x.shape[-1:]:
            return f"weight shape {tuple(weight.shape)} does not match x's last dim {x.shape[-1]}"
        return _interpreted(x, "rmsnorm") or _width(_rows(x)[1]) or True

    def _add_rms_fits(x, residual, weight, eps, **config):
        if residual.shape != x.shape or residual.dtype != x.dtype:
            return "residual differs from x in shape or dtype"
        return _rms_fits(x, weight, eps)

    def _row_fits(x, *rest, **config):
        return _width(_rows(x)[1]) or True

    def _multi_fits(x, **config):
        if not callable(tl.float32):  # Liger writes tl.float32(-inf); Triton 3.9's dtypes are not callable
            return (f"Liger's softmax_multi kernel calls tl.float32(...) as a constructor, which Triton "
                    f"{triton.__version__} does not compile (its dtypes are not callable)")
        return _interpreted(x, "softmax_multi") or _row_fits(x)

    def _swiglu_fits(gate, up, **config):
        if gate.shape != up.shape or gate.dtype != up.dtype:
            return "gate and up differ in shape or dtype"
        return _interpreted(gate, "swiglu") or _row_fits(gate)

    def _rope_fits(q, k, cos, sin, **config):
        if q.dim() != 4 or k.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
            return "q and k must be (batch, seq, heads, head_dim) with one batch, seq and head_dim"
        want = (q.shape[1], q.shape[3])
        if cos.dim() != 3 or cos.shape != sin.shape or tuple(cos.shape[1:]) != want or cos.shape[0] not in (1, q.shape[0]):
            return f"cos and sin must be (1 or batch, seq, head_dim) = (.., {want[0]}, {want[1]})"
        if q.shape[3] % 2:  # Liger rotates the halves [0, d/2) and [d/2, 2*(d/2)): an odd last element is left out
            return f"Liger's rope kernel rotates two halves of head_dim; head_dim {q.shape[3]} is odd"
        if q.dtype == torch.bfloat16:
            return _interpreted(q, "rope") or True
        return True

    rmsnorm_row = kg.triton(launch_liger_rmsnorm, supports=_rms_fits, name="liger_rmsnorm")
    rmsnorm_block = kg.triton(launch_liger_rmsnorm_block, configs=[{"BLOCK_ROW": 16}], supports=_rms_fits,
                              name="liger_rmsnorm_block")
    add_rmsnorm = kg.triton(launch_liger_add_rmsnorm, supports=_add_rms_fits, name="liger_add_rmsnorm")
    softmax_single = kg.triton(launch_liger_softmax, supports=_row_fits, name="liger_softmax")
    softmax_multi = kg.triton(launch_liger_softmax_multi, supports=_multi_fits, name="liger_softmax_multi")
    swiglu = kg.triton(launch_liger_swiglu, supports=_swiglu_fits, name="liger_swiglu")
    rope = kg.triton(launch_liger_rope, supports=_rope_fits, name="liger_rope")
else:
    def _missing(*args, **config):
        raise kg.KernelgraftError(REASON)

    rmsnorm_row, rmsnorm_block, add_rmsnorm, softmax_single, softmax_multi, swiglu, rope = (
        kg.triton(_missing, supports=unavailable(REASON), name=name)
        for name in ("liger_rmsnorm", "liger_rmsnorm_block", "liger_add_rmsnorm", "liger_softmax",
                     "liger_softmax_multi", "liger_swiglu", "liger_rope")
    )
