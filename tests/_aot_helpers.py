"""Shared by the AOT tests (CPU and GPU): build a bundle through the CLI, run the child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
EXAMPLES = ("kernelgraft.examples.add_relu", "kernelgraft.examples.rmsnorm")


def env() -> dict:
    """The environment with Triton's interpreter off: bundles compile real cubins."""
    out = dict(os.environ)
    out.pop("TRITON_INTERPRET", None)
    return out


def build_bundle(out: Path, arch: str, timeout: int) -> Path:
    cmd = [sys.executable, "-m", "kernelgraft", "aot", *EXAMPLES, "--arch", arch, "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def run_child(bundle: Path, mode: str, out: Path, timeout: int) -> dict:
    """Run tests/_aot_child.py (triton blocked) in ``mode`` and return its JSON report."""
    proc = subprocess.run([sys.executable, str(HERE / "_aot_child.py"), str(bundle), mode, str(out)],
                          capture_output=True, text=True, env=env(), timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())
