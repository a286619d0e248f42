"""kernelgraft tune TARGET: tune every op in TARGET now, on its sample inputs or given shapes."""

from __future__ import annotations

import inspect

HELP = "tune the ops in TARGET now (sample inputs or --shapes) and store the decisions"


def add_arguments(parser) -> None:
    parser.add_argument("target", help="a .py file or module defining ops")
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
    import torch
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    import kernelgraft as kg

    from ._common import load_target, ops_of, table_console

    module = load_target(args.target)
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
        for op in ops_of(module):
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
        console.print(escape(f"kernelgraft tune: no ops found in {args.target}"))
        return 1
    return 0
