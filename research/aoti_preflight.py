"""Does AOTInductor on this machine compile a model whose graph has an Inductor-generated Triton
kernel, with no kernelgraft op in it? (Session 8: the grafted Llama's package failed to compile on
the H200 machine's torch 2.11: the generated wrapper declared ``CUfunctiontriton_...{nullptr};``,
the space between type and name missing.) Compiles two tiny packages, plain and with a
kernelgraft op, and prints which compile."""

from __future__ import annotations

import sys
import tempfile
import traceback

import torch


class Plain(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2 + 1).sum(-1)


class WithOp(torch.nn.Module):
    def forward(self, x):
        from kernelgraft.examples import add_relu  # noqa: F401 (registers the op)

        return torch.ops.kgexamples.add_relu(x * 2, x).sum(-1)


def main() -> int:
    x = torch.randn(8, 64, device="cuda")
    ok = True
    for model in (Plain(), WithOp()):
        name = type(model).__name__
        try:
            ep = torch.export.export(model, (x,))
            with tempfile.TemporaryDirectory() as d:
                torch._inductor.aoti_compile_and_package(ep, package_path=f"{d}/m.pt2")
            print(f"{name}: compiled")
        except Exception as exc:
            ok = False
            text = "".join(traceback.format_exception_only(exc))
            first = next((line for line in text.splitlines() if "error:" in line), text.splitlines()[0])
            print(f"{name}: FAILED {type(exc).__name__}: {first[:400]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
