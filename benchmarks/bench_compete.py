"""PyTorch competing in tuning: tuning time per new shape with and without the
``torch:eager`` / ``torch:compile`` candidates, and which candidate won. GPU only.

    python benchmarks/bench_compete.py [--out DIR] [--ops rmsnorm,softmax] [--limit N]

For each example op over its ``BENCH_SHAPES`` (``kernelgraft.bench.module_inputs``), each shape is tuned three times (forced, so
never from the cache): first with PyTorch competing, cold (it pays the Triton JIT of every config
and the reference's torch.compile, a recompile for a later shape), then warm with
``kg.tune(compete=False)`` (kernels only) and warm with PyTorch competing (the default on CUDA).
Reported per shape: the three tuning wall times (gate + timing, plus compiles when cold), the
winner with PyTorch, its time, the best kernel's time
and the torch candidates' times (all from the tuner's own CUDA-graph timings), and whether the
kernels-only winner is the best kernel of the run with PyTorch. A table is printed; JSON and
markdown go to ``--out`` (default $OUT or benchmarks/results).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
import traceback

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import environment, write_json  # noqa: E402

EXAMPLES = ["add_relu", "rmsnorm", "rmsnorm_residual", "softmax", "swiglu", "gemm", "fp8_kcache_scatter"]


def _label(entry: dict | None) -> str:
    from kernelgraft.tune.tuner import entry_label

    return "-" if entry is None else entry_label(entry)


def _shape(args: tuple) -> str:
    import torch

    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            parts.append(f"{str(a.dtype).removeprefix('torch.')}{list(a.shape)}")
        elif not isinstance(a, (list, tuple)):
            parts.append(repr(a))
    return " ".join(parts)


def _us(entry: dict | None) -> float | None:
    return None if entry is None or entry.get("ms") is None else entry["ms"] * 1e3


def bench_op(name: str, limit: int | None) -> list[dict]:
    import kernelgraft as kg
from kernelgraft.bench import module_inputs

    module = importlib.import_module(f"kernelgraft.examples.{name}")
    op = getattr(module, name)
    rows = []
    for n, args in enumerate(module_inputs(module, "cuda")):
        if limit is not None and n >= limit:
            break
        args = tuple(args)
        row: dict = {"op": name, "shape": _shape(args)}
        try:
            # Pass 1 pays every compile (Triton JIT of each config, Dynamo/Inductor for the
            # reference's shape); passes 2 and 3 then compare the tuning work itself, warm.
            with kg.tune(compete=True):
                t0 = time.perf_counter()
                kg.tune.pretune(op, *args, force=True)
                row["tune_s_cold"] = time.perf_counter() - t0
            with kg.tune(compete=False):
                t0 = time.perf_counter()
                plain = kg.tune.pretune(op, *args, force=True)
                row["tune_s_kernels"] = time.perf_counter() - t0
            with kg.tune(compete=True):
                t0 = time.perf_counter()
                both = kg.tune.pretune(op, *args, force=True)
                row["tune_s_with_torch"] = time.perf_counter() - t0
            if plain is None or both is None:
                row["error"] = "no candidate supports these inputs"
                rows.append(row)
                continue
            by = {_label(e): e for e in both.ranking}
            kernels = [e for e in both.ranking if e.get("backend") != "torch"]
            row.update(
                winner=_label(both.winner), winner_us=_us(both.winner),
                best_kernel=_label(kernels[0] if kernels else None),
                best_kernel_us=_us(kernels[0] if kernels else None),
                eager_us=_us(by.get("torch:eager")), compile_us=_us(by.get("torch:compile")),
                kernels_only_winner=_label(plain.winner),
                torch_excluded={f"torch:{e['impl_name']}": e.get("reason") for e in both.excluded
                                if e.get("backend") == "torch"},
                measured=both.measured, measured_kernels=plain.measured,
            )
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            traceback.print_exc()
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _f(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


COLUMNS = ["op", "inputs", "tune s (cold, +torch)", "tune s (kernels)", "tune s (+torch)", "winner", "winner us", "best kernel us",
           "eager us", "compile us"]


def _cells(row: dict) -> list[str]:
    if "error" in row:
        return [row["op"], row["shape"], "-", "-", "-", f"error: {row['error']}", "-", "-", "-", "-"]
    return [row["op"], row["shape"], _f(row.get("tune_s_cold"), ".2f"), _f(row.get("tune_s_kernels"), ".2f"), _f(row.get("tune_s_with_torch"), ".2f"),
            row["winner"], _f(row["winner_us"], ".1f"), _f(row["best_kernel_us"], ".1f"),
            _f(row["eager_us"], ".1f"), _f(row["compile_us"], ".1f")]


def _line(row: dict) -> str:
    return " | ".join(_cells(row))


def markdown(rows: list[dict], env: dict) -> str:
    lines = [f"# PyTorch competing in tuning ({env.get('device')}, torch {env.get('torch')})", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    ok = [r for r in rows if "error" not in r]
    if ok:
        won = [r for r in ok if r["winner"].startswith("torch:")]
        extra = [r["tune_s_with_torch"] - r["tune_s_kernels"] for r in ok]
        lines += ["", f"PyTorch won {len(won)} of {len(ok)} shapes"
                  + (": " + ", ".join(f"{r['op']} {r['shape']} ({r['winner']})" for r in won) if won else "."),
                  f"Tuning time added by the PyTorch candidates per shape: median {sorted(extra)[len(extra) // 2]:.2f} s, "
                  f"max {max(extra):.2f} s (warm: compiles are in the cold column)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for the JSON and markdown (default $OUT or benchmarks/results)")
    parser.add_argument("--ops", default=",".join(EXAMPLES), help="comma-separated example modules")
    parser.add_argument("--limit", type=int, default=None, help="at most this many shapes per op")
    args = parser.parse_args()
    # an empty tuning cache: every shape is tuned here, not read from an earlier run
    os.environ.setdefault("KERNELGRAFT_CACHE_DIR", tempfile.mkdtemp(prefix="kg-compete-"))
    import torch

    if not torch.cuda.is_available():
        print("bench_compete: needs a CUDA GPU (PyTorch competes on CUDA tensors)")
        return 1
    env = environment()
    print(" | ".join(COLUMNS))
    rows: list[dict] = []
    for name in [n.strip() for n in args.ops.split(",") if n.strip()]:
        try:
            rows += bench_op(name, args.limit)
        except Exception as exc:
            traceback.print_exc()
            rows.append({"op": name, "shape": "-", "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]})
    text = markdown(rows, env)
    print()
    print(text)
    path = write_json("bench_compete", {"environment": env, "rows": rows}, args.out)
    path.with_suffix(".md").write_text(text)
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
