"""The KV-cache append and the top-k router bundle, and both loaders serve them with strided cache
views: ``kernelgraft aot`` of the two examples for sm_90 on this machine, then the Python loader
(in a process where ``import triton`` fails, launches recorded) and the C++ runtime (its planning
hook) on K and V caches interleaved per head, one layer of a larger allocation, and a strided
``slot_mapping``: the kernel is chosen and reads the caller's strides. GPU tests write through them
(``tests/integration/test_aot_layouts.py`` for the same rules on a smaller op)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelgraft.aot import manifest as _manifest

from _aot_helpers import env
from _runtime_helpers import RECORDING_LOADER, json_child, so, variant  # noqa: F401 (so: a fixture)

KV, ROUTER = "kgexamples::kv_append", "kgexamples::topk_router"
BLOCKS, BS, HEADS, HD, TOKENS = 4, 16, 2, 80, 33
# [blocks, bs, heads, 2, hd]: K is [..., 0, :], V is [..., 1, :] (vLLM's interleaved layout)
INTERLEAVED = (BS * HEADS * 2 * HD, HEADS * 2 * HD, 2 * HD, 1)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    pytest.importorskip("cuda.bindings")
    out = tmp_path_factory.mktemp("examples") / "b"
    run = subprocess.run([sys.executable, "-m", "kernelgraft", "aot", "kernelgraft.examples.kv_append",
                          "kernelgraft.examples.topk_router", "--arch", "sm_90", "-o", str(out)],
                         capture_output=True, text=True, env=env(), timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "dropped 0 (candidate, signature) pairs, skipped 0 candidates" in run.stdout, run.stdout[-2000:]
    return out


def test_both_examples_bundle_every_candidate_with_strides_as_expressions(bundle):
    manifest = _manifest.read(bundle)
    ops = {e["name"]: e for e in manifest["ops"]}
    assert set(ops) == {KV, ROUTER}
    for name in (KV, ROUTER):
        backends = {c["backend"] for c in ops[name]["candidates"] if c["kernels"]}
        assert backends == {"triton", "cuda"}, (name, backends)
        # no layout baked in: every kernel takes the caller's strides (guarded where it must)
        assert all(k["contiguous"] == [] for c in ops[name]["candidates"] for k in c["kernels"])


def _t(shape, stride=None, dtype="bfloat16") -> dict:
    return {"shape": list(shape), "dtype": dtype, **({"stride": list(stride)} if stride is not None else {})}


def test_the_cpp_runtime_plans_interleaved_caches_with_their_strides(so, bundle, tmp_path):
    path = variant(bundle, tmp_path / "b", "kgex_cpp")
    assert list(torch.ops.kernelgraft.load_bundle(str(path), None, "sm_90")) == ["kgex_cpp::kv_append",
                                                                                  "kgex_cpp::topk_router"]
    key = _t((TOKENS, HEADS, HD), (3 * HEADS * HD, HD, 1))  # a slice of a fused QKV projection
    cache = _t((BLOCKS, BS, HEADS, HD), INTERLEAVED)
    plan = json.loads(torch.ops.kernelgraft._runtime_plan(
        "kgex_cpp::kv_append", json.dumps([key, key, cache, cache, _t((30,), None, "int64")])))
    params = [p for p in plan["params"] if p is not None]
    text = ",".join(params)
    assert plan["outputs"] == [] and ",".join(map(str, INTERLEAVED * 2)) in text, plan
    assert ",".join(map(str, (3 * HEADS * HD, HD, 1))) in text, plan
    # one layer of a [2, blocks, ...] allocation: the layer's strides are the dense ones
    layer = _t((BLOCKS, BS, HEADS, HD), (BS * HEADS * HD, HEADS * HD, HD, 1))
    again = json.loads(torch.ops.kernelgraft._runtime_plan(
        "kgex_cpp::kv_append", json.dumps([key, key, layer, layer, _t((30,), (2,), "int64")])))
    assert again["candidate"].split("[")[0] in ("triton:launch_kv_append", "cuda:kv_append"), again
    router = json.loads(torch.ops.kernelgraft._runtime_plan(
        "kgex_cpp::topk_router", json.dumps([_t((64, 128), (256, 1)), 8, True])))
    assert router["outputs"] == [[64, 8], [64, 8]], router
    assert "256" in [p for p in router["params"] if p is not None], router  # the logits' row stride


PY_CHILD = RECORDING_LOADER + r"""
bundle = kg.load_bundle(sys.argv[1], arch="sm_90")
manifest = bundle.manifest
report = {}
g = torch.Generator().manual_seed(0)
kv = torch.randn(4, 16, 2, 2, 80, generator=g).bfloat16()
qkv = torch.randn(33, 3, 2, 80, generator=g).bfloat16()
key, value = qkv[:, 1], qkv[:, 2]
slots = torch.randperm(64, generator=g)[:30]
args = (key, value, kv[..., 0, :], kv[..., 1, :], slots)
entry = next(e for e in manifest["ops"] if e["name"] == "kgexamples::kv_append")
for cand in entry["candidates"]:
    runner = bundle.runner("kgexamples::kv_append", cand["index"], cand["config"])
    why = runner.covers(args)
    if why is not None:
        report[cand["label"]] = {"covers": why}
        continue
    calls.clear()
    runner(*args)
    (call,) = calls
    ptrs = [a.data_ptr() for a in args]
    report[cand["label"]] = {"ptrs": all(p in call["values"] for p in ptrs), "values": call["values"][5:]}
print(json.dumps(report))
"""


def test_the_python_loader_serves_interleaved_caches_with_their_strides(bundle, tmp_path):
    report, _ = json_child(tmp_path, PY_CHILD, bundle)
    served = {label: r for label, r in report.items() if "covers" not in r}
    assert any(label.startswith("triton:") for label in served), report
    for label, r in served.items():
        # each cache view at its own address (V is K's address plus one head_dim), read with the
        # interleaved strides, not the dense ones its shape would give
        assert r["ptrs"], (label, r)
        text = ",".join(map(str, r["values"]))
        assert ",".join(map(str, INTERLEAVED)) in text, (label, r)
