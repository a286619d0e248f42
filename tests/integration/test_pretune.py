"""Tuning ahead over shape ranges (kg.tune.pretune with ranges, kernelgraft tune --decode/--prefill):
the keys a range yields, resuming after an interruption, a model's op sites from an HF config or
example inputs, and the decisions feeding ``kernelgraft aot --decisions``. Fake timers; kernels
run through Triton's interpreter. Ranks: tests/integration/test_pretune_dist.py."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import zlib

import pytest
import torch

import kernelgraft as kg
from kernelgraft.tune import key as _key
from kernelgraft.tune.cache import DiskCache
from kernelgraft.tune.pretune import prepare
from kernelgraft.tune.ranges import RECORD_POINTS, Formula, Ranges, describe_arg, fit_site
from kernelgraft.tune.tuner import TUNER

import _pretune_ops as P  # module level: its ops outlive each test
from _paths import TESTS

HERE = TESTS


@pytest.fixture(autouse=True)
def _fresh_tuner(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "cache"))
    TUNER.clear()  # decisions in memory and failures waiting for their retry
    TUNER.disk = DiskCache()
    yield


def _digest(op, *args) -> str:
    return prepare(op, args, {})[2].digest


def _entries() -> dict:
    return DiskCache().entries()


def test_ranges():
    assert Ranges(decode=3).points() == [(1, 1), (2, 1), (3, 1)]
    assert Ranges(decode=[8, 2], prefill=[512, 128]).points() == [(2, 1), (8, 1), (1, 128), (1, 512)]
    assert Ranges.parse("4", "16,64").points() == [(1, 1), (2, 1), (3, 1), (4, 1), (1, 16), (1, 64)]
    for bad in ({}, {"decode": 0}, {"prefill": [0]}, {"decode": "x"}):
        with pytest.raises(kg.SpecError):
            Ranges(**bad)


def test_a_site_follows_batch_sequence_and_tokens():
    op = P.scale
    calls = []
    for b, s in RECORD_POINTS:  # [batch, seq, 64] activations, a [b*s, 8] view, a constant [64]
        calls.append([describe_arg(torch.randn(b, s, 64)), describe_arg(torch.randn(b * s, 16)[:, :8]),
                      describe_arg(torch.randn(64)), describe_arg(b * s), describe_arg(0.5)])
    site = fit_site(op, calls, RECORD_POINTS)
    x, view, const, n, eps = site.args
    assert x.sizes == (Formula("batch", 1, 0), Formula("seq", 1, 0), Formula("1", 0, 64))
    assert x.strides == (Formula("seq", 64, 0), Formula("1", 0, 64), Formula("1", 0, 1))
    assert view.sizes[0] == Formula("tokens", 1, 0) and view.strides == (Formula("1", 0, 16), Formula("1", 0, 1))
    assert const.sizes == (Formula("1", 0, 64),) and n.value == Formula("tokens", 1, 0) and eps.value == 0.5
    assert site.at(4, 1)[0][2:4] == ((4, 1, 64), (64, 64, 1))
    # a size that follows neither (a square of the length) is refused with the reason
    squared = [[describe_arg(torch.randn(s * s))] for b, s in RECORD_POINTS]
    assert "follows neither" in fit_site(op, squared, RECORD_POINTS)


def test_op_over_ranges_tunes_each_bucket_once_and_resumes_after_an_interruption():
    ranges = Ranges(decode=8, prefill=[16, 100, 1000, 3000])
    sizes = [b * s for b, s in ranges.points()]
    want = {_digest(P.scale, torch.randn(n)) for n in sizes}  # pow2 buckets: 1 2 4 8 16 128 1024 4096
    assert len(want) == 8
    seen = []

    def stop_after_three(result):
        seen.append(result)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with kg.tune("on", timer=P.fake_timer), pytest.raises(KeyboardInterrupt):
        kg.tune.pretune(P.scale, torch.randn(5), ranges=ranges, progress=False, on_key=stop_after_three)
    assert set(_entries()) == {r.digest for r in seen} and len(seen) == 3  # what finished is kept
    TUNER.memory.clear()  # a new process: only tune.json remains
    with kg.tune("on", timer=P.fake_timer):
        report = kg.tune.pretune(P.scale, torch.randn(5), ranges=ranges, progress=False)
    assert {k.digest for k in report.keys} == want == set(_entries())
    assert report.count("cached") == 3 and report.count("tuned") == 5  # only the rest was measured
    for k in report.keys:  # the choices follow the fake timings, ties broken by declaration order
        n = max(s for s in sizes if _digest(P.scale, torch.randn(s)) == k.digest)
        block = {True: 256, False: 128}[n < 64] if n < 1024 else 512
        assert k.winner == f"triton:launch_scale[BLOCK={block}]", (n, k)


def test_a_key_whose_tuning_failed_says_why(monkeypatch):
    """A key whose tuning raised is 'failed' with the error in its result and in the report's
    line (a rank's log is often all there is), and nothing of it is saved."""
    from kernelgraft.tune import tuner as _tuner

    def broken(*args, **kwargs):
        raise RuntimeError("the compile workers could not start")

    monkeypatch.setattr(_tuner, "run_trials", broken)
    with kg.tune("on", timer=P.fake_timer), pytest.warns(kg.TuneWarning, match="tuning failed"):
        report = kg.tune.pretune(P.scale, torch.randn(5), ranges=Ranges(decode=2), progress=False)
    assert report.keys and report.count("failed") == len(report.keys)
    assert {k.reason for k in report.keys} == {"RuntimeError: the compile workers could not start"}
    assert "; failed (" in str(report) and "RuntimeError: the compile workers could not start" in str(report)
    assert not _entries()
    text = str(kg.tune.report(P.scale))  # the op's report says so too
    assert "failed (RuntimeError: the compile workers could not start; the default candidate serves)" in text
    decision = TUNER.memory[report.keys[0].digest]  # shared with the other ranks as JSON: the reason goes along
    assert _tuner.Decision.from_json(decision.to_json(), "rank").failure == decision.failure


_CUBLAS = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"


def _short_of_memory_then(monkeypatch, failures: int) -> dict:
    """run_trials fails ``failures`` times the way cuBLAS does when it cannot allocate its handle,
    then runs; what happened is counted in the returned dict."""
    from kernelgraft.tune import tuner as _tuner

    _pretune = importlib.import_module("kernelgraft.tune.pretune")  # the package's name is the function
    real = _tuner.run_trials
    seen = {"trials": 0, "released": 0}

    def trials(*args, **kwargs):
        seen["trials"] += 1
        if seen["trials"] <= failures:
            raise RuntimeError(_CUBLAS)
        return real(*args, **kwargs)

    def release():
        seen["released"] += 1

    monkeypatch.setattr(_tuner, "run_trials", trials)
    monkeypatch.setattr(_pretune, "release_cached_memory", release)
    monkeypatch.setattr(_pretune, "MEMORY_WAIT_S", 0.0)
    return seen


def test_a_key_that_ran_out_of_memory_is_tuned_again_after_releasing_cached_memory(monkeypatch):
    """A CUDA library's own allocation failure (cuBLAS creating its handle beside a full caching
    allocator, or another rank on the GPU) counts as out of memory: the key is tuned again once
    cached memory is handed back, and its decision is saved like any other."""
    seen = _short_of_memory_then(monkeypatch, failures=1)
    with kg.tune("on", timer=P.fake_timer), pytest.warns(kg.TuneWarning, match="CUBLAS_STATUS_ALLOC_FAILED"):
        report = kg.tune.pretune(P.scale, torch.randn(5), ranges=Ranges(decode=1), progress=False)
    assert [k.status for k in report.keys] == ["tuned"], report.keys
    assert report.keys[0].retries == 1 and report.keys[0].reason is None
    assert seen["trials"] == 2 and seen["released"] >= 2  # before the second try, and after the key
    assert "1 tuned again after running out of memory" in str(report)
    assert report.keys[0].digest in _entries()
    assert not TUNER.short_of_memory(report.keys[0].digest)


def test_a_key_that_keeps_running_out_of_memory_fails_saying_so(monkeypatch):
    _pretune = importlib.import_module("kernelgraft.tune.pretune")

    seen = _short_of_memory_then(monkeypatch, failures=99)
    with kg.tune("on", timer=P.fake_timer), pytest.warns(kg.TuneWarning, match="tuning again in"):
        report = kg.tune.pretune(P.scale, torch.randn(5), ranges=Ranges(decode=1), progress=False)
    key = report.keys[0]
    assert key.status == "failed" and key.retries == _pretune.MEMORY_RETRIES
    assert seen["trials"] == 1 + _pretune.MEMORY_RETRIES
    assert _CUBLAS in key.reason and _CUBLAS in str(report)
    assert not _entries()  # a shortage is the moment's, not the key's: nothing stands for later processes


def test_a_key_whose_candidates_keep_running_out_of_memory_is_not_cached_and_counts_one_shortage(monkeypatch):
    """Some candidates short of memory: the others' ranking serves this process and nothing is
    saved, so the key is 'failed' (not 'tuned'), a second pretune tunes it again (not 'cached'),
    and the attempts made at once count as one shortage toward the tuner's limit, after which the
    short candidates would be saved as not fitting."""
    _pretune = importlib.import_module("kernelgraft.tune.pretune")
    monkeypatch.setattr(_pretune, "release_cached_memory", lambda: None)
    monkeypatch.setattr(_pretune, "MEMORY_WAIT_S", 0.0)

    def short_timer(trial, settings):
        if trial.candidate.config.as_dict()["BLOCK"] == 512:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return P.fake_timer(trial, settings)

    for run in (1, 2):
        with kg.tune("on", timer=short_timer), pytest.warns(kg.TuneWarning, match="ran out of memory"):
            report = kg.tune.pretune(P.scale, torch.randn(5), ranges=Ranges(decode=1), progress=False)
        key = report.keys[0]
        assert (key.status, key.retries) == ("failed", _pretune.MEMORY_RETRIES), (run, key)
        assert "ran out of memory" in key.reason and "nothing was saved" in key.reason
        assert TUNER._retry[key.digest][1] == run  # one shortage per pretune, not one per attempt
    assert not _entries()


def _llama():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from kernelgraft.examples.rmsnorm import rmsnorm

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                      max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    kg.graft(model, {LlamaRMSNorm: rmsnorm}, verify=False)
    return model, config, rmsnorm


def _crc_timer(trial, settings):
    trial.run(0)
    return 1.0 + zlib.crc32(trial.candidate.label.encode()) % 97 / 100


def test_model_sites_from_an_hf_config_and_from_example_inputs():
    model, config, rmsnorm = _llama()
    try:
        ranges = Ranges(decode=4, prefill=[16, 64])
        w = torch.randn(64)
        want = {_digest(rmsnorm, torch.randn(b, s, 64), w, 1e-6) for b, s in ranges.points()}
        assert len(want) == 5  # batches 1 2 3 4 -> buckets 1 2 4; prefills 16 and 64
        with kg.tune("on", timer=_crc_timer):
            report = kg.tune.pretune(model, ranges=ranges, hf_config=config, progress=False)
        assert report.sites == 1 and not report.left_out  # 5 RMSNorm calls per pass, one site
        assert {k.digest for k in report.keys} == want and report.count("tuned") == 5
        ids = torch.randint(0, 256, (2, 12))
        with kg.tune("on", timer=_crc_timer):
            again = kg.tune.pretune(model, ranges=ranges, example_inputs=((ids,), {"use_cache": False}),
                                    progress=False)
        assert {k.digest for k in again.keys} == want and again.count("cached") == 5
    finally:
        kg.ungraft(model)


def test_pretuned_decisions_feed_aot_decisions(tmp_path, monkeypatch):
    pytest.importorskip("cuda.bindings")
    # The keys say where they were tuned; AOT keeps decisions made on the bundle's arch: these CPU
    # timings stand for an sm_90 device's.
    monkeypatch.setattr(_key, "_device_info", lambda kind, index: ("NVIDIA H200", "9.0", "580"))
    with kg.tune("on", timer=P.fake_timer):
        report = kg.tune.pretune(P.scale, torch.randn(5), ranges=Ranges(decode=2, prefill=[100, 2000]),
                                 progress=False)
    assert report.count("tuned") == 4
    tune = tmp_path / "tune.json"
    tune.write_bytes(DiskCache().path.read_bytes())
    out = tmp_path / "bundle"
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = __import__("os").pathsep.join(p for p in sys.path if p)
    proc = subprocess.run([sys.executable, "-m", "kernelgraft", "aot", str(HERE / "_pretune_ops.py"), "--op",
                           "tpre::scale", "--arch", "sm_90", "-o", str(out),
                           "--decisions", str(tune)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    entry = next(e for e in manifest["ops"] if e["name"] == "tpre::scale")
    blocks = sorted(entry["candidates"][row["ranking"][0]]["config"]["BLOCK"] for row in entry["decisions"])
    assert blocks == [128, 256, 256, 512]  # 1 and 2 rows: 256 (a tie); 128 rows: 128 (a tie); 2048: 512


def test_cli_tune_ahead_lists_the_keys(tmp_path, capsys):
    from kernelgraft.cli import main

    target = tmp_path / "ops.py"
    target.write_text("import sys; sys.path.insert(0, %r)\nfrom _pretune_ops import scale\n" % str(HERE))
    assert main(["tune", str(target), "--decode", "3", "--prefill", "40", "--device", "cpu",
                 "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "tpre::scale" in out and "4 keys" in out  # 1, 2, 4 and 64 rows
    report = json.loads((tmp_path / "r.json").read_text())
    assert [k["status"] for k in report["keys"]] == ["not measured"] * 4  # the CPU has no timer


@pytest.mark.gpu
def test_gpu_pretuned_llama_serves_its_shapes_without_tuning():
    """On the GPU: the Llama's RMSNorm sites tuned ahead over decode and prefill ranges; the
    model's calls at those shapes then measure nothing."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from kernelgraft.examples.rmsnorm import rmsnorm

    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                      max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    kg.graft(model, {LlamaRMSNorm: rmsnorm}, verify=False)
    try:
        report = kg.tune.pretune(model, ranges=Ranges(decode=4, prefill=[64]), hf_config=config, progress=False)
        assert report.count("tuned") == 4 and not report.count("failed"), report.keys
        tuned = kg.tune.stats().get("tuned", 0)
        with torch.no_grad():
            for ids in (torch.randint(0, 512, (3, 1), device="cuda"), torch.randint(0, 512, (1, 64), device="cuda")):
                model(ids, use_cache=False)
        assert kg.tune.stats().get("tuned", 0) == tuned  # every shape was decided ahead
    finally:
        kg.ungraft(model)


def test_a_pretune_names_its_ops_to_the_compile_workers_before_planning():
    """The zygote the compile workers fork from imports the modules of the ops a pretune names (so
    no worker imports them at its first job): the calls' ops, the target ops, else every op defined
    so far (a model's sites are found after the workers start)."""
    from kernelgraft.op import registry
    from kernelgraft.tune import api

    ops = [P.scale, P.scale2]
    assert len(ops) == 2
    assert api._named_ops(None, [(ops[1], lambda: ()), (ops[0], lambda: ())]) == [ops[1], ops[0]]
    assert api._named_ops(ops[0], None) == [ops[0]] and api._named_ops(ops, None) == ops
    assert api._named_ops(torch.nn.Linear(2, 2), None) == registry.all_ops()
