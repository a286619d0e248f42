"""Why did ``torch.ops.kernelgraft.load_bundle(path, None, None)`` crash the pytest process on the
GPU machine (`benchmarks/results/2026-12-01-h200-4/`, run 1: tests/test_gpu_runtime.py's ``served`` fixture, a bundle holding
CuTe DSL candidates, native code not allowed)? The same call passes on the CPU machine with
arch='sm_90', and the C++ examples load the same bundle with native code allowed.

Runs the load in child processes, one variant each, and prints each one's exit status and last
lines; the first variant that crashes is run again under cuda-gdb (no gdb there) for a backtrace.

    python research/diag_runtime_load.py BUNDLE_DIR
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import faulthandler, json, sys, warnings
faulthandler.enable()
import torch
so, path, arch, allow, pre = sys.argv[1], sys.argv[2], sys.argv[3] or None, sys.argv[4] == "1", sys.argv[5]
if "examples" in pre:
    import kernelgraft.examples.add_relu  # noqa: F401  (as the pytest process had)
if "errors" in pre:
    warnings.simplefilter("error")
if "cuda" in pre:
    torch.zeros(1, device="cuda")
torch.ops.load_library(so)
print("loading", flush=True)
names = torch.ops.kernelgraft.load_bundle(path, None, arch, allow)
print("loaded", list(names), flush=True)
ns = getattr(torch.ops, names[0].split("::")[0])
x = torch.randn(33, 97, device="cuda")
print("add_relu equal:", torch.equal(ns.add_relu(x, x), torch.relu(x + x)), flush=True)
"""


def variant(bundle: Path, dst: Path, namespace: str, drop_cutedsl: bool) -> Path:
    from kernelgraft.aot import manifest as _manifest

    shutil.copytree(bundle, dst)
    manifest = _manifest.read(dst)
    for op in manifest["ops"]:
        op["name"] = f"{namespace}::" + op["name"].split("::")[1]
        if drop_cutedsl:
            op["candidates"] = [c for c in op["candidates"] if c["backend"] != "cutedsl"]
            op["decisions"] = []
    _manifest.write(dst, manifest)
    return dst


OPEN_NATIVE = r"""
import sys
mode = sys.argv[3]
if mode == "cutlass":
    import cutlass.cute  # noqa: F401  (CuTe DSL's own libraries in the process, as in pytest)
elif mode == "candidates":
    import torch
    from kernelgraft.examples.add_relu import add_relu
    x = torch.randn(4096, device="cuda")
    print("supported:", [c.label for c in add_relu.candidates(x, x) if c.supported], flush=True)
from kernelgraft.aot.native_kernel import open_library
runtime, library = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
print("runtime:", open_library("runtime", runtime), flush=True)
print("library:", open_library("library", library), flush=True)
"""


def facts(so: str, bundle: Path, tmp: Path) -> None:
    """What the crash and the CuTe DSL library's failed load (`benchmarks/results/2026-12-01-h200-4/`, run 2) may depend on: the
    compiler, glibc, the libstdc++ symbols the runtime library defines, the kernel (gVisor or not),
    and glibc's own account of resolving a bundled library's DT_NEEDED on the dialect runtime."""
    print("LDFLAGS:", os.environ.get("LDFLAGS"), "CXXFLAGS:", os.environ.get("CXXFLAGS"))
    log = Path(so).parent / "build.log"
    if log.exists():
        print("build.log (link lines):", [l[:400] for l in log.read_text(errors="replace").splitlines() if " -shared" in l][:2])
    specs = subprocess.run(["c++", "-dumpspecs"], capture_output=True, text=True).stdout
    print("c++ specs mentioning static:", [l[:200] for l in specs.splitlines() if "static" in l][:6])
    for cmd in (["c++", "--version"], ["ldd", "--version"], ["c++", "-print-file-name=libstdc++.so"],
                ["c++", "-print-file-name=libstdc++.a"], ["readelf", "-d", so]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        print(f"$ {' '.join(cmd)}: {[l for l in lines if 'NEEDED' in l] if cmd[0] == 'readelf' else lines[:1]}")
    proc = subprocess.run(["nm", "-D", "--defined-only", "-C", so], capture_output=True, text=True)
    std = [l for l in proc.stdout.splitlines() if " std::" in l or "__cxx" in l]
    print(f"runtime .so defines {len(std)} std:: symbols; e.g. {[l.split(' ', 2)[-1][:90] for l in std[:8]]}")
    proc = subprocess.run(["ldd", so], capture_output=True, text=True)
    print("ldd runtime .so:", [l.strip() for l in proc.stdout.splitlines() if "stdc++" in l or "c10" in l])
    manifest = json.loads((bundle / "manifest.json").read_text())
    pair = next(((k["images"]["runtime"]["file"], k["images"]["so"]["file"]) for op in manifest["ops"]
                 for c in op["candidates"] for k in c["kernels"] if "so" in k.get("images", {})), None)
    if pair is None:
        print("the bundle holds no CuTe DSL library")
        return
    script = tmp / "open_native.py"
    script.write_text(OPEN_NATIVE)
    for mode in ("fresh", "cutlass", "candidates"):
        proc = subprocess.run([sys.executable, str(script), str(bundle / pair[0]), str(bundle / pair[1]), mode],
                              capture_output=True, text=True, env={**os.environ, "LD_DEBUG": "libs,files"},
                              timeout=180)
        lines = (proc.stdout + proc.stderr).splitlines()
        keep = [l for l in lines if "dialect" in l or "/proc/self/fd" in l or l.startswith(("runtime:", "library:"))
                or "cannot open" in l or "BundleError" in l]
        print(f"== open a bundled CuTe DSL library after '{mode}' (LD_DEBUG=libs,files): exit {proc.returncode}")
        print("\n".join(l[:240] for l in keep[-30:]))


def main() -> None:
    from kernelgraft import runtime

    bundle = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ["KERNELGRAFT_TEST_BUNDLE"])
    so = str(runtime.library())
    tmp = Path(tempfile.mkdtemp())
    facts(so, bundle, tmp)
    script = tmp / "child.py"
    script.write_text(CHILD)
    cases = [  # (label, drop CuTe DSL, arch, allow native, what the child does first)
        ("not allowed, arch from the GPU", False, "", "0", ""),
        ("not allowed, arch sm_90", False, "sm_90", "0", ""),
        ("allowed", False, "", "1", ""),
        ("no CuTe DSL candidates", True, "", "0", ""),
    ]
    crashed = None
    for i, (label, drop, arch, allow, pre) in enumerate(cases):
        path = variant(bundle, tmp / f"b{i}", f"kgdiag{i}", drop)
        cmd = [sys.executable, str(script), so, str(path), arch, allow, pre]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-6:]
        print(f"== {label}: exit {proc.returncode}")
        for line in tail:
            print(f"   {line[:300]}")
        if proc.returncode < 0 and crashed is None:
            crashed = cmd
    if crashed and shutil.which("cuda-gdb"):
        print("== cuda-gdb backtrace of the first crash")
        proc = subprocess.run(["cuda-gdb", "-batch", "-ex", "run", "-ex", "bt 40", "--args", *crashed],
                              capture_output=True, text=True, timeout=240)
        lines = (proc.stdout + proc.stderr).splitlines()
        start = next((i for i, l in enumerate(lines) if "SIGSEGV" in l or "signal" in l.lower()), max(0, len(lines) - 60))
        print("\n".join(lines[start:start + 60]))
    print(json.dumps({"crashed": crashed is not None}))


if __name__ == "__main__":
    main()
