"""Build the cuTile cubins the examples and the benchmarks need, on a machine without a GPU.

The GPU machine cannot run tileiras (no ptxas/libnvvm there), so its cuTile candidates run from
these cubins: carry the output folder and point ``KERNELGRAFT_CUTILE_CUBINS`` at it.

    python benchmarks/build_cutile_cubins.py --out .carry/cutile_cubins [--arch sm_90]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from kernelgraft.backends.cutile import jit as _cutile


def _rmsnorm_bench_inputs():
    from bench_rmsnorm_backends import SHAPES  # same folder

    for rows, cols in SHAPES:
        for dt in (torch.float16, torch.bfloat16, torch.float32):
            yield torch.empty(rows, cols, dtype=dt), torch.empty(cols, dtype=dt), 1e-6


def _add_relu_bench_inputs():
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        yield torch.empty(1024, dtype=dt), torch.empty(1024, dtype=dt)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--arch", action="append", default=None, help="default: each impl's arch (sm_90)")
    args = parser.parse_args()
    reason = _cutile.toolchain_reason()
    if reason:
        print(f"cannot build cuTile cubins here: {reason}", file=sys.stderr)
        return 1
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from kernelgraft.examples import add_relu, rmsnorm

    total = 0
    for module, extra in ((add_relu, _add_relu_bench_inputs), (rmsnorm, _rmsnorm_bench_inputs)):
        op = getattr(module, module.__name__.rsplit(".", 1)[-1])
        t0 = time.time()
        inputs = list(module.sample_inputs("cpu")) + list(extra())
        arts = _cutile.build_for_op(op, inputs, args.out, args.arch)
        total += len(arts)
        print(f"{op.name}: {len(arts)} cubins in {time.time() - t0:.1f} s")
        for art in arts:
            print(f"  {art.relpath} ({len(art.image)} bytes)")
    print(f"{total} cubins under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
