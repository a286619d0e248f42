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
from kernelgraft.check import check_inputs
from kernelgraft.op.candidates import evaluate_one
from kernelgraft.verify import guard


def build_for_op(op: Any, inputs: Any, out_dir: str | os.PathLike | None = None,
                 arch: Sequence[str] | None = None) -> list[CubinArtifact]:
    """Cubins for every cuTile candidate of ``op`` over the argument tuples ``inputs`` (CPU tensors
    are fine), deduplicated by symbol; written under ``out_dir`` when given. This is the AOT hook
    bundles use; candidates whose ``supports`` refuses an input are skipped for it."""
    seen: dict[tuple[str, str, str], CubinArtifact] = {}
    for args in inputs:
        args = op.signature.bind(op.name, tuple(args), {})
        specs = op.dispatcher.output_specs(args)
        outs = [torch.empty(s, dtype=d) for s, d, _ in specs]
        tensors = list(op.signature.tensors(args))
        guarded = guard.Call(op, args, [(s, d, "cpu") for s, d, _ in specs])  # as check runs kernels
        layouts = [(*args, *outs), (*guarded.args, *guarded.outs)]
        for index, spec in enumerate(op.impls):
            if spec.backend != "cutile":
                continue
            for config in spec.configs:
                cand = evaluate_one(index, spec, config, tensors, args)
                if cand.reason is not None and cand.category not in ("device", "capability"):
                    continue
                for target in arch or spec.arch:  # type: ignore[attr-defined]
                    for call in layouts:
                        try:
                            art = _cutile.build_cubin(spec, config, call, target)
                        except Exception:  # noqa: BLE001 - a layout this launch does not take (a strided
                            continue  # view its supports refuses on a GPU): nothing to build for it
                        key = (art.kernel_hash, art.symbol, art.arch)
                        if key not in seen:
                            seen[key] = art
                            if out_dir is not None:
                                art.write(out_dir)
    return list(seen.values())


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
        # what check runs (samples, strided copies, derived inputs; plain and guarded) and the benchmarks
        inputs = [a for _, a in check_inputs(op, "cpu")] + list(extra())
        arts = build_for_op(op, inputs, args.out, args.arch)
        total += len(arts)
        print(f"{op.name}: {len(arts)} cubins in {time.time() - t0:.1f} s")
        for art in arts:
            print(f"  {art.relpath} ({len(art.image)} bytes)")
    print(f"{total} cubins under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
