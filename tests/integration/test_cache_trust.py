"""Caches trust only their owner (``kernelgraft.cache.trust``, the rule the native build follows): an
entry of the compiled-code cache or a ``tune.json`` that another user owns or could have written,
in a directory another user owns or could write to, or an oversized entry, is ignored (a miss) with
one warning per cache directory per process; the compiled code is then rebuilt, also by
``kernelgraft aot``, which never ships a planted cubin."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import kernelgraft as kg
from kernelgraft.cache import code as _codecache
from kernelgraft.tune import cache as tune_cache

OTHER_UID = 54321
ROOT = hasattr(os, "getuid") and os.getuid() == 0


def _owned_by_another(path: Path) -> None:
    os.chown(path, OTHER_UID, -1, follow_symlinks=False)


# How an entry or directory stops being this user's alone. Another owner needs root (chown).
ENTRY_CASES = ["group-or-other-writable"] + (["another-owner"] if ROOT else [])
DIR_CASES = ["world-writable", "symlink"] + (["another-owner"] if ROOT else [])


def _spoil(path: Path, how: str) -> None:
    if how in ("group-or-other-writable", "world-writable"):
        os.chmod(path, 0o666 if path.is_file() else 0o777)
    elif how == "another-owner":
        _owned_by_another(path)
    elif how == "symlink":
        real = path.with_name(path.name + ".real")
        path.rename(real)
        path.symlink_to(real)


def _entry(key: str, payload: bytes, meta: dict) -> bytes:
    header = json.dumps({"key": key, "sha256": hashlib.sha256(payload).hexdigest(), "meta": meta},
                        sort_keys=True).encode()
    return b"KGCC0001" + struct.pack("<I", len(header)) + header + payload


def _warnings(record, category=kg.KernelgraftWarning) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, category)]


@pytest.fixture
def cache_root(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(root))
    return root


@pytest.mark.parametrize("how", ENTRY_CASES)
def test_a_code_cache_entry_not_this_users_alone_is_a_miss_with_one_warning(cache_root, how):
    cache = _codecache.CodeCache("trust")
    for key in ("a" * 64, "b" * 64):
        cache.put(key, {"symbol": "k"}, b"real " + key.encode())
    for key in ("a" * 64, "b" * 64):
        _spoil(cache_root / "trust" / f"{key}.kgc", how)
    cache.clear_memory()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cache.get("a" * 64) is None and cache.get("b" * 64) is None
    messages = _warnings(record)
    assert len(messages) == 1 and str(cache_root / "trust") in messages[0], messages
    cache.put("a" * 64, {"symbol": "k"}, b"rebuilt")  # the next put replaces the entry with one of ours
    cache.clear_memory()
    assert cache.get("a" * 64) == ({"symbol": "k"}, b"rebuilt")


@pytest.mark.parametrize("how", DIR_CASES)
def test_a_code_cache_directory_not_this_users_alone_is_neither_read_nor_written(cache_root, how):
    cache = _codecache.CodeCache("trustdir")
    cache.put("c" * 64, {"symbol": "k"}, b"planted?")
    directory = cache_root / "trustdir"
    _spoil(directory, how)
    cache.clear_memory()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cache.get("c" * 64) is None
        cache.put("d" * 64, {"symbol": "k"}, b"ours")
        assert cache.get("d" * 64) == ({"symbol": "k"}, b"ours")  # from memory
    assert len(_warnings(record)) == 1
    assert not (directory / ("d" * 64 + ".kgc")).exists()  # nothing of ours written there


def test_a_code_cache_entry_over_its_cap_is_refused_unread(cache_root):
    cache = _codecache.CodeCache("huge")
    cache.put("e" * 64, {}, b"x")
    with open(cache_root / "huge" / ("e" * 64 + ".kgc"), "r+b") as f:
        f.truncate(8 << 30)  # sparse: 8 GiB that a whole read would try to hold
    cache.clear_memory()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cache.get("e" * 64) is None
    messages = _warnings(record)
    assert len(messages) == 1 and "over the" in messages[0]


def test_the_code_cache_directory_is_created_private(cache_root):
    _codecache.CodeCache("private").put("f" * 64, {}, b"x")
    assert (os.stat(cache_root / "private").st_mode & 0o777) == 0o700


def test_nvrtc_rebuilds_what_another_user_planted(cache_root):
    pytest.importorskip("cuda.bindings")
    from kernelgraft.backends.cuda import nvrtc as _nvrtc

    source = 'extern "C" __global__ void kgtrust(float* x) { x[0] = 2; }'
    real = _nvrtc.compile_cuda(source, "kgtrust")
    key = _nvrtc.cache_key(source, "kgtrust", (), "sm_90", "cubin")
    path = cache_root / "nvrtc" / f"{key}.kgc"
    planted = b"\x7fELF planted by someone else"
    path.write_bytes(_entry(key, planted, {"symbol": "kgtrust", "log": "", "arch": "sm_90"}))
    _spoil(path, ENTRY_CASES[-1])
    _nvrtc.CACHE.clear_memory()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        again = _nvrtc.compile_cuda(source, "kgtrust")
    assert again.image == real.image != planted
    assert len(_warnings(record)) == 1


_TARGET = '''
import torch
import kernelgraft as kg
from kernelgraft.examples.add_relu import CUDA


def _samples():
    return [(torch.randn(1000), torch.randn(1000))]


@kg.op("kgcachetrust::add_relu", impls=[CUDA], sample_inputs=_samples)
def add_relu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x + y)
'''


def _aot(target: Path, out: Path, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "KERNELGRAFT_CACHE_DIR": str(cache)}
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-m", "kernelgraft", "aot", str(target), "--arch", "sm_90", "-o", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)


def _cubins(bundle: Path) -> set[bytes]:
    return {p.read_bytes() for p in (bundle / "bin").glob("*.cubin")}


def test_kernelgraft_aot_never_ships_cubins_planted_in_a_shared_cache(tmp_path):
    """A world-writable KERNELGRAFT_CACHE_DIR where another user made nvrtc/ and filled it with
    entries for the very keys the build asks for: the build compiles its own and says so once."""
    pytest.importorskip("cuda.bindings")
    target = tmp_path / "kgcachetrust_op.py"
    target.write_text(_TARGET)
    clean = tmp_path / "clean-cache"
    first = _aot(target, tmp_path / "clean-bundle", clean)
    assert first.returncode == 0, first.stdout + first.stderr
    real = _cubins(tmp_path / "clean-bundle")
    assert real

    shared = tmp_path / "shared-cache"
    (shared / "nvrtc").mkdir(parents=True)
    os.chmod(shared, 0o777)
    planted = {}
    for entry in (clean / "nvrtc").glob("*.kgc"):  # the same keys, other code
        key = entry.stem
        data = b"\x7fELF\x02" + hashlib.sha256(key.encode()).digest() * 8
        meta = json.loads(entry.read_bytes()[12:12 + struct.unpack_from("<I", entry.read_bytes(), 8)[0]])["meta"]
        (shared / "nvrtc" / entry.name).write_bytes(_entry(key, data, meta))
        planted[key] = data
    assert planted
    for path in [shared / "nvrtc", *(shared / "nvrtc").iterdir()]:
        _spoil(path, "another-owner" if ROOT else "world-writable")
    second = _aot(target, tmp_path / "shared-bundle", shared)
    assert second.returncode == 0, second.stdout + second.stderr
    shipped = _cubins(tmp_path / "shared-bundle")
    assert shipped == real and not shipped & set(planted.values())
    assert (second.stdout + second.stderr).count("ignoring the compiled-code cache") == 1, second.stderr


# --- tune.json ---

def _decision_file(path: Path) -> None:
    entry = {"key": {"op": "x"}, "ranking": [], "excluded": [], "created": 1.0}
    path.write_text(json.dumps({"format": "kernelgraft-tune-cache", "schema": tune_cache.KEY_SCHEMA_VERSION,
                                "entries": {"d1": entry}}))


@pytest.mark.parametrize("how", ENTRY_CASES)
def test_a_tune_json_not_this_users_alone_is_ignored_with_one_warning(cache_root, how):
    cache_root.mkdir(mode=0o700)
    path = cache_root / "tune.json"
    _decision_file(path)
    assert list(tune_cache.DiskCache().entries()) == ["d1"]  # ours: used
    _spoil(path, how)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert tune_cache.DiskCache().entries() == {}
        assert tune_cache.DiskCache().entries() == {}
    messages = _warnings(record, kg.TuneWarning)
    assert len(messages) == 1 and "ignoring the tuning cache" in messages[0], messages
    assert path.exists() and not tune_cache.set_aside_files(path)  # not ours to move
    with pytest.raises(kg.BundleError, match="not a readable tuning cache"):
        from kernelgraft.aot.program import read_decisions

        read_decisions("cache")
    assert tune_cache.DiskCache().put({"d2": {"key": {}, "ranking": [], "excluded": [], "created": 2.0}})
    assert list(tune_cache.DiskCache().entries()) == ["d2"]  # our write replaced it


@pytest.mark.parametrize("how", DIR_CASES)
def test_a_tune_directory_not_this_users_alone_is_neither_read_nor_written(cache_root, how):
    cache_root.mkdir(mode=0o700)
    _decision_file(cache_root / "tune.json")
    _spoil(cache_root, how)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert tune_cache.DiskCache().entries() == {}
        assert not tune_cache.DiskCache().put({"d3": {"key": {}, "ranking": [], "excluded": [], "created": 3.0}})
    assert len(_warnings(record, kg.TuneWarning)) == 1
    assert "d3" not in (cache_root / "tune.json").read_text()
