"""Bundles are untrusted input: a tampered bundle is refused before any work that grows with it (the
corpus of tampered bundles, and the same verdict from the C++ runtime, is
tests/integration/test_bundle_verdicts.py), no module a manifest names is imported unless allowed, a signed
bundle refuses any change, and a bundle cannot take an op name from the module defining it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernelgraft as kg
from kernelgraft.aot import manifest as _manifest
from kernelgraft.aot.sign import SIGNATURE
from kernelgraft.examples import add_relu, rmsnorm  # registered before the per-test registry snapshot

from _aot_helpers import bundled_configs, env
from _bundle_corpus import KEY, first, resum, set_expr


@pytest.fixture(scope="module")
def signed(signed_example_bundle) -> Path:
    """One real bundle of the examples, signed (once per run: conftest); unkeyed loads ignore the signature."""
    return signed_example_bundle


def _copy(bundle: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "b"
    shutil.copytree(bundle, dst, symlinks=True)
    return dst


def _refused(b: Path, match: str, **kwargs) -> kg.BundleError:
    with pytest.raises(kg.BundleError, match=match) as info:
        kg.load_bundle(b, arch="sm_90", **kwargs)
    return info.value


def _resum(b: Path, manifest: dict) -> None:
    resum(b, manifest)


def _first_kernel(manifest: dict, backend: str = "triton") -> dict:
    return first(manifest, backend)[1]


@pytest.fixture
def opened(monkeypatch) -> list[tuple[str, int]]:
    """(file, bytes returned) of every bundle file read (kernelgraft.aot.manifest.read_file)."""
    seen: list[tuple[str, int]] = []
    real = _manifest.read_file

    def counting(root, name, limit, **kwargs):
        data = real(root, name, limit, **kwargs)
        seen.append((name, len(data)))
        return data

    monkeypatch.setattr(_manifest, "read_file", counting)
    return seen


@pytest.mark.parametrize("what", ["cubin", "manifest"])
def test_a_file_over_its_cap_is_refused_unread(signed, tmp_path, opened, what):
    """Bounded work, shown by the bytes read: the size is checked before a byte is read, so a huge
    (here sparse) file costs nothing."""
    b = _copy(signed, tmp_path)
    m = _manifest.read(b)
    path = b / (_first_kernel(m)["images"]["cubin"]["file"] if what == "cubin" else "manifest.json")
    cap = _manifest.MAX_BINARY_BYTES if what == "cubin" else _manifest.MAX_MANIFEST_BYTES
    with open(path, "r+b") as f:
        f.truncate(cap + 1)
    opened.clear()
    _refused(b, f"is {cap + 1} bytes, over the {cap}-byte cap")
    assert str(path.relative_to(b)) not in [name for name, _ in opened]
    assert sum(n for _, n in opened) < 8 << 20  # the manifest and a few binaries, not the huge file


def test_one_load_reads_each_file_once(signed, tmp_path, opened):
    """A signed load verifies every file and then uses those very bytes: nothing is read twice."""
    b = _copy(signed, tmp_path)
    loaded = kg.load_bundle(b, arch="sm_90", key=KEY)
    try:
        names = [name for name, _ in opened]
        assert len(names) == len(set(names)) and "manifest.json" in names and SIGNATURE in names
    finally:
        loaded.detach()


def _with_grid(signed, tmp_path, expr: str):
    """A copy of the signed bundle whose add_relu Triton kernel for 1-D inputs computes its grid's
    first dimension as ``expr`` (program and checksum recompiled: a careful edit), loaded unsigned;
    returns (the bundle, that kernel as the loader holds it)."""
    b = _copy(signed, tmp_path)
    m = _manifest.read(b)
    op = next(e for e in m["ops"] if e["name"] == "kgexamples::add_relu")
    cand = next(c for c in op["candidates"] if c["backend"] == "triton")
    k = next(k for k in cand["kernels"] if k["ranks"] == {"x": 1, "y": 1} and k["dynamic"])
    set_expr(op, k, "grid", expr, 0)
    _resum(b, m)
    loaded = kg.load_bundle(b, arch="sm_90")
    kernel = next(kk for kk in loaded.runner(op["name"], cand["index"], cand["config"]).kernels
                  if kk.entry["grid"] == k["grid"])
    return loaded, kernel


def test_a_grid_that_is_negative_for_some_inputs_is_refused_before_the_launch(signed, tmp_path):
    loaded, kernel = _with_grid(signed, tmp_path, "(x.shape[0] - 100000)")
    try:
        x = torch.empty(4096)
        assert kernel.fits((x, x, x), 2), "the edited kernel should cover these inputs"
        with pytest.raises(kg.BundleError, match=r"grid \(-95904, 1, 1\) is outside the device limits"):
            kernel.prepare((x, x, x), 2)
    finally:
        loaded.detach()


def test_a_divisor_that_is_zero_for_some_inputs_is_a_clear_error_at_call(signed, tmp_path):
    loaded, kernel = _with_grid(signed, tmp_path, "(1 // (x.shape[0] - 4096))")
    try:
        x = torch.empty(4096)
        with pytest.raises(kg.BundleError, match=r"'1 // \(x.shape\[0\] - 4096\)': it divides by zero"):
            kernel.prepare((x, x, x), 2)
    finally:
        loaded.detach()


def test_an_expression_text_that_is_not_its_program_is_refused(signed, tmp_path):
    """The Python loader evaluates the texts, the C++ runtime the programs: they must be one."""
    b = _copy(signed, tmp_path)
    m = _manifest.read(b)
    _first_kernel(m)["grid"][0] = "(x.shape[0] // 2)"  # the program still says // 1024
    _resum(b, m)
    _refused(b, r"ops\[0\]\.candidates\[0\]\.kernels\[0\]\.program\.grid\[0\]: the program is not the compiled")


def test_a_guard_program_that_is_not_its_text_is_refused(signed, tmp_path):
    """Each guard text has its own program: one edited alone (its rules derived again from it, as
    the C++ runtime, which has no texts, would accept) is refused by the Python loader, by its index."""
    from kernelgraft.aot.rpn import compile_rpn

    b = _copy(signed, tmp_path)
    m = _manifest.read(b)
    k = _first_kernel(m)
    at = len(k["guards"]) - 1
    k["program"]["guards"][at] = compile_rpn("x.shape[0] < 4 or x.shape[0] > 8", ["x", "y"])
    _resum(b, m)
    _refused(b, rf"ops\[0\]\.candidates\[0\]\.kernels\[0\]\.program\.guards\[{at}\]: the program is not the "
                "compiled expression text")


# --- modules named by a manifest ---

@pytest.fixture(autouse=True)
def _forget_trust_ops():
    """Ops rebuilt under the test-only namespace are dropped after each test."""
    yield
    from kernelgraft.op import registry as _registry

    for name in [n for n in _registry._OPS if n.startswith("kgtrust::")]:
        _registry.unregister(name)


def _payload_bundle(signed: Path, tmp_path: Path, module: str) -> tuple[Path, Path]:
    """A copy whose ops claim fresh names and a module that, if imported, writes a marker file."""
    b = _copy(signed, tmp_path)
    marker = tmp_path / "imported.marker"
    (b / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    m = _manifest.read(b)
    for i, op in enumerate(m["ops"]):
        op["name"] = f"kgtrust::op{i}"
        op["module"] = "antigravity" if i else module
    _resum(b, m)
    return b, marker


def test_no_module_named_by_the_manifest_is_imported_by_default(signed, tmp_path, monkeypatch):
    module = "kgtrust_payload"
    b, marker = _payload_bundle(signed, tmp_path, module)
    monkeypatch.syspath_prepend(str(b))  # importable, so only load_bundle's restraint keeps it out
    before = set(sys.modules)
    loaded = kg.load_bundle(b, arch="sm_90")
    assert {m for m in set(sys.modules) - before if not m.startswith("kernelgraft.")} == set()
    assert not marker.exists()
    assert sorted(loaded.rebuilt) == ["kgtrust::op0", "kgtrust::op1"]
    loaded = kg.load_bundle(b, arch="sm_90", import_modules=["some.other.module"])
    assert module not in sys.modules and "antigravity" not in sys.modules and not marker.exists()


def test_an_allow_list_imports_exactly_the_modules_it_names(signed, tmp_path, monkeypatch):
    module = "kgtrust_allowed"
    b, marker = _payload_bundle(signed, tmp_path, module)
    monkeypatch.syspath_prepend(str(b))
    monkeypatch.delitem(sys.modules, module, raising=False)
    try:
        kg.load_bundle(b, arch="sm_90", import_modules=[module])
        assert marker.read_text() == "ran" and "antigravity" not in sys.modules
    finally:
        sys.modules.pop(module, None)
    with pytest.raises(TypeError, match="collection of module names"):
        kg.load_bundle(b, arch="sm_90", import_modules=module)


# --- signatures ---

def test_signed_bundle_round_trip(signed, tmp_path):
    keyfile = tmp_path / "k"
    keyfile.write_bytes(KEY + b"\n")
    for key in (KEY, str(keyfile), keyfile):
        loaded = kg.load_bundle(signed, arch="sm_90", key=key)
        try:
            assert loaded.signed and repr(loaded).endswith(", signed)")
            # signed: its CuTe DSL libraries are loaded too (native code a key vouches for)
            assert len(loaded.attached["kgexamples::add_relu"]) == bundled_configs(add_relu.add_relu, native=True)
        finally:
            loaded.detach()


def _sign_edit_add(b, m):
    (b / "bin" / "extra.cubin").write_bytes(b"\x7fELF")


def _sign_edit_remove(b, m):
    (b / _first_kernel(m)["images"]["ptx"]["file"]).unlink()


def _sign_edit_signature(b, m):
    body = json.loads((b / SIGNATURE).read_text())
    body["files"]["manifest.json"] = "0" * 64
    (b / SIGNATURE).write_text(json.dumps(body))


def _sign_edit_grid(b, m):
    op, k = first(m)
    set_expr(op, k, "grid", "(x.shape[0] // 2)", 0)
    _resum(b, m)


def _sign_edit_ptx(b, m):
    path = b / _first_kernel(m)["images"]["ptx"]["file"]
    text = path.read_text().replace(".target sm_90", ".target sm_90 // edited", 1)
    path.unlink()  # a copy of its own
    path.write_text(text)


SIGNED_VARIANTS = {
    "grid-resummed": (_sign_edit_grid, "manifest.json differs from the signed file"),
    "ptx-edited": (_sign_edit_ptx, r"bin/\w+\.ptx differs from the signed file"),
    "file-added": (_sign_edit_add, r"added \['bin/extra.cubin'\]"),
    "file-removed": (_sign_edit_remove, r"removed \['bin/\w+\.ptx'\]"),
    "signature-edited": (_sign_edit_signature, "does not verify with this key"),
    "unsigned": (lambda b, m: (b / SIGNATURE).unlink(), "is not signed"),
}


@pytest.mark.parametrize("variant", list(SIGNED_VARIANTS))
def test_with_a_key_a_modified_or_unsigned_bundle_is_refused(signed, tmp_path, variant):
    edit, match = SIGNED_VARIANTS[variant]
    b = _copy(signed, tmp_path)
    edit(b, _manifest.read(b))
    _refused(b, match, key=KEY)


def test_another_key_is_refused(signed):
    _refused(signed, "does not verify with this key", key=b"another-key-of-enough-length")


@pytest.mark.parametrize("key", [b"short", b"", 42], ids=["short", "empty", "not-bytes"])
def test_bad_keys_are_bundle_errors(signed, key):
    with pytest.raises(kg.BundleError, match="key"):
        kg.load_bundle(signed, arch="sm_90", key=key)


def test_cli_refuses_a_short_key_before_compiling(tmp_path):
    keyfile = tmp_path / "short.key"
    keyfile.write_text("abc\n")
    cmd = [sys.executable, "-m", "kernelgraft", "aot", "kernelgraft.examples.add_relu", "-o",
           str(tmp_path / "out"), "--sign", str(keyfile)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=300)
    assert proc.returncode == 2 and "at least 16" in proc.stdout, proc.stdout + proc.stderr
    assert not (tmp_path / "out").exists()


# --- arch and repr ---

@pytest.mark.parametrize("arch", ["sm_90", "sm90", "90", "9.0", "SM_90"])
def test_arch_spellings_are_normalized(signed, arch):
    loaded = kg.load_bundle(signed, arch=arch)
    try:
        assert loaded.arch == "sm_90"
        text = repr(loaded)
        assert text.startswith("Bundle(") and "kgexamples::add_relu" in text and "kernels=" in text
        assert len(text) < 300 and "candidates" not in text
    finally:
        loaded.detach()


@pytest.mark.parametrize("arch,match", [("sm100", r"not for sm_100;"), ("sm_sm90", "is not a CUDA arch")])
def test_other_or_bad_arch_is_refused_with_a_plain_name(signed, arch, match):
    with pytest.raises(kg.BundleError, match=match) as info:
        kg.load_bundle(signed, arch=arch)
    assert "sm_sm" not in str(info.value).replace("'sm_sm90'", "")


# --- op names ---

def test_a_bundle_op_of_another_schema_under_an_imported_name_is_refused(signed, tmp_path):
    b = _copy(signed, tmp_path)
    m = _manifest.read(b)
    m["ops"] = [e for e in m["ops"] if e["name"] == "kgexamples::rmsnorm"]
    m["ops"][0]["name"] = "kgexamples::add_relu"  # rmsnorm's binaries claiming add_relu's name
    _resum(b, m)
    with pytest.raises(kg.RegistrationError, match="names two different ops") as info:
        kg.load_bundle(b, arch="sm_90")
    message = str(info.value)
    assert str(b) in message and "kernelgraft.examples.add_relu.add_relu" in message
    assert "(Tensor x, Tensor y) -> Tensor" in message  # the imported op's schema beside the bundle's
    assert not add_relu.add_relu.dispatcher.bundled_keys()  # nothing attached before the refusal


def test_a_bundle_cannot_give_binaries_to_an_op_whose_impl_code_differs(signed, tmp_path):
    b = _copy(signed, tmp_path)
    m = _manifest.read(b)
    m["ops"] = [e for e in m["ops"] if e["name"] == "kgexamples::add_relu"]
    for cand in m["ops"][0]["candidates"]:  # the same op, as if its kernels were edited since
        cand["impl_fingerprint"] = "0" * 64
    _resum(b, m)
    with pytest.warns(kg.KernelgraftWarning, match="impl fingerprint differs"):
        loaded = kg.load_bundle(b, arch="sm_90")
    assert loaded.attached["kgexamples::add_relu"] == [] and not add_relu.add_relu.dispatcher.bundled_keys()
    assert loaded.ops["kgexamples::add_relu"] is add_relu.add_relu and loaded.rebuilt == []


_CHILD = r"""
import json, sys, warnings
import kernelgraft as kg
from kernelgraft.op import registry as _registry
from kernelgraft.aot import manifest as _manifest
path, renamed = sys.argv[1], sys.argv[2]
out = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loaded = kg.load_bundle(path, arch="sm_90", allow_native=True)
    out["rebuilt"] = sorted(loaded.rebuilt)
    stand_in = next(iter(loaded.ops.values()))
    try:
        if renamed == "1":
            import kernelgraft.examples.softmax as module
            real = module.softmax
        else:
            import kernelgraft.examples.add_relu as module
            real = module.add_relu
    except kg.RegistrationError as exc:
        out["error"] = str(exc)
        out["stand_in_serves"] = _registry.lookup(stand_in.name) is stand_in
    else:
        out["registered_is_module_op"] = _registry.lookup(real.name) is real
        out["bundle_op_is_module_op"] = loaded.ops[real.name] is real
        out["stand_in_forwards"] = stand_in.overload is real.overload
        out["rebuilt_after"] = sorted(loaded.rebuilt)
        out["attached"] = loaded.attached[real.name]
        out["bundled_keys"] = len(real.dispatcher.bundled_keys())
out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, kg.KernelgraftWarning)]
print(json.dumps(out))
"""


def _child(bundle: Path, renamed: bool) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(bundle), "1" if renamed else "0"],
                          capture_output=True, text=True, env=env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_defining_module_takes_its_name_back_from_a_bundle(signed, tmp_path):
    """Loaded first (no import), the bundle's op is a stand-in; importing the real module later
    registers the module's op under the name and moves the binaries onto it (same fingerprint)."""
    report = _child(signed, renamed=False)
    assert report["rebuilt"] == ["kgexamples::add_relu", "kgexamples::rmsnorm"]
    assert report["registered_is_module_op"] and report["bundle_op_is_module_op"]
    assert report["stand_in_forwards"]  # references to the bundle's op reach the module's op
    assert report["rebuilt_after"] == ["kgexamples::rmsnorm"]
    n = bundled_configs(add_relu.add_relu, native=True)
    assert len(report["attached"]) == n and report["bundled_keys"] == n
    assert report["warnings"] == []


def test_an_edited_op_takes_its_name_from_an_older_bundle(signed, tmp_path):
    """The same op (same schema) whose code changed since the bundle was built: the module's op
    takes over with a warning, and no binary of changed code is attached."""
    b = _copy(signed, tmp_path)
    m = _manifest.read(b)
    m["ops"] = [e for e in m["ops"] if e["name"] == "kgexamples::add_relu"]
    m["ops"][0]["fingerprint"] = "0" * 64
    for cand in m["ops"][0]["candidates"]:
        cand["impl_fingerprint"] = "0" * 64
    _resum(b, m)
    report = _child(b, renamed=False)
    assert report["registered_is_module_op"] and report["bundle_op_is_module_op"], report
    assert report["stand_in_forwards"]
    assert report["attached"] == [] and report["bundled_keys"] == 0
    assert any("replaces the op of this name" in w for w in report["warnings"]), report["warnings"]


def test_another_op_under_a_bundle_op_name_is_a_registration_error_naming_both(signed, tmp_path):
    """add_relu's binaries under softmax's name: importing softmax is a clash, not an edit."""
    b = _copy(signed, tmp_path)
    m = _manifest.read(b)
    m["ops"] = [e for e in m["ops"] if e["name"] == "kgexamples::add_relu"]
    m["ops"][0]["name"] = "kgexamples::softmax"
    _resum(b, m)
    report = _child(b, renamed=True)
    assert report["rebuilt"] == ["kgexamples::softmax"]
    error = report.get("error", "")
    assert "names two different ops" in error and str(b) in error, report
    assert "kernelgraft.examples.softmax.softmax" in error and "replace=True" in error
    assert report["stand_in_serves"]  # the refused import changed nothing


