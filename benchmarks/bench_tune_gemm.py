"""The autotuner on a bf16 Triton GEMM (30 configs, 20+ shapes). GPU only; ~3-5 min on an H200.

    python benchmarks/bench_tune_gemm.py [--out DIR] [--quick]

Sections (each reports and continues on failure):
  exhaustive  every config on every shape, timed by triton.testing.do_bench_cudagraph (the judge)
  quality     kernelgraft's full-sweep choice vs the exhaustive best, re-timed side by side (<= 3%)
  prune       tuning wall time with the GEMM prune hook (and nvMatmulHeuristics if installed) vs
              the full sweep (>= 5x lower), choice within 5% of the exhaustive best
  host        warm-call host cost of the tuned op vs the untuned default dispatch (<= 1 us more)
  autotune    triton.autotune over the same configs: our choice the same or faster
  reuse       a new process with the same cache dir: same choices, zero keys tuned
Prints a ratio table last; JSON goes to $OUT (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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

SHAPES = [  # (M, N, K)
    (256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
    (8192, 8192, 8192), (16, 4096, 4096), (32, 4096, 11008), (64, 11008, 4096), (16, 12288, 4096),
    (128, 4096, 4096), (4096, 64, 4096), (2048, 4096, 4096), (2048, 11008, 4096),
    (2048, 4096, 11008), (4096, 12288, 4096), (1024, 14336, 4096), (1024, 4096, 14336),
    (8192, 1024, 1024), (512, 8192, 2048), (3072, 768, 768), (127, 333, 515),
]
QUICK = [(512, 512, 512), (4096, 4096, 4096), (16, 4096, 4096), (2048, 11008, 4096), (127, 333, 515)]
START = time.perf_counter()
DEADLINE_S = 290.0


def elapsed() -> float:
    return time.perf_counter() - START


def section(results: dict, name: str, fn) -> None:
    t0 = time.perf_counter()
    if elapsed() > DEADLINE_S:
        results[name] = {"skipped": f"time limit ({DEADLINE_S:.0f}s) reached before this section"}
        print(f"[{name}] skipped: time limit", flush=True)
        return
    try:
        results[name] = fn()
    except Exception as exc:
        results[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
        print(f"[{name}] FAILED: {exc}\n{traceback.format_exc()}", flush=True)
    print(f"[{name}] {time.perf_counter() - t0:.1f}s (total {elapsed():.0f}s)", flush=True)


def cfg_id(cfg: dict) -> str:
    return json.dumps(cfg, sort_keys=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    import torch
    import triton
    import triton.testing

    if not torch.cuda.is_available():
        print("bench_tune_gemm: needs a CUDA GPU")
        return 2
    cache = tempfile.mkdtemp(prefix="kg-tune-bench-")
    os.environ["KERNELGRAFT_CACHE_DIR"] = cache
    import kernelgraft as kg
    from kernelgraft.examples import gemm as G
    from _tune_gemm_op import gemm_triton

    op = gemm_triton  # the example's Triton configs alone (see _tune_gemm_op.py)
    shapes = QUICK if args.quick else SHAPES
    torch.manual_seed(0)
    inputs = {s: (torch.randn(s[0], s[2], device="cuda", dtype=torch.bfloat16),
                  torch.randn(s[2], s[1], device="cuda", dtype=torch.bfloat16)) for s in shapes}
    outs = {s: torch.empty(s[0], s[1], device="cuda", dtype=torch.bfloat16) for s in shapes}
    configs = [c.as_dict() for c in G.TRITON.configs]
    results: dict = {"env": environment(), "shapes": [list(s) for s in shapes], "n_configs": len(configs)}
    judge: dict = {}  # shape -> {cfg_id: ms}

    def bench(shape, cfg, rep=20) -> float:
        """The judge: Triton's own CUDA-graph timing (warm L2, like back-to-back calls in a model),
        a code path separate from kernelgraft's timer."""
        a, b = inputs[shape]
        c = outs[shape]
        fn = lambda: G.launch_gemm(a, b, c, **cfg)  # noqa: E731
        try:
            return float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median"))
        except Exception:
            return float(triton.testing.do_bench(fn, warmup=5, rep=rep, return_mode="median"))

    def retime(shape, cfgs: list[dict], rounds=3) -> dict:
        """Side-by-side, interleaved re-timing; the min over rounds of each config's median."""
        best = {cfg_id(c): float("inf") for c in cfgs}
        for _ in range(rounds):
            for c in cfgs:
                best[cfg_id(c)] = min(best[cfg_id(c)], bench(shape, c, rep=20))
        return best

    # ------------------------------------------------------------------ exhaustive (the judge)
    def exhaustive():
        rows = {}
        for s in shapes:
            times = {}
            for cfg in configs:
                try:
                    times[cfg_id(cfg)] = bench(s, cfg, rep=10)
                except Exception as exc:  # a config that does not compile/fit: not a candidate
                    times[cfg_id(cfg)] = float("inf")
                    print(f"  {s} {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
            judge[s] = times
            best = min(times, key=times.get)
            rows[str(s)] = {"best": json.loads(best), "best_ms": times[best]}
            print(f"  exhaustive {s}: best {times[best]:.4f} ms {best}", flush=True)
        return rows

    # ------------------------------------------------------------------ tuning
    def tune_all(label: str, **options) -> dict:
        kg.tune.clear(disk=True)
        rows, total = {}, 0.0
        with kg.tune("on", **options):
            for s in shapes:
                a, b = inputs[s]
                t0 = time.perf_counter()
                d = kg.tune.pretune(op, a, b, force=True)
                wall = time.perf_counter() - t0
                total += wall
                rows[str(s)] = {"winner": d.winner["config"] if d and d.winner else None,
                                "measured": d.measured if d else 0, "wall_s": wall,
                                "excluded": [e["reason"][:160] for e in (d.excluded if d else [])]}
        print(f"  {label}: tuning wall {total:.2f}s over {len(shapes)} shapes", flush=True)
        return {"rows": rows, "total_wall_s": total}

    def judged(tuned: dict, limit: float) -> dict:
        rows, worst = {}, 0.0
        for s in shapes:
            win = tuned["rows"][str(s)]["winner"]
            times = judge.get(s)
            if win is None or not times:
                rows[str(s)] = {"error": "no winner or no exhaustive timing"}
                worst = float("inf")
                continue
            best = json.loads(min(times, key=times.get))
            re = retime(s, [win, best] if cfg_id(win) != cfg_id(best) else [win])
            ratio = re[cfg_id(win)] / min(re.values())
            worst = max(worst, ratio)
            rows[str(s)] = {"winner": win, "best": best, "winner_ms": re[cfg_id(win)],
                            "best_ms": re[cfg_id(best)], "ratio": ratio, "ok": ratio <= limit}
        return {"rows": rows, "worst_ratio": worst, "all_ok": worst <= limit}

    full: dict = {}

    def quality():
        full.update(tune_all("full sweep", repeats=30))
        out = judged(full, 1.03)
        out["tuning"] = full
        return out

    def prune():
        out = {}
        base = full.get("total_wall_s") or tune_all("full sweep", repeats=30)["total_wall_s"]
        hooks = {"heuristic": G.prune_gemm}
        if kg.tune._prune._nvmmh() is not None:
            hooks["nvmatmulheuristics"] = kg.tune.matmul_heuristics(
                lambda a, b: (a.shape[0], b.shape[1], a.shape[1]), keep=8)
        saved = op.prune
        try:
            for name, hook in hooks.items():
                op.prune = hook
                t = tune_all(f"pruned ({name})", repeats=30, prune=True)
                q = judged(t, 1.05)
                out[name] = {"total_wall_s": t["total_wall_s"], "speedup": base / max(t["total_wall_s"], 1e-9),
                             "worst_ratio": q["worst_ratio"], "quality_ok": q["all_ok"],
                             "rows": q["rows"], "tuning": t["rows"]}
        finally:
            op.prune = saved
        out["full_wall_s"] = base
        return out

    # ------------------------------------------------------------------ host cost
    def host():
        a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)

        def per_call_us(n=3000) -> float:
            for _ in range(50):
                op(a, b)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                op(a, b)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            return (t1 - t0) / n * 1e6

        kg.tune.pretune(op, a, b)
        # The difference sought (<= 1 us) is far below this host's run-to-run spread (whole
        # rounds of 27 and 38 us were seen): one core, no GC during a round, and the judgement
        # by the median of paired differences of adjacent rounds in ABBA order, so slow drift
        # and one-off stalls cancel instead of landing on one side.
        import gc

        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        if cores:
            os.sched_setaffinity(0, {max(cores)})
        tuned, default, diffs = [], [], []
        gc.collect()
        gc.disable()
        try:
            for r in range(16):
                pair = {}
                for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
                    with kg.tune(mode):  # each switch re-plans once, before the timed loop
                        pair[mode] = per_call_us(1500)
                tuned.append(pair["on"])
                default.append(pair["off"])
                diffs.append(pair["on"] - pair["off"])
        finally:
            gc.enable()
            if cores:
                os.sched_setaffinity(0, cores)
        # a fresh plan on a warm in-memory decision: the per-new-signature cost
        from kernelgraft.op import select as _select

        replans = []
        for _ in range(20):
            _select.bump_epoch()
            t0 = time.perf_counter()
            op(a, b)
            replans.append((time.perf_counter() - t0) * 1e6)
        t_med, d_med = statistics.median(tuned), statistics.median(default)
        extra = statistics.median(diffs)
        return {"tuned_us": t_med, "default_us": d_med, "extra_us": extra,
                "extra_us_of_medians": t_med - d_med, "ok": extra <= 1.0,
                "replan_us_median": statistics.median(replans),
                "tuned_all": tuned, "default_all": default, "paired_diffs": diffs}

    # ------------------------------------------------------------------ triton.autotune
    def autotune():
        import triton.language as tl  # noqa: F401

        tconfigs = [triton.Config({k: v for k, v in c.items() if k not in ("num_warps", "num_stages")},
                                  num_warps=c["num_warps"], num_stages=c["num_stages"]) for c in configs]
        tuned_kernel = triton.autotune(configs=tconfigs, key=["M", "N", "K"])(G._gemm_kernel)
        rows, worse = {}, 0
        subset = shapes if len(shapes) <= 8 else shapes[::3]
        ours = full.get("rows") or {}
        for s in subset:
            a, b = inputs[s]
            c = outs[s]
            M, K = a.shape
            N = b.shape[1]

            def grid(meta):
                return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

            tuned_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                               c.stride(0), c.stride(1))
            bc = tuned_kernel.best_config
            theirs = {**bc.kwargs, "num_warps": bc.num_warps, "num_stages": bc.num_stages}
            win = (ours.get(str(s)) or {}).get("winner")
            if win is None:
                d = kg.tune.pretune(op, a, b)
                win = d.winner["config"]
            re = retime(s, [win, theirs] if cfg_id(win) != cfg_id(theirs) else [win])
            ratio = re[cfg_id(win)] / re[cfg_id(theirs)]
            same = cfg_id(win) == cfg_id(theirs)
            ok = same or ratio <= 1.01
            worse += not ok
            rows[str(s)] = {"ours": win, "triton_autotune": theirs, "same": same, "ours_over_theirs": ratio, "ok": ok}
            print(f"  autotune {s}: same={same} ours/theirs={ratio:.3f}", flush=True)
        return {"rows": rows, "not_same_or_better": worse, "all_ok": worse == 0}

    # ------------------------------------------------------------------ new process reuses decisions
    def reuse():
        parent = {k: v["winner"] for k, v in (full.get("rows") or {}).items() if v.get("winner")}
        if not parent:
            return {"error": "the quality section made no decisions to reuse"}
        code = r"""
import json, sys, time, torch, kernelgraft as kg
sys.path.insert(0, sys.argv[2])
from _tune_gemm_op import gemm_triton as gemm
shapes = json.loads(sys.argv[1]); out = {}
t0 = time.perf_counter()
for m, n, k in shapes:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16); b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    gemm(a, b)
    plan = gemm.dispatcher.plan_for((a, b))
    out[str((m, n, k))] = plan.candidate.config.as_dict()
torch.cuda.synchronize()
print(json.dumps({"choices": out, "stats": kg.tune.stats(), "wall_s": time.perf_counter() - t0}))
"""
        proc = subprocess.run([sys.executable, "-c", code, json.dumps([json.loads(k.replace("(", "[").replace(")", "]")) for k in parent]),
                               os.path.dirname(os.path.abspath(__file__))],
                              capture_output=True, text=True, timeout=240,
                              env={**os.environ, "KERNELGRAFT_CACHE_DIR": cache, "KERNELGRAFT_TUNE": "on"})
        if proc.returncode != 0:
            return {"error": proc.stderr[-3000:]}
        child = json.loads(proc.stdout.strip().splitlines()[-1])
        same = sum(child["choices"].get(k) == v for k, v in parent.items())
        tuned = child["stats"].get("tuned", 0)
        return {"same_choices": same, "of": len(parent), "child_tuned_keys": tuned,
                "child_disk_hits": child["stats"].get("disk_hit", 0), "child_wall_s": child["wall_s"],
                "ok": same == len(parent) and tuned == 0}

    section(results, "exhaustive", exhaustive)
    section(results, "quality", quality)
    section(results, "reuse", reuse)  # uses quality's decisions on disk
    section(results, "host", host)
    section(results, "autotune", autotune)
    section(results, "prune", prune)  # clears the cache
    results["total_s"] = elapsed()
    path = write_json("bench_tune_gemm", results, args.out)

    def get(*keys, default="n/a"):
        cur = results
        for k in keys:
            if not isinstance(cur, dict) or k not in cur:
                return default
            cur = cur[k]
        return cur

    def fmt(v, spec=".3f"):
        return format(v, spec) if isinstance(v, (int, float)) else str(v)

    print(f"\nresults: {path}")
    print(f"{'must-hold':<52} {'value':>12}  pass")
    print(f"{'1. tuned / exhaustive best, worst shape (<= 1.03)':<52} {fmt(get('quality', 'worst_ratio')):>12}  {get('quality', 'all_ok')}")
    for name in ("heuristic", "nvmatmulheuristics"):
        if isinstance(get("prune", name), dict):
            sp, wr = get("prune", name, "speedup"), get("prune", name, "worst_ratio")
            ok = isinstance(sp, float) and sp >= 5 and get("prune", name, "quality_ok") is True
            print(f"{'2. prune (' + name + ') tuning speedup (>= 5x)':<52} {fmt(sp, '.2f'):>12}  {ok}")
            print(f"{'   prune (' + name + ') worst / best (<= 1.05)':<52} {fmt(wr):>12}")
    print(f"{'3. warm call extra host us vs default (<= 1.0)':<52} {fmt(get('host', 'extra_us')):>12}  {get('host', 'ok')}")
    print(f"{'4. shapes where triton.autotune beat us (0)':<52} {fmt(get('autotune', 'not_same_or_better'), 'd'):>12}  {get('autotune', 'all_ok')}")
    print(f"{'4. new process: keys re-tuned (0)':<52} {fmt(get('reuse', 'child_tuned_keys'), 'd'):>12}  {get('reuse', 'ok')}")
    print(f"{'total seconds':<52} {results['total_s']:>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
