"""The launch shared by the examples' elementwise CUDA C++ kernels (add_relu, swiglu)."""

from __future__ import annotations

import kernelgraft as kg


def launch_binary_cuda(x, y, out, *, BLOCK, ITEMS):
    """``kernel<T>(x, y, out, n)`` over ``x.numel()`` elements: BLOCK threads per block, each
    handling ITEMS elements BLOCK apart; ``T`` is the CUDA type of ``x``'s dtype."""
    n = x.numel()
    per_block = BLOCK * ITEMS
    return kg.Launch(
        grid=(n + per_block - 1) // per_block,
        block=BLOCK,
        args=(x, y, out, kg.driver.i64(n)),
        template={"T": kg.ctype(x.dtype)},
    )
