"""kernelgraft bench TARGET: time every op of TARGET against torch eager, torch.compile and its
ceilings; write a table, JSON and a PNG plot."""

from __future__ import annotations

import os

HELP = "benchmark every op in TARGET (candidates, torch eager, torch.compile, tuned) on the GPU"


def add_arguments(parser) -> None:
    parser.add_argument("target", nargs="*", help="a .py file or module defining ops (several allowed)")
    parser.add_argument("--op", action="append", help="only ops whose name contains this (repeatable)")
    parser.add_argument("--out", help="directory for bench.json and bench.png (default: $OUT if set)")
    parser.add_argument("--json", help="write the full report here (overrides --out)")
    parser.add_argument("--png", help="write the plot here (overrides --out)")
    parser.add_argument("--max-shapes", type=int, help="only the first N benchmark shapes of each op")
    parser.add_argument("--suite", choices=("short", "llm"), default="short",
                        help="which shapes: short (default, a few per op) or llm (every regime an LLM meets: "
                             "decode, prefill, narrow, wide, vocab, skinny GEMMs)")
    parser.add_argument("--against", action="append", metavar="[OP=]MODULE:FUNCTION",
                        help="time this peer (same signature as the op) beside it; MODULE a dotted name or a "
                             ".py path; OP= limits it to one op (repeatable)")
    parser.add_argument("--timing", choices=("cold", "graph"), default="cold",
                        help="cold: each call after an L2 flush (default); graph: CUDA-graph replay")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time the tuned op, torch and the peers N times each and keep each one's median "
                             "(with --timing graph each round replays their graphs in turn): large GEMMs drift "
                             "by several %% between two timings")
    parser.add_argument("--dynamic", action="store_true",
                        help="compile the reference once with dynamic shapes instead of once per shape")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile of the reference")
    parser.add_argument("--no-tune", action="store_true", help="skip the autotuned op")
    parser.add_argument("--all-candidates", action="store_true", help="list every candidate in the table")
    parser.add_argument("--replot", metavar="JSON", help="no benchmark: render the table and plot of a saved report")


def _paths(args) -> tuple[str | None, str | None]:
    out = args.out or os.environ.get("OUT")
    json_path = args.json or (os.path.join(out, "bench.json") if out else None)
    png_path = args.png or (os.path.join(out, "bench.png") if out else None)
    return json_path, png_path


def run(args) -> int:
    if args.replot:
        from ..bench import load_json, plot, render_table
        from ..bench.run import summary_rows

        rows, ceilings, _ = load_json(args.replot)
        render_table(summary_rows(rows, all_candidates=args.all_candidates), ceilings)
        png = args.png or os.path.splitext(args.replot)[0] + ".png"
        why = plot(rows, png, ceilings)
        print(f"wrote {png}" if why is None else f"no plot: {why}")
        return 0 if why is None else 1
    if not args.target:
        print("kernelgraft bench: give a TARGET (a .py file or module defining ops), or --replot JSON")
        return 2
    from ..bench.peers import parse_peer

    try:  # before the GPU check: a typo in a peer is reported anywhere
        peers = [parse_peer(spec) for spec in args.against or ()]
    except ValueError as exc:
        print(f"kernelgraft bench --against: {exc}")
        return 2
    import torch

    if not torch.cuda.is_available():
        print(
            "kernelgraft bench: needs a CUDA GPU, and torch.cuda.is_available() is False here "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}). Run it on a GPU machine; "
            "`kernelgraft check` verifies the kernels on the CPU, and `kernelgraft bench --replot "
            "bench.json` renders a saved report anywhere."
        )
        return 2
    from ..bench import run_benchmarks
    from .common import load_target, ops_of

    ops = []
    for target in args.target:
        try:
            module = load_target(target)
        except (SystemExit, Exception) as exc:  # one missing or broken target must not stop the run
            print(f"kernelgraft bench: skipping {target}: {type(exc).__name__}: {exc}")
            continue
        for op in ops_of(module):
            if not args.op or any(s in op.name for s in args.op):
                ops.append(op)
    if not ops:
        print("kernelgraft bench: no ops found in", " ".join(args.target))
        return 1
    json_path, png_path = _paths(args)
    rows, _ = run_benchmarks(
        ops, json_path=json_path, png_path=png_path, compile=not args.no_compile,
        tune=not args.no_tune, max_shapes=args.max_shapes, all_candidates=args.all_candidates,
        suite=args.suite, peers=peers, timing=args.timing, dynamic=args.dynamic, rounds=args.rounds,
    )
    return 0 if any(r.time_us for r in rows) else 1
