"""Shared by the AOT tests (CPU and GPU): build a bundle through the CLI, run the child process."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
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


def build_bundle(out: Path, arch: str, timeout: int, examples=EXAMPLES, allow_partial: bool = False) -> Path:
    cmd = [sys.executable, "-m", "kernelgraft", "aot", *examples, "--arch", arch, "-o", str(out)]
    proc = subprocess.run(cmd + ["--allow-partial"] * allow_partial, capture_output=True, text=True, env=env(),
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out


def shared_bundle(base: Path, name: str, examples=EXAMPLES, arch: str = "sm_90", timeout: int = 900) -> Path:
    """``build_bundle`` into ``base / name`` once: the first caller (of any process sharing
    ``base``) builds under a file lock and marks it done; later callers find it there."""
    from filelock import FileLock

    out, done = base / name, base / f"{name}.done"
    with FileLock(str(base / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)  # left by a build that failed
            build_bundle(out, arch, timeout, examples)
            done.touch()
    return out


def tree_digest(root: Path) -> str:
    """A sha256 over every file's relative path and bytes under ``root``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def gpu_bundle(tmp_path_factory, variable: str, examples=EXAMPLES, allow_partial: bool = False,
               timeout: int = 900) -> Path:
    """The bundle named in the environment ``variable`` (built where every toolchain is), else one
    built here for this GPU's arch."""
    given = os.environ.get(variable)
    if given:
        return Path(given)
    import torch

    major, minor = torch.cuda.get_device_capability()
    return build_bundle(tmp_path_factory.mktemp("bundle") / "b", f"sm_{major}{minor}", timeout, examples,
                        allow_partial)


def run_child(bundle: Path, mode: str, out: Path, timeout: int) -> dict:
    """Run tests/_aot_child.py (triton blocked) in ``mode`` and return its JSON report."""
    proc = subprocess.run([sys.executable, str(HERE / "_aot_child.py"), str(bundle), mode, str(out)],
                          capture_output=True, text=True, env=env(), timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def cutedsl_bundled() -> bool:
    """Whether bundles built here hold CuTe DSL candidates (nvidia-cutlass-dsl and a C compiler)."""
    from kernelgraft.backends.cutedsl import aot as _cutedsl_aot

    try:
        _cutedsl_aot.toolchain_version()
    except Exception:
        return False
    return True


def bundled_configs(op, native: bool = False) -> int:
    """How many (candidate, config) pairs of ``op`` a bundle built here serves once loaded: Triton
    and CUDA C++, cuTile where its toolchain (tileiras) works (elsewhere its candidates are
    skipped), and with ``native`` (a signed bundle, or allow_native) CuTe DSL where it builds."""
    from kernelgraft.backends.cutile.jit import toolchain_reason

    backends = ("triton", "cuda") + (("cutile",) if toolchain_reason() is None else ())
    backends += ("cutedsl",) if native and cutedsl_bundled() else ()
    return sum(len(i.configs) for i in op.impls if i.backend in backends)
