"""Does anything stall a process's first seconds?

Part 1, windows: the tuned ``kgexamples::softmax`` on a bf16 2048 x 32768 input, timed with
``triton.testing.do_bench`` (host launches included) and by CUDA-graph replay (GPU time only) in
windows ``--gap`` seconds apart from the first call, in three fresh processes:

- ``warm``: the native replay already built in the cache (and this shape tuned), as on a second run;
- ``fresh``: an empty cache: the first plan starts the native build in a child process;
- ``off``: ``KERNELGRAFT_NATIVE=0``, empty cache (the Python path only).

With the native replay on, the first window must be within 5% of the later ones in both cache states.

Part 2, decisions: two fresh processes (empty caches) tune every example op on its ``bench_inputs``:
one at once (its first second, while the native build runs), one after building the extension and
waiting ``--settle`` seconds. Prints any (op, shape) whose winner differs, with both timings.

    python benchmarks/bench_first_seconds.py --out DIR [--seconds 12] [--gap 1.5] [--settle 30]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

SHAPE = (2048, 32768)


def _child_windows(seconds: float, gap: float) -> dict:
    import torch
    import triton.testing

    import kernelgraft as kg
    from kernelgraft import native as _native
    from kernelgraft.examples.softmax import softmax

    x = torch.randn(*SHAPE, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    softmax(x)  # tunes (or reads the cache) and plans
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - t0
    windows = []
    start = time.perf_counter()
    i = 0
    while True:
        target = start + i * gap
        if target - start > seconds:
            break
        delay = target - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        at = time.perf_counter() - start
        busy = _native.busy()
        loaded = _native.get() is not None
        bench_us = triton.testing.do_bench(lambda: softmax(x), warmup=5, rep=40) * 1e3
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            softmax(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(10):
                softmax(x)
        graph.replay()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(5):
            graph.replay()
        end.record()
        end.synchronize()
        graph_us = begin.elapsed_time(end) * 1e3 / 50
        del graph
        windows.append({"t_s": round(at, 2), "do_bench_us": round(bench_us, 2), "graph_us": round(graph_us, 2),
                        "native_busy": busy, "native_loaded": loaded})
        i += 1
    decision = kg.tune.decision(softmax, x)
    winner = decision.winner if decision is not None else None
    return {"first_call_s": round(first_call_s, 2), "windows": windows,
            "winner": f"{winner['impl_name']} {winner['config']}" if winner else None,
            "native_reason": _native.reason()}


def _child_decisions(settle: float) -> dict:
    import torch

    import kernelgraft as kg
    from kernelgraft.bench import bench_inputs_of
    from kernelgraft.examples import add_relu, fp8_kcache_scatter, gemm, rmsnorm, rmsnorm_residual, softmax, swiglu

    started = time.perf_counter()
    if settle > 0:
        kg.native.build()
        time.sleep(max(0.0, settle - (time.perf_counter() - started)))
    ops = [add_relu.add_relu, rmsnorm.rmsnorm, rmsnorm_residual.rmsnorm_residual, softmax.softmax,
           swiglu.swiglu, gemm.gemm, fp8_kcache_scatter.fp8_kcache_scatter]
    rows = []
    for op in ops:
        for args in bench_inputs_of(op, "cuda") or ():
            t = time.perf_counter()
            decision = kg.tune.pretune(op, *args)
            took = time.perf_counter() - t
            shape = ", ".join("x".join(map(str, a.shape)) + f" {str(a.dtype)[6:]}"
                              for a in args if isinstance(a, torch.Tensor))
            ranking = decision.ranking if decision is not None else []
            rows.append({"op": op.name, "shape": shape, "tune_s": round(took, 2),
                         "t_s": round(t - started, 2),
                         "ranking": [{"name": f"{r['impl_name']} {r['config']}",
                                      **{k: v for k, v in r.items() if isinstance(v, float)}}
                                     for r in ranking[:3]]})
    return {"rows": rows}


def _spawn(args: list[str], env: dict, timeout: float) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode != 0:
        return {"error": out.stderr[-3000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _env(cache: Path, native: bool = True, gpu: str | None = None) -> dict:
    env = dict(os.environ, KERNELGRAFT_CACHE_DIR=str(cache), KERNELGRAFT_NATIVE="1" if native else "0")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def _summary(name: str, result: dict) -> list[str]:
    if "error" in result:
        return [f"| {name} | error | | | | |", "", "```", result["error"], "```"]
    w = result["windows"]
    first, later = w[0], w[1:]
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    lb, lg = med([x["do_bench_us"] for x in later]), med([x["graph_us"] for x in later])
    return [f"| {name} | {result['first_call_s']} | {first['do_bench_us']} ({first['do_bench_us'] / lb:.3f}x) | "
            f"{lb} | {first['graph_us']} ({first['graph_us'] / lg:.3f}x) | {lg} | "
            f"{min(x['do_bench_us'] for x in later)}-{max(x['do_bench_us'] for x in later)} | "
            f"{sum(x['native_busy'] for x in w)} | {result['winner']} |"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=["windows", "decisions"])
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--gap", type=float, default=1.5)
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--skip-decisions", action="store_true")
    parser.add_argument("--modes", default="warm,fresh,off", help="which processes to run (comma-separated)")
    a = parser.parse_args()
    if a.child == "windows":
        print(json.dumps(_child_windows(a.seconds, a.gap)))
        return 0
    if a.child == "decisions":
        print(json.dumps(_child_decisions(a.settle)))
        return 0

    import torch

    from _common import environment, write_json

    root = Path(tempfile.mkdtemp(prefix="kg-first-seconds-"))
    warm = root / "warm"
    modes = [m for m in a.modes.split(",") if m]
    results = {"environment": environment()}
    if "warm" in modes:
        subprocess.run([sys.executable, "-c", "import kernelgraft as kg; kg.native.build()"], env=_env(warm),
                       check=False, timeout=600)
        results["prime"] = _spawn(["--child", "windows", "--seconds", "0"], _env(warm), 600)  # tunes the shape
    window_args = ["--child", "windows", "--seconds", str(a.seconds), "--gap", str(a.gap)]
    for name, env in (("warm", _env(warm)), ("fresh", _env(root / "fresh")), ("off", _env(root / "off", native=False))):
        if name not in modes:
            continue
        results[name] = _spawn(window_args, env, 900)
        print(name, json.dumps(results[name])[:2000], flush=True)
    lines = [f"# First seconds of a process: softmax bf16 {SHAPE[0]} x {SHAPE[1]}", "",
             f"{results['environment']}", "",
             "| process | first call s | first window do_bench us | later do_bench us (median) | "
             "first window graph us | later graph us (median) | later do_bench range | windows with a build/load busy | winner |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
    for name in ("warm", "fresh", "off"):
        if name in results:
            lines += _summary(name, results[name])
    if not a.skip_decisions:
        gpus = torch.cuda.device_count()
        now_env = _env(root / "now", gpu="0")
        later_env = _env(root / "later", gpu="1" if gpus > 1 else "0")
        procs = {}
        for name, env, settle in (("now", now_env, 0.0), ("later", later_env, a.settle)):
            procs[name] = subprocess.Popen([sys.executable, __file__, "--child", "decisions", "--settle", str(settle)],
                                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if gpus < 2:
                procs[name].wait()
        decided = {}
        for name, p in procs.items():
            out, err = p.communicate(timeout=1200)
            decided[name] = json.loads(out.strip().splitlines()[-1]) if p.returncode == 0 else {"error": err[-3000:]}
        results["decisions"] = decided
        lines += ["", f"## Decisions: tuned at once vs after {a.settle:.0f} s (native built)", ""]
        if any("error" in d for d in decided.values()):
            lines += ["```", json.dumps(decided)[:4000], "```"]
        else:
            same = 0
            rows = list(zip(decided["now"]["rows"], decided["later"]["rows"]))
            lines += ["| op | shape | at once | after waiting | tune s (at once / after) |", "| --- | --- | --- | --- | ---: |"]
            for now, later in rows:
                w_now = now["ranking"][0]["name"] if now["ranking"] else "-"
                w_later = later["ranking"][0]["name"] if later["ranking"] else "-"
                same += w_now == w_later
                mark = "" if w_now == w_later else " **differs**"
                lines.append(f"| {now['op']} | {now['shape']} | {now['ranking'][:2]} | {later['ranking'][:2]}{mark} | "
                             f"{now['tune_s']} / {later['tune_s']} |")
            lines += ["", f"{same} of {len(rows)} decisions agree."]
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "first_seconds.md").write_text(text + "\n")
        write_json("first_seconds", results, a.out)
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
