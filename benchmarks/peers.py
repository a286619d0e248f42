"""Peers for the examples: Liger-Kernel (pip ``liger-kernel``) behind the examples' own signatures.

Each adapter takes the op's arguments and returns what the op returns, so ``kernelgraft bench
--against benchmarks/peers.py:liger_rmsnorm`` (or ``peers=`` in Python) can time it beside the op
and check its output. Liger's forward functions are called directly (``torch.autograd.Function``
``.apply`` under ``torch.no_grad``), with the "gemma" casting mode where it has one: everything in
float32, cast back once, as the examples' references compute. ``PEERS`` maps each example op to
its adapters; ``available()`` says why none can run (Liger not installed).

Liger-Kernel 0.8.5 has RMSNorm, fused add + RMSNorm, SiLU-mul (SwiGLU) and softmax; it has no
GEMM, elementwise add+relu or FP8 cache scatter. The GEMM gets torch's own cuBLAS matmul as a peer.
"""

from __future__ import annotations

import torch

__all__ = ["PEERS", "available", "cublas_gemm", "liger_rmsnorm", "liger_rmsnorm_residual", "liger_softmax", "liger_swiglu"]


def available() -> str | None:
    """None when Liger-Kernel imports, else why not (the cuBLAS GEMM peer needs nothing)."""
    try:
        import liger_kernel  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"liger-kernel is not importable ({type(exc).__name__}: {exc}); pip install liger-kernel"
    return None


@torch.no_grad()
def liger_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """kgexamples::rmsnorm by Liger's RMSNorm (its block-of-rows kernel for narrow rows)."""
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    # offset 0, casting "gemma", in_place only matters for the backward
    return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "gemma", False)


@torch.no_grad()
def liger_rmsnorm_residual(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """kgexamples::rmsnorm_residual by Liger's fused add + RMSNorm: (normed, x + residual)."""
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

    out, summed = LigerFusedAddRMSNormFunction.apply(x, residual, weight, eps, 0.0, "gemma", False)
    return out, summed


@torch.no_grad()
def liger_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """kgexamples::swiglu by Liger's SiLU-mul: silu(gate) * up."""
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return LigerSiLUMulFunction.apply(gate, up)


@torch.no_grad()
def liger_softmax(x: torch.Tensor) -> torch.Tensor:
    """kgexamples::softmax by Liger's softmax over the last dimension."""
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    return LigerSoftmaxFunction.apply(x)


def cublas_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """kgexamples::gemm by torch's own bf16/fp16 matmul (cuBLAS), the GEMM a model calls: the
    example's reference upcasts to float32, which no model does."""
    return a @ b


for _fn in (liger_rmsnorm, liger_rmsnorm_residual, liger_swiglu, liger_softmax):
    _fn.peer_name = "liger"  # the label in bench reports
cublas_gemm.peer_name = "cublas"

PEERS = {
    "kgexamples::rmsnorm": [liger_rmsnorm],
    "kgexamples::rmsnorm_residual": [liger_rmsnorm_residual],
    "kgexamples::swiglu": [liger_swiglu],
    "kgexamples::softmax": [liger_softmax],
    "kgexamples::gemm": [cublas_gemm],
}
