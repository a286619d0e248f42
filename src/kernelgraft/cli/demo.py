"""kernelgraft demo: the example ops through `check`, then a small model using them under
torch.compile(fullgraph=True) and torch.export. Runs on the CPU through Triton's interpreter."""

from __future__ import annotations

import time

HELP = "run the example ops through check and a compiled model (CPU or GPU)"


def add_arguments(parser) -> None:
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    parser.add_argument("--skip-check", action="store_true", help="only the model part")


def run(args) -> int:
    from .common import prepare_environment

    prepare_environment()
    import torch
    from rich.console import Console

    from ..check import CheckReport, check_op, render
    from ..examples import add_relu as add_relu_mod
    from ..examples import rmsnorm as rmsnorm_mod

    console = Console(width=200)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    console.rule(f"kernelgraft demo on {device}")
    ok = True
    if not args.skip_check:
        report = CheckReport()
        for op in (add_relu_mod.add_relu, rmsnorm_mod.rmsnorm):
            console.print(f"checking {op.name}: {len(op.impls)} impls, "
                          f"{sum(len(i.configs) for i in op.impls)} candidates")
            report.extend(check_op(op, device=device))
        render(report, console)
        ok = report.ok

    model = _model(add_relu_mod.add_relu, rmsnorm_mod.rmsnorm).to(device)
    x = torch.randn(64, 256, device=device)
    with torch.no_grad():
        expected = model.reference(x)
        eager = model(x)
        graphs = []

        def recording_backend(gm, example_inputs):
            graphs.append(gm)
            if args.backend == "inductor":
                from torch._inductor.compile_fx import compile_fx

                return compile_fx(gm, example_inputs)
            from torch._dynamo.backends.registry import lookup_backend

            return lookup_backend(args.backend)(gm, example_inputs)

        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend=recording_backend)
        start = time.perf_counter()
        out = compiled(x)
        took = time.perf_counter() - start
    targets = sorted({str(n.target) for g in graphs for n in g.graph.nodes if "kgexamples" in str(n.target)})
    err_eager = ((eager - expected).norm() / expected.norm()).item()
    err_compiled = ((out - expected).norm() / expected.norm()).item()
    exported = torch.export.export(model, (x,))
    in_export = sorted({str(n.target) for n in exported.graph.nodes if "kgexamples" in str(n.target)})
    console.print(f"model eager vs reference: rel err {err_eager:.2e}")
    console.print(
        f"torch.compile(fullgraph=True, backend={args.backend}): {len(graphs)} graph(s), "
        f"compiled in {took:.1f}s, rel err {err_compiled:.2e}; ops in graph: {targets}"
    )
    console.print(f"torch.export: ops in exported graph: {in_export}")
    model_ok = (
        err_eager < 1e-5 and err_compiled < 1e-4 and len(graphs) == 1 and len(targets) == 2
        and len(in_export) == 2
    )
    ok = ok and model_ok
    console.rule("[green]demo passed" if ok else "[red]demo FAILED")
    return 0 if ok else 1


def _model(add_relu, rmsnorm):
    import torch

    class Block(torch.nn.Module):
        """x -> Linear -> relu(h + x) -> RMSNorm -> Linear, built on the two example ops."""

        def __init__(self, dim: int = 256) -> None:
            super().__init__()
            self.up = torch.nn.Linear(dim, dim)
            self.down = torch.nn.Linear(dim, dim)
            self.weight = torch.nn.Parameter(torch.randn(dim) * 0.1 + 1.0)

        def forward(self, x):
            h = add_relu(self.up(x), x)
            return self.down(rmsnorm(h, self.weight, 1e-6))

        def reference(self, x):
            h = torch.relu(self.up(x) + x)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
            return self.down(h)

    return Block()
