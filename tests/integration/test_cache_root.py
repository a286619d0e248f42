"""One cache root for every kernelgraft disk cache: KERNELGRAFT_CACHE_DIR, else
$XDG_CACHE_HOME/kernelgraft, else ~/.cache/kernelgraft; 'off' means no disk caching anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelgraft.cache import root as _cache, code as _codecache
from kernelgraft.tune import cache as tune_cache

from _paths import ROOT, TESTS


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A clean slate: no cache variables, HOME in tmp_path."""
    monkeypatch.delenv("KERNELGRAFT_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


@pytest.mark.parametrize("value,want", [
    (None, "home/.cache/kernelgraft"),
    ("{tmp}/mine", "mine"),
    ("~/kg", "home/kg"),
    ("off", None), ("OFF", None), ("0", None), ("none", None), (" off ", None),
    ("", "home/.cache/kernelgraft"),
], ids=["default", "absolute", "user", "off", "OFF", "zero", "none", "spaced-off", "empty"])
def test_root_from_kernelgraft_cache_dir(env, tmp_path, value, want):
    if value is not None:
        env.setenv("KERNELGRAFT_CACHE_DIR", value.format(tmp=tmp_path))
    got = _cache.root()
    assert got == (None if want is None else tmp_path / want)


@pytest.mark.parametrize("xdg,want", [
    ("{tmp}/xdg", "xdg/kernelgraft"),
    ("relative/xdg", "home/.cache/kernelgraft"),  # the XDG rules ignore a relative path
], ids=["absolute", "relative-ignored"])
def test_root_from_xdg_cache_home(env, tmp_path, xdg, want):
    env.setenv("XDG_CACHE_HOME", xdg.format(tmp=tmp_path))
    assert _cache.root() == tmp_path / want
    env.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "wins"))
    assert _cache.root() == tmp_path / "wins"


@pytest.mark.parametrize("setting", ["KERNELGRAFT_CACHE_DIR", "XDG_CACHE_HOME"])
def test_every_cache_lives_under_the_root(env, tmp_path, setting):
    env.setenv(setting, str(tmp_path / "c"))
    root = _cache.root()
    assert root is not None and root.is_relative_to(tmp_path / "c")
    assert _codecache.cache_root() == root
    assert _codecache.CodeCache("nvrtc").directory() == root / "nvrtc"
    assert tune_cache.cache_dir() == root and tune_cache.cache_path() == root / "tune.json"
    assert tune_cache.DiskCache().path == root / "tune.json"


def test_off_turns_every_disk_cache_off(env, tmp_path):
    env.setenv("KERNELGRAFT_CACHE_DIR", "off")
    env.chdir(tmp_path)
    assert _codecache.cache_root() is None and tune_cache.cache_path() is None
    code = _codecache.CodeCache("test-off")
    code.put("ab" * 32, {"n": 1}, b"payload")
    assert code.get("ab" * 32) == ({"n": 1}, b"payload")  # kept in memory
    disk = tune_cache.DiskCache()
    assert disk.put({"d": {"key": {}}}) is False and disk.entries() == {} and disk.remove() == 0
    assert list(tmp_path.iterdir()) == []


def test_code_cache_entry_that_is_not_a_regular_file_is_a_miss(env, tmp_path):
    env.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "c"))
    cache = _codecache.CodeCache("fifo")
    directory = cache.directory()
    directory.mkdir(parents=True)
    os.mkfifo(directory / f"{'cd' * 32}.kgc")  # would block a plain read forever
    assert cache.get("cd" * 32) is None


# A small kernelgraft workload: an op with two configs tuned (fake timer) and called, the NVRTC
# code cache used, the native build directory asked for, the CLI listing the cache.
_WORKLOAD = textwrap.dedent("""
    import sys, torch, kernelgraft as kg
    sys.path.insert(0, sys.argv[1])
    from _tune_ops import make_scale, fake_timer
    from kernelgraft.cache.code import CodeCache
    from kernelgraft.native import directory
    from kernelgraft.cli import main

    op = make_scale("tcroot::scale")
    with kg.tune("on", timer=fake_timer):
        for n in (100, 1000, 1000):
            x = torch.randn(n)
            torch.testing.assert_close(op(x), x * 2)
    CodeCache("nvrtc").put("ef" * 32, {}, b"cubin")
    from kernelgraft.cache.root import root
    directory()  # with off, a private temporary directory of this process, removed at exit
    assert main(["cache", "show"]) == 0
    print("tuned", kg.tune.stats().get("tuned", 0))
""")


def _files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("mode", ["configured", "off"])
def test_workload_writes_only_inside_the_configured_cache(tmp_path, mode):
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "cwd"
    work.mkdir()
    configured = tmp_path / "kgcache"
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "KERNELGRAFT_CACHE_DIR")}
    env.update(HOME=str(home), TRITON_INTERPRET="1", KERNELGRAFT_NATIVE="0",
               KERNELGRAFT_CACHE_DIR=str(configured) if mode == "configured" else "off",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", _WORKLOAD, str(TESTS)], cwd=work,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "tuned 2" in run.stdout
    assert not (home / ".cache").exists() or _files_under(home / ".cache") == []
    assert _files_under(work) == []  # in particular no ./off/tune.json
    if mode == "configured":
        written = _files_under(configured)
        assert "tune.json" in written and any(p.startswith("nvrtc/") for p in written)
        assert any(p.startswith("native/") for p in written)
    else:
        assert not configured.exists()
