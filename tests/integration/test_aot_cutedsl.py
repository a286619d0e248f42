"""CuTe DSL candidates in bundles, on a machine without a GPU: every example candidate becomes a
shared library (the exported host function plus kernelgraft's shim) that exports only the shim's
entry points and needs the CUDA dialect runtime the bundle ships; both load and call through to the
driver (a stub ``libcuda.so.1`` here, in a child process); the Python loader and the C++ runtime
load them only from a signed bundle or with ``allow_native``, and refuse tampered libraries. The
launch itself is on the GPU (tests/gpu/test_gpu_runtime.py, tests/gpu/test_gpu_aot.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

import kernelgraft as kg
from kernelgraft.backends.cutedsl import so as _cutedsl_so
from kernelgraft.aot import manifest as _manifest
from kernelgraft.aot.load import reset_bundles
from kernelgraft.aot.sign import sign_bundle
from kernelgraft.examples import add_relu, rmsnorm  # registered before the per-test registry snapshot

from _runtime_helpers import json_child, so, variant  # noqa: F401 (so: a fixture)

pytestmark = pytest.mark.cutedsl  # rerun under the oldest supported release: scripts/compat.sh

pytest.importorskip("cutlass.cute")
if not (shutil.which("gcc") or shutil.which("cc")):
    pytest.skip("no C compiler to link CuTe DSL libraries with", allow_module_level=True)

# the DSL's runtime library: libcuda_dialect_runtime.so in 4.3, libcute_dsl_runtime.so from 4.4 on
RUNTIME = _cutedsl_so.runtime_library().name

OPS = {"kgexamples::add_relu": add_relu.add_relu, "kgexamples::rmsnorm": rmsnorm.rmsnorm}
SHIM = {"kg_cutedsl_abi", "kg_cutedsl_kinds", "kg_cutedsl_launch", "kg_cutedsl_num_args"}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    from kernelgraft.aot import build_bundle

    out = tmp_path_factory.mktemp("cute") / "b"
    build_bundle(list(OPS.values()), out, archs=["sm_90"])
    return out


def _native(manifest: dict):
    for op in manifest["ops"]:
        for cand in op["candidates"]:
            if cand["backend"] == "cutedsl":
                for k in cand["kernels"]:
                    yield op, cand, k


def test_every_cutedsl_candidate_of_the_examples_is_bundled(bundle):
    manifest = _manifest.read(bundle)
    assert manifest["toolchain"]["cutedsl"].startswith("nvidia-cutlass-dsl ")
    for op in manifest["ops"]:
        python_op = OPS[op["name"]]
        want = {f"cutedsl:{i.display_name}[{c.label()}]" for i in python_op.impls if i.backend == "cutedsl"
                for c in i.configs}
        assert want, op["name"]
        assert {c["label"] for c in op["candidates"] if c["backend"] == "cutedsl"} == want
        assert not [s for s in op["skipped"] + op["dropped"] if s["candidate"].startswith("cutedsl:")]
    kernels = list(_native(manifest))
    assert len(kernels) >= 5 * 4  # 5 candidates, each for several dtypes and ranks
    for op, _, k in kernels:
        assert set(k["images"]) == {"so", "runtime"} and k["entry"] == "kg_cutedsl_launch"
        assert k["grid"] == ["1", "1", "1"] and k["block"] == [1, 1, 1] and k["shared_mem"] == "0"
        assert k["cutedsl"]["target"] == "sm_90a" and k["cutedsl"]["kinds"] == [p["kind"] for p in k["params"]]
        assert set(k["aligned"]) == {p["source"] for p in k["params"] if "source" in p}
    rms = [k for op, _, k in kernels if op["name"].endswith("rmsnorm")]
    # eps is the op's own argument, not the sample's value compiled in
    assert all({"kind": "f32", "expr": "eps"} in k["params"] for k in rms)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    return path


def test_libraries_export_only_the_shim_and_need_the_dialect_runtime_and_the_driver(bundle):
    manifest = _manifest.read(bundle)
    files = {k["images"]["so"]["file"]: k for _, _, k in _native(manifest)}
    runtimes = {k["images"]["runtime"]["sha256"] for _, _, k in _native(manifest)}
    assert len(runtimes) == 1  # one copy of the runtime, shared by every library
    for name, k in files.items():
        data = _manifest.read_binary(bundle, k["images"]["so"])  # sha256 verified
        assert data[:4] == b"\x7fELF"
        defined = subprocess.run([_tool("nm"), "-D", "--defined-only", str(bundle / name)], capture_output=True,
                                 text=True, check=True).stdout
        assert {line.split()[-1] for line in defined.splitlines() if line.strip()} == SHIM, name
        dynamic = subprocess.run([_tool("readelf"), "-d", str(bundle / name)], capture_output=True, text=True,
                                 check=True).stdout
        assert f"Shared library: [{RUNTIME}]" in dynamic
        # the library names the driver itself: 4.8's runtime library does not, and a library opened
        # RTLD_LOCAL resolves only through what it and its dependencies name
        assert "Shared library: [libcuda.so.1]" in dynamic
    runtime = next(iter(_native(manifest)))[2]["images"]["runtime"]
    dynamic = subprocess.run([_tool("readelf"), "-d", str(bundle / runtime["file"])], capture_output=True,
                             text=True, check=True).stdout
    assert f"Library soname: [{RUNTIME}]" in dynamic


# A child (the stub driver must not leak into this process): a libcuda.so.1 whose every entry point
# returns CUDA_ERROR_NO_DEVICE (100), opened RTLD_LOCAL as torch and the C++ runtime open the driver
# (its symbols reach only libraries that name it), then each library opened as the loaders open it. Mode
# "context": cuInit succeeds and a context of device 0 is current, so the launch gets as far as the
# library's own cuda_init (whose static CUDA runtime then finds no usable driver).
CHILD = r"""
import ctypes, json, subprocess, sys
bundle, stub_dir, kernels, mode = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
names = set()
for lib in [kernels[0]["runtime"]] + [k["so"] for k in kernels]:
    out = subprocess.run(["nm", "-D", "--undefined-only", bundle + "/" + lib], capture_output=True, text=True).stdout
    names |= {l.split()[-1] for l in out.splitlines() if l.split() and l.split()[-1].startswith("cu")}
special = {"cuInit": "int cuInit(unsigned f) { return 0; }",
           "cuCtxGetCurrent": "int cuCtxGetCurrent(void **c) { *c = (void *)0x10; return 0; }",
           "cuCtxGetDevice": "int cuCtxGetDevice(int *d) { *d = 0; return 0; }"} if mode == "context" else {}
src = "\n".join(special.get(n.split("@")[0], "int %s(void) { return 100; }" % n.split("@")[0]) for n in sorted(names))
open(stub_dir + "/stub.c", "w").write(src)
subprocess.run(["gcc", "-shared", "-fPIC", "-o", stub_dir + "/libcuda.so.1", stub_dir + "/stub.c",
                "-Wl,-soname,libcuda.so.1"], check=True)
report = {}
try:
    ctypes.CDLL(bundle + "/" + kernels[0]["so"], mode=2)
    report["without_runtime"] = "loaded"
except OSError as exc:
    report["without_runtime"] = str(exc)
ctypes.CDLL(stub_dir + "/libcuda.so.1", mode=2 | ctypes.RTLD_LOCAL)
ctypes.CDLL(bundle + "/" + kernels[0]["runtime"], mode=2 | ctypes.RTLD_LOCAL)
report["kernels"] = []
for k in kernels:
    lib = ctypes.CDLL(bundle + "/" + k["so"], mode=2 | ctypes.RTLD_LOCAL)
    lib.kg_cutedsl_kinds.restype = ctypes.c_char_p
    n = lib.kg_cutedsl_num_args()
    error = ctypes.create_string_buffer(256)
    slots = (ctypes.c_uint64 * max(n, 1))()
    args = (ctypes.c_void_p * max(n, 1))(*[ctypes.addressof(slots) + 8 * i for i in range(max(n, 1))])
    status = lib.kg_cutedsl_launch(0, None, args, n, error, 256)
    first = error.value.decode()
    wrong = lib.kg_cutedsl_launch(0, None, args, n + 1, error, 256)
    report["kernels"].append({"abi": lib.kg_cutedsl_abi(), "n": n, "kinds": lib.kg_cutedsl_kinds().decode(),
                              "status": status, "error": first, "wrong": wrong, "wrong_error": error.value.decode()})
print(json.dumps(report))
"""


@pytest.mark.parametrize("mode", ["no_device", "context"])
def test_libraries_load_and_call_through_to_the_driver(bundle, tmp_path, mode):
    _tool("nm")
    manifest = _manifest.read(bundle)
    kernels, seen = [], set()
    for _, _, k in _native(manifest):
        if k["images"]["so"]["file"] not in seen:
            seen.add(k["images"]["so"]["file"])
            kernels.append({"so": k["images"]["so"]["file"], "runtime": k["images"]["runtime"]["file"],
                            "kinds": [p["kind"] for p in k["params"]]})
    report, _ = json_child(tmp_path, CHILD, bundle, tmp_path, json.dumps(kernels), mode, isolated=False)
    # the library names the runtime by soname: the loaders must open the bundle's copy first
    assert RUNTIME in report["without_runtime"]
    for want, got in zip(kernels, report["kernels"]):
        assert got["abi"] == 1 and got["n"] == len(want["kinds"]) and got["kinds"] == ",".join(want["kinds"])
        if mode == "no_device":
            assert got["status"] == 100 and "cuInit: CUDA error 100" in got["error"]  # the stub driver's answer
        else:  # cuda_init was called with the arguments it takes, and its error came back (no crash)
            assert got["status"] > 0 and "loading the embedded cubin (cuda_init): CUDA runtime error" in got["error"]
        assert got["wrong"] == -1 and "arguments given, the host function takes" in got["wrong_error"]


# ---------------------------------------------------------------- the Python loader
@pytest.fixture
def fresh():
    yield
    reset_bundles()


def _cute_labels(loaded) -> set[str]:
    return {label for labels in loaded.attached.values() for label in labels if label.startswith("cutedsl:")}


def test_python_loader_loads_native_code_only_when_allowed_or_signed(bundle, tmp_path, fresh):
    manifest = _manifest.read(bundle)
    want = {c["label"] for _, c, _ in _native(manifest)}
    with pytest.warns(kg.KernelgraftWarning, match="CuTe DSL candidates are native code .* allow_native=True"):
        loaded = kg.load_bundle(bundle, arch="sm_90")
    assert _cute_labels(loaded) == set() and loaded.attached["kgexamples::add_relu"]
    reset_bundles()
    loaded = kg.load_bundle(bundle, arch="sm_90", allow_native=True)
    assert _cute_labels(loaded) == want
    from kernelgraft.aot.native_kernel import NativeKernel

    op = manifest["ops"][0]
    cand = next(c for c in op["candidates"] if c["backend"] == "cutedsl")
    runner = loaded.runner(op["name"], cand["index"], cand["config"])
    assert runner.kernels and all(isinstance(k, NativeKernel) for k in runner.kernels)
    reset_bundles()
    key = tmp_path / "k.key"
    key.write_text("0123456789abcdef0123456789abcdef")
    signed = tmp_path / "signed"
    shutil.copytree(bundle, signed)
    sign_bundle(signed, key)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kg.KernelgraftWarning)
        loaded = kg.load_bundle(signed, arch="sm_90", key=key)
    assert _cute_labels(loaded) == want


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _not_elf(root: Path, kind: str):
    """An edit that puts other bytes under a recomputed sha256 in place of every ``kind`` image."""
    def edit(op):
        for cand in op["candidates"]:
            for k in cand["kernels"]:
                if kind in k.get("images", {}):
                    fake = b"#!/bin/sh\nexit 0\n" + b"\0" * 64 + b"kg_cutedsl_launch\0"
                    k["images"][kind] = _manifest.store_binary(root, fake, kind)
    return edit


@pytest.mark.parametrize("case,match", [
    ("flip", "checksum mismatch for bin/"),
    ("so", "is not a 64-bit ELF shared object"),
    ("runtime", "is not a 64-bit ELF shared object"),
])
def test_tampered_libraries_are_refused_by_the_python_loader(bundle, tmp_path, fresh, case, match):
    path = tmp_path / "b"
    shutil.copytree(bundle, path)
    if case == "flip":
        k = next(iter(_native(_manifest.read(path))))[2]
        _flip(path / k["images"]["so"]["file"])
    else:
        manifest = _manifest.read(path)
        for op in manifest["ops"]:
            _not_elf(path, case)(op)
        _manifest.write(path, manifest)
    with pytest.raises(kg.BundleError, match=match):
        kg.load_bundle(path, arch="sm_90", allow_native=True)


# ---------------------------------------------------------------- the C++ runtime
def _load(path: Path, key=None, allow_native=False) -> list[str]:
    return list(torch.ops.kernelgraft.load_bundle(str(path), None if key is None else str(key), "sm_90",
                                                  allow_native))


def _only_cutedsl(op):
    op["candidates"] = [c for c in op["candidates"] if c["backend"] == "cutedsl"]
    op["decisions"] = []


def test_runtime_serves_cutedsl_candidates_when_allowed(so, bundle, tmp_path, capfd):
    path = variant(bundle, tmp_path / "b", "kgrt_cute", edit_op=_only_cutedsl)
    assert _load(path, allow_native=True) == ["kgrt_cute::add_relu", "kgrt_cute::rmsnorm"]
    plan = json.loads(torch.ops.kernelgraft._runtime_plan(
        "kgrt_cute::add_relu", json.dumps([{"shape": [33, 97], "dtype": "float16"}] * 2)))
    assert plan["candidate"].startswith("cutedsl:") and plan["kernel"].startswith("kg_")
    assert plan["grid"] == [1, 1, 1] and plan["params"] == [None, None, None, str(33 * 97)]
    plan = json.loads(torch.ops.kernelgraft._runtime_plan(
        "kgrt_cute::rmsnorm", json.dumps([{"shape": [9, 768], "dtype": "bfloat16"}, {"shape": [768], "dtype": "bfloat16"}, 1e-6])))
    assert plan["candidate"].startswith("cutedsl:") and plan["params"][3:] == ["9", "768", "1e-06"]
    x = torch.randn(8)
    with pytest.raises(RuntimeError, match=r"kgrt_cute::add_relu: argument x must be a CUDA tensor, got a tensor on cpu"):
        torch.ops.kgrt_cute.add_relu(x, x)
    meta = torch.empty(9, 768, device="meta")
    assert list(torch.ops.kgrt_cute.rmsnorm(meta, torch.empty(768, device="meta"), 1e-6).shape) == [9, 768]


def test_runtime_leaves_native_code_of_unsigned_bundles_out(so, bundle, tmp_path, capfd):
    path = variant(bundle, tmp_path / "b", "kgrt_cute_unsigned", edit_op=_only_cutedsl)
    assert _load(path) == ["kgrt_cute_unsigned::add_relu", "kgrt_cute_unsigned::rmsnorm"]
    assert "CuTe DSL candidates are native code (shared libraries) and are not loaded from an unsigned bundle" in \
        capfd.readouterr().err
    with pytest.raises(RuntimeError, match="no bundled kernel serves these inputs"):
        torch.ops.kernelgraft._runtime_plan("kgrt_cute_unsigned::add_relu",
                                            json.dumps([{"shape": [33, 97], "dtype": "float16"}] * 2))
    key = tmp_path / "k.key"
    key.write_text("0123456789abcdef0123456789abcdef")
    signed = variant(bundle, tmp_path / "s", "kgrt_cute_signed", edit_op=_only_cutedsl)
    sign_bundle(signed, key)
    assert _load(signed, key=key) == ["kgrt_cute_signed::add_relu", "kgrt_cute_signed::rmsnorm"]
    plan = json.loads(torch.ops.kernelgraft._runtime_plan(
        "kgrt_cute_signed::add_relu", json.dumps([{"shape": [33, 97], "dtype": "float16"}] * 2)))
    assert plan["candidate"].startswith("cutedsl:")


@pytest.mark.parametrize("case,match", [
    ("flip", "checksum mismatch for bin/"),
    ("so", "is not a 64-bit ELF shared object"),
    ("runtime", "is not a 64-bit ELF shared object"),
])
def test_tampered_libraries_are_refused_by_the_runtime(so, bundle, tmp_path, case, match):
    ns = f"kgrt_cute_bad_{case}"
    path = variant(bundle, tmp_path / "b", ns, edit_op=None if case == "flip" else _not_elf(tmp_path / "b", case))
    if case == "flip":
        k = next(iter(_native(_manifest.read(path))))[2]
        _flip(path / k["images"]["so"]["file"])
    with pytest.raises(RuntimeError, match=match):
        _load(path, allow_native=True)
    with pytest.raises(RuntimeError, match="does not exist"):  # nothing of a refused bundle is registered
        torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::add_relu", "Meta")


def test_library_hashes_are_those_the_manifest_records(bundle):
    for _, _, k in _native(_manifest.read(bundle)):
        for image in k["images"].values():
            assert hashlib.sha256((bundle / image["file"]).read_bytes()).hexdigest() == image["sha256"]


RUNTIME_CHILD = r"""
import ctypes, json, subprocess, sys
so, bundle, stub_dir, runtime = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
names = set()
for lib in [runtime, so]:
    out = subprocess.run(["nm", "-D", "--undefined-only", lib], capture_output=True, text=True).stdout
    names |= {l.split()[-1].split("@")[0] for l in out.splitlines() if l.split() and l.split()[-1].startswith("cu")}
names |= {"cuInit", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxGetDevice", "cuDeviceGet", "cuDevicePrimaryCtxRetain",
          "cuGetErrorString"}
open(stub_dir + "/stub.c", "w").write("\n".join("int %s(void) { return 100; }" % n for n in sorted(names)))
subprocess.run(["gcc", "-shared", "-fPIC", "-o", stub_dir + "/libcuda.so.1", stub_dir + "/stub.c",
                "-Wl,-soname,libcuda.so.1"], check=True)
ctypes.CDLL(stub_dir + "/libcuda.so.1", mode=2 | ctypes.RTLD_LOCAL)
import torch
torch.ops.load_library(so)
torch.ops.kernelgraft.load_bundle(bundle, None, "sm_90", True)
print(torch.ops.kernelgraft._runtime_native_probe("kgrt_cute_probe::add_relu"))
"""


def test_runtime_opens_the_verified_libraries_and_calls_them(so, bundle, tmp_path):
    """The C++ runtime's own open/check/call path, against a stub driver (in a child process)."""
    _tool("nm")
    path = variant(bundle, tmp_path / "b", "kgrt_cute_probe", edit_op=_only_cutedsl)
    runtime = next(iter(_native(_manifest.read(path))))[2]["images"]["runtime"]["file"]
    probes, _ = json_child(tmp_path, RUNTIME_CHILD, so, path, tmp_path, path / runtime, isolated=False)
    kernels = {k["kernel"] for op, _, k in _native(_manifest.read(path)) if op["name"].endswith("add_relu")}
    assert {p["kernel"] for p in probes} == kernels
    for p in probes:  # opened, the ABI and kinds matched the manifest, and the call reached the driver
        assert p["error"].endswith("cuInit: CUDA error 100 (unknown)"), p


PYTHON_CHILD = r"""
import ctypes, json, subprocess, sys
bundle, stub_dir, runtime, so_file = sys.argv[1:5]
names = {"cuInit", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxGetDevice", "cuDeviceGet", "cuDevicePrimaryCtxRetain",
         "cuGetErrorString"}
out = subprocess.run(["nm", "-D", "--undefined-only", runtime], capture_output=True, text=True).stdout
names |= {l.split()[-1].split("@")[0] for l in out.splitlines() if l.split() and l.split()[-1].startswith("cu")}
open(stub_dir + "/stub.c", "w").write("\n".join("int %s(void) { return 100; }" % n for n in sorted(names)))
subprocess.run(["gcc", "-shared", "-fPIC", "-o", stub_dir + "/libcuda.so.1", stub_dir + "/stub.c",
                "-Wl,-soname,libcuda.so.1"], check=True)
ctypes.CDLL(stub_dir + "/libcuda.so.1", mode=2 | ctypes.RTLD_LOCAL)
import kernelgraft as kg
import kernelgraft.driver

kernelgraft.driver.current_stream = lambda device: 0  # no CUDA torch here
loaded = kg.load_bundle(bundle, arch="sm_90", allow_native=True)
report = []
for entry in loaded.manifest["ops"]:
    for cand in entry["candidates"]:
        for kernel in loaded.runner(entry["name"], cand["index"], cand["config"]).kernels:
            kernel._check_params(0)  # opens the runtime, then the library; checks its ABI and kinds
            try:
                kernel.launcher(0, (1, 1, 1), (1, 1, 1), [0] * len(kernel.kinds), 0)
                error = ""
            except kg.KernelgraftError as exc:
                error = str(exc)
            report.append({"kernel": kernel.name, "error": error})
print(json.dumps(report))
"""


def test_python_loader_opens_the_verified_libraries_and_calls_them(bundle, tmp_path):
    """The Python loader's open/check/call path, against a stub driver (in a child process)."""
    _tool("nm")
    path = variant(bundle, tmp_path / "b", "kgpy_cute_probe", edit_op=_only_cutedsl)
    first = next(iter(_native(_manifest.read(path))))[2]["images"]
    report, _ = json_child(tmp_path, PYTHON_CHILD, path, tmp_path, path / first["runtime"]["file"],
                           path / first["so"]["file"], isolated=False)
    assert len(report) == len(list(_native(_manifest.read(path))))
    for r in report:  # every library opened (not the previous one under a reused /proc path) and reached the driver
        assert r["error"].endswith("cuInit: CUDA error 100 (unknown)"), r
