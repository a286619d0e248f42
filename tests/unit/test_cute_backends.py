"""cuTile and CuTe DSL backends: specs, cuTile AOT cubins (no GPU needed), the CuTe DSL compile
cache and call ABI (compile works without a GPU), and on a GPU every example candidate."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import subprocess

import pytest
import torch

import kernelgraft as kg
from _graphs import check_graph_replay
from kernelgraft import SpecError

pytestmark = pytest.mark.cutedsl  # rerun under the oldest supported release: scripts/compat.sh

HAS_CUTILE = importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.tile") is not None
HAS_CUTE = importlib.util.find_spec("cutlass") is not None
needs_cutile = pytest.mark.skipif(not HAS_CUTILE, reason="cuda-tile not installed (pip install 'kernelgraft[cutile]')")
needs_cute = pytest.mark.skipif(not HAS_CUTE, reason="nvidia-cutlass-dsl not installed (pip install 'kernelgraft[cutedsl]')")


def _launch(x, out, *, TILE):
    return 1, None, (x, out, TILE)


# ---------------------------------------------------------------- specs
def test_specs_validate_and_export():
    s = kg.cutile(_launch, configs=[{"TILE": 128}], arch="sm_100")
    assert s.backend == "cutile" and s.arch == ("sm_100",)
    c = kg.cutedsl(_launch, configs=[{"TILE": 128}], min_capability=90, arch="sm_90a")
    assert c.backend == "cutedsl" and c.min_capability == (9, 0)
    with pytest.raises(SpecError, match="arch 'hopper'"):
        kg.cutile(_launch, configs=[{"TILE": 1}], arch="hopper")
    with pytest.raises(SpecError, match="opt_level"):
        kg.cutedsl(_launch, configs=[{"TILE": 1}], opt_level=7)
    with pytest.raises(SpecError, match="does not take"):
        kg.cutile(_launch, configs=[{"BLOCK": 1}])


def test_backends_say_why_not_on_cpu():
    from kernelgraft import backends

    for name in ("cutile", "cutedsl"):
        reason = backends.get(name).device_reason(torch.device("cpu"))
        assert reason and "CUDA tensors" in reason


@needs_cutile
def test_fingerprint_follows_kernel_source():
    from kernelgraft.examples import _cute_kernels as K

    src = K.CUTILE_IMPLS["add_relu"].code_identity()
    assert "def _ct_add_relu" in src and "def launch_add_relu_cutile" in src


# ---------------------------------------------------------------- cuTile AOT (CPU)
def _cuobjdump() -> str | None:
    try:
        import triton

        path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        return path if os.path.exists(path) else None
    except ImportError:
        return None


@needs_cutile
def test_cutile_aot_cubin_for_sm90(tmp_path):
    from kernelgraft.backends.cutile import jit as _cutile
    from kernelgraft.examples import _cute_kernels as K

    reason = _cutile.toolchain_reason()
    if reason:
        pytest.skip(f"cuTile toolchain incomplete: {reason}")
    spec = K.CUTILE_IMPLS["add_relu"]
    x = torch.randn(1000)
    art = _cutile.build_cubin(spec, spec.configs[0], (x, x.clone(), torch.empty(1000)), "sm_90")
    image = art.image
    assert image[:4] == b"\x7fELF" and int.from_bytes(image[18:20], "little") == 190  # EM_CUDA
    assert art.symbol.encode() in image and "f32" in art.symbol
    # The driver parameter layout kernelgraft packs must be the one the cubin declares.
    sig = _cutile._signature(K._ct_add_relu, (x, x, torch.empty(1000), 1024), "test")
    assert sig.symbol == art.symbol
    kinds, _ = _cutile._param_kinds(sig)
    assert kinds == ["ptr", "i32", "i32"] * 3
    tool = _cuobjdump()
    if tool:
        dump = subprocess.run([tool, "-elf", "-"], input=image, capture_output=True)
        if dump.returncode != 0:  # older cuobjdump wants a file
            path = tmp_path / "k.cubin"
            path.write_bytes(image)
            dump = subprocess.run([tool, "-elf", str(path)], capture_output=True)
        text = dump.stdout.decode(errors="replace")
        found = sorted((int(o, 16), int(off, 16), int(sz, 16)) for o, off, sz in re.findall(
            r"Ordinal\s*:\s*0x([0-9a-f]+)\s+Offset\s*:\s*0x([0-9a-f]+)\s+Size\s*:\s*0x([0-9a-f]+)", text))
        from kernelgraft.driver import ParamBuffer

        buf = ParamBuffer(kinds)
        sizes = [8 if k == "ptr" else 4 for k in kinds]
        assert [(off, sz) for _, off, sz in found] == list(zip(buf.offsets, sizes))
    # Round trip through a cubin folder, the way the GPU machine gets them.
    art.write(tmp_path)
    _cutile._CUBINS.clear()
    assert _cutile.load_cubin_dir(tmp_path) == 1
    assert _cutile._stored_cubin(art.kernel_hash, art.symbol, "sm_90") == image


@needs_cutile
def test_cutile_fp16_and_static_constant_change_the_symbol():
    from kernelgraft.backends.cutile import jit as _cutile
    from kernelgraft.examples import _cute_kernels as K

    x32, x16 = torch.empty(8), torch.empty(8, dtype=torch.float16)
    a = _cutile._signature(K._ct_add_relu, (x32, x32, x32, 1024), "t").symbol
    b = _cutile._signature(K._ct_add_relu, (x16, x16, x16, 1024), "t").symbol
    c = _cutile._signature(K._ct_add_relu, (x32, x32, x32, 4096), "t").symbol
    assert len({a, b, c}) == 3


def test_cutile_missing_tool_message(monkeypatch):
    from kernelgraft.backends.cutile import jit as _cutile

    _cutile.toolchain_reason.cache_clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cuda.tile" else object())
    try:
        assert "cuda-tile is not installed" in _cutile.toolchain_reason()
    finally:
        monkeypatch.undo()
        _cutile.toolchain_reason.cache_clear()


# ---------------------------------------------------------------- CuTe DSL (compiles without a GPU)
@needs_cute
def test_cutedsl_compile_cache_keys():
    from kernelgraft.backends.cutedsl import jit as _cutedsl
    from kernelgraft.examples import _cute_kernels as K

    spec = K.CUTEDSL_IMPLS["add_relu"]
    n = 1000
    args32 = (torch.randn(n), torch.randn(n), torch.empty(n))
    args16 = tuple(a.half() for a in args32)
    start = _cutedsl.stats["compiles"]
    c1, _, _ = _cutedsl.compile_for(spec, spec.configs[0], args32, "sm_90a")
    assert _cutedsl.stats["compiles"] == start + 1
    again, _, _ = _cutedsl.compile_for(spec, spec.configs[0], (torch.randn(77), torch.randn(77), torch.empty(77)), "sm_90a")
    assert again is c1 and _cutedsl.stats["compiles"] == start + 1  # other size, same key
    c16, _, _ = _cutedsl.compile_for(spec, spec.configs[0], args16, "sm_90a")
    assert c16 is not c1 and _cutedsl.stats["compiles"] == start + 2  # dtype recompiles
    _cutedsl.compile_for(spec, spec.configs[1], args32, "sm_90a")  # constexpr BLOCK recompiles
    assert _cutedsl.stats["compiles"] == start + 3
    for _ in range(2):
        _cutedsl.compile_for(spec, spec.configs[1], args32, "sm_90a")
        _cutedsl.compile_for(spec, spec.configs[0], args16, "sm_90a")
    assert _cutedsl.stats["compiles"] == start + 3  # the same key never compiles twice
    assert any("add_relu" in k for k in c1.kernel_info), "the device kernel was compiled"


@needs_cute
def test_cutedsl_packed_abi_matches_library():
    """The fast path's per-argument slots hold what the library's own packing holds."""
    from kernelgraft.backends.cutedsl import jit as _cutedsl
    from kernelgraft.examples import _cute_kernels as K

    spec = K.CUTEDSL_IMPLS["rmsnorm"]
    x, w = torch.randn(5, 100), torch.randn(100)
    compiled, host, largs = _cutedsl.compile_for(spec, spec.configs[0], (x, w, 1e-6, torch.empty(5, 100)), "sm_90a")
    _, consts = _cutedsl._params(host)
    runtime = [i for i, c in enumerate(consts[:-1]) if not c]
    probe = [_cutedsl._slow_value(largs[i]) for i in runtime] + [_cutedsl._stream_obj(0xBEEF)]
    exe_args, _adapted = compiled.generate_execution_args(*probe)
    values = [largs[i].data_ptr() if isinstance(largs[i], torch.Tensor) else largs[i] for i in runtime]
    assert _cutedsl.check_abi(compiled, exe_args, values + [0xBEEF]) is None
    assert _cutedsl.check_abi(compiled, exe_args, values + [0xBEEE]) is not None
    kinds = [t for _, t in _cutedsl.slot_kinds(compiled)]
    assert kinds == [ctypes.c_void_p] * 3 + [ctypes.c_int32] * 2 + [ctypes.c_float, ctypes.c_void_p]


@needs_cute
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cutedsl_parameter_weight_keys_and_packs_like_a_tensor(dtype):
    """A module's weight reaches the backend as an nn.Parameter (eagerly and from a compiled
    graph's runtime). It once keyed without its dtype and, passed raw to the library's packing
    (whose adapter registry is keyed by exact type), packed nothing: 6 arguments for a program
    declaring 7, and calling that crashed the process on an H200. It must key, probe and pack
    exactly like a plain tensor, and a mismatched ABI must still be reported."""
    from kernelgraft.backends.cutedsl import jit as _cutedsl
    from kernelgraft.examples import _cute_kernels as K

    spec = K.CUTEDSL_IMPLS["rmsnorm"]
    x = torch.randn(4, 64, 256, dtype=dtype)
    w = torch.randn(256, dtype=dtype)
    param = torch.nn.Parameter(w.clone(), requires_grad=False)
    plain_args = (x, w, 1e-6, torch.empty_like(x))
    param_args = (x, param, 1e-6, torch.empty_like(x))
    compiled, host, largs = _cutedsl.compile_for(spec, spec.configs[0], param_args, "sm_90a")
    plain, _, _ = _cutedsl.compile_for(spec, spec.configs[0], plain_args, "sm_90a")
    assert plain is compiled  # same key: the Parameter keys by dtype and alignment
    other = torch.nn.Parameter(torch.randn(256, dtype=torch.float16), requires_grad=False)
    _, _, oargs = _cutedsl.compile_for(spec, spec.configs[0], (x, other, 1e-6, torch.empty_like(x)), "sm_90a")
    assert _cutedsl.compile_key(spec, host, oargs, "sm_90a") != _cutedsl.compile_key(spec, host, largs, "sm_90a")

    _, consts = _cutedsl._params(host)
    runtime = tuple(i for i, c in enumerate(consts[:-1]) if not c)
    values = [largs[i].data_ptr() if isinstance(largs[i], torch.Tensor) else largs[i] for i in runtime]
    assert _cutedsl.abi_mismatch(compiled, largs, runtime, values + [0xBEEF]) is None
    wrong = values[:3] + [values[3] + 1] + values[4:]
    assert _cutedsl.abi_mismatch(compiled, largs, runtime, wrong + [0xBEEF]) == "argument 3: packed 256, expected 257"
    exe_args, _ = compiled.generate_execution_args(*[_cutedsl._slow_value(largs[i]) for i in runtime],
                                                   _cutedsl._stream_obj(0xBEEF))
    assert len(exe_args) == len(_cutedsl.slot_kinds(compiled)) == 7
    # nvidia-cutlass-dsl 4.3 packs nothing for a raw Parameter: the safety net sees the short
    # layout; from 4.4 on it packs a tensor subclass like a tensor (a pointer), or refuses it
    raw = [largs[i] if i == 1 else _cutedsl._slow_value(largs[i]) for i in runtime]
    try:
        short, _ = compiled.generate_execution_args(*raw, _cutedsl._stream_obj(0xBEEF))
    except Exception:
        return
    assert _cutedsl.check_abi(compiled, short, values + [0xBEEF]) in ("6 packed arguments, expected 7", None)


@needs_cute
@pytest.mark.gpu
def test_cutedsl_runs_needs_gpu():
    """Placeholder marker so a CPU run lists why CuTe DSL launches are not exercised here."""
    from kernelgraft.examples.add_relu import add_relu

    x = torch.randn(4097, device="cuda")
    y = torch.randn(4097, device="cuda")
    out = add_relu.run(x, y, impl="cutedsl")
    torch.testing.assert_close(out, torch.relu(x + y))


# ---------------------------------------------------------------- GPU: every example candidate
def _examples():
    from kernelgraft.examples import add_relu, rmsnorm

    return [(add_relu.add_relu, add_relu.sample_inputs), (rmsnorm.rmsnorm, rmsnorm.sample_inputs)]


@pytest.mark.gpu
@pytest.mark.parametrize("which", [0, 1], ids=["add_relu", "rmsnorm"])
def test_every_example_candidate_matches_reference(which):
    op, samples = _examples()[which]
    failures, ran = [], set()
    for args in samples("cuda"):
        ref = op.reference(*[a.double() if isinstance(a, torch.Tensor) else a for a in args])
        for cand in op.candidates(*args):
            if not cand.supported:
                continue
            try:
                out = op.run(*args, impl=cand.index, config=cand.config.as_dict())
                torch.cuda.synchronize()
                tol = 1e-4 if out.dtype == torch.float32 else 2e-2
                torch.testing.assert_close(out.double(), ref.to(out.dtype).double(), atol=tol, rtol=tol, equal_nan=True)  # the samples hold NaN
                ran.add(cand.impl.backend)
            except Exception as exc:
                failures.append(f"{cand.label} on {[tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]}: {exc}")
    assert not failures, "\n".join(failures)
    expected = {"triton"} | ({"cutile"} if HAS_CUTILE else set()) | ({"cutedsl"} if HAS_CUTE else set())
    assert expected <= ran, f"backends that ran: {ran}, expected at least {expected}"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cutile", "cutedsl"])
def test_cuda_graph_capture(backend):
    if backend == "cutile" and not HAS_CUTILE or backend == "cutedsl" and not HAS_CUTE:
        pytest.skip(f"{backend} not installed")
    from kernelgraft.examples import add_relu as ex

    spec = next(s for s in ex.IMPLS if s.backend == backend)
    op = kg.op(f"kgtest_graph::add_relu_{backend}", impls=[spec], fallback="error")(ex.add_relu.reference)
    x, y = torch.randn(10000, device="cuda"), torch.randn(10000, device="cuda")
    op(x, y)  # compile/load outside the capture
    check_graph_replay(op, x, y, lambda a, b: torch.relu(a + b))


def test_cutile_arg_key_treats_parameters_as_tensors():
    """A module weight arrives as nn.Parameter: it must key (dtype, rank, layout, alignment) like
    the tensor it is, not by its Python type (which would also skip it when packing)."""
    from kernelgraft.backends.cutile import jit as _cutile

    w = torch.randn(64)
    key_tensor = _cutile._arg_key((w, 3), (False, False))
    key_param = _cutile._arg_key((torch.nn.Parameter(w.clone()), 3), (False, False))
    assert key_param == key_tensor
    assert key_param[0][0] == torch.float32
