"""CuTe DSL across nvidia-cutlass-dsl releases (4.3 and 4.4 on, 4.8 the newest): the exported
header's two layouts and the shim they call for, the runtime library the DSL itself names, the JIT
path's argument layout read off the compiled function, and ``kernelgraft aot``'s summary counting
skipped candidates. The shim and header tests need no DSL; the others run against whichever
release is installed (CI runs them under both ends: scripts/compat.sh)."""

from __future__ import annotations

import argparse
import types

import pytest
import torch

from kernelgraft.backends.cutedsl import so as _cutedsl_so

pytestmark = pytest.mark.cutedsl  # rerun under the oldest supported release: scripts/compat.sh

# Headers as export_to_c writes them (trimmed to what the shim reads), prefix "kg_abc".
HEADER_4_8 = """
typedef struct {
    cudaLibrary_t module;
} kg_abc_Kernel_Module_t;
void _mlir_kg_abc_cuda_init(void **);
void _mlir_kg_abc_cuda_load_to_device(void **);
static inline void kg_abc_Kernel_Module_Load(kg_abc_Kernel_Module_t *module) {
    cudaLibrary_t *libraryPtr = &(module->module);
    struct {
        cudaLibrary_t **library;
        int32_t *device_id;
        cudaError_t *ret;
    } loadArgs = {&libraryPtr, &device_id, &ret};
        _mlir_kg_abc_cuda_load_to_device((void **)(&loadArgs));
}
void _mlir_kg_abc__mlir_ciface_cutlass_host_Ptrgmem_Ptrgmem_5_256_CUstream0x0(void **args, int32_t num_args);

static inline int32_t cute_dsl_kg_abc_wrapper(kg_abc_Kernel_Module_t *module, void *x, void *out, int32_t n, cudaStream_t stream) {
"""
HEADER_4_3 = """
typedef struct {
    CUlibrary module;
} kg_abc_Kernel_Metadata_t;
void _mlir_kg_abc_cuda_init(void **);
void _mlir_kg_abc_cuda_load(void **);
void _mlir_kg_abc__mlir_ciface_cutlass_host_Ptrgmem_Ptrgmem_CUstream(void **args, int32_t num_args);
static inline int32_t kg_abc_wrapper(kg_abc_Kernel_Metadata_t *metadata, void *x, void *out, int32_t n, CUstream stream) {
"""


def test_both_header_layouts_give_the_entry_the_kinds_and_how_to_load():
    entry, kinds, indirect = _cutedsl_so.header_signature(HEADER_4_8, "kg_abc")
    assert entry == "_mlir_kg_abc__mlir_ciface_cutlass_host_Ptrgmem_Ptrgmem_5_256_CUstream0x0"
    assert kinds == ["ptr", "ptr", "i32"] and indirect
    entry, kinds, indirect = _cutedsl_so.header_signature(HEADER_4_3, "kg_abc")
    assert entry.endswith("cutlass_host_Ptrgmem_Ptrgmem_CUstream") and kinds == ["ptr", "ptr", "i32"]
    assert not indirect


def test_an_unknown_load_convention_is_refused_not_guessed():
    changed = HEADER_4_8.replace("loadArgs = {&libraryPtr, &device_id, &ret}", "loadArgs = {libraryPtr, &ret}")
    with pytest.raises(_cutedsl_so.Unsupported, match="cuda_load_to_device"):
        _cutedsl_so.header_signature(changed, "kg_abc")
    with pytest.raises(_cutedsl_so.Unsupported, match="stream"):
        _cutedsl_so.header_signature(HEADER_4_8.replace("cudaStream_t stream", "int32_t s"), "kg_abc")


def test_the_shim_passes_the_library_handle_as_the_header_says():
    direct = _cutedsl_so.shim_source("kg_abc", "entry", ["ptr", "i32"], indirect=False)
    indirect = _cutedsl_so.shim_source("kg_abc", "entry", ["ptr", "i32"], indirect=True)
    assert "load_args = {&library, &dev, &ret}" in direct and "&handle" not in direct
    assert "CUlibrary *handle = &library;" in indirect and "load_args = {&handle, &dev, &ret}" in indirect


def _dsl():
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl is not installed")
    from importlib.metadata import version

    return tuple(int(p) for p in version("nvidia-cutlass-dsl").split(".")[:2])


def test_the_runtime_library_is_the_one_the_dsl_names():
    _dsl()
    from cutlass.cute.runtime import find_runtime_libraries

    path = _cutedsl_so.runtime_library()
    assert str(path) == find_runtime_libraries(enable_tvm_ffi=False)[0]
    assert path.name in _cutedsl_so.RUNTIME_SONAMES


def test_jit_argument_layout_is_read_off_the_compiled_function():
    """slot_kinds and the packing check work on this release's compiled functions (4.8 has no
    args_spec): compiled for sm_90a without a GPU, as the JIT path would on an H200."""
    _dsl()
    from kernelgraft.backends.cutedsl import jit as _cutedsl
    from kernelgraft.examples import add_relu

    impl = next(i for i in add_relu.add_relu.impls if i.backend == "cutedsl")
    x, y, out = torch.randn(1000), torch.randn(1000), torch.empty(1000)
    compiled, host_fn, args = _cutedsl.compile_for(impl, impl.configs[0], (x, y, out), "sm_90a")
    kinds = [k.__name__ for _, k in _cutedsl.slot_kinds(compiled)]
    assert kinds == ["c_void_p", "c_void_p", "c_void_p", "c_int", "c_void_p"]
    _, constants = _cutedsl._params(host_fn)
    runtime = tuple(i for i, c in enumerate(constants[:-1]) if not c)
    values = [args[i].data_ptr() if isinstance(args[i], torch.Tensor) else args[i] for i in runtime] + [0]
    assert _cutedsl.abi_mismatch(compiled, args, runtime, values) is None
    values[3] += 1  # a wrong value is seen, not waved through
    assert "argument 3" in _cutedsl.abi_mismatch(compiled, args, runtime, values)


def test_aot_summary_counts_skipped_candidates(monkeypatch, capsys):
    from kernelgraft.cli import aot as _aot

    manifest = {"archs": ["sm_90"], "build_seconds": 1.0, "ops": [{
        "name": "demo::op", "candidates": [{"kernels": [{}]}], "dropped": [],
        "skipped": [{"candidate": "cutedsl:k[-]", "reason": "no cutedsl toolchain here"}]}]}
    import kernelgraft.aot as aot

    monkeypatch.setattr(aot, "build_bundle", lambda *a, **k: manifest)
    monkeypatch.setattr("kernelgraft.cli.common.load_target", lambda t: types.SimpleNamespace())
    monkeypatch.setattr("kernelgraft.cli.common.ops_of", lambda m: [types.SimpleNamespace(name="demo::op")])
    args = argparse.Namespace(target=["x"], arch=None, out="/tmp/kg-none", op=None, static=False, sign=None,
                              decisions=None, allow_partial=False)
    assert _aot._run(args) == 0
    out = capsys.readouterr().out
    assert "skipped cutedsl:k[-]: no cutedsl toolchain here" in out
    assert "built 1 kernels, dropped 0 (candidate, signature) pairs, skipped 1 candidates" in out
