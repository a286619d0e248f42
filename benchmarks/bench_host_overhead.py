"""Host cost of one eager call on a tiny tensor, and the cost under CUDA-graph replay.

(a0) raw Triton launch into a preallocated output; (a) the same with its output allocated
(what hand-written glue does); (b) (a) wrapped in a plain torch.library.custom_op; (c) the
kernelgraft op; (d) the kernelgraft op called as torch.ops.<ns>.<name>.
Targets: (c) <= (a) + 3 us, (c) < (b); under graph replay (c) == (a).

    python benchmarks/bench_host_overhead.py [--calls 2000] [--rounds 25]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import os  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))
# These measure the kernels' tuner (configs against each other) and the kernels' dispatch: PyTorch
# competing (on by default on CUDA) would add torch:eager/torch:compile winners with no
# config; benchmarks/bench_compete.py measures that. KERNELGRAFT_COMPETE=1 overrides.
os.environ.setdefault("KERNELGRAFT_COMPETE", "0")

import torch
import triton

from _common import environment, interleaved_host_us, write_json
import kernelgraft as kg
from kernelgraft.examples.add_relu import TRITON, _add_relu_kernel
from kernelgraft.examples.add_relu import add_relu as example_add_relu

# The op under test holds only the example's Triton impl, so (c) launches exactly the kernel and
# config of (a): the example op itself also has CUDA C++, cuTile and CuTe DSL candidates, and the
# tuner may pick one of those (an earlier run of this script measured the CuTe DSL candidate).
# One config (the one (a) launches) so no tuning happens either.
_ONE = kg.triton(TRITON.launch, configs=[{"BLOCK": 1024, "num_warps": 4}], supports=TRITON.supports)
add_relu = kg.op("kgbench::add_relu_triton", impls=[_ONE])(example_add_relu.reference)

BLOCK, WARPS = 1024, 4  # the example op's first config, which it runs by default


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--out")
    args = parser.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"

    n = args.n
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    out0 = torch.empty_like(x)
    grid = (triton.cdiv(n, BLOCK),)

    def raw_prealloc(x, y):
        _add_relu_kernel[grid](x, y, out0, n, BLOCK=BLOCK, num_warps=WARPS)
        return out0

    def raw(x, y):
        out = torch.empty_like(x)
        _add_relu_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, out, x.numel(), BLOCK=BLOCK, num_warps=WARPS)
        return out

    @torch.library.custom_op("kgbench::add_relu_custom_op", mutates_args=())
    def custom(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return raw(x, y)

    @custom.register_fake
    def _(x, y):
        return torch.empty_like(x)

    dispatcher = torch.ops.kgbench.add_relu_triton
    variants = {
        "(a0) raw launch, preallocated out": raw_prealloc,
        "(a) raw launch + torch.empty_like": raw,
        "(b) torch.library.custom_op": custom,
        "(c) kernelgraft op": add_relu,
        "(d) kernelgraft via torch.ops": dispatcher,
    }
    expected = torch.relu(x + y)
    for name, fn in variants.items():  # warm-up, JIT, and a correctness check of each path
        for _ in range(20):
            got = fn(x, y)
        torch.cuda.synchronize()
        torch.testing.assert_close(got, expected, msg=name)

    samples = interleaved_host_us(variants, (x, y), args.calls, args.rounds)
    host = {k: statistics.median(v) for k, v in samples.items()}

    # CUDA-graph replay: 100 calls captured per graph, two captures per variant, replays
    # alternated; per-call device time from CUDA events.
    def capture(fn):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn(x, y)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = [fn(x, y) for _ in range(100)]
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(outs[-1], expected)
        return g, outs

    names = ("(a) raw launch + torch.empty_like", "(c) kernelgraft op")
    graphs = {(name, k): capture(variants[name]) for k in range(2) for name in names}
    replay: dict = {key: [] for key in graphs}
    for _ in range(40):
        for key, (g, _outs) in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            replay[key].append(start.elapsed_time(end) * 1e3 / 100)
    per_capture = {f"{name} #{k}": statistics.median(v) for (name, k), v in replay.items()}
    graph_us = {name: statistics.median(replay[(name, 0)] + replay[(name, 1)]) for name in names}
    # two captures of the same variant differ only by noise: that spread is the yardstick
    spread = max(abs(per_capture[f"{n} #0"] - per_capture[f"{n} #1"]) for n in names)

    a, b, c = host["(a) raw launch + torch.empty_like"], host["(b) torch.library.custom_op"], host["(c) kernelgraft op"]
    ga, gc = graph_us["(a) raw launch + torch.empty_like"], graph_us["(c) kernelgraft op"]
    checks = {
        "(c) <= (a) + 3 us": c <= a + 3.0,
        "(c) < (b)": c < b,
        "graph replay (c) == (a) within 5% or the capture-to-capture spread": abs(gc - ga) <= max(0.05 * ga, spread),
    }
    plan = next(iter(add_relu.dispatcher.plans().values()))
    chosen = plan.candidate.label if plan.candidate is not None else "reference"
    assert chosen == f"triton:launch_add_relu[BLOCK={BLOCK},num_warps={WARPS}]", chosen
    payload = {"env": environment(), "op_candidate": chosen, "n": n, "calls": args.calls, "rounds": args.rounds,
               "host_us_median": host, "host_us_all": samples, "graph_replay_us_per_call": graph_us,
               "graph_replay_us_per_capture": per_capture, "graph_capture_spread_us": spread,
               "checks": checks}
    path = write_json("host_overhead", payload, args.out)
    env = payload["env"]
    print(f"\n{env['device']} | torch {env['torch']} | triton {env.get('triton')} | {env['date']} | n={n}")
    print(f"kernelgraft op runs {chosen}")
    print(f"{'variant':40s} {'us/call':>9s} {'vs (a)':>8s}")
    for name, value in host.items():
        print(f"{name:40s} {value:9.2f} {value / a:8.2f}x")
    print(f"{'graph replay (a) per call':40s} {ga:9.2f}")
    print(f"{'graph replay (c) per call':40s} {gc:9.2f} {gc / ga:8.2f}x")
    print(f"{'capture-to-capture spread':40s} {spread:9.2f}")
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    print(f"results: {path}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
