"""Every example op on the LLM shape suite: tuned op vs torch eager, torch.compile and Liger-Kernel.

For every op and every shape of its ``BENCH_SHAPES["llm"]`` (kernelgraft.bench.suite: decode,
prefill, narrow, wide and vocab rows, skinny and prefill GEMMs, FP8 cache scatters) this times, by
CUDA-graph replay through ``kernelgraft.bench`` (the timer ``kernelgraft bench --timing graph``
uses), the tuned op, its eager reference, ``torch.compile`` of the reference (one dynamic-shape
compile per op unless ``--compile static``) and Liger-Kernel where it has the op
(``benchmarks/peers.py``). It reports op / min(eager, compile) and op / Liger per shape, the worst
five of each, and the achieved bandwidth of memory-bound ops at their largest shape against the
copy bandwidth measured at the start. Each of ``--rounds`` rounds times the tuned op and its rivals
at once, their graph replays taken in turn (``kernelgraft.bench.measure_interleaved``), so the
ratio within a round is free of the clock drift that moves a large GEMM by 5-14% between timings.

    python benchmarks/bench_llm_suite.py --out $OUT            # the whole suite (~5 min on an H200, 3 rounds)
    python benchmarks/bench_llm_suite.py --quick               # a shape per regime + the known gaps
    python benchmarks/bench_llm_suite.py --dry-run [--quick]   # list the shapes; no GPU needed

Writes ``llm_suite.json`` (every row in kernelgraft's bench schema plus the summary) and
``llm_suite.md`` (the tables) under ``--out`` (else $OUT, else benchmarks/results/).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import statistics
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from kernelgraft.bench import Row, shape_plan  # noqa: E402
from kernelgraft.bench.run import COMPILE, EAGER, PEER, TUNED  # noqa: E402
from kernelgraft.bench import module_inputs  # noqa: E402

MODULES = ("rmsnorm", "rmsnorm_residual", "softmax", "swiglu", "fp8_kcache_scatter", "kv_append", "topk_router",
           "add_relu", "gemm")
COMPUTE_BOUND = {"kgexamples::gemm"}
# shapes --quick adds to the first of each regime: the gaps measured before the suite existed
QUICK_EXTRA = {
    "rmsnorm": [(65536, 128), (16384, 8192)],
    "softmax": [(1, 151936), (64, 128256)],
}
LIMITS = {"vs_torch": 1.02, "vs_liger": 1.05, "bandwidth": 0.90}  # the bar each shape must meet
INCONSISTENT = 1.15  # tuned op / its chosen kernel forced, beyond timing noise
FEW_CALLS = 10  # a graph of fewer calls adds the graph launch's own latency to each (seen in `benchmarks/results/2026-12-01-h200-3/`)


def plan(quick: bool, only: Sequence[str] = ()) -> list[tuple[str, str, tuple]]:
    """``[(module, regime, dims)]`` of the run: the whole llm suite, or for ``quick`` the first
    shape of each regime plus QUICK_EXTRA."""
    out = []
    for name in MODULES:
        if only and not any(s in name for s in only):
            continue
        module = importlib.import_module(f"kernelgraft.examples.{name}")
        shapes = shape_plan(module.BENCH_SHAPES, "llm")
        if quick:
            firsts = {}
            for regime, dims in shapes:
                firsts.setdefault(regime, dims)
            keep = set(firsts.values()) | set(QUICK_EXTRA.get(name, ()))
            shapes = [(r, d) for r, d in shapes if d in keep]
        out += [(name, regime, dims) for regime, dims in shapes]
    return out


def input_megabytes(name: str, dims: tuple) -> float:
    """Megabytes of the shape's tensors, built on the meta device (nothing allocated)."""
    module = importlib.import_module(f"kernelgraft.examples.{name}")
    for case in module_inputs(module, "meta", "llm"):
        if case.dims == dims:
            return sum(t.numel() * t.element_size() for t in case if isinstance(t, torch.Tensor)) / 1e6
    raise KeyError(f"{name}: no llm shape {dims}")


def dry_run(shapes: list[tuple[str, str, tuple]]) -> str:
    lines = ["| op | regime | dims | inputs MB |", "| --- | --- | --- | ---: |"]
    lines += [f"| {n} | {r} | {'x'.join(map(str, d))} | {input_megabytes(n, d):.1f} |" for n, r, d in shapes]
    lines.append(f"\n{len(shapes)} shapes")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ summary
def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def paired(ours: list | None, theirs: Sequence[list | None]) -> float | None:
    """The median over rounds of ours / the fastest of ``theirs`` in the same round (rounds rotate
    the order, so a drifting clock lands on both sides of each ratio), over the rounds every side
    completed (a failed round is None); None unless every side has the same rounds and at least
    two of them are complete."""
    rivals = [t for t in theirs if t]
    if not ours or not rivals or any(len(t) != len(ours) for t in rivals):
        return None
    ratios = [o / min(t[r] for t in rivals) for r, o in enumerate(ours)
              if o is not None and all(t[r] is not None for t in rivals)]
    return statistics.median(ratios) if len(ratios) >= 2 else None


def largest(rows: Iterable[Row]) -> dict[str, float]:
    """Bytes moved by each memory-bound op's largest tuned shape."""
    out: dict[str, float] = {}
    for r in rows:
        if r.kind == TUNED and r.op not in COMPUTE_BOUND and r.time_us and r.bytes == r.bytes:
            out[r.op] = max(out.get(r.op, 0.0), r.bytes)
    return out


def summarize(rows: Iterable[Row], copy_gbps: float | None, same_size_copy_gbps: dict | None = None) -> dict:
    """Per shape: tuned, eager, compile and peer times with op/min(eager, compile) and op/peer
    (paired by round where the rows carry their rounds' samples, see ``paired``);
    the worst five of each ratio; bandwidth of memory-bound ops at their largest shape, of the copy
    measured at the start (1 GiB) and, where given (``same_size_copy_gbps``: op -> GB/s), of a copy
    moving the same bytes timed the same way: a small kernel pays a launch and a tail a 1 GiB copy
    spreads thin, and so does a copy of its size."""
    rows = list(rows)  # read twice: the table, then the largest shapes
    shapes: dict[tuple[str, int], dict] = {}
    for r in rows:
        entry = shapes.setdefault((r.op, r.size), {"op": r.op, "shape": r.shape, "regime": r.regime,
                                                    "bytes": r.bytes, "peers": {}})
        if r.kind == TUNED:
            entry.update(tuned_us=r.time_us, choice=r.detail, tuned_error=r.error, bw_frac=r.bw_frac,
                         gbps=r.gbps, h2h_vs_compile=r.vs_compile, vs_chosen=r.vs_chosen,
                         graph_calls=r.calls if r.method == "graph" else None,
                         rounds=getattr(r, "rounds", 1), tuned_spread=getattr(r, "spread", None),
                         ranking=getattr(r, "ranking", None), tuned_samples=getattr(r, "samples", None))
        elif r.kind == EAGER:
            entry["eager_us"] = r.time_us
            entry["eager_spread"] = getattr(r, "spread", None)
            entry["eager_samples"] = getattr(r, "samples", None)
        elif r.kind == COMPILE:
            entry["compile_us"] = r.time_us
            entry["compile_samples"] = getattr(r, "samples", None)
        elif r.kind == PEER:
            entry["peers"][r.variant.removeprefix("peer: ")] = r.time_us
            entry.setdefault("peer_samples", {})[r.variant.removeprefix("peer: ")] = getattr(r, "samples", None)
            if r.detail:
                entry["peer_note"] = r.detail
    table = []
    for entry in shapes.values():
        torch_best = min((t for t in (entry.get("eager_us"), entry.get("compile_us")) if t), default=None)
        entry["vs_torch"] = paired(entry.get("tuned_samples"), [entry.get("eager_samples"), entry.get("compile_samples")]) \
            or _ratio(entry.get("tuned_us"), torch_best)
        liger = entry["peers"].get("liger")
        entry["vs_liger"] = paired(entry.get("tuned_samples"), [entry.get("peer_samples", {}).get("liger")]) \
            or _ratio(entry.get("tuned_us"), liger)
        table.append(entry)

    def worst(key: str) -> list[dict]:
        have = [e for e in table if e.get(key) is not None]
        return sorted(have, key=lambda e: -e[key])[:5]

    bandwidth = []
    for op, nbytes in largest(rows).items():
        big = next(e for e in table if e["op"] == op and e["bytes"] == nbytes and e.get("tuned_us"))
        same = (same_size_copy_gbps or {}).get(op)
        bandwidth.append({"op": op, "shape": big["shape"], "gbps": big.get("gbps"),
                          "fraction": big.get("bw_frac"), "copy_gbps": copy_gbps,
                          "same_size_copy_gbps": same,
                          "fraction_of_same_size_copy": _ratio(big.get("gbps"), same)})
    failures = [e for e in table if e.get("tuned_us") is None]
    return {
        "limits": LIMITS,
        "shapes": table,
        "worst_vs_torch": worst("vs_torch"),
        "worst_vs_liger": worst("vs_liger"),
        "bandwidth": bandwidth,
        # the tuned op slower than its own chosen kernel forced, or timed by graphs of a handful of
        # calls: a row to distrust (and a bug to find)
        "inconsistent": [e for e in table if (e.get("vs_chosen") or 0) > INCONSISTENT
                         or 0 < (e.get("graph_calls") or FEW_CALLS) < FEW_CALLS],
        "over_limit": {
            "vs_torch": sum(1 for e in table if (e.get("vs_torch") or 0) > LIMITS["vs_torch"]),
            "vs_liger": sum(1 for e in table if (e.get("vs_liger") or 0) > LIMITS["vs_liger"]),
            "bandwidth": sum(1 for b in bandwidth if (b["fraction"] or 0) < LIMITS["bandwidth"]),
            "failed": len(failures),
        },
    }


def _us(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


def _others(peers: dict) -> str:
    return ", ".join(f"{name} {_us(t)}" for name, t in peers.items() if name != "liger") or "-"


def _scores(ranking: list | None) -> str:
    if not ranking:
        return "-"
    ms = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
    return "; ".join(f"{label} {ms(score)}/{ms(gpu)}/{ms(host)}" for label, score, gpu, host in ranking)


def _gbps(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def markdown(summary: dict) -> str:
    """The tables: every shape, the worst five of each ratio, bandwidth at the largest shapes."""
    head = ("| op | regime | inputs | tuned us | choice | eager us | compile us | liger us | other peers us | "
            "op/min(torch) | op/liger |")
    lines = ["## Every shape (GPU time by CUDA-graph replay)", "",
             "Times are medians of each variant's rounds; with several rounds the ratios are medians of "
             "the ratios within a round (each round times the variants at once, their graph replays in turn).", "",
             head, "|" + " --- |" * 11]
    for e in summary["shapes"]:
        lines.append(
            f"| {e['op'].split('::')[-1]} | {e['regime']} | {e['shape']} | {_us(e.get('tuned_us'))} | "
            f"{e.get('choice') or e.get('tuned_error') or '-'} | {_us(e.get('eager_us'))} | "
            f"{_us(e.get('compile_us'))} | {_us(e['peers'].get('liger'))} | {_others(e['peers'])} | "
            f"{_x(e.get('vs_torch'))} | "
            f"{_x(e.get('vs_liger'))} |")
    for key, title in (("worst_vs_torch", f"op / min(eager, compile), limit {LIMITS['vs_torch']}x"),
                       ("worst_vs_liger", f"op / Liger-Kernel, limit {LIMITS['vs_liger']}x")):
        lines += ["", f"## Worst five: {title}", "",
                  "| op | inputs | ratio | spread of the op's rounds | the tuner's scores, ms (score/GPU/host) |",
                  "| --- | --- | ---: | ---: | --- |"]
        lines += [f"| {e['op'].split('::')[-1]} | {e['shape']} | {_x(e[key.removeprefix('worst_')])} | "
                  f"{_x(e.get('tuned_spread'))} | {_scores(e.get('ranking'))} |" for e in summary[key]]
    lines += ["", f"## Bandwidth at the largest shape (limit {LIMITS['bandwidth']:.0%} of measured copy)", "",
              "| op | inputs | GB/s | of copy | copy of the same bytes, GB/s | of that copy |",
              "| --- | --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {b['op'].split('::')[-1]} | {b['shape']} | {_gbps(b['gbps'])} | {_pct(b['fraction'])} | "
              f"{_gbps(b.get('same_size_copy_gbps'))} | {_pct(b.get('fraction_of_same_size_copy'))} |"
              for b in summary["bandwidth"]]
    if summary.get("inconsistent"):
        lines += ["", f"## Rows to distrust: the tuned op over {INCONSISTENT}x its own chosen kernel forced, "
                      f"or timed by graphs of fewer than {FEW_CALLS} calls", "",
                  "| op | inputs | tuned us | chosen | tuned / chosen forced | calls per graph |",
                  "| --- | --- | ---: | --- | ---: | ---: |"]
        lines += [f"| {e['op'].split('::')[-1]} | {e['shape']} | {_us(e.get('tuned_us'))} | {e.get('choice')} | "
                  f"{_x(e.get('vs_chosen'))} | {e.get('graph_calls') or '-'} |" for e in summary["inconsistent"]]
    over = summary["over_limit"]
    lines += ["", f"Over the limits: {over['vs_torch']} shapes vs torch, {over['vs_liger']} vs Liger, "
                  f"{over['bandwidth']} ops under the bandwidth bar; {over['failed']} shapes without a tuned time."]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ GPU run
def _until(deadline: float, cases: Iterator, skipped: list, name: str) -> Iterator:
    """Yield ``cases`` until ``deadline`` (time.monotonic), then record the rest as skipped."""
    for case in cases:
        if time.monotonic() > deadline:
            skipped.append(f"{name} {case.regime} {case.dims}")
            continue
        yield case


def run(args) -> int:
    from _common import environment

    from kernelgraft.bench import bench_op, measure, measure_ceilings, measure_interleaved, write_json
    from kernelgraft.bench.report import document
    from kernelgraft.bench.peers import peers_for

    import peers as peer_module

    os.environ.setdefault("KERNELGRAFT_PRUNE", "1")  # the GEMM's 30 configs pruned to a few per shape
    why = peer_module.available()
    liger = not (why or args.no_liger)
    peers = {op: [p for p in fns if liger or getattr(p, "peer_name", "") != "liger"]
             for op, fns in peer_module.PEERS.items()}
    if why and not args.no_liger:
        print(f"no Liger-Kernel peers: {why}")
    shapes = plan(args.quick, args.op or ())
    wanted: dict[str, set] = {}
    for name, _, dims in shapes:
        wanted.setdefault(name, set()).add(dims)
    print("measuring ceilings ...", flush=True)
    ceilings = measure_ceilings("cuda")
    print(f"  copy {ceilings.copy_gbps:.0f} GB/s, bf16 GEMM {ceilings.bf16_tflops:.0f} TFLOP/s", flush=True)
    deadline = time.monotonic() + args.time_limit
    timer = lambda fn: measure(fn, graph=True, warmup_ms=30.0, rep_ms=40.0)  # noqa: E731
    # each round times the op and its rivals at once, their replays in turn (the same clock)
    together = lambda fns: measure_interleaved(fns, warmup_ms=30.0, rep_ms=40.0)  # noqa: E731
    rows, skipped = [], []
    out = Path(args.out or os.environ.get("OUT") or HERE / "results")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for name, dims_set in wanted.items():
        module = importlib.import_module(f"kernelgraft.examples.{name}")
        op = getattr(module, name)
        cases = (c for c in module_inputs(module, "cuda", "llm") if c.dims in dims_set)
        t0 = time.monotonic()
        try:
            rows += bench_op(op, _until(deadline, cases, skipped, name), ceilings=ceilings, timer=timer,
                             compile=args.compile != "off", dynamic=args.compile == "dynamic",
                             peers=peers_for(op.name, peers), timing="graph", candidates=False, untuned=False,
                             compare=args.head_to_head, rounds=args.rounds, together=together)
        except Exception as exc:  # one op failing must not lose the others
            print(f"{name}: failed: {type(exc).__name__}: {exc}")
        print(f"{name}: {len(dims_set)} shapes in {time.monotonic() - t0:.1f} s", flush=True)
        torch.cuda.empty_cache()
    same_size = {}
    for op_name, nbytes in largest(rows).items():  # the copy moving what the op moves, same timer
        src = torch.empty(max(int(nbytes) // 8, 1), dtype=torch.float32, device="cuda").uniform_()
        dst = torch.empty_like(src)
        same_size[op_name] = 2 * src.numel() * 4 / (timer(lambda: dst.copy_(src)).median_us * 1e-6) / 1e9
        del src, dst
    summary = summarize(rows, ceilings.copy_gbps, same_size)
    summary.update(skipped=skipped, seconds=time.monotonic() - started, compile=args.compile, quick=args.quick)
    text = markdown(summary)
    print(text)
    if skipped:
        print(f"\nskipped after --time-limit {args.time_limit:.0f} s: {len(skipped)} shapes")
    doc = document(rows, ceilings, environment())
    doc["summary"] = summary
    write_json(doc, out / "llm_suite.json")
    (out / "llm_suite.md").write_text(text + "\n")
    print(f"wrote {out / 'llm_suite.json'} and {out / 'llm_suite.md'}")
    return 0 if rows else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a shape per regime plus the known gaps")
    parser.add_argument("--dry-run", action="store_true", help="list the shapes and their sizes, time nothing")
    parser.add_argument("--op", action="append", help="only example modules whose name contains this")
    parser.add_argument("--out", help="directory for llm_suite.json and llm_suite.md (default $OUT)")
    parser.add_argument("--compile", choices=("dynamic", "static", "off"), default="dynamic",
                        help="torch.compile of the reference: once per op with dynamic shapes (default), "
                             "once per shape, or not at all")
    parser.add_argument("--no-liger", action="store_true", help="no Liger-Kernel peers")
    parser.add_argument("--head-to-head", action="store_true",
                        help="also time the tuned op against torch.compile in alternating rounds (h2h_vs_compile "
                             "in the JSON; about a second more per shape)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="time the tuned op, eager, compile and peers this many times each, in rotating "
                             "order, and keep each one's median (clock drift under large GEMMs moved one "
                             "cuBLAS call by 15%% between two timings a few seconds apart)")
    parser.add_argument("--time-limit", type=float, default=420.0,
                        help="seconds after which remaining shapes are skipped (and listed)")
    args = parser.parse_args(argv)
    if args.dry_run:
        print(dry_run(plan(args.quick, args.op or ())))
        return 0
    if not torch.cuda.is_available():
        print("bench_llm_suite: needs a CUDA GPU (use --dry-run to list the shapes here)")
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
