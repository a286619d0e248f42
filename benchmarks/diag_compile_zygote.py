"""Does the compile workers' zygote fork after importing an example op's module on this machine, and
do the op's compile jobs compile in its workers?

For each op: a pool of the default size whose zygote preloads the op's module; whether the zygote
could fork (``zygote_ready``) and its refusal if not, the op module it left out and why (its import
left a fork unsafe: the zygote then forks the workers without it), the modules its workers have,
then the jobs of one bf16 shape compiled in the pool: compiled and failed, with each failure's text.

    python benchmarks/diag_compile_zygote.py [--ops rmsnorm,softmax,swiglu,gemm]
    python benchmarks/diag_compile_zygote.py --imports cuda.tile,cutlass.cute

``--imports``: for each module, a fresh process set up as the zygote is (a worker's imports,
``OMP_NUM_THREADS=1``) imports it alone: its import time, and the threads it left or whether it
initialised CUDA (what makes a zygote unsafe to fork after it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time

import torch

SHAPES = {"rmsnorm": (1500, 5120), "softmax": (33, 50257), "swiglu": (300, 13824), "gemm": (777, 4096, 4096)}


def _args(name: str, shape: tuple) -> tuple:
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g, dtype=torch.bfloat16)  # noqa: E731
    if name == "rmsnorm":
        return r(*shape), r(shape[1]), 1e-6
    if name == "softmax":
        return (r(*shape),)
    if name == "swiglu":
        return r(*shape), r(*shape)
    m, n, k = shape
    return r(m, k), r(k, n)


def one(name: str) -> dict:
    from kernelgraft.tune import compile_pool as cp
    from kernelgraft.tune.compile_jobs import Target

    op = getattr(importlib.import_module(f"kernelgraft.examples.{name}"), name)
    pool = cp.CompilePool(cp.workers())
    try:
        t0 = time.perf_counter()
        pool.start(cp.preload_for([op]))
        zygote = pool._zygote
        ready = pool.zygote_ready()
        ready_s = time.perf_counter() - t0
        args = _args(name, SHAPES[name])
        outs = [torch.empty_like(o) if isinstance(o, torch.Tensor) else o for o in (op.reference(*args),)]
        jobs = cp.jobs_for(op, op.candidates(*args), (*args, *outs), Target.of_device(args[0].device),
                           cp.source_of(op))
        t0 = time.perf_counter()
        outcomes = pool.run(jobs)
        return {"op": name, "workers": pool.size, "zygote_refusal": zygote.refusal if zygote else None,
                "zygote_ready": ready, "ready_s": round(ready_s, 2),
                "zygote_left_out": {s.module: why for s, why in zygote.left_out.items()} if zygote else None,
                "zygote_preloads": [s.module for s in zygote.preload] if zygote and zygote.preloaded else [],
                "jobs": len(jobs), "compiled": sum(o.ok for o in outcomes), "seconds": round(time.perf_counter() - t0, 2),
                "failures": [f"{j.impl}{list(j.config)}: {o.detail[:300]}" for j, o in zip(jobs, outcomes) if not o.ok]}
    finally:
        pool.close()


_PROBE = """
import importlib, json, os, sys, time
from kernelgraft.tune import compile_worker
from kernelgraft.tune.compile_zygote_serve import _threads
from kernelgraft.backends.triton.ahead import warm_process
compile_worker.imports(); warm_process()
before = _threads(); t0 = time.perf_counter()
try:
    importlib.import_module(sys.argv[1]); error = None
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
import torch
print(json.dumps({"module": sys.argv[1], "import_s": round(time.perf_counter() - t0, 2), "error": error,
                  "threads_before": before, "threads_after": _threads(),
                  "cuda_initialized": torch.cuda.is_initialized()}))
"""


def imports(module: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", _PROBE, module], env=env, capture_output=True, text=True,
                          timeout=120)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {"module": module, "rc": done.returncode,
                                                 "stderr": done.stderr[-600:]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", default="rmsnorm,softmax,swiglu,gemm")
    parser.add_argument("--imports", default="", help="modules, each imported alone in a zygote-like process")
    args = parser.parse_args()
    if args.imports:
        for module in args.imports.split(","):
            print(json.dumps(imports(module)), flush=True)
        return
    for name in args.ops.split(","):
        print(json.dumps(one(name)), flush=True)


if __name__ == "__main__":
    main()
