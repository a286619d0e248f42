"""kg.cuda: spec validation, NVRTC compilation for sm_90 without a GPU, the code cache, errors;
on a GPU every CUDA C++ candidate of the examples against the reference."""

from __future__ import annotations

import pytest
import torch

import kernelgraft as kg
from kernelgraft.backends.cuda import nvrtc as _nvrtc
from kernelgraft.backends.cuda.jit import CudaRunner

from _toolchains import needs_nvrtc

EM_CUDA = 190
_SRC = r"""
template <int BLOCK>
__global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) y[i] = FACTOR * x[i];
}
"""


def _launch(x, out, *, BLOCK, FACTOR=2):
    return kg.Launch(grid=(x.numel() + BLOCK - 1) // BLOCK, block=BLOCK,
                     args=(x, out, kg.driver.i32(x.numel())))


def _is_cuda_elf(image: bytes) -> bool:
    return image[:4] == b"\x7fELF" and int.from_bytes(image[18:20], "little") == EM_CUDA


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path))
    _nvrtc.CACHE.clear_memory()
    yield tmp_path
    _nvrtc.CACHE.clear_memory()


def test_spec_validation_errors_are_specific():
    with pytest.raises(kg.SpecError, match="kernel_name must name"):
        kg.cuda(_SRC, "", launch=_launch, configs=[{"BLOCK": 128}])
    with pytest.raises(kg.SpecError, match="the arch is chosen per device"):
        kg.cuda(_SRC, "scale<{BLOCK}>", launch=_launch, configs=[{"BLOCK": 128}], options=["-arch=sm_80"])
    with pytest.raises(kg.SpecError, match="must be scalars"):
        kg.cuda(_SRC, "scale<{BLOCK}>", launch=_launch, configs=[{"BLOCK": (1, 2)}])
    spec = kg.cuda(_SRC, "scale<{BLOCK}, {T}>", launch=_launch, configs=[{"BLOCK": 128}])
    with pytest.raises(kg.SpecError, match=r"placeholder \{T\} has no value"):
        spec.expression(spec.configs[0], None)
    assert spec.expression(spec.configs[0], {"T": "float"}) == "scale<128, float>"
    assert spec.display_name == "scale"
    # placeholders fill the name; the other keys become macros
    two = kg.cuda(_SRC, "scale<{BLOCK}>", launch=_launch, configs=[{"BLOCK": 128, "FACTOR": 3}])
    assert two.compile_options(two.configs[0], None) == ("-DFACTOR=3",)


def test_specs_hash_by_source_and_options():
    a = kg.cuda(_SRC, "scale<{BLOCK}>", launch=_launch, configs=[{"BLOCK": 128}])
    b = kg.cuda(_SRC, "scale<{BLOCK}>", launch=_launch, configs=[{"BLOCK": 128}])
    c = kg.cuda(_SRC, "scale<{BLOCK}>", launch=_launch, configs=[{"BLOCK": 128}], options=["-use_fast_math"])
    d = kg.cuda(_SRC + "\n", "scale<{BLOCK}>", launch=_launch, configs=[{"BLOCK": 128}])
    assert a == b and hash(a) == hash(b)
    assert a != c and a != d


@needs_nvrtc
@pytest.mark.parametrize(
    "change",
    [
        {"source": _SRC + "// edit\n"},
        {"name": "scale<256>"},
        {"options": ("-DFACTOR=3",)},
        {"arch": "sm_80"},
        {"kind": "ptx"},
    ],
    ids=["source", "name", "options", "arch", "kind"],
)
def test_cache_key_differs_on_everything_that_changes_code(change):
    base = dict(source=_SRC, name="scale<128>", options=("-DFACTOR=2",), arch="sm_90", kind="cubin")
    assert _nvrtc.cache_key(**base) != _nvrtc.cache_key(**{**base, **change})


@needs_nvrtc
def test_cache_key_ignores_macro_order():
    k1 = _nvrtc.cache_key(_SRC, "scale<128>", ("-DA=1", "-DB=2"), "sm_90", "cubin")
    k2 = _nvrtc.cache_key(_SRC, "scale<128>", ("-DB=2", "-DA=1"), "sm_90", "cubin")
    assert k1 == k2


@needs_nvrtc
def test_compile_for_sm90_without_gpu_and_disk_cache(cache_dir):
    spec = kg.cuda(_SRC, "scale<{BLOCK}>", launch=_launch, configs=[{"BLOCK": 128, "FACTOR": 3}])
    runner = CudaRunner(spec, spec.configs[0])
    first = runner.compile("sm_90")
    assert _is_cuda_elf(first.image)
    assert first.symbol == "_Z5scaleILi128EEvPKfPfi"
    entries = list((cache_dir / "nvrtc").glob("*.kgc"))
    assert len(entries) == 1
    _nvrtc.CACHE.clear_memory()
    hits = _nvrtc.CACHE.hits["disk"]
    again = runner.compile("sm_90")
    assert _nvrtc.CACHE.hits["disk"] == hits + 1
    assert again.image == first.image and again.symbol == first.symbol

    # a corrupt entry is a miss, recompiled and rewritten
    entries[0].write_bytes(entries[0].read_bytes()[:-10] + b"garbage!!!")
    _nvrtc.CACHE.clear_memory()
    misses = _nvrtc.CACHE.misses
    third = runner.compile("sm_90")
    assert _nvrtc.CACHE.misses == misses + 1
    assert third.image == first.image
    _nvrtc.CACHE.clear_memory()
    assert runner.compile("sm_90").image == first.image  # the rewritten entry loads

    # entries with the right magic that another version (or an editor) wrote: misses, never crashes
    import hashlib
    import json
    import struct

    def plant(header: bytes, payload: bytes = b"x") -> None:
        entries[0].write_bytes(b"KGCC0001" + struct.pack("<I", len(header)) + header + payload)

    key = entries[0].stem
    for header in (b"[1, 2]", b"[" * 100_000 + b"]" * 100_000,
                   json.dumps({"key": key, "sha256": hashlib.sha256(b"x").hexdigest(), "meta": {}}).encode(),
                   json.dumps({"key": key, "sha256": hashlib.sha256(b"x").hexdigest(), "meta": [1]}).encode()):
        plant(header)
        _nvrtc.CACHE.clear_memory()
        got = runner.compile("sm_90")
        assert got.image == first.image and got.symbol == first.symbol


@needs_nvrtc
@pytest.mark.parametrize("kind", ["cubin", "ptx"])
def test_a_clean_compile_leaves_the_interpreters_shared_bytes_alone(kind, cache_dir):
    """NVRTC writes its log, cubin and PTX into the buffers it is handed. A warning-free compile
    has a one-byte log (its NUL): handed b" " * 1, which is CPython's one shared b" ", it turned
    every space the process encoded into a NUL (the H200 machine's AOTInductor wrappers came out
    as `CUfunctiontriton_...` and would not compile)."""
    spec = kg.cuda(_SRC, "scale<{BLOCK}>", launch=_launch, configs=[{"BLOCK": 64, "FACTOR": 5}])
    compiled = _nvrtc.compile_cuda(spec.source, "scale<64>", options=("-DFACTOR=5",), arch="sm_90", kind=kind)
    assert compiled.log == ""  # the case that wrote into b" "
    # encoding a one-space str returns the shared object (a b" " literal need not be it)
    assert list(" ".encode()) == [32] and list(chr(32).encode("latin-1")) == [32]
    assert list(f"{'a'} {'b'}".encode()) == [97, 32, 98]
    assert (_is_cuda_elf(compiled.image) if kind == "cubin" else compiled.image.startswith(b"//"))


@needs_nvrtc
def test_compile_error_shows_nvrtc_log_with_file_line_and_config(cache_dir):
    bad = _SRC.replace("FACTOR * x[i]", "FACTOR * x[i] + undefined_name")
    spec = kg.cuda(bad, "scale<{BLOCK}>", launch=_launch, configs=[{"BLOCK": 128, "FACTOR": 2}])
    with pytest.raises(kg.CompileError) as info:
        CudaRunner(spec, spec.configs[0]).compile("sm_90")
    text = str(info.value)
    assert "cuda:scale[BLOCK=128,FACTOR=2]" in text
    assert "scale.cu(5): error" in text and "undefined_name" in text
    assert "sm_90" in text


@needs_nvrtc
@pytest.mark.parametrize("module", ["add_relu", "rmsnorm"])
def test_example_cuda_kernels_compile_for_sm90_in_every_dtype(module, cache_dir):
    import importlib

    mod = importlib.import_module(f"kernelgraft.examples.{module}")
    spec = mod.CUDA
    for config in spec.configs:
        runner = CudaRunner(spec, config)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            compiled = runner.compile("sm_90", {"T": kg.ctype(dtype)})
            assert _is_cuda_elf(compiled.image), (config, dtype)
            assert compiled.symbol.startswith("_Z")


def test_cuda_candidates_refuse_cpu_tensors_with_a_reason():
    from kernelgraft.examples.add_relu import add_relu

    x = torch.randn(8)
    cands = [c for c in add_relu.candidates(x, x) if c.impl.backend == "cuda"]
    assert cands and all("CUDA tensors" in c.reason for c in cands)


def _check_all_cuda_candidates(op):
    n = 0
    for inputs in op.sample_inputs("cuda"):
        want = op.reference(*[i.double() if isinstance(i, torch.Tensor) else i for i in inputs])
        for cand in op.candidates(*inputs):
            if cand.impl.backend != "cuda" or not cand.supported:
                continue
            got = op.run(*inputs, impl=cand.index, config=cand.config.as_dict())
            tol = 1e-5 if inputs[0].dtype == torch.float32 else 2e-2
            # the samples carry NaN and Inf: a NaN the reference makes must come out NaN too
            torch.testing.assert_close(got.double(), want.to(got.device), rtol=tol, atol=tol, equal_nan=True,
                                       msg=lambda m: f"{cand.label} {inputs[0].shape}: {m}")
            n += 1
    assert n > 0


@pytest.mark.gpu
@pytest.mark.parametrize("module", ["add_relu", "rmsnorm"])
def test_example_cuda_candidates_match_reference_on_gpu(module):
    import importlib

    _check_all_cuda_candidates(importlib.import_module(f"kernelgraft.examples.{module}").__dict__[module])


@pytest.mark.gpu
def test_cuda_op_is_cuda_graph_safe():
    from kernelgraft.examples.add_relu import add_relu

    x = torch.randn(5000, device="cuda")
    y = torch.randn(5000, device="cuda")
    index = next(i for i, s in enumerate(add_relu.impls) if s.backend == "cuda")
    add_relu.run(x, y, impl=index)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        out = add_relu.run(x, y, impl=index)
    torch.cuda.current_stream().wait_stream(side)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, torch.relu(x + y))
