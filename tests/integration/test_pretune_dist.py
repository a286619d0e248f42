"""Tuning ahead on two gloo ranks on the CPU (fake timers): the keys are split (each rank measures
only its share), the decisions merge into one tune.json, identical on both ranks and equal to a
one-rank run's, and a rank that raises midway loses only its unfinished keys (a re-run tunes
those, and nothing else)."""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from _paths import TESTS
from _ranks import run_ranks

HERE = TESTS
RANGES = {"decode": 8, "prefill": [16, 100, 1000, 3000]}  # 8 keys


def _decisions(entries: dict) -> dict:
    """What a decision chose and why (not when it was made or how long it took)."""
    return {d: {"ranking": [(r["impl"], r["config"]) for r in e["ranking"]],
                "excluded": [(r["impl"], r["config"], r["kind"]) for r in e["excluded"]]}
            for d, e in entries.items()}


def _rank_main(rank: int, world: int, root: str) -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["KERNELGRAFT_CACHE_DIR"] = os.path.join(root, f"cache{rank}")  # a host each
    os.environ["KERNELGRAFT_TUNE_RANK_TIMEOUT"] = "120"
    sys.path.insert(0, str(HERE))
    import torch._dynamo  # noqa: F401  before the group exists (see test_tune_dist.py)
    import torch.distributed as dist

    import kernelgraft as kg
    from _pretune_ops import fake_timer, scale, scale2
    from kernelgraft.tune.cache import DiskCache

    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=world)
    out: dict = {}
    ranges = kg.tune.Ranges(**RANGES)
    with kg.tune("on", timer=fake_timer):
        # 1. the keys split across the ranks, merged on both
        report = kg.tune.pretune(scale, torch.randn(5), ranges=ranges, progress=False)
        out["split"] = {"mine": [k.digest for k in report.keys if k.status == "tuned" and k.rank == rank],
                        "statuses": [k.status for k in report.keys], "ranks": report.ranks}
        # 2. rank 1 raises after finishing its first key
        finished = []

        def fail_midway(result) -> None:
            finished.append(result.digest)
            if rank == 1:
                raise RuntimeError("rank 1 fails midway")

        try:
            report = kg.tune.pretune(scale2, torch.randn(5), ranges=ranges, progress=False, on_key=fail_midway)
            out["failed"] = {"raised": None}
        except RuntimeError as exc:
            out["failed"] = {"raised": str(exc)}
        out["failed"]["finished"] = finished
        # 3. a re-run (a new job: memory forgotten) tunes only what was lost
        kg.tune.clear()
        report = kg.tune.pretune(scale2, torch.randn(5), ranges=ranges, progress=False)
        out["rerun"] = {"tuned": [k.digest for k in report.keys if k.status == "tuned"],
                        "statuses": [k.status for k in report.keys]}
    out["entries"] = DiskCache().entries()
    with open(os.path.join(root, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)
    dist.barrier()
    dist.destroy_process_group()
    time.sleep(0.2)


def test_two_ranks_split_merge_and_survive_a_failing_rank(tmp_path, monkeypatch):
    run_ranks(_rank_main, lambda r: (r, 2, str(tmp_path)), timeout=400)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))

    # 1. each rank measured its share only; both files hold every key, the same decisions
    mine0, mine1 = r0["split"]["mine"], r1["split"]["mine"]
    assert len(mine0) + len(mine1) == 8 and not set(mine0) & set(mine1) and mine0 and mine1
    assert r0["split"]["statuses"] == ["tuned"] * 8 and r0["split"]["ranks"] == 2
    assert r0["entries"] == r1["entries"]  # one merged tune.json, the same bytes on both hosts

    # ... equal to what one rank alone decides
    sys.path.insert(0, str(HERE))
    import kernelgraft as kg
    from _pretune_ops import fake_timer, scale, scale2
    from kernelgraft.tune.cache import DiskCache
    from kernelgraft.tune.tuner import TUNER

    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "alone"))
    TUNER.memory.clear()
    TUNER.disk = DiskCache()
    with kg.tune("on", timer=fake_timer):
        kg.tune.pretune(scale, torch.randn(5), ranges=kg.tune.Ranges(**RANGES), progress=False)
        kg.tune.pretune(scale2, torch.randn(5), ranges=kg.tune.Ranges(**RANGES), progress=False)
    alone = _decisions(DiskCache().entries())
    merged = _decisions(r0["entries"])
    assert merged == alone

    # 2. rank 1 raised after one key: that key and all of rank 0's survived; its other keys were lost
    assert r1["failed"]["raised"] == "rank 1 fails midway" and r0["failed"]["raised"] is None
    assert len(r1["failed"]["finished"]) == 1
    kept = set(r0["failed"]["finished"]) | set(r1["failed"]["finished"])
    # 3. the re-run tuned exactly the lost keys, on either rank
    rerun = set(r0["rerun"]["tuned"]) | set(r1["rerun"]["tuned"])
    scale2_keys = {d for d, e in r0["entries"].items() if e["key"]["op"] == "tpre::scale2"}
    assert len(scale2_keys) == 8 and rerun == scale2_keys - kept and rerun
    assert r0["rerun"]["statuses"].count("cached") == len(kept)
