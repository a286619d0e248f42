"""kernelgraft tune TARGET...: tune every op in TARGET now, on its sample inputs or given shapes, or
ahead over shape ranges (``--decode``/``--prefill``, of the ops or of a model's op sites) or a
benchmark suite (``--suite``). Under ``torchrun --nproc_per_node K -m kernelgraft tune ...`` the
keys are split across the ranks and every rank's tune.json gets all the decisions."""

from __future__ import annotations

import inspect
import os

HELP = "tune the ops in TARGET now (sample inputs, --shapes, --decode/--prefill ranges or --suite)"


def add_arguments(parser) -> None:
    parser.add_argument("target", nargs="+", help="a .py file or module defining ops (several allowed)")
    parser.add_argument("--op", action="append", help="only ops whose name contains this (repeatable)")
    parser.add_argument("--shapes", action="append", metavar="SHAPES",
                        help="tensor shapes of one call, in parameter order, e.g. '16x4096,4096x4096' "
                             "(repeatable); other arguments come from the op's first sample input")
    parser.add_argument("--dtype", help="dtype of --shapes tensors, e.g. bfloat16 (default: the sample's)")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--force", action="store_true", help="measure again even if a decision is cached")
    parser.add_argument("--prune", action="store_true", help="use the ops' prune hooks")
    parser.add_argument("--max-candidates", type=int, help="measure at most this many candidates per key")
    parser.add_argument("--budget", type=float, help="seconds per key (default 60)")
    parser.add_argument("--cold-l2", action="store_true", help="time with a cold L2 cache")
    parser.add_argument("--isolate", action="store_true", help="run trials in a subprocess")
    ahead = parser.add_argument_group("tuning ahead (resumable: keys already in tune.json are skipped)")
    ahead.add_argument("--decode", metavar="N|LIST",
                       help="decode steps of 1..N sequences (or the batch sizes listed), one token each")
    ahead.add_argument("--prefill", metavar="LIST", help="prompt lengths of one sequence, e.g. 512,2048,8192")
    ahead.add_argument("--model", metavar="NAME",
                       help="a function in TARGET returning the grafted model whose op sites are tuned over "
                            "the ranges (called with the --hf-config config when given)")
    ahead.add_argument("--hf-config", metavar="PATH",
                       help="a Hugging Face config (config.json or its directory): the model's token ids")
    ahead.add_argument("--example", metavar="NAME",
                       help="a function (batch, seq) -> args or (args, kwargs) in TARGET: the model's inputs")
    ahead.add_argument("--suite", choices=("short", "llm"), help="the shapes of each op module's benchmark suite")
    ahead.add_argument("--compile-workers", type=int, metavar="N",
                       help="compile worker processes (0: compile serially; default: one per core but one)")
    ahead.add_argument("--json", metavar="PATH", help="write the per-key report as JSON (rank 0)")


def _samples(op, device: str):
    if op.sample_inputs is None:
        return []
    fn = op.sample_inputs
    try:
        params = inspect.signature(fn).parameters
        return list(fn(device=device) if "device" in params else fn())
    except Exception as exc:
        raise SystemExit(f"kernelgraft tune: {op.name}.sample_inputs failed: {exc}") from exc


def _from_shapes(op, spec: str, template: tuple | None, dtype, device: str) -> tuple:
    import torch

    shapes = [tuple(int(d) for d in part.split("x") if d) for part in spec.split(",")]
    tensor_params = [i for i, p in enumerate(op.signature.params) if p.kind == "tensor"]
    if len(shapes) != len(tensor_params):
        raise SystemExit(f"kernelgraft tune: {op.name} takes {len(tensor_params)} tensors, --shapes "
                         f"gave {len(shapes)}: {spec!r}")
    args = list(template) if template else [p.default for p in op.signature.params]
    for i, shape in zip(tensor_params, shapes):
        like = template[i] if template else None
        dt = dtype or (like.dtype if like is not None else torch.float32)
        args[i] = torch.randn(shape, device=device).to(dt)
    return tuple(args)


def run(args) -> int:
    if args.compile_workers is not None:
        os.environ["KERNELGRAFT_COMPILE_WORKERS"] = str(args.compile_workers)
    if args.decode or args.prefill or args.suite:
        return _ahead(args)
    return _per_call(args)


def _per_call(args) -> int:
    import torch
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    import kernelgraft as kg

    from .common import load_target, ops_of, table_console

    modules = [load_target(t) for t in args.target]
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype) if args.dtype else None
    console = Console()
    if device != "cuda":
        console.print("[yellow]kernelgraft tune: timing needs a CUDA GPU; on the CPU nothing is measured "
                      "(the default candidate runs)[/]")
    options = {k: v for k, v in {"prune": args.prune or None, "max_candidates": args.max_candidates,
                                 "budget": args.budget, "cold_l2": args.cold_l2 or None,
                                 "isolate": args.isolate or None}.items() if v is not None}
    table = Table(title=escape(f"kernelgraft tune ({kg.tune.cache_path()})"))
    for col in ("op", "inputs", "winner", "ms", "measured", "excluded", "source"):
        table.add_column(col)
    found = 0
    tuned = []
    with kg.tune("on", **options):
        for op in [o for m in modules for o in ops_of(m)]:
            if args.op and not any(s in op.name for s in args.op):
                continue
            found += 1
            tuned.append(op)
            samples = _samples(op, device)
            calls = ([_from_shapes(op, s, samples[0] if samples else None, dtype, device) for s in args.shapes]
                     if args.shapes else samples)
            for call in calls:
                d = kg.tune.pretune(op, *call, force=args.force)
                desc = ", ".join(f"{tuple(a.shape)}" for a in call if isinstance(a, torch.Tensor))
                if d is None:
                    table.add_row(escape(op.name), escape(desc), "-", "-", "0", "-", "no supported candidate")
                    continue
                w = d.winner
                label = ("default" if not w else f"torch:{w['impl_name']} (PyTorch won)" if w.get("backend") == "torch"
                         else f"{w['impl_name']}[{','.join(f'{k}={v}' for k, v in w['config'].items())}]")
                table.add_row(escape(op.name), escape(desc), escape(label), f"{w['ms']:.4f}" if w else "-",
                              str(d.measured), str(len(d.excluded)), escape(str(d.source)))
    table_console(table).print(table)
    for op in tuned:  # what was tried per key, compile time against measuring, why each lost
        console.print(escape(str(kg.tune.report(op))), soft_wrap=True)
    if not found:
        console.print(escape(f"kernelgraft tune: no ops found in {' '.join(args.target)}"))
        return 1
    return 0


def _options(args) -> dict:
    return {k: v for k, v in {"prune": args.prune or None, "max_candidates": args.max_candidates,
                              "budget": args.budget, "cold_l2": args.cold_l2 or None,
                              "isolate": args.isolate or None}.items() if v is not None}


def suite_calls(ops, device: str, suite: str) -> list:
    """``(op, make)`` per shape of each op module's benchmark suite; ``make()`` builds that shape's
    arguments (one shape's tensors alive at a time)."""
    from itertools import islice

    from ..bench import bench_inputs_of

    calls = []
    for op in ops:
        if bench_inputs_of(op, "meta", suite) is None:
            continue
        count = sum(1 for _ in bench_inputs_of(op, "meta", suite))
        for i in range(count):
            calls.append((op, lambda op=op, i=i: tuple(next(islice(bench_inputs_of(op, device, suite), i, None)))))
    return calls


def _distributed(device: str) -> bool:
    """Join the torchrun job this process belongs to (gloo: tuning ahead only exchanges through the
    store); False when not launched by torchrun."""
    import torch
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    if device == "cuda" and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group("gloo")
    return True


def _ahead(args) -> int:
    import json

    import torch
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    import kernelgraft as kg

    from .common import load_target, ops_of, table_console

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    joined = _distributed(device)
    rank = int(os.environ.get("RANK", "0")) if joined else 0
    console = Console(stderr=True)
    try:
        modules = [load_target(t) for t in args.target]
        ops = [o for m in modules for o in ops_of(m) if not args.op or any(s in o.name for s in args.op)]
        terminal = console.is_terminal

        def said(result) -> None:
            if not terminal:
                print(f"[rank {result.rank}] {result.status:>12}  {result.key}"
                      + (f"  -> {result.winner}" if result.winner else ""), flush=True)

        common = dict(device=device, force=args.force, progress=terminal, on_key=said)
        with kg.tune("on", **_options(args)):
            if args.suite:
                report = kg.tune.pretune(calls=suite_calls(ops, device, args.suite), **common)
            else:
                ranges = kg.tune.Ranges.parse(args.decode, args.prefill)
                if args.model:
                    report = _model_report(args, modules, ranges, common)
                else:
                    if args.shapes:
                        raise SystemExit("kernelgraft tune: --shapes is for tuning calls now; with --decode/"
                                         "--prefill each op's first sample input is its call")
                    report = kg.tune.pretune(ops, ranges=ranges, **common)
    finally:
        if joined:
            import torch.distributed as dist

            dist.destroy_process_group()
    if rank != 0:
        print(f"[rank {rank}] {report}")
        return 0 if not report.count("lost") else 1
    table = Table(title=escape(f"kernelgraft tune ahead ({kg.tune.cache_path()})"))
    for col in ("op", "key", "status", "winner", "s", "rank"):
        table.add_column(col)
    for k in report.keys:
        table.add_row(escape(k.op), escape(k.key.split(" (", 1)[-1].rstrip(")")), k.status,
                      escape(k.winner or "-"), f"{k.seconds:.1f}", str(k.rank))
    table_console(table).print(table)
    for reason in report.left_out:
        print(f"left out: {reason}")
    print(report)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"seconds": report.seconds, "ranks": report.ranks, "sites": report.sites,
                       "left_out": report.left_out, "keys": [vars(k) for k in report.keys]}, fh, indent=1)
    if not report.keys:
        print(escape(f"kernelgraft tune: no keys to tune in {' '.join(args.target)}"))
        return 1
    return 0 if not report.count("lost") else 1


def _model_report(args, modules, ranges, common):
    import kernelgraft as kg

    def find(name: str):
        for m in modules:
            if hasattr(m, name):
                return getattr(m, name)
        raise SystemExit(f"kernelgraft tune: no {name!r} in {' '.join(args.target)}")

    config = None
    if args.hf_config:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(args.hf_config, local_files_only=True)
    build = find(args.model)
    model = build(config) if config is not None else build()
    example = find(args.example) if args.example else None
    if example is None and config is None:
        raise SystemExit("kernelgraft tune: --model needs --hf-config or --example to make its inputs")
    return kg.tune.pretune(model, ranges=ranges, hf_config=config, example_inputs=example, **common)
