"""Does AOTInductor on this machine compile a model whose graph has an Inductor-generated Triton
kernel, with no kernelgraft op in it? (`benchmarks/results/2026-12-01-h200-3/`: the grafted Llama's package failed to compile on
the H200 machine's torch 2.11: the generated wrapper declared ``CUfunctiontriton_...{nullptr};``,
the space between type and name missing.) Compiles two tiny packages, plain and with a
kernelgraft op, and prints which compile.

`benchmarks/results/2026-12-01-h200-4/`: both tiny ones compile; the grafted Llama still fails, and every failing line is an
f-string of Inductor's whose single space between two replacement fields is gone
(``f"{device_ptr_type} {var_name} = ..."`` came out ``CUdeviceptrvar_5 = ...``), though the
torch 2.11.0 wheel's source has the spaces. ``--llama`` adds the Llama as written, with no
kernelgraft imported in its process (a child), to tell whether grafting has anything to do with it,
and ``--fstring`` checks this Python's f-strings directly."""

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
    if "--fstring" in sys.argv:
        a, b = "CUdeviceptr", "var_5"
        print(f"f-string of two fields and a space: {f'{a} {b}'!r}")
    if "--llama" in sys.argv:
        ok = _plain_llama() and ok
    return 0 if ok else 1


LLAMA = r"""
import sys, tempfile, torch
sys.path.insert(0, "benchmarks")
from _common import build_llama
args = type("A", (), dict(hidden=2048, intermediate=5632, layers=4, heads=16, kv_heads=8, vocab=32000,
                         batch=4, seq=1024))()
model, ids = build_llama(args)

class Logits(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(ids, use_cache=False).logits

with torch.no_grad():
    ep = torch.export.export(Logits(model), (ids,))
    with tempfile.TemporaryDirectory() as d:
        torch._inductor.aoti_compile_and_package(ep, package_path=f"{d}/m.pt2")
print("kernelgraft imported:", "kernelgraft" in sys.modules)
"""


def _plain_llama() -> bool:
    """The Llama of the graft benchmarks as written, compiled by AOTInductor in a child process
    that never imports kernelgraft."""
    import subprocess

    proc = subprocess.run([sys.executable, "-c", LLAMA], capture_output=True, text=True, timeout=600)
    lines = (proc.stdout + proc.stderr).splitlines()
    errors = [line for line in lines if "error:" in line]
    if proc.returncode == 0:
        print(f"Llama as written (no kernelgraft in the process): compiled; {lines[-1] if lines else ''}")
        return True
    print(f"Llama as written (no kernelgraft in the process): FAILED, {len(errors)} compiler errors; "
          f"first: {(errors or lines[-1:] or [''])[0][-300:]}")
    return False


if __name__ == "__main__":
    sys.exit(main())
