"""The compile phase of the GEMM example's key, serially and in the compile pool.

    python benchmarks/bench_compile_pool.py [--workers N] [--shape 777x4096x4096] [--out DIR]

On a GPU (the H200 host: 16 cores) it times, from empty caches (Triton's and kernelgraft's, in
temporary directories):
  1. the pool: every Triton and CUDA C++ candidate compiled by ``--workers`` worker processes,
     cold (the zygote and its forked workers started by the call), and warm: the next key (M
     rounded to a multiple of 16, another specialisation of the same kernels) on the same, already
     started workers;
  2. the first launch of each candidate in this process after the pool: it must compile nothing
     (Triton compile-listener events that are not cache hits, and NVRTC cache misses, counted);
  3. serially, as the gate did before the pool: each candidate's first launch, compile included,
     from empty caches again (in-memory caches cleared).
On a machine without a GPU the same phases cross-compile for ``--arch`` (default sm_90): serially
in this process, then in the pool, then the launching side's compile path again (counted hits).

The PyTorch candidates (torch:eager, torch:compile) are not in the pool: eager compiles nothing,
and Inductor compiles in the gate; the table counts the kernel candidates only. Prints a table
last; JSON goes to $OUT (or --out).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import environment, write_json  # noqa: E402


def _fresh(root: str, name: str) -> None:
    for var, sub in (("TRITON_CACHE_DIR", "triton"), ("KERNELGRAFT_CACHE_DIR", "kg")):
        path = os.path.join(root, name, sub)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        os.environ[var] = path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=None, help="pool size (default: kernelgraft's)")
    parser.add_argument("--shape", default="777x4096x4096", help="M x N x K of the GEMM key")
    parser.add_argument("--arch", default="sm_90", help="target without a GPU")
    parser.add_argument("--limit", type=int, default=None, help="only the first N kernel candidates (a quick look)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        parser.error("this measures compiles, which Triton's interpreter does not make: unset TRITON_INTERPRET "
                     "(without a GPU the candidates cross-compile for --arch)")
    warnings.filterwarnings("ignore")
    root = tempfile.mkdtemp(prefix="kg-compile-pool-")
    _fresh(root, "pool")
    import torch
    from triton import knobs

    from kernelgraft.backends.cuda.jit import CudaRunner
    from kernelgraft.backends.cuda.nvrtc import CACHE
    from kernelgraft.examples import gemm as G
    from kernelgraft.tune import compile_pool as P
    from kernelgraft.tune.compile_jobs import Target, compile_only_triton, run_job

    gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    m, n, k = (int(v) for v in args.shape.split("x"))
    device = "cuda" if gpu else "cpu"
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
    c = torch.empty(m, n, device=device, dtype=torch.bfloat16)
    op = G.gemm
    cands = [x for x in op.candidates(a, b) if x.index >= 0 and (x.supported or not gpu)]
    if args.limit:  # the first Triton configs and the CUDA ones
        cands = [x for x in cands if x.impl.backend != "triton"][: args.limit // 2] + [
            x for x in cands if x.impl.backend == "triton"][: args.limit - min(args.limit // 2, 4)]
    target = Target.of_device(a.device) if gpu else Target(int(args.arch.removeprefix("sm_")))
    jobs = P.jobs_for(op, cands, (a, b, c), target, P.source_of(op))
    size = args.workers or P.workers() or max(2, (os.cpu_count() or 2) - 1)
    events: list[bool] = []
    listening = hasattr(knobs.compilation, "listener")  # else only the cache directory tells
    knobs.compilation.listener = lambda **kw: events.append(bool(kw["cache_hit"]))

    def cache_entries() -> tuple[int, int]:
        """Entries in Triton's cache directory: (compiled kernels, host modules). A kernel compile
        adds one holding its binary (a hit adds none); the first launch in a process also builds
        Triton's host modules there (``cuda_utils`` and the kernel signature's launcher, C compiled
        by gcc), which the workers never do: they compile, they never launch."""
        kernels = stubs = 0
        top = os.environ["TRITON_CACHE_DIR"]
        for entry in os.listdir(top):
            try:
                files = os.listdir(os.path.join(top, entry))
            except OSError:
                continue
            if any(f.endswith((".cubin", ".hsaco", ".ptx")) for f in files):
                kernels += 1
            elif any(f.endswith(".so") for f in files):
                stubs += 1
        return kernels, stubs
    report: dict = {"env": environment(), "shape": [m, n, k], "gpu": gpu, "workers": size,
                    "cores": os.cpu_count(), "candidates": len(cands), "jobs": len(jobs)}

    def first_launches() -> None:
        if gpu:
            for cand in cands:
                op.dispatcher.runner(cand)(a, b, c)
            torch.cuda.synchronize()
        else:  # the launching side's compile path: Triton's JIT, NVRTC's cache
            with compile_only_triton(target):
                for cand in cands:
                    if cand.impl.backend == "triton":
                        cand.impl.launch(a, b, c, **cand.config.as_dict())
            for cand in cands:
                if cand.impl.backend == "cuda":
                    launch = cand.impl.launch(a, b, c, **cand.config.as_dict())
                    CudaRunner(cand.impl, cand.config).compile(target.arch, launch.template)

    def forget_compiled() -> None:
        """In-memory compiled code of this process: gone, so the next launch reads the disk caches."""
        G._gemm_kernel.device_caches.clear()
        CACHE.clear_memory()
        op.dispatcher.runners.clear()

    # 1. the pool, cold then warm
    pool = P.CompilePool(size)
    t = time.perf_counter()
    outcomes = pool.run(jobs)
    report["pool_cold_s"] = time.perf_counter() - t

    def parent(pid: int) -> int:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    # the workers forked from one zygote that imported once, or started on their own (the log says why)
    report["workers_forked"] = pool.zygote_pid is not None and all(parent(p) == pool.zygote_pid for p in pool.pids)
    report["pool_failed"] = [f"{j.label}: {o.detail}" for j, o in zip(jobs, outcomes) if not o.ok]
    report["pool_compile_sum_s"] = sum(o.seconds for o in outcomes)
    # the floor of a cold pool: one fresh process importing torch and Triton (the zygote's start
    # until it could fork), which no worker start avoids; kg.tune.warm() pays it at start-up
    report["zygote_imports_s"] = pool.zygote_imports_s
    # 2. the first launches after the pool compile nothing
    forget_compiled()
    events.clear()
    misses, (kernels, stubs) = CACHE.misses, cache_entries()
    t = time.perf_counter()
    first_launches()
    report["first_launches_after_pool_s"] = time.perf_counter() - t
    report["triton_compile_listener"] = listening
    kernels_after, stubs_after = cache_entries()
    report["triton_cache_entries_added_after_pool"] = kernels_after - kernels
    report["triton_host_modules_built_after_pool"] = stubs_after - stubs
    report["triton_compiles_after_pool"] = max(events.count(False), report["triton_cache_entries_added_after_pool"])
    report["triton_cache_hits_after_pool"] = events.count(True)
    report["nvrtc_misses_after_pool"] = CACHE.misses - misses
    # the warm pool's next key: another specialisation of the same kernels (M a multiple of 16)
    m2 = m + 16 - m % 16 if m % 16 else m + 16
    a2 = torch.randn(m2, k, device=device, dtype=torch.bfloat16)
    c2 = torch.empty(m2, n, device=device, dtype=torch.bfloat16)
    jobs2 = P.jobs_for(op, cands, (a2, b, c2), target, P.source_of(op))
    t = time.perf_counter()
    outcomes = pool.run(jobs2)
    report["pool_warm_s"] = time.perf_counter() - t
    report["pool_warm_shape"] = [m2, n, k]
    report["pool_failed"] += [f"{j.label}: {o.detail}" for j, o in zip(jobs2, outcomes) if not o.ok]
    pool.close()
    # 3. serially, from empty caches
    _fresh(root, "serial")
    forget_compiled()
    events.clear()
    t = time.perf_counter()
    if gpu:
        first_launches()
    else:
        for job in jobs:
            run_job(job)
    report["serial_s"] = time.perf_counter() - t
    report["serial_triton_compiles"] = events.count(False)
    report["speedup_cold"] = report["serial_s"] / report["pool_cold_s"]
    report["speedup_warm"] = report["serial_s"] / report["pool_warm_s"]
    imports = report["zygote_imports_s"]
    report["speedup_cold_after_imports"] = (report["serial_s"] / (report["pool_cold_s"] - imports)
                                            if imports is not None and report["pool_cold_s"] > imports else None)
    shutil.rmtree(root, ignore_errors=True)
    path = write_json("bench_compile_pool", report, args.out)
    print(f"\nresults: {path}")
    ok = not (report["triton_compiles_after_pool"] or report["nvrtc_misses_after_pool"] or report["pool_failed"])
    rows = [
        ("kernel candidates (jobs)", f"{len(cands)} ({len(jobs)})"),
        ("workers / cores", f"{size} / {os.cpu_count()}"),
        ("workers forked from a zygote (yes)", "yes" if report["workers_forked"] else "no"),
        ("serial compile phase (s)", f"{report['serial_s']:.2f}"),
        ("pool, cold: workers started (s)", f"{report['pool_cold_s']:.2f}"),
        ("pool, warm: the next key (s)", f"{report['pool_warm_s']:.2f}"),
        ("speedup cold / warm (>= 4x on 16 cores)", f"{report['speedup_cold']:.2f}x / {report['speedup_warm']:.2f}x"),
        ("the zygote's imports, cold's floor (s)", "-" if imports is None else f"{imports:.2f}"),
        ("speedup cold, less the zygote's imports", "-" if report["speedup_cold_after_imports"] is None
         else f"{report['speedup_cold_after_imports']:.2f}x"),
        ("after the pool: Triton compiles in this process (0)", str(report["triton_compiles_after_pool"])),
        ("after the pool: Triton host modules built (launcher, utils)", str(report["triton_host_modules_built_after_pool"])),
        ("after the pool: NVRTC cache misses (0)", str(report["nvrtc_misses_after_pool"])),
        ("pool jobs failed (0)", str(len(report["pool_failed"]))),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'compile phase, ' + args.shape + (' on ' + report['env']['device']):<{width}}  value")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print("PASS" if ok else "FAIL: the pool did not leave every kernel compiled")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
