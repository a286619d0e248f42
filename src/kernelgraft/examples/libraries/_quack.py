"""quack-kernels' CuTe DSL kernels (RMSNorm, softmax, cross-entropy forward) as ``kg.cutedsl``
launches.

quack compiles each kernel class (``RMSNorm(dtype, N)`` ...) with ``cute.compile`` on fake tensors
and calls it through TVM-FFI. Here a ``@cute.jit`` host function takes kernelgraft's raw pointers
and sizes, builds the row-major tensors quack's ``__call__`` takes (N, the row length, a
``cutlass.Constexpr`` as quack compiles it) and calls that ``__call__``: the same kernel class,
traced into kernelgraft's own compile, cache, native replay and bundles. The kernels move 16-byte
vectors, so every tensor must start on a 16-byte boundary (``supports`` says so otherwise).

No ``from __future__ import annotations``: CuTe DSL reads parameter annotations as objects.
"""

import kernelgraft as kg

from ._sources import library, unavailable

__all__ = ["QUACK", "REASON", "rmsnorm", "softmax", "cross_entropy"]

QUACK, REASON = library("quack-kernels")
_FLOATS = ("torch.float32", "torch.float16", "torch.bfloat16")


def _aligned(**tensors) -> str | None:
    # on the GPU, where they run; a bundle checks 16-byte alignment per call itself
    for name, t in tensors.items():
        if t.is_cuda and t.data_ptr() % 16:
            return f"{name} does not start on a 16-byte boundary (quack's kernels move 16-byte vectors)"
    return None


def _rows(x) -> tuple[int, int]:
    cols = x.shape[-1] if x.dim() else 1
    return (x.numel() // cols if cols else 0), cols


def _fits(x, **tensors) -> str | None:
    rows, cols = _rows(x)
    if rows == 0 or cols == 0:
        return "no rows to normalize: nothing to launch"
    if rows >= 2**31:
        return "2**31 rows or more"
    for name, t in tensors.items():
        if str(t.dtype) not in _FLOATS:
            return f"{name} is {t.dtype}; quack's kernels take float32, float16 and bfloat16"
    return _aligned(x=x, **tensors)


if QUACK is not None:
    import cutlass
    import cutlass.cute as cute
    from cuda.bindings import driver as _cu
    from quack.cross_entropy import CrossEntropy
    from quack.rmsnorm import RMSNorm
    from quack.softmax import Softmax

    @cute.jit
    def _rmsnorm_host(x: cute.Pointer, w: cute.Pointer, out: cute.Pointer, rstd: cute.Pointer,
                      res: cute.Pointer, res_out: cute.Pointer, rows: cutlass.Int32, eps: cutlass.Float32,
                      N: cutlass.Constexpr, RESIDUAL: cutlass.Constexpr, stream: _cu.CUstream):
        # quack's _rmsnorm_fwd: x (rows, N), weight (N,), rstd (rows,), residual in and out (rows, N)
        rows_n = cute.make_layout((rows, N), stride=(N, 1))
        mRes, mResO = None, None
        if cutlass.const_expr(RESIDUAL):
            mRes, mResO = cute.make_tensor(res, rows_n), cute.make_tensor(res_out, rows_n)
        RMSNorm(x.dtype, N)(
            cute.make_tensor(x, rows_n), cute.make_tensor(w, cute.make_layout((N,), stride=(1,))), None, mRes,
            cute.make_tensor(out, rows_n), mResO, cute.make_tensor(rstd, cute.make_layout((rows,), stride=(1,))),
            None, eps, stream,
        )

    @cute.jit
    def _softmax_host(x: cute.Pointer, out: cute.Pointer, rows: cutlass.Int32, N: cutlass.Constexpr,
                      stream: _cu.CUstream):
        rows_n = cute.make_layout((rows, N), stride=(N, 1))
        Softmax(x.dtype, N)(cute.make_tensor(x, rows_n), cute.make_tensor(out, rows_n), stream)

    @cute.jit
    def _cross_entropy_host(x: cute.Pointer, target: cute.Pointer, loss: cute.Pointer, rows: cutlass.Int32,
                            ignore_index: cutlass.Int32, N: cutlass.Constexpr, stream: _cu.CUstream):
        # quack's cross_entropy_fwd_out without lse, dx, weights or a separate target logit
        per_row = cute.make_layout((rows,), stride=(1,))
        CrossEntropy(x.dtype, N)(
            cute.make_tensor(x, cute.make_layout((rows, N), stride=(N, 1))), cute.make_tensor(target, per_row),
            None, cute.make_tensor(loss, per_row), None, None, None, ignore_index, stream,
        )

    def _vectors(x):
        # quack's softmax and cross-entropy move rows in 16-byte vectors with no remainder path
        if x.shape[-1] % (16 // x.element_size()):
            return (f"rows of {x.shape[-1]} elements are not whole 16-byte vectors of {x.dtype} "
                    "(quack's softmax and cross-entropy need that)")
        return None

    def launch_quack_rmsnorm(x, weight, eps, out, rstd):
        rows, cols = _rows(x)
        return _rmsnorm_host, (x, weight, out, rstd, x, out, rows, float(eps), cols, False)

    def launch_quack_add_rmsnorm(x, residual, weight, eps, out, summed, rstd):
        rows, cols = _rows(x)
        return _rmsnorm_host, (x, weight, out, rstd, residual, summed, rows, float(eps), cols, True)

    def launch_quack_softmax(x, out):
        rows, cols = _rows(x)
        return _softmax_host, (x, out, rows, cols)

    def launch_quack_cross_entropy(logits, target, loss):
        rows, cols = logits.shape
        return _cross_entropy_host, (logits, target, loss, rows, -100, cols)

    def _rmsnorm_fits(x, weight, eps, **config):
        if weight.shape != x.shape[-1:]:
            return f"weight shape {tuple(weight.shape)} does not match x's last dim {x.shape[-1]}"
        return _fits(x, weight=weight) or True

    def _add_rmsnorm_fits(x, residual, weight, eps, **config):
        if residual.shape != x.shape or residual.dtype != x.dtype:
            return "residual differs from x in shape or dtype"
        return _fits(x, residual=residual) or _rmsnorm_fits(x, weight, eps)

    def _ce_fits(logits, target, **config):
        if str(target.dtype) not in ("torch.int64", "torch.int32"):
            return f"target is {target.dtype}; quack's cross-entropy takes int32 and int64 class indices"
        return _fits(logits) or _vectors(logits) or True

    rmsnorm = kg.cutedsl(launch_quack_rmsnorm, supports=_rmsnorm_fits, name="quack_rmsnorm")
    add_rmsnorm = kg.cutedsl(launch_quack_add_rmsnorm, supports=_add_rmsnorm_fits, name="quack_add_rmsnorm")
    softmax = kg.cutedsl(launch_quack_softmax, supports=lambda x, **c: _fits(x) or _vectors(x) or True,
                         name="quack_softmax")
    cross_entropy = kg.cutedsl(launch_quack_cross_entropy, supports=_ce_fits, name="quack_cross_entropy")
else:
    def _missing(*args, **config):
        raise kg.KernelgraftError(REASON)

    rmsnorm = kg.cutedsl(_missing, supports=unavailable(REASON), name="quack_rmsnorm")
    add_rmsnorm = kg.cutedsl(_missing, supports=unavailable(REASON), name="quack_add_rmsnorm")
    softmax = kg.cutedsl(_missing, supports=unavailable(REASON), name="quack_softmax")
    cross_entropy = kg.cutedsl(_missing, supports=unavailable(REASON), name="quack_cross_entropy")
