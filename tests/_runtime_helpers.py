"""Shared by the C++ runtime's tests: the runtime library loaded once per module (``so``), and
copies of a bundle whose ops live in a namespace of their own (``variant``), so each test's ops
stay apart from the others' and from the Python ops of the same name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelgraft.aot import manifest as _manifest

from _aot_helpers import env


@pytest.fixture(scope="module")
def so() -> Path:
    from kernelgraft import runtime

    library = runtime.library()  # minutes the first time on a small machine, then cached
    torch.ops.load_library(str(library))
    return library


def variant(bundle: Path, dst: Path, namespace: str, edit=None, edit_op=None) -> Path:
    """A copy of ``bundle`` whose ops live in ``namespace``, edited by ``edit(manifest)`` and/or
    ``edit_op(op_entry)``, with its output rules derived again from its kernels and a valid checksum
    (what a careless edit that recomputes them looks like)."""
    shutil.copytree(bundle, dst)
    manifest = _manifest.read(dst)
    for op in manifest["ops"]:
        op["name"] = namespace + "::" + op["name"].split("::")[1]
        if edit_op is not None:
            edit_op(op)
    if edit is not None:
        edit(manifest)
    rewrite(dst, manifest)
    return dst


def rewrite(dst: Path, manifest: dict) -> None:
    """Write an edited ``manifest`` into ``dst``: its output rules derived again from its kernels'
    programs (the bundle spec holds them equal; the texts play no part) and its checksum recomputed."""
    from kernelgraft.aot.program import meta_rules

    for op in manifest["ops"]:
        if "meta" in op:
            op["meta"] = meta_rules(op["candidates"])
    _manifest.write(dst, manifest)


def backend_only(bundle: Path, dst: Path, namespace: str, backend: str) -> list[bool]:
    """A copy of ``bundle`` at ``dst`` whose ops live in ``namespace`` and hold only ``backend``'s
    candidates (no decision rows); per op, whether any candidate is left."""
    shutil.copytree(bundle, dst)
    manifest = _manifest.read(dst)
    for op in manifest["ops"]:
        op["name"] = f"{namespace}::" + op["name"].split("::")[1]
        op["candidates"] = [c for c in op["candidates"] if c["backend"] == backend]
        op["decisions"] = []
    rewrite(dst, manifest)
    return [bool(op["candidates"]) for op in manifest["ops"]]


def json_child(tmp_path: Path, text: str, *args, extra_env: dict | None = None, isolated: bool = True,
               timeout: int = 300):
    """Run ``text`` as a script in ``tmp_path`` (``-P``: not the test directory on its path, when
    ``isolated``) with ``args``; it must succeed. Returns (the JSON of its last stdout line, the process)."""
    script = tmp_path / "child.py"
    script.write_text(text)
    cmd = [sys.executable, *(["-P"] if isolated else []), str(script), *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**env(), **(extra_env or {})}, timeout=timeout,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc


# The start of a child script that loads a bundle with the Python loader where ``import triton``
# fails (the ops are rebuilt from the manifest) and no kernel reaches a driver: each launch is
# recorded in ``calls`` (kernel name, grid, packed values).
RECORDING_LOADER = r"""
import json, sys
sys.modules["triton"] = None  # as if triton were not installed: the ops are rebuilt from the manifest
import torch
import kernelgraft as kg
from kernelgraft.driver import module as _module

calls = []
def fake(self, device_index, grid, block, values, shared_mem=0, stream=None):
    calls.append({"kernel": self.function.name, "grid": list(grid), "values": list(values)})
_module.Launcher.__call__ = fake
"""


# The start of a child script run where ``import kernelgraft`` and ``import triton`` fail: what a
# process without kernelgraft's Python looks like. A None in sys.modules is how Python marks a
# module absent: ``import`` raises ModuleNotFoundError and ``importlib.util.find_spec`` answers None
# (torch's CUDA initialisation asks find_spec("triton"), and a meta-path finder that raised there
# broke CUDA in the child). ``loaded_blocked()`` lists what got imported anyway.
WITHOUT_KERNELGRAFT = r"""
import json, sys

BLOCKED = ("kernelgraft", "triton")
for blocked in BLOCKED:
    sys.modules[blocked] = None
    try:
        __import__(blocked)
        raise SystemExit(f"{blocked} imported")
    except ModuleNotFoundError:
        pass


def loaded_blocked():
    return sorted(m for m, v in list(sys.modules.items()) if v is not None and m.split(".")[0] in BLOCKED)


import torch
"""
