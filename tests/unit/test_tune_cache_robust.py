"""A tuning cache file that cannot be used is a miss with one warning and is set aside; it never
raises from an op call, kg.tune.decision or the CLI, and reading it stays fast."""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import pytest
import torch

import kernelgraft as kg
from kernelgraft import TuneWarning
from kernelgraft.cli import main
from kernelgraft.tune import cache as _cache
from kernelgraft.tune.cache import DiskCache, set_aside
from kernelgraft.tune.key import KEY_SCHEMA_VERSION

from _tune_ops import CONFIGS, fake_timer, make_scale  # noqa: E402

HEAD = f'{{"format": "kernelgraft-tune-cache", "schema": {KEY_SCHEMA_VERSION}, "entries": '


def _deep(n: int) -> str:
    return "[" * n + "]" * n


def _write_fifo(path: Path) -> None:
    os.mkfifo(path)


def _write_devzero_link(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _write_sparse_huge(path: Path) -> None:
    with open(path, "wb") as fh:
        fh.truncate(_cache.MAX_BYTES + 1)  # sparse: costs no disk, reads as zeros


# variant -> bytes or a function that makes the file
BROKEN = {
    "invalid-utf8": (HEAD + '{"\xff": {}}}').encode("latin-1"),
    "nested-100k": _deep(100_000).encode(),
    "nested-in-entry": (HEAD + '{"a": {"key": ' + _deep(100_000) + "}}}").encode(),
    "truncated": HEAD.encode(),
    "not-json": b"\x00\x01garbage",
    "top-level-list": b"[1, 2]",
    "entries-list": (HEAD + "[]}").encode(),
    "schema-string": b'{"format": "kernelgraft-tune-cache", "schema": "2", "entries": {}}',
    "huge": _write_sparse_huge,
    "fifo": _write_fifo,
    "link-to-dev-zero": _write_devzero_link,
}


@pytest.fixture
def cache_file(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "cache"))
    path = kg.tune.cache_path()
    path.parent.mkdir(parents=True)
    return path


def _plant(path: Path, variant: str) -> None:
    content = BROKEN[variant]
    if callable(content):
        content(path)
    else:
        path.write_bytes(content)


def _tune_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, TuneWarning)]


@pytest.mark.parametrize("variant", sorted(BROKEN))
def test_broken_file_is_a_miss_with_one_warning_and_set_aside(cache_file, variant):
    _plant(cache_file, variant)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert DiskCache().entries() == {}  # a huge file is refused by its size, unread (_cache.read_json)
    messages = _tune_warnings(record)
    assert len(messages) == 1 and "cannot be used" in messages[0] and "set aside" in messages[0]
    aside = _cache.set_aside_files(cache_file)
    assert len(aside) == 1 and not os.path.lexists(cache_file)
    assert aside[0].name in messages[0]


@pytest.mark.parametrize("variant", ["invalid-utf8", "nested-100k", "huge", "entries-list"])
def test_op_call_over_a_broken_file_tunes_and_writes_a_fresh_file(cache_file, variant):
    _plant(cache_file, variant)
    op = make_scale(f"tcr::{variant.replace('-', '_')}")
    x = torch.randn(1000)
    with warnings.catch_warnings(record=True) as record, kg.tune("on", timer=fake_timer):
        warnings.simplefilter("always")
        torch.testing.assert_close(op(x), x * 2)
        y = torch.randn(5000)  # a second key: reads the cache again
        torch.testing.assert_close(op(y), y * 2)
        plan = op.dispatcher.plan_for((x,))  # plans belong to the tuning scope they were made in
    assert len(_tune_warnings(record)) == 1  # one warning, however many calls read the cache
    assert len(_cache.set_aside_files(cache_file)) == 1
    data = json.loads(cache_file.read_text())
    assert len(data["entries"]) == 2 and data["schema"] == KEY_SCHEMA_VERSION
    assert plan.candidate.config.as_dict() == {"BLOCK": 256}


def test_cached_mode_over_a_broken_file_runs_the_default(cache_file):
    _plant(cache_file, "nested-100k")
    op = make_scale("tcr::cached")
    x = torch.randn(1000)
    with pytest.warns(TuneWarning, match="nested too deep"), kg.tune("cached"):
        torch.testing.assert_close(op(x), x * 2)
        assert op.dispatcher.plan_for((x,)).candidate.config.as_dict() == CONFIGS[0]


@pytest.mark.parametrize("bad", [
    {"created": "yesterday"}, {"tune_s": None}, {"measured": "many"}, {"offered": 1.5},
    {"ranking": 5}, {"excluded": [1]}, {"key": "oops"}, {"created": float("nan")},
], ids=["created", "tune_s", "measured", "offered", "ranking", "excluded-items", "key", "created-nan"])
def test_mistyped_entry_is_a_miss_for_the_op_call_and_for_decision(cache_file, bad):
    op = make_scale("tcr::mistyped")
    x = torch.randn(1000)
    key = kg.tune.build_key(op, (x,), ["triton"])
    good = {"key": key.as_json(), "ranking": [{"impl": 0, "config": {"BLOCK": 512}, "ms": 1.0}],
            "excluded": [], "created": time.time(), "measured": 4, "offered": 4}
    DiskCache().put({key.digest: {**good, **bad}, "other": good})
    with pytest.warns(TuneWarning, match="1 entries .* wrong type"):
        assert kg.tune.decision(op, x) is None
    with kg.tune("cached"):
        op(x)
        assert op.dispatcher.plan_for((x,)).candidate.config.as_dict() == CONFIGS[0]
    # the file is kept (its other entries are fine); the next write drops the mistyped one
    with pytest.warns(TuneWarning, match="dropped at the next write"):
        DiskCache().put({"new": good})
    assert sorted(json.loads(cache_file.read_text())["entries"]) == ["new", "other"]


def test_well_typed_decision_is_used(cache_file):
    op = make_scale("tcr::typed")
    x = torch.randn(1000)
    key = kg.tune.build_key(op, (x,), ["triton"])
    DiskCache().put({key.digest: {"key": key.as_json(), "ranking": [
        {"impl": 0, "config": {"BLOCK": 512}, "ms": 1.0}], "excluded": [], "created": time.time()}})
    assert kg.tune.decision(op, x).winner["config"] == {"BLOCK": 512}


@pytest.mark.parametrize("variant", sorted(BROKEN))
def test_cli_show_and_clear_survive(cache_file, variant, capsys):
    _plant(cache_file, variant)
    with pytest.warns(TuneWarning, match="cannot be used"):
        assert main(["cache", "show"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "0 entries" in out and "set aside" in out
    assert main(["cache", "clear"]) == 0
    assert "1 set-aside files" in " ".join(capsys.readouterr().out.split())
    assert _cache.set_aside_files(cache_file) == []
    assert json.loads(cache_file.read_text())["entries"] == {}


def test_cli_import_refuses_a_broken_file(cache_file, tmp_path, capsys):
    bad = tmp_path / "deep.json"
    bad.write_text(_deep(100_000))
    assert main(["cache", "import", str(bad)]) == 1
    assert "nested too deep" in capsys.readouterr().out


def test_cli_show_prints_brackets_as_text(cache_file, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # one table row per line
    DiskCache().put({"a": {"key": {"op": "x::[bold]y[/nope]"}, "ranking": [{"config": {"B": "[/]"}, "ms": 1}]}})
    assert main(["cache", "show"]) == 0
    assert "x::[bold]y[/nope]" in capsys.readouterr().out


def test_writes_stay_within_the_bound_dropping_the_oldest(cache_file, monkeypatch):
    monkeypatch.setattr(_cache, "MAX_BYTES", 8192)
    cache = DiskCache()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for i in range(60):
            cache.put({f"d{i:02d}": {"key": {}, "ranking": [], "created": 1000.0 + i, "pad": "x" * 200}})
            assert cache_file.stat().st_size <= 8192
    assert _tune_warnings(record) == [] and _cache.set_aside_files(cache_file) == []
    kept = sorted(json.loads(cache_file.read_text())["entries"])
    assert "d59" in kept and "d00" not in kept
    assert kept == [f"d{i:02d}" for i in range(60 - len(kept), 60)]  # the newest survive


def test_a_file_replaced_meanwhile_is_not_set_aside(cache_file):
    cache_file.write_text("[")
    stamp = _cache._stamp(cache_file)
    time.sleep(0.01)
    cache_file.write_text(json.dumps(_cache._empty()) + " ")  # another process rewrote it
    assert set_aside(cache_file, stamp) is None
    assert cache_file.exists() and _cache.set_aside_files(cache_file) == []


def test_off_writes_nothing_and_warns_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", "off")
    monkeypatch.chdir(tmp_path)
    op = make_scale("tcr::off")
    with warnings.catch_warnings(record=True) as record, kg.tune("on", timer=fake_timer):
        warnings.simplefilter("always")
        x = torch.randn(1000)
        torch.testing.assert_close(op(x), x * 2)
    assert kg.tune.cache_path() is None and _tune_warnings(record) == []
    assert list(tmp_path.iterdir()) == []  # no ./off/tune.json
    assert kg.tune.stats()["tuned"] == 1  # the decision lives in memory


@pytest.mark.parametrize("ranked", [
    {"impl": 1e400, "config": {"BLOCK": 512}, "ms": 1.0}, {"impl": "0", "config": {"BLOCK": 512}, "ms": 1.0},
    {"config": {"BLOCK": 512}, "ms": 1.0}, {"impl": -1, "config": {"BLOCK": 512}, "ms": 1.0},
    {"impl": 1.0, "config": {"BLOCK": 512}, "ms": 1.0}, {"impl": True, "config": {"BLOCK": 512}, "ms": 1.0},
    {"impl": 0, "backend": "torch", "impl_name": "nope", "ms": 1.0},
], ids=["impl-inf", "impl-string", "no-impl", "impl-negative", "impl-float", "impl-bool", "unknown-torch"])
def test_an_entry_no_candidate_can_serve_is_a_miss_for_calls_and_decision(cache_file, ranked):
    # JSON's 1e400 reads as inf: int(inf) raised OverflowError out of the op call and decision()
    op = make_scale("tcr::unservable")
    x = torch.randn(1000)
    key = kg.tune.build_key(op, (x,), ["triton"])
    DiskCache().put({key.digest: {"key": key.as_json(), "ranking": [ranked], "excluded": [],
                                  "created": time.time()}})
    assert kg.tune.decision(op, x) is None
    with kg.tune("cached"):
        torch.testing.assert_close(op(x), x * 2)
        assert op.dispatcher.plan_for((x,)).candidate.config.as_dict() == CONFIGS[0]
    with kg.tune("on", timer=fake_timer):  # tuned again, and the entry replaced
        torch.testing.assert_close(op(x), x * 2)
    assert kg.tune.decision(op, x).winner["config"] == {"BLOCK": 256}


def test_another_versions_file_is_left_whole_and_decisions_stay_in_memory(cache_file):
    # two kernelgraft versions sharing a cache directory must not erase each other's decisions
    other = {"format": "kernelgraft-tune-cache", "schema": KEY_SCHEMA_VERSION + 1,
             "entries": {f"k{i}": {"key": {}, "ranking": [], "excluded": []} for i in range(50)}}
    cache_file.write_text(json.dumps(other))
    before = cache_file.read_bytes()
    op = make_scale("tcr::other_schema")
    x = torch.randn(1000)
    with warnings.catch_warnings(record=True) as record, kg.tune("on", timer=fake_timer):
        warnings.simplefilter("always")
        torch.testing.assert_close(op(x), x * 2)
        y = torch.randn(3000)
        torch.testing.assert_close(op(y), y * 2)
        assert op.dispatcher.plan_for((x,)).candidate.config.as_dict() == {"BLOCK": 256}
    messages = _tune_warnings(record)
    assert len(messages) == 1 and "key schema" in messages[0] and "KERNELGRAFT_CACHE_DIR" in messages[0], messages
    assert cache_file.read_bytes() == before and _cache.set_aside_files(cache_file) == []
    assert kg.tune.decision(op, x).winner["config"] == {"BLOCK": 256}  # from memory


def test_an_earlier_versions_file_is_replaced_and_clear_replaces_a_newer_one(cache_file, capsys):
    # an upgrade must keep caching: the file of an earlier key schema is read as empty and replaced
    cache_file.write_text(json.dumps({"format": "kernelgraft-tune-cache", "schema": KEY_SCHEMA_VERSION - 1,
                                      "entries": {"old": {"key": {}, "ranking": [], "excluded": []}}}))
    op = make_scale("tcr::earlier_schema")
    x = torch.randn(1000)
    with warnings.catch_warnings(record=True) as record, kg.tune("on", timer=fake_timer):
        warnings.simplefilter("always")
        op(x)
    assert _tune_warnings(record) == []
    data = json.loads(cache_file.read_text())
    assert data["schema"] == KEY_SCHEMA_VERSION and len(data["entries"]) == 1
    # a newer version's file stays, but an explicit clear replaces it
    cache_file.write_text(json.dumps({**data, "schema": KEY_SCHEMA_VERSION + 1}))
    assert main(["cache", "clear"]) == 0
    assert json.loads(cache_file.read_text()) == {"format": "kernelgraft-tune-cache", "schema": KEY_SCHEMA_VERSION,
                                                  "entries": {}}
