"""Host cost per call of a bundled op from C++ (the runtime, through the dispatcher) side by side
with at::add from C++ and the same ops in Python (the kernelgraft op, native replay), on tiny CUDA
tensors (the target: a C++ call of 3 us or less).

Builds benchmarks/cpp (the runtime, examples/cpp and host_cost) with CMake unless --build-dir
already holds it, then alternates processes: host_cost (C++), this script's --python-side (Python),
--repeats times, each timing --rounds rounds of --calls calls per variant in two modes: queued (a
spin kernel keeps the GPU busy for the whole round, so the loop measures the host alone: the
"host cost") and idle GPU (each round starts on an idle GPU, as `benchmarks/results/2026-12-01-h200-3/` measured; with
that run's 2000 calls per round the launch queue overran and the GPU's pace set the number). Prints the medians over
processes and the ratios; writes cpp_host_cost.json.

    python benchmarks/bench_cpp_host_cost.py --bundle DIR [--build-dir build] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = Path(__file__).resolve().parents[1]


def python_side(calls: int, rounds: int, n: int, covered_us: float) -> dict:
    os.environ.setdefault("KERNELGRAFT_COMPETE", "0")  # the kernels, as in the bundle
    import torch

    from kernelgraft.examples.add_relu import add_relu
    from kernelgraft.examples.rmsnorm import rmsnorm
    from kernelgraft import native as _native
    from _common import covered_host_us, interleaved_host_us

    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    rows, w = torch.randn(4, 256, device="cuda"), torch.randn(256, device="cuda")
    variants = {
        "torch.add (Python)": lambda: torch.add(x, y),
        "kgexamples::add_relu, kernelgraft op (Python)": lambda: add_relu(x, y),
        "kgexamples::add_relu via torch.ops (Python)": lambda: torch.ops.kgexamples.add_relu(x, y),
        "kgexamples::rmsnorm, kernelgraft op (Python)": lambda: rmsnorm(rows, w, 1e-6),
    }
    torch.testing.assert_close(add_relu(x, y), torch.relu(x + y), rtol=0, atol=0)
    for fn in variants.values():
        for _ in range(50):
            fn()
    torch.cuda.synchronize()
    samples, uncovered = covered_host_us(variants, (), calls, rounds, covered_us)
    idle = interleaved_host_us(variants, (), calls, rounds)
    samples.update({f"{k} [idle GPU]": v for k, v in idle.items()})
    plans = {op.name: [p.candidate.label if p.candidate is not None else "reference"
                       for p in op.dispatcher.plans().values()] for op in (add_relu, rmsnorm)}
    return {"host_us_median": {k: statistics.median(v) if v else None for k, v in samples.items()},
            "candidates": plans, "native_replay": _native.load() is not None,
            "python_uncovered_rounds": int(uncovered)}


def build(build_dir: Path) -> Path:
    exe = build_dir / "host_cost"
    if exe.exists():
        return build_dir
    import torch

    cmds = [["cmake", "-S", str(ROOT / "benchmarks" / "cpp"), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
             f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"],
            ["cmake", "--build", str(build_dir), f"-j{os.cpu_count() or 2}"]]
    for cmd in cmds:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return build_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=os.environ.get("KERNELGRAFT_TEST_BUNDLE"))
    parser.add_argument("--build-dir", default="build-bench")
    parser.add_argument("--calls", type=int, default=400, help="calls per round (at most 900: under the launch "
                        "queue's depth, so queued rounds measure the host)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--covered-us", type=float, default=40.0,
                        help="queued mode: the spin covers calls x this many microseconds")
    parser.add_argument("--python-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out")
    args = parser.parse_args()
    if not 0 < args.calls <= 900:
        parser.error("--calls must be 1 to 900 (the launch queue holds about 1000 launches)")
    if args.python_side:
        print(json.dumps(python_side(args.calls, args.rounds, args.n, args.covered_us)))
        return 0
    if not args.bundle:
        raise SystemExit("--bundle DIR (a bundle with kgexamples::add_relu and kgexamples::rmsnorm) is needed")
    from _common import environment, write_json

    build_dir = build(Path(args.build_dir))
    timing = ["--calls", str(args.calls), "--rounds", str(args.rounds), "--n", str(args.n),
              "--covered-us", str(args.covered_us)]
    runs: dict[str, list[float]] = {}
    extra: dict = {}
    for _ in range(args.repeats):  # C++ and Python processes alternate
        cpp = subprocess.run([str(build_dir / "host_cost"), args.bundle, *timing], capture_output=True, text=True,
                             timeout=300)
        if cpp.returncode != 0:
            raise SystemExit(f"host_cost failed:\n{cpp.stdout}\n{cpp.stderr[-3000:]}")
        py = subprocess.run([sys.executable, __file__, "--python-side", *timing], capture_output=True, text=True,
                            timeout=300)
        if py.returncode != 0:
            raise SystemExit(f"the Python side failed:\n{py.stdout}\n{py.stderr[-3000:]}")
        for out in (cpp.stdout, py.stdout):
            result = json.loads(out.strip().splitlines()[-1])
            for name, us in result.pop("host_us_median").items():
                runs.setdefault(name, [])
                if us is not None and us > 0:  # None: every round of the variant was dropped
                    runs[name].append(us)
            for key in ("uncovered_rounds", "python_uncovered_rounds"):
                if key in result:
                    extra[key] = extra.get(key, 0) + result.pop(key)
            extra.update(result)
    median = {name: statistics.median(v) for name, v in runs.items() if v}
    base = median.get("at::add (C++)")
    cpp_op = median.get("kgexamples::add_relu, bundled (C++ dispatcher)")
    if base is None or cpp_op is None:
        raise SystemExit(f"no covered round of at::add or the bundled add_relu survived (dropped: C++ "
                         f"{extra.get('uncovered_rounds')}, Python {extra.get('python_uncovered_rounds')}); "
                         "raise --covered-us")
    checks = {"bundled add_relu from C++ <= 3 us per call (queued: the host's cost)": cpp_op <= 3.0}
    bundled = [name for name in median if "bundled" in name and "[idle GPU]" not in name]  # queued
    extra["runtime_over_at_add_us"] = {name: round(median[name] - base, 3) for name in bundled}
    # What a bundled op adds over the floor under any op here: one launch plus one allocation.
    launch, alloc = median.get("bare kernel launch (at::cuda::sleep(0))"), median.get("output allocation (at::empty_like)")
    if launch is not None and alloc is not None:
        extra["floor_us"] = {"launch": round(launch, 3), "allocation": round(alloc, 3)}
        extra["runtime_over_floor_us"] = {name: round(median[name] - launch - alloc, 3) for name in bundled}
    payload = {"env": environment(), "per_process_us": runs, "median_us": median, "checks": checks, **extra}
    write_json("cpp_host_cost", payload, args.out)
    env = payload["env"]
    print(f"\n{env['device']} | torch {env['torch']} | {env['date']} | n={args.n}, {args.calls} calls x "
          f"{args.rounds} rounds x {args.repeats} processes each")
    print(f"Python candidates: {extra.get('candidates')}; native replay: {extra.get('native_replay')}")
    print(f"uncovered rounds dropped: C++ {extra.get('uncovered_rounds', 0)}, "
          f"Python {extra.get('python_uncovered_rounds', 0)}")
    print(f"{'variant':64s} {'us/call':>8s} {'vs at::add':>11s}")
    for name, us in sorted(median.items(), key=lambda kv: ("[idle GPU]" in kv[0], kv[0])):
        print(f"{name:64s} {us:8.2f} {us / base:10.2f}x")
    print(f"the runtime's cost over at::add in the same process: {extra['runtime_over_at_add_us']}")
    if "floor_us" in extra:
        print(f"floor on this host: {extra['floor_us']}; the runtime over launch + allocation: "
              f"{extra['runtime_over_floor_us']}")
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
