"""The softmax example's CUDA C++ kernels (NVRTC), for ``kernelgraft.examples.softmax``.

- ``CUDA``: one block per row, an online (max, sum) per thread merged across the block.
- ``CUDA_CLUSTER``: one Hopper thread-block cluster per row; each block holds a slice of the row in
  registers and the blocks exchange partial max and sum through distributed shared memory.
- ``CUDA_STREAM``: persistent blocks that walk rows through a ring of row buffers in shared memory,
  filled by ``cp.async`` ahead of the row being normalised (vocab-wide rows).
- ``CUDA_ROW_REGS``: one block per row, the whole row loaded into registers in
  one burst of 16-byte loads, several rows in flight per SM (vocab-wide rows; measured in
  benchmarks/results/2026-11-30-h200-4/explore_round5.txt).
- ``CUDA_ROW_TMA``: one block per row in shared memory, loaded by Hopper bulk copies (TMA) that
  complete on an mbarrier (vocab-wide rows; explore_round7.txt there).

All compute in float32 and return the input's dtype; a row that is all ``-inf``, or holds a NaN or
``+inf``, gives NaN throughout, as the reference does.
"""

from __future__ import annotations

import functools

import torch

import kernelgraft as kg
from ._cuda_sources import cuda_source


def _rows_cols(x):
    n_cols = x.shape[-1]
    return (x.numel() // n_cols if n_cols else 0), n_cols


def _nonempty(x):
    if x.dim() == 0 or x.shape[-1] == 0:
        return "x needs a non-empty last dimension"
    return None


def _fits_nonempty(x, **config):
    return _nonempty(x) or True


def _aligned16(t) -> bool:
    """16-byte aligned, for the kernels' vector loads. Fake tensors (an AOT trace) count as aligned:
    bundles check alignment at run time and fall back for a misaligned pointer."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor) or t.data_ptr() % 16 == 0


_CUDA_SOURCE = cuda_source("softmax_rows.cu")


def launch_softmax_cuda(x, out, *, THREADS):
    n_rows, n_cols = _rows_cols(x)
    return kg.Launch(grid=n_rows, block=THREADS, args=(x, out, kg.driver.i32(n_cols)),
                     template={"T": kg.ctype(x.dtype)})


CUDA = kg.cuda(
    _CUDA_SOURCE,
    "softmax_rows<{T}>",
    launch=launch_softmax_cuda,
    configs=[{"THREADS": 128}, {"THREADS": 256}, {"THREADS": 1024}],
    supports=_fits_nonempty,
)

# Shared by the cluster and streaming kernels: types, constants and a block-wide reduction.
_CUDA_PRELUDE = cuda_source("softmax_prelude.cuh")

_CLUSTER_PRIMITIVES = cuda_source("softmax_cluster_primitives.cuh")

_CLUSTER_SOURCE = _CUDA_PRELUDE + _CLUSTER_PRIMITIVES + cuda_source("softmax_cluster.cu")


def launch_softmax_cluster(x, out, *, CLUSTER, THREADS, CHUNKS, MIN_BLOCKS=1):
    n_rows, n_cols = _rows_cols(x)
    return kg.Launch(grid=n_rows * CLUSTER, block=THREADS, args=(x, out, kg.driver.i32(n_cols)),
                     template={"T": kg.ctype(x.dtype)})


def _fits_cluster(x, *, CLUSTER, THREADS, CHUNKS, MIN_BLOCKS=1):
    why = _nonempty(x)
    if why:
        return why
    vec = 16 // x.element_size()
    n_cols = x.shape[-1]
    if n_cols % (CLUSTER * vec):
        return f"rows of {n_cols} elements do not split into {CLUSTER} slices of 16-byte vectors"
    if n_cols > CLUSTER * THREADS * CHUNKS * vec:
        return f"rows of {n_cols} elements exceed this config's {CLUSTER * THREADS * CHUNKS * vec}"
    if n_cols < CLUSTER * THREADS * CHUNKS * vec // 2:
        return "rows this short leave half of this config's threads idle"
    if not _aligned16(x):
        return "x is not 16-byte aligned"
    return True


CUDA_CLUSTER = kg.cuda(
    _CLUSTER_SOURCE,
    "softmax_cluster<{T}, {CLUSTER}, {THREADS}, {CHUNKS}>",
    launch=launch_softmax_cluster,
    # 32K bf16 columns: 4 blocks of 256 threads x 32 elements, or 8 x 128 x 32, or 2 x 512 x 32
    configs=[{"CLUSTER": 4, "THREADS": 256, "CHUNKS": 4}, {"CLUSTER": 8, "THREADS": 128, "CHUNKS": 4},
             {"CLUSTER": 2, "THREADS": 512, "CHUNKS": 4}, {"CLUSTER": 2, "THREADS": 256, "CHUNKS": 2}],
    supports=_fits_cluster,
    min_capability=(9, 0),  # thread-block clusters and distributed shared memory
    name="softmax_cluster",
)

_STREAM_SOURCE = _CUDA_PRELUDE + cuda_source("softmax_stream.cu")

_SMEM_LIMIT = 227 * 1024  # Hopper's opt-in dynamic shared memory per block


def _sm_count(device: torch.device) -> int:
    if not torch.cuda.is_available():
        raise kg.UnsupportedError(
            "softmax_stream launches one block per SM of the device, which is not known without a "
            "GPU (so it is left out of bundles built on a CPU machine)")
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def launch_softmax_stream(x, out, *, THREADS, STAGES):
    n_rows, n_cols = _rows_cols(x)
    grid = min(n_rows, _sm_count(x.device))
    return kg.Launch(grid=grid, block=THREADS,
                     args=(x, out, kg.driver.i32(n_rows), kg.driver.i32(n_cols)),
                     shared_mem=STAGES * n_cols * x.element_size(), template={"T": kg.ctype(x.dtype)})


def _fits_stream(x, *, THREADS, STAGES):
    why = _nonempty(x)
    if why:
        return why
    n_cols = x.shape[-1]
    if n_cols % (16 // x.element_size()):
        return f"rows of {n_cols} elements are not whole 16-byte vectors"
    if STAGES * n_cols * x.element_size() > _SMEM_LIMIT:
        return f"{STAGES} rows of {n_cols} {x.dtype} elements exceed 227 KiB of shared memory"
    if n_cols < 8192:
        return "rows under 8192 elements: the one-pass kernels keep them in registers"
    if not _aligned16(x):
        return "x is not 16-byte aligned"
    return True


CUDA_STREAM = kg.cuda(
    _STREAM_SOURCE,
    "softmax_stream<{T}, {THREADS}, {STAGES}>",
    launch=launch_softmax_stream,
    configs=[{"THREADS": 1024, "STAGES": 3}, {"THREADS": 512, "STAGES": 3}, {"THREADS": 1024, "STAGES": 2}],
    supports=_fits_stream,
    min_capability=(8, 0),  # cp.async, and dynamic shared memory above 48 KiB
    name="softmax_stream",
)


_ROW_REGS_SOURCE = _STREAM_SOURCE + cuda_source("softmax_row_regs.cu")


def launch_softmax_row_regs(x, out, *, THREADS, CHUNKS, MINB):
    n_rows, n_cols = _rows_cols(x)
    return kg.Launch(grid=n_rows, block=THREADS, args=(x, out, kg.driver.i32(n_rows), kg.driver.i32(n_cols)),
                     template={"T": kg.ctype(x.dtype)})


def _fits_row_regs(x, *, THREADS, CHUNKS, MINB):
    why = _nonempty(x)
    if why:
        return why
    n_cols, vec = x.shape[-1], 16 // x.element_size()
    if n_cols % vec:
        return f"rows of {n_cols} elements are not whole 16-byte vectors"
    if n_cols > THREADS * CHUNKS * vec:
        return f"rows over {THREADS * CHUNKS * vec} {x.dtype} elements do not fit the registers of {THREADS} threads"
    if n_cols < 8192:
        return "rows under 8192 elements: the one-pass kernels keep them in registers"
    if not _aligned16(x):
        return "x is not 16-byte aligned"
    return True


CUDA_ROW_REGS = kg.cuda(
    _ROW_REGS_SOURCE,
    "softmax_row_direct<{T}, {THREADS}, {CHUNKS}, {MINB}>",
    launch=launch_softmax_row_regs,
    # rows up to 64 KiB (32768 2-byte elements); MINB rows in flight per SM (no spills at sm_90)
    configs=[{"THREADS": 256, "CHUNKS": 16, "MINB": 3}, {"THREADS": 512, "CHUNKS": 8, "MINB": 2},
             {"THREADS": 1024, "CHUNKS": 4, "MINB": 2}],
    supports=_fits_row_regs,
    min_capability=(8, 0),
    name="softmax_row_regs",
)


_ROW_TMA_SOURCE = _ROW_REGS_SOURCE + cuda_source("softmax_row_tma.cu")
_ROW_TMA_SMEM = _SMEM_LIMIT - 2048  # the row, under the opt-in limit less the static shared memory


def launch_softmax_row_tma(x, out, *, THREADS, STORE, CHUNK):
    n_rows, n_cols = _rows_cols(x)
    return kg.Launch(grid=n_rows, block=THREADS, shared_mem=n_cols * x.element_size(),
                     args=(x, out, kg.driver.i32(n_rows), kg.driver.i32(n_cols)), template={"T": kg.ctype(x.dtype)})


def _fits_row_tma(x, *, THREADS, STORE, CHUNK):
    why = _nonempty(x)
    if why:
        return why
    n_cols = x.shape[-1]
    if (n_cols * x.element_size()) % 16:
        return f"rows of {n_cols} {x.dtype} elements are not whole 16-byte vectors"
    if n_cols * x.element_size() > _ROW_TMA_SMEM:
        return f"a row of {n_cols} {x.dtype} elements exceeds the shared memory of a block"
    if n_cols < 8192:
        return "rows under 8192 elements: the one-pass kernels keep them in registers"
    if not _aligned16(x):
        return "x is not 16-byte aligned"
    return True


CUDA_ROW_TMA = kg.cuda(
    _ROW_TMA_SOURCE,
    "softmax_row_tma<{T}, {THREADS}, {STORE}, {CHUNK}>",
    launch=launch_softmax_row_tma,
    configs=[{"THREADS": 256, "STORE": 0, "CHUNK": 65536}, {"THREADS": 512, "STORE": 0, "CHUNK": 65536},
             {"THREADS": 256, "STORE": 1, "CHUNK": 65536}],
    supports=_fits_row_tma,
    min_capability=(9, 0),  # cp.async.bulk and mbarrier transaction counts
    name="softmax_row_tma",
)
