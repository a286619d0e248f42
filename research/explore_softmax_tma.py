"""Round 7: softmax over bf16[2048, 32768] with the Hopper bulk-copy (TMA) engine.

Round 6 (benchmarks/results/2026-11-30-h200-4/explore_round6.txt) showed the one-row-per-block
register kernel is bound by its access pattern, not its math: the same loads and stores with no
math at all (a burst of 16-byte loads per row, then a burst of stores) take 78.6 us, the softmax
76.4 us, an elementwise copy of the same bytes 68 us. These variants move each row with
``cp.async.bulk`` instead of per-thread loads and stores: one row per block in shared memory
(64 KiB, so three blocks per SM), loaded by bulk copies that complete on an mbarrier, normalised in
place, and written back by bulk copies (``STORE=1``) or by 16-byte streaming stores (``STORE=0``).
Checked against float32 torch.softmax before timing. Run on a GPU:
``python research/explore_softmax_tma.py``.

The kernel became the library's ``softmax_row_tma`` (this script now runs that one). The measured
run (explore_round7.txt) used it written for bf16 only, with ``__launch_bounds__(THREADS, 3)`` (a
register cap that did not bind: 32 registers); config labels there carry that ``MINB``.
"""

import json
import sys

import torch

import kernelgraft as kg
from kernelgraft.backends.cuda.jit import CudaRunner
from kernelgraft.examples import _softmax_cuda as C

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from softmax_explore import check_and_time  # noqa: E402

# The library's kernel over more configs (bulk-copy size, store path, threads).
TMA = kg.cuda(C._ROW_TMA_SOURCE, "softmax_row_tma<{T}, {THREADS}, {STORE}, {CHUNK}>",
              launch=C.launch_softmax_row_tma,
              configs=[{"THREADS": t, "STORE": st, "CHUNK": ch} for t in (256, 512) for st in (1, 0) for ch in (16384, 65536)]
              + [{"THREADS": 1024, "STORE": 1, "CHUNK": 16384}],
              min_capability=(9, 0))


def main():
    res = {}
    for rows, cols in ((2048, 32768), (4096, 16384)):
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        x[1, 100:] = float("-inf")
        out = torch.empty_like(x)
        for c in TMA.configs:
            r = CudaRunner(TMA, c)
            check_and_time(res, f"{rows}x{cols} tma {c.label()}", lambda r=r: r(x, out), x, out)
        r = CudaRunner(C.CUDA_ROW_REGS, C.CUDA_ROW_REGS.configs[0])
        check_and_time(res, f"{rows}x{cols} library row_regs {C.CUDA_ROW_REGS.configs[0].label()}",
                       lambda: r(x, out), x, out)
        y = torch.empty_like(x)
        check_and_time(res, f"{rows}x{cols} copy same bytes", lambda: y.copy_(x), x, y, check=False)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
