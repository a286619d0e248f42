"""CuTe DSL and cuTile kernels of the examples (add+relu, RMSNorm), importable only with the DSLs.

No ``from __future__ import annotations`` here: CuTe DSL reads parameter annotations as objects.

The example modules import this inside ``try`` and add the impls when it imports, so they still load
on machines without cuda-tile or nvidia-cutlass-dsl.
"""


import kernelgraft as kg

__all__ = ["CUTILE_IMPLS", "CUTEDSL_IMPLS"]

CUTILE_IMPLS: dict[str, object] = {}
CUTEDSL_IMPLS: dict[str, object] = {}


def _same_shape(x, y, **config):
    return True if x.shape == y.shape else f"shapes differ: {tuple(x.shape)} vs {tuple(y.shape)}"


def _rms_fits(x, weight, eps, **config):
    if weight.shape != x.shape[-1:]:
        return f"weight shape {tuple(weight.shape)} does not match x's last dim {x.shape[-1]}"
    limit = config.get("MAX_COLS", 65536)
    if x.shape[-1] > limit:
        return f"rows of {x.shape[-1]} elements exceed this config's limit of {limit}"
    return True


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# ---------------------------------------------------------------- cuTile
try:
    import cuda.tile as ct
except Exception:  # pragma: no cover - cuTile not installed
    ct = None

if ct is not None:

    @ct.kernel
    def _ct_add_relu(x, y, out, TILE: ct.Constant[int]):
        bid = ct.bid(0)
        a = ct.load(x, index=(bid,), shape=(TILE,), padding_mode=ct.PaddingMode.ZERO)
        b = ct.load(y, index=(bid,), shape=(TILE,), padding_mode=ct.PaddingMode.ZERO)
        s = a.astype(ct.float32) + b.astype(ct.float32)
        # relu as torch computes it: NaN and -0.0 pass through (ct.maximum drops NaN by default)
        ct.store(out, index=(bid,), tile=ct.where(s < 0.0, 0.0, s).astype(out.dtype))

    def launch_add_relu_cutile(x, y, out, *, TILE):
        n = x.numel()
        # cuTile arrays carry their shape; flat views keep one kernel for every rank.
        return (n + TILE - 1) // TILE, _ct_add_relu, (x.view(-1), y.view(-1), out.view(-1), TILE)

    CUTILE_IMPLS["add_relu"] = kg.cutile(
        launch_add_relu_cutile,
        configs=[{"TILE": 1024}, {"TILE": 4096}],
        supports=_same_shape,
    )

    @ct.kernel
    def _ct_rmsnorm(x, w, out, eps, BLOCK: ct.Constant[int]):
        row = ct.bid(0)
        xt = ct.load(x, index=(row, 0), shape=(1, BLOCK), padding_mode=ct.PaddingMode.ZERO)
        xt = xt.astype(ct.float32)
        wt = ct.load(w, index=(0,), shape=(BLOCK,), padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
        ms = ct.sum(xt * xt, axis=1, keepdims=True) / x.shape[1]
        y = xt * ct.rsqrt(ms + eps) * ct.reshape(wt, (1, BLOCK))
        ct.store(out, index=(row, 0), tile=y.astype(out.dtype))

    def launch_rmsnorm_cutile(x, weight, eps, out, *, MIN_BLOCK, MAX_COLS):
        cols = x.shape[-1]
        rows = x.numel() // cols if cols else 0
        block = max(MIN_BLOCK, _next_pow2(cols))
        return rows, _ct_rmsnorm, (x.view(rows, cols), weight, out.view(rows, cols), float(eps), block)

    CUTILE_IMPLS["rmsnorm"] = kg.cutile(
        launch_rmsnorm_cutile,
        configs=[{"MIN_BLOCK": 16, "MAX_COLS": 16384}],
        supports=_rms_fits,
    )


# ---------------------------------------------------------------- CuTe DSL
try:
    import cutlass
    import cutlass.cute as cute
    from cuda.bindings import driver as _cu
except Exception:  # pragma: no cover - CuTe DSL not installed
    cute = None

if cute is not None:

    @cute.kernel
    def _cute_add_relu_kernel(gX: cute.Tensor, gY: cute.Tensor, gO: cute.Tensor, n: cutlass.Int32,
                              BLOCK: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * BLOCK + tidx
        if i < n:
            s = gX[i].to(cutlass.Float32) + gY[i].to(cutlass.Float32)
            # relu as torch computes it: NaN and -0.0 pass through (fmax would turn NaN into 0)
            zero = cutlass.Float32(0.0)
            gO[i] = cutlass.Float32(zero if s < zero else s).to(gO.element_type)

    @cute.jit
    def _cute_add_relu(x: cute.Pointer, y: cute.Pointer, out: cute.Pointer, n: cutlass.Int32,
                       BLOCK: cutlass.Constexpr, stream: _cu.CUstream):
        layout = cute.make_layout(n)
        _cute_add_relu_kernel(
            cute.make_tensor(x, layout), cute.make_tensor(y, layout), cute.make_tensor(out, layout),
            n, BLOCK,
        ).launch(grid=((n + BLOCK - 1) // BLOCK, 1, 1), block=(BLOCK, 1, 1), stream=stream)

    def launch_add_relu_cutedsl(x, y, out, *, BLOCK):
        return _cute_add_relu, (x, y, out, x.numel(), BLOCK)

    def _fits_int32(x, y, **config):
        return True if x.numel() < 2**31 else "more than 2**31 elements"

    CUTEDSL_IMPLS["add_relu"] = kg.cutedsl(
        launch_add_relu_cutedsl,
        configs=[{"BLOCK": 256}, {"BLOCK": 512}],
        supports=lambda x, y, **c: _same_shape(x, y) if x.shape != y.shape else _fits_int32(x, y),
    )

    @cute.kernel
    def _cute_rmsnorm_kernel(gX: cute.Tensor, gW: cute.Tensor, gO: cute.Tensor, n_cols: cutlass.Int32,
                             eps: cutlass.Float32, THREADS: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        acc = cutlass.Float32(0.0)
        for c in cutlass.range(tidx, n_cols, THREADS):
            v = gX[row, c].to(cutlass.Float32)
            acc += v * v
        acc = cute.arch.warp_reduction_sum(acc)
        partial = cute.make_tensor(cute.arch.alloc_smem(cutlass.Float32, 32), cute.make_layout(32))
        warp = cute.arch.warp_idx()
        lane = cute.arch.lane_idx()
        if lane == 0:
            partial[warp] = acc
        cute.arch.sync_threads()
        total = cutlass.Float32(0.0)
        if lane < THREADS // 32:
            total = partial[lane]
        total = cute.arch.warp_reduction_sum(total)
        rstd = cute.math.rsqrt(total / n_cols.to(cutlass.Float32) + eps)
        for c in cutlass.range(tidx, n_cols, THREADS):
            y = gX[row, c].to(cutlass.Float32) * rstd * gW[c].to(cutlass.Float32)
            gO[row, c] = y.to(gO.element_type)

    @cute.jit
    def _cute_rmsnorm(x: cute.Pointer, w: cute.Pointer, out: cute.Pointer, rows: cutlass.Int32,
                      n_cols: cutlass.Int32, eps: cutlass.Float32, THREADS: cutlass.Constexpr,
                      stream: _cu.CUstream):
        layout = cute.make_layout((rows, n_cols), stride=(n_cols, 1))
        _cute_rmsnorm_kernel(
            cute.make_tensor(x, layout), cute.make_tensor(w, cute.make_layout(n_cols)),
            cute.make_tensor(out, layout), n_cols, eps, THREADS,
        ).launch(grid=(rows, 1, 1), block=(THREADS, 1, 1), stream=stream)

    def launch_rmsnorm_cutedsl(x, weight, eps, out, *, THREADS):
        cols = x.shape[-1]
        rows = x.numel() // cols if cols else 0
        return _cute_rmsnorm, (x, weight, out, rows, cols, float(eps), THREADS)

    CUTEDSL_IMPLS["rmsnorm"] = kg.cutedsl(
        launch_rmsnorm_cutedsl,
        configs=[{"THREADS": 128}, {"THREADS": 256}, {"THREADS": 1024}],
        supports=_rms_fits,
    )
