"""examples/cpp on a machine without a GPU: the CMake project builds against the torch wheel, and
run_aoti, a program with no Python in it, loads a bundle and an AOTInductor package whose graph
calls kernelgraft ops; AOTInductor's proxy executor reaches the ops through the dispatcher, where
the runtime serves them (here its CPU kernel refuses the CPU tensors, naming op and argument: the
bundle's kernels run on CUDA devices). On a GPU the same run gives the logits
(benchmarks/build_llama_aoti.py). Slow: a CMake build and an AOTInductor compile, minutes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _aot_helpers import env
from _paths import ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")]

PACKAGE = r"""
import sys, torch
from kernelgraft.examples import add_relu, rmsnorm

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
        self.w = torch.nn.Parameter(torch.ones(64))
    def forward(self, x):
        return torch.ops.kgexamples.add_relu(torch.ops.kgexamples.rmsnorm(self.lin(x), self.w, 1e-6), x)

x = torch.randn(8, 64)
ep = torch.export.export(Block().eval(), (x,), dynamic_shapes={"x": {0: torch.export.Dim("b", min=2, max=1024)}})
torch._inductor.aoti_compile_and_package(ep, package_path=sys.argv[1])
torch.save({"inputs": [x], "outputs": [Block()(x)]}, sys.argv[2])
"""


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> Path:
    build = tmp_path_factory.mktemp("cmake")
    prefix = torch.utils.cmake_prefix_path
    for cmd in (["cmake", "-S", str(ROOT / "examples" / "cpp"), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}"],
                ["cmake", "--build", str(build), "-j2"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return build


def test_run_aoti_reaches_the_bundled_op_through_the_proxy_executor(programs, example_bundle, tmp_path):
    bundle = example_bundle
    package, io = tmp_path / "block.pt2", tmp_path / "io.pt"
    script = tmp_path / "package.py"
    script.write_text(PACKAGE)
    proc = subprocess.run([sys.executable, str(script), str(package), str(io)], capture_output=True, text=True,
                          env=env(), timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    run = subprocess.run([str(programs / "run_aoti"), str(bundle), str(package), str(io), "--arch", "sm_90"],
                         capture_output=True, text=True, timeout=300)
    assert "serving kgexamples::add_relu" in run.stdout and "serving kgexamples::rmsnorm" in run.stdout
    assert "(device cpu) loaded" in run.stdout, run.stdout + run.stderr
    assert run.returncode == 1
    assert "kgexamples::rmsnorm: argument x must be a CUDA tensor, got a tensor on cpu" in run.stderr, run.stderr

    # without --arch the bundle's arch comes from the GPU; without one the error says what to pass
    bare = subprocess.run([str(programs / "run_aoti"), str(bundle), str(package)], capture_output=True, text=True,
                          timeout=300)
    if torch.cuda.is_available():
        assert bare.returncode == 0, bare.stdout + bare.stderr
    else:
        assert bare.returncode == 1 and "pass arch='sm_90'" in bare.stderr, bare.stderr
