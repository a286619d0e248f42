"""Two ranks (NCCL) tune the same GEMM keys: zero disagreements, and a planted wrong config never
wins. Rank 0 starts with a disk cache holding half of the keys, rank 1 with an empty one; ranks
meet the keys in opposite orders and rank 1 also meets keys of its own.

    torchrun --nproc_per_node 2 benchmarks/bench_tune_ranks.py [--out DIR]

Prints a table on rank 0 last; JSON goes to $OUT (or --out). A hang aborts after 8 minutes.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import tempfile
import time
import traceback

sys.path.insert(0, __file__.rsplit("/", 1)[0])
# These measure the kernels' tuner (configs against each other) and the kernels' dispatch: PyTorch
# competing (on by default on CUDA) would add torch:eager/torch:compile winners with no
# config; benchmarks/bench_compete.py measures that. KERNELGRAFT_COMPETE=1 overrides.
os.environ.setdefault("KERNELGRAFT_COMPETE", "0")
from _common import environment, write_json  # noqa: E402

SHAPES = [(512, 512, 512), (16, 4096, 4096), (2048, 4096, 4096), (128, 11008, 4096), (4096, 4096, 1024),
          (1024, 1024, 4096), (64, 4096, 11008), (3072, 768, 768), (8192, 1024, 1024), (256, 12288, 4096)]
RANK1_ONLY = [(96, 4096, 4096), (1000, 4096, 4096)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(480, exit=True)  # a deadlock must not eat the GPU session
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    root = os.environ.get("KG_RANKS_CACHE_ROOT") or tempfile.mkdtemp(prefix="kg-ranks-")
    os.environ["KERNELGRAFT_CACHE_DIR"] = os.path.join(root, f"rank{rank}")
    os.environ.setdefault("KERNELGRAFT_TUNE_RANK_TIMEOUT", "300")
    import torch
    import torch.distributed as dist
    import triton

    import kernelgraft as kg
    from kernelgraft.examples import gemm as G

    torch.cuda.set_device(local)
    try:
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    except TypeError:  # older torch: no device_id
        dist.init_process_group("nccl")
    world = dist.get_world_size()

    def launch_bad(a, b, c, *, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M=8, num_warps=4, num_stages=3):
        # Planted bug: the last K block is skipped. Wrong results, and faster than any correct config.
        M, K = a.shape
        N = b.shape[1]
        k_eff = max(BLOCK_K, K - BLOCK_K)
        grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
        G._gemm_kernel[grid](a, b, c, M, N, k_eff, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                             c.stride(0), c.stride(1), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                             GROUP_M=GROUP_M, num_warps=num_warps, num_stages=num_stages)

    good = kg.triton(G.launch_gemm, configs=G.CONFIGS[::2], supports=G._shapes_fit, name="gemm")
    bad = kg.triton(launch_bad, configs=[{"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8,
                                          "num_stages": 3}], supports=G._shapes_fit, name="planted_bad")

    @kg.op("kgbench::gemm_ranks", impls=[bad, good])  # the bad impl first: it is also the default
    def gemm_ranks(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.float() @ b.float()).to(a.dtype)

    def inputs(s):
        g = torch.Generator(device="cuda").manual_seed(hash(s) % (2**31))
        m, n, k = s
        return (torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g),
                torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g))

    def picked(a, b) -> dict:
        plan = gemm_ranks.dispatcher.plan_for((a, b))
        c = plan.candidate
        return {"impl": c.impl.display_name if c else "reference", "config": c.config.as_dict() if c else None}

    report: dict = {"rank": rank, "world": world}
    t0 = time.perf_counter()
    try:
        if rank == 0:  # phase 1: rank 0 alone fills its disk cache with half the keys
            with kg.tune("on", distributed=False, repeats=20):
                for s in SHAPES[::2]:
                    kg.tune.pretune(gemm_ranks, *inputs(s))
            kg.tune.clear()  # memory only: phase 2 finds them on disk
        dist.barrier()
        order = SHAPES if rank == 0 else list(reversed(SHAPES)) + RANK1_ONLY
        choices, wrong = {}, 0
        with kg.tune("on", repeats=20):
            for s in order:
                a, b = inputs(s)
                out = gemm_ranks(a, b)
                ref = (a.double() @ b.double())
                err = ((out.double() - ref).norm() / ref.norm()).item()
                wrong += err > 2e-2
                choices[str(s)] = {**picked(a, b), "rel_err": err}
        torch.cuda.synchronize()
        report.update(choices=choices, wrong_outputs=wrong, stats=kg.tune.stats(),
                      phase2_s=time.perf_counter() - t0)
        excluded_bad = 0
        for s in SHAPES:
            d = kg.tune.decision(gemm_ranks, *inputs(s))
            if d is not None and any(e.get("impl_name") == "planted_bad" and e.get("kind") == "wrong"
                                     for e in d.excluded):
                excluded_bad += 1
        report["bad_excluded_in_decisions"] = excluded_bad
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["trace"] = traceback.format_exc()
        print(f"[rank {rank}] FAILED: {exc}\n{traceback.format_exc()}", flush=True)
    everyone = [None] * world
    dist.all_gather_object(everyone, report)
    faulthandler.cancel_dump_traceback_later()
    if rank == 0:
        common = [str(s) for s in SHAPES]
        disagreements = 0
        for key in common:
            seen = {json.dumps({k: v for k, v in (r.get("choices", {}).get(key) or {}).items() if k != "rel_err"},
                               sort_keys=True) for r in everyone}
            disagreements += len(seen) != 1
        bad_wins = sum(1 for r in everyone for c in r.get("choices", {}).values() if c.get("impl") == "planted_bad")
        wrong = sum(r.get("wrong_outputs", 0) for r in everyone)
        errors = [r.get("error") for r in everyone if r.get("error")]
        summary = {"keys": len(common), "disagreements": disagreements, "planted_bad_wins": bad_wins,
                   "wrong_outputs": wrong, "errors": errors,
                   "leaders": [r.get("stats", {}).get("rank_leader", 0) for r in everyone],
                   "followers": [r.get("stats", {}).get("rank_follower", 0) for r in everyone],
                   "disk_hits": [r.get("stats", {}).get("disk_hit", 0) for r in everyone],
                   "bad_excluded": [r.get("bad_excluded_in_decisions") for r in everyone]}
        path = write_json("bench_tune_ranks", {"env": environment(), "summary": summary, "ranks": everyone},
                          args.out)
        print(f"\nresults: {path}")
        print(f"{'must-hold 5':<44} {'value':>8}  pass")
        print(f"{'disagreements over ' + str(len(common)) + ' common keys (0)':<44} {disagreements:>8}  {disagreements == 0 and not errors}")
        print(f"{'planted bad config wins (0)':<44} {bad_wins:>8}  {bad_wins == 0 and not errors}")
        print(f"{'wrong outputs (0)':<44} {wrong:>8}  {wrong == 0}")
        print(f"leaders per rank {summary['leaders']}, followers {summary['followers']}, "
              f"disk hits {summary['disk_hits']}, errors {len(errors)}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
