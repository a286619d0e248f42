"""String arguments in bundles (manifest version 3): a launch turns a string argument into a
constant (a constexpr, a flag), so each kernel records the value it was compiled with ("pinned")
and serves only calls with that value, in the Python loader and in the C++ runtime alike. The
example is the FP8 KV-cache scatter, whose ``scale_fmt`` ('' or 'ue8m0') picks the scale format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernelgraft.aot import manifest as _manifest

from _aot_helpers import build_bundle
from _runtime_helpers import so, variant  # noqa: F401 (so: a fixture)

FORMATS = ("", "ue8m0")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    pytest.importorskip("cuda.bindings")
    # partial: the samples' padded-row caches are not bundled (non-contiguous)
    return build_bundle(tmp_path_factory.mktemp("fp8") / "bundle", "sm_90", 900,
                        examples=("kernelgraft.examples.fp8_kcache_scatter",), allow_partial=True)


def _call(fmt: str, tokens: int = 37):
    k = torch.randn(tokens, 128, dtype=torch.bfloat16)
    return k, torch.zeros(3, 64, 132, dtype=torch.uint8), torch.arange(tokens), 128, fmt


def test_every_kernel_is_pinned_to_the_string_it_was_recorded_with(bundle):
    manifest = _manifest.read(bundle)
    assert manifest["version"] == _manifest.VERSION == 4  # pins came with version 3
    (op,) = manifest["ops"]
    kernels = [k for c in op["candidates"] for k in c["kernels"]]
    assert kernels and all(set(k["pinned"]) == {"scale_fmt"} for k in kernels)
    assert {k["pinned"]["scale_fmt"] for k in kernels} == set(FORMATS)
    assert all("pinned" in rule for rule in op["meta"])
    # the CUDA kernels take the format as an int flag: recorded as a constant beside the pin
    cuda = [k for c in op["candidates"] if c["backend"] == "cuda" for k in c["kernels"]]
    for k in cuda:
        flag = k["params"][-3]["expr"]  # the launch's ue8m0 flag, before nqb and the vector path's flag
        assert str(flag) == str(k["pinned"]["scale_fmt"] == "ue8m0"), (k["pinned"], flag)  # "True"/"False"


def test_the_python_loader_serves_only_the_pinned_string(bundle):
    import kernelgraft as kg

    manifest = _manifest.read(bundle)
    cand = next(c for c in manifest["ops"][0]["candidates"] if c["backend"] == "cuda")
    loaded = kg.load_bundle(bundle, arch="sm_90")
    runner = loaded.runner("kgexamples::fp8_kcache_scatter", cand["index"], cand["config"])
    for fmt in FORMATS:
        assert runner.covers(_call(fmt)) is None, fmt
    assert "no bundled kernel" in runner.covers(_call("e4m3"))


def _cpp_plan(name: str, fmt: str, tokens: int = 37) -> dict:
    args = [{"shape": [tokens, 128], "dtype": "bfloat16"}, {"shape": [3, 64, 132], "dtype": "uint8"},
            {"shape": [tokens], "dtype": "int64"}, 128, fmt]
    return json.loads(torch.ops.kernelgraft._runtime_plan(name, json.dumps(args)))


def test_the_cpp_runtime_serves_only_the_pinned_string(so, bundle, tmp_path):
    def cuda_only(op):
        op["candidates"] = [c for c in op["candidates"] if c["backend"] == "cuda"]
        op["decisions"] = []

    path = variant(bundle, tmp_path / "b", "kgrt_pin", edit_op=cuda_only)
    assert list(torch.ops.kernelgraft.load_bundle(str(path), None, "sm_90")) == ["kgrt_pin::fp8_kcache_scatter"]
    plans = {fmt: _cpp_plan("kgrt_pin::fp8_kcache_scatter", fmt)["params"] for fmt in FORMATS}
    assert {fmt: params[-3] for fmt, params in plans.items()} == {"": "0", "ue8m0": "1"}  # the ue8m0 flag
    # the 16-byte path (its flag last: 1 + log2(128 / VEC)): a dense cache the trace saw aligned
    # (a misaligned pointer falls back at run time, as for every bundled kernel)
    assert {params[-1] for params in plans.values()} <= {"3", "4"}
    with pytest.raises(RuntimeError, match=r"no bundled kernel serves these inputs.*scale_fmt='ue8m0'"):
        _cpp_plan("kgrt_pin::fp8_kcache_scatter", "e4m3")
    # the Meta kernel keeps to the pins too: a mutating op with no outputs traces for a pinned string
    k = torch.empty(37, 128, dtype=torch.bfloat16, device="meta")
    cache = torch.empty(3, 64, 132, dtype=torch.uint8, device="meta")
    slots = torch.empty(37, dtype=torch.int64, device="meta")
    assert torch.ops.kgrt_pin.fp8_kcache_scatter(k, cache, slots, 128, "ue8m0") is None
    with pytest.raises(RuntimeError, match="kgrt_pin::fp8_kcache_scatter"):
        torch.ops.kgrt_pin.fp8_kcache_scatter(k, cache, slots, 128, "e4m3")
