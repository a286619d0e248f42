"""cuTile candidates in bundles, on a machine without a GPU: ``kernelgraft aot`` exports their
cubins with launch descriptions (grid and parameters as expressions of the sizes), and the C++
runtime plans each call exactly as the Python cuTile backend launches it: the same cubin symbol,
grid and parameter values (pointer, sizes and strides of each array, scalars)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from kernelgraft.aot import manifest as _manifest
from kernelgraft.backends.cutile import jit as _cutile
from kernelgraft.op.samples import samples
from kernelgraft.examples import add_relu, rmsnorm

from _runtime_helpers import rewrite

OPS = {"add_relu": add_relu.add_relu, "rmsnorm": rmsnorm.rmsnorm}

pytestmark = pytest.mark.skipif(_cutile.toolchain_reason() is not None,
                                reason=f"no cuTile toolchain: {_cutile.toolchain_reason()}")


@pytest.fixture(scope="module")
def bundle(example_bundle) -> Path:
    return example_bundle  # built once per run (conftest); read-only


@pytest.fixture(scope="module")
def cutile_only(bundle, tmp_path_factory) -> dict:
    """The bundle with its cuTile candidates alone, served by the C++ runtime as kgct_test::*."""
    from kernelgraft import runtime

    torch.ops.load_library(str(runtime.library()))
    dst = tmp_path_factory.mktemp("cutile") / "b"
    shutil.copytree(bundle, dst)
    manifest = _manifest.read(dst)
    for op in manifest["ops"]:
        op["name"] = "kgct_test::" + op["name"].split("::")[1]
        op["candidates"] = [c for c in op["candidates"] if c["backend"] == "cutile"]
        op["decisions"] = []
    rewrite(dst, manifest)  # the output rules of the kernels left
    assert list(torch.ops.kernelgraft.load_bundle(str(dst), None, "sm_90")) == ["kgct_test::add_relu",
                                                                                 "kgct_test::rmsnorm"]
    return manifest


def test_the_bundle_holds_cutile_kernels_with_launch_descriptions(bundle):
    manifest = _manifest.read(bundle)
    assert not any(s["candidate"].startswith("cutile:") for op in manifest["ops"] for s in op["skipped"])
    for op in manifest["ops"]:
        kernels = [k for c in op["candidates"] if c["backend"] == "cutile" for k in c["kernels"]]
        assert kernels, op["name"]
        assert any(k["dynamic"] for k in kernels), op["name"]  # grid and sizes are expressions
        for k in kernels:
            assert k["block"] == [1, 1, 1] and k["shared_mem"] == "0"
            assert k["kernel"] == k["cutile"]["symbol"] and k["arch"] == "sm_90"
            image = (bundle / k["images"]["cubin"]["file"]).read_bytes()
            assert image[:4] == b"\x7fELF" and k["kernel"].encode() + b"\0" in image


def _python_launch(op, impl, config, sample) -> dict:
    """What the Python cuTile backend passes the driver for ``sample`` (CPU tensors stand in)."""
    args = op.signature.bind(op.name, tuple(sample), {})
    outs = [torch.empty(s, dtype=d) for s, d, _ in op.dispatcher.output_specs(args)]
    grid, kernel, kargs = _cutile._unpack(impl.launch(*args, *outs, **config.as_dict()), "test")
    values = []
    for a, const in zip(kargs, _cutile._constant_params(kernel)):
        if const:
            continue
        if isinstance(a, torch.Tensor):
            values += [None, *map(str, a.shape), *map(str, a.stride())]
        else:
            values.append(json.dumps(a) if isinstance(a, float) else str(a))
    return {"kernel": _cutile._signature(kernel, kargs, "test").symbol, "grid": [*grid, *[1] * (3 - len(grid))],
            "params": values, "outputs": [list(o.shape) for o in outs]}


@pytest.mark.parametrize("short", list(OPS))
def test_the_cpp_runtime_plans_cutile_calls_as_python_launches_them(cutile_only, short):
    op = OPS[short]
    (impl,) = [i for i in op.impls if i.backend == "cutile"]
    planned = 0
    for sample in samples(op, "cpu"):
        described = [{"shape": list(a.shape), "dtype": str(a.dtype)[6:]} if isinstance(a, torch.Tensor) else a
                     for a in sample]
        try:
            plan = json.loads(torch.ops.kernelgraft._runtime_plan(f"kgct_test::{short}", json.dumps(described)))
        except RuntimeError as exc:  # a sample cuTile's supports() refuses has no cuTile kernel
            assert "no bundled kernel serves these inputs" in str(exc)
            continue
        config = next(c for c in impl.configs if plan["candidate"].endswith(f"[{c.label()}]"))
        want = _python_launch(op, impl, config, sample)
        assert {k: plan[k] for k in want} == want, (short, described)
        planned += 1
    assert planned >= 3, short


_EXPORT = """
import sys, torch
from kernelgraft.backends.cutile import jit as _cutile
from kernelgraft.examples._cute_kernels import CUTILE_IMPLS

spec = CUTILE_IMPLS["add_relu"]
x = torch.empty(4096)
art = _cutile.build_cubin(spec, spec.configs[0], (x, x, torch.empty(4096)), "sm_90")
print(len(art.image))
"""


@pytest.mark.parametrize("mode", ["configured", "off"])
def test_cutile_compiles_write_only_inside_kernelgraft_cache(tmp_path, mode):
    """cuTile's own cubin cache defaults to ~/.cache/cutile-python: compiles kernelgraft starts keep
    it under kernelgraft's cache root, and write none with KERNELGRAFT_CACHE_DIR=off."""
    import os
    import subprocess
    import sys

    home, configured = tmp_path / "home", tmp_path / "kgcache"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "CUDA_TILE_CACHE_DIR")}
    env.update(HOME=str(home), KERNELGRAFT_CACHE_DIR=str(configured) if mode == "configured" else "off")
    run = subprocess.run([sys.executable, "-c", _EXPORT], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout.split()[-1]) > 0
    assert not (home / ".cache").exists(), sorted(str(p) for p in (home / ".cache").rglob("*"))
    if mode == "configured":
        assert (configured / "cutile").is_dir()
    else:
        assert not configured.exists()
