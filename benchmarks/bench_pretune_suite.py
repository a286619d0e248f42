"""Tune the LLM benchmark suite (every example op's BENCH_SHAPES["llm"], 74 shapes) ahead of time,
on one GPU and on two ranks, from empty caches.

    python benchmarks/bench_pretune_suite.py [--phase all|one|two|compare] [--state DIR] [--out DIR]

Phase ``one``: ``kg.tune.pretune`` of the suite's calls in one process on one GPU (wall time).
Phase ``two``: the same under ``torchrun --nproc_per_node 2`` (on two GPUs when there are two,
else both ranks on GPU 0: then the point is the split and the merge, not the speed-up, and the
timings of the two ranks disturb each other). Each rank has its own tuning cache (a host each),
both ranks share a fresh Triton cache. Phase ``compare`` reads both and prints the table: wall
times, the ratio (the target on two GPUs: at most 0.55x of one), keys per rank, whether both
ranks' tune.json hold the same decisions (they must), and how many keys the one-GPU and the
two-rank runs chose alike (timing noise may part close candidates; informative only).

Each phase writes under ``--state`` (default /tmp/kg-pretune-suite), so phases can run as
separate commands (each must finish within a device call's limit); ``all`` runs the three.
JSON goes to $OUT (or --out); the table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import environment, write_json  # noqa: E402

MODULES = ("rmsnorm", "rmsnorm_residual", "softmax", "swiglu", "fp8_kcache_scatter", "add_relu", "gemm")


def _worker(args) -> int:
    """One process of a phase (plain or a torchrun rank): tune the suite, write what it decided."""
    rank = int(os.environ.get("RANK", "0"))
    os.environ["KERNELGRAFT_CACHE_DIR"] = os.path.join(args.cache, f"rank{rank}")
    import importlib
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    import kernelgraft as kg
    from kernelgraft.cli.tune import suite_calls
    from kernelgraft.tune.cache import DiskCache

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        dist.init_process_group("gloo")
    from kernelgraft.cli.common import ops_of

    ops = [o for name in MODULES for o in ops_of(importlib.import_module(f"kernelgraft.examples.{name}"))]
    calls = suite_calls(ops, args.device, "llm")
    if args.max_keys:
        calls = calls[: args.max_keys]
    if world > 1:
        dist.barrier()  # both ranks start together
    started = time.perf_counter()
    options = {"compete": False} if args.no_compete else {}
    with kg.tune("on", **options):
        report = kg.tune.pretune(calls=calls, device=args.device, progress=False)
    wall = time.perf_counter() - started
    memory = {}
    if args.device == "cuda":  # what this rank's tuning held at its peak, beside the GPU's state now
        free, total = torch.cuda.mem_get_info()
        memory = {"peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
                  "free_gib_at_end": free / 2**30, "total_gib": total / 2**30}
        print(f"[rank {rank}] memory: {memory}", flush=True)
    result = {"rank": rank, "world": world, "shapes": len(calls), "wall_s": wall, "report": str(report), "memory": memory,
              "keys": [vars(k) for k in report.keys], "entries": DiskCache().entries()}
    with open(os.path.join(args.cache, f"result-rank{rank}.json"), "w") as fh:
        json.dump(result, fh)
    print(f"[rank {rank}] {report}", flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def _fresh(path: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def _phase(name: str, args, launcher: list[str]) -> float:
    cache = _fresh(os.path.join(args.state, name))
    env = dict(os.environ)
    env["TRITON_CACHE_DIR"] = _fresh(os.path.join(args.state, name + "-triton"))
    if args.device == "cuda":
        env.pop("TRITON_INTERPRET", None)
    cmd = launcher + [os.path.abspath(__file__), "--worker", "--cache", cache]
    cmd += ["--max-keys", str(args.max_keys)] if args.max_keys else []
    cmd += ["--no-compete"] if args.no_compete else []
    cmd += ["--device", args.device]
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env)
    took = time.perf_counter() - started
    with open(os.path.join(args.state, f"{name}.json"), "w") as fh:
        json.dump({"rc": done.returncode, "process_wall_s": took, "cmd": cmd}, fh)
    if done.returncode:
        print(f"phase {name} failed with exit code {done.returncode}")
    return took


def _load(args, name: str) -> tuple[dict, list[dict]]:
    with open(os.path.join(args.state, f"{name}.json")) as fh:
        meta = json.load(fh)
    folder = os.path.join(args.state, name)
    ranks = []
    for f in sorted(os.listdir(folder)):
        if f.startswith("result-rank"):
            with open(os.path.join(folder, f)) as fh:
                ranks.append(json.load(fh))
    return meta, ranks


def _chosen(entries: dict) -> dict:
    return {d: (e["ranking"][0]["impl"], e["ranking"][0].get("impl_name"), e["ranking"][0]["config"])
            if e.get("ranking") else None for d, e in entries.items()}


def _compare(args) -> int:
    one_meta, one = _load(args, "one")
    two_meta, two = _load(args, "two")
    report: dict = {"env": environment(), "one": {"meta": one_meta}, "two": {"meta": two_meta}}
    if not one or not two:
        print("missing results: run phases one and two first")
        return 1
    wall1 = one[0]["wall_s"]
    wall2 = max(r["wall_s"] for r in two)  # the job ends when its slowest rank does
    files_equal = all(r["entries"] == two[0]["entries"] for r in two[1:])
    per_rank = [sum(k["status"] == "tuned" and k["rank"] == r["rank"] for k in r["keys"]) for r in two]
    c1, c2 = _chosen(one[0]["entries"]), _chosen(two[0]["entries"])
    common = set(c1) & set(c2)
    alike = sum(c1[d] == c2[d] for d in common)
    lost = sum(k["status"] == "lost" for k in two[0]["keys"])
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    report["summary"] = {
        "shapes": one[0]["shapes"], "keys": len(one[0]["keys"]), "wall_one_gpu_s": wall1,
        "wall_two_ranks_s": wall2, "ratio": wall2 / wall1 if wall1 else None, "gpus": gpus,
        "keys_tuned_per_rank": per_rank, "rank_files_identical": files_equal, "lost": lost,
        "decisions_in_both_runs": len(common), "same_choice_as_one_gpu": alike,
        "one": one[0]["report"], "two": [r["report"] for r in two]}
    report["one"]["keys"], report["two"]["keys"] = one[0]["keys"], [r["keys"] for r in two]
    path = write_json("bench_pretune_suite", report, args.out)
    s = report["summary"]
    print(f"\nresults: {path}")
    where = ("two GPUs" if gpus >= 2 else "one GPU (ranks share it: split and merge, not speed)" if gpus
             else "the CPU (a dry run: nothing timed)")
    rows = [
        ("shapes / distinct keys", f"{s['shapes']} / {s['keys']}"),
        ("1 process: wall time (s)", f"{wall1:.1f}"),
        (f"2 ranks on {where}: wall time (s)", f"{wall2:.1f}"),
        ("ratio (<= 0.55 on two GPUs)", f"{s['ratio']:.3f}" if s["ratio"] else "-"),
        ("keys tuned per rank", str(per_rank)),
        ("both ranks' tune.json identical", str(files_equal)),
        ("keys lost", str(lost)),
        ("same choice as the 1-GPU run (informative)", f"{alike} of {len(common)}"),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    ok = files_equal and not lost and (gpus < 2 or (s["ratio"] or 1) <= 0.55)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", default="all", choices=("all", "one", "two", "compare"))
    parser.add_argument("--state", default="/tmp/kg-pretune-suite")
    parser.add_argument("--out", default=None)
    parser.add_argument("--max-keys", type=int, default=None, help="only the first N shapes (a quick look)")
    parser.add_argument("--no-compete", action="store_true",
                        help="kernels only (by default PyTorch's eager and compiled runs compete, as in ops)")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the orchestration (nothing is timed)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return _worker(args)
    os.makedirs(args.state, exist_ok=True)
    if args.phase in ("all", "one"):
        _phase("one", args, [sys.executable])
    if args.phase in ("all", "two"):
        _phase("two", args, [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"])
    if args.phase in ("all", "compare"):
        return _compare(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
