"""The admission rule (kernelgraft/admit.py): a tensor reaches a kernel only if it is dense, strided
and read as stored. Views with the negative or conjugate bit are resolved when the op only reads
them and refused when it mutates them; sparse, mkldnn, nested and quantized tensors are refused with
an ``InputError`` naming the op and the argument; meta tensors get the meta function's outputs. Every
route applies the same rule: ``op(...)``, ``torch.ops.<ns>.<name>``, ``op.run``, ``torch.compile``
and the native replay (the C++ runtime's share is in test_runtime.py).

Real kernels run: the examples' Triton kernels in the interpreter, and host "kernels" (C functions
through the packed C ABI, tests/_host_backend.py) that the native replay serves on CPU."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import kernelgraft as kg
from kernelgraft.examples.add_relu import add_relu
from kernelgraft.examples.gemm import gemm

from _host_backend import HOST_FN, accumulate_op, kg_host
from _paths import TESTS


def _double_fn(packed):
    """out[i] = 2 * a[i] over n floats (a complex tensor is 2 floats per element)."""
    a, o = (ctypes.c_uint64.from_address(packed[i]).value for i in range(2))
    n = ctypes.c_int64.from_address(packed[2]).value
    A, O = ((ctypes.c_float * n).from_address(p) for p in (a, o))
    for i in range(n):
        O[i] = 2 * A[i]


_DOUBLE = HOST_FN(_double_fn)


def double_op(name: str):
    """``x * 2`` for float32 and complex64 CPU tensors, run by a host kernel that reads memory as
    stored; no dtypes declared, so the op takes complex tensors."""

    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def launch(x, out):
        return [x, out, x.numel() * (2 if x.is_complex() else 1)]

    return kg.op(name, fallback="error",
                 impls=[kg_host(_DOUBLE, [ctypes.c_void_p] * 2 + [ctypes.c_int64], launch)])(double)


def _values(*shape, dtype=torch.float32, seed=0):
    """Random values with a NaN, an inf and a -inf in them (never zeros)."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        return torch.randn(*shape, dtype=dtype, generator=g)
    t = torch.randn(*shape, generator=g).to(dtype)
    flat = t.view(-1)
    flat[1], flat[-2], flat[len(flat) // 2] = float("nan"), float("inf"), float("-inf")
    return t


def _routes(op, compile_too=True):
    ns, name = op.name.split("::")
    routes = {"op": op, "torch.ops": getattr(getattr(torch.ops, ns), name),
              "op.run": lambda *a: op.run(*a, impl=0)}
    if compile_too:
        torch._dynamo.reset()
        routes["compile"] = torch.compile(lambda *a: op(*a), fullgraph=True, backend="aot_eager")
    return routes


def _same(got, want):
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- deferred values: resolved when read
def test_a_negative_view_is_read_as_its_values_on_every_route():
    x, y = _values(257, seed=1), _values(257, seed=2)
    neg = torch._neg_view(x)
    want = torch.relu(-x + y)
    add_relu(x, y)  # a plan for plain tensors first: the view must not take it
    for route, call in _routes(add_relu).items():
        _same(call(neg, y), want)
        _same(call(y, neg), want)
        _same(call(x, y), torch.relu(x + y))  # and the plain signature still runs as before


def test_conjugate_views_are_read_as_their_values_on_every_route():
    # z.conj().imag is a real tensor with the negative bit: -z.imag, its memory holds z.imag
    z = torch.complex(_values(48, 32, seed=3), torch.randn(48, 32))
    b = torch.randn(32, 16)
    a = z.conj().imag
    assert a.is_neg()
    for route, call in _routes(gemm).items():
        torch.testing.assert_close(call(a, b), -(z.imag @ b), rtol=1e-4, atol=1e-4, equal_nan=True,
                                   msg=route)
    # a complex tensor with the conjugate bit, after a plan for the plain one
    double = double_op("tadmit::double")
    w = torch.randn(33, dtype=torch.complex64)
    torch.testing.assert_close(double(w), w * 2)
    for route, call in _routes(double).items():
        got = call(w.conj())
        assert not got.is_conj()
        torch.testing.assert_close(got, w.conj() * 2, msg=route)
        torch.testing.assert_close(call(w), w * 2, msg=route)


def test_a_mutated_view_with_deferred_values_is_refused_and_a_read_one_resolved():
    acc_op = accumulate_op("tadmit::accumulate")
    x, acc = torch.randn(16), torch.randn(16)
    for _ in range(3):  # plain calls first: plans (and, with the native build, a replay) exist
        acc_op(x, acc.clone())
    for route, call in _routes(acc_op).items():
        target = acc.clone()
        with pytest.raises((kg.InputError, RuntimeError)) as info:
            call(x, torch._neg_view(target))
        text = str(info.value)
        assert "tadmit::accumulate: argument 'acc' is mutated by the op but is a view with the negative bit" in text, route
        assert route == "compile" or isinstance(info.value, kg.InputError), route
        torch.testing.assert_close(target, acc, msg=route)  # nothing written
        target = acc.clone()
        call(torch._neg_view(x), target)  # read only: resolved
        torch.testing.assert_close(target, acc - x, msg=route)


# ---------------------------------------------------------------- tensors no kernel may read: refused
def _kinds():
    kinds = {
        "sparse_coo": lambda t: t.to_sparse(),
        "sparse_csr": lambda t: t.to_sparse_csr(),
        "nested": lambda t: torch.nested.nested_tensor(list(t)),
        "nested_jagged": lambda t: torch.nested.nested_tensor(list(t), layout=torch.jagged),
        "quantized": lambda t: torch.quantize_per_tensor(t, 0.05, 10, torch.quint8),
    }
    if torch.backends.mkldnn.is_available():
        kinds["mkldnn"] = lambda t: t.to_mkldnn()
    return kinds


@pytest.mark.parametrize("kind", list(_kinds()))
def test_tensors_no_kernel_may_read_are_refused_naming_the_op_and_argument(kind):
    make = _kinds()[kind]
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors and quantize_per_tensor warn that they are prototypes
        odd = make(x)
    add_relu(x, y)  # a plan for the dense signature exists
    routes = _routes(add_relu, compile_too=False)
    routes["op.run(reference)"] = lambda *a: add_relu.run(*a, impl="reference")
    routes["op.candidates"] = add_relu.candidates
    for route, call in routes.items():
        for args, name in (((odd, y), "x"), ((y, odd), "y")):
            if kind == "nested_jagged" and route == "torch.ops":
                continue  # a tensor subclass: its own __torch_dispatch__ answers torch.ops calls
            with pytest.raises(kg.InputError, match=rf"kgexamples::add_relu: argument '{name}' expected a dense "
                                                    rf"strided tensor, got an? [a-z]"):
                call(*args)


# ---------------------------------------------------------------- meta tensors: shapes, no kernel
def test_meta_tensors_get_the_meta_functions_outputs_and_never_reach_a_kernel():
    double = double_op("tadmit::double_meta")  # fallback="error": no kernel runs on meta
    x = torch.empty(5, 3, device="meta")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "running the reference instead" warning either
        for call in (double, torch.ops.tadmit.double_meta, lambda a: double.run(a, impl="reference")):
            out = call(x)
            assert out.device.type == "meta" and out.shape == (5, 3) and out.dtype == torch.float32
        assert add_relu(x, x).device.type == "meta"
    with pytest.raises(kg.InputError, match=r"tadmit::double_meta: argument 'x' is a meta tensor"):
        double.run(x, impl=0)


def test_an_op_that_returns_none_takes_meta_tensors_as_torch_ops_does():
    """A mutate-only op whose reference indexes by its data (a boolean mask, as kv_append's) gives
    None on meta tensors through the op object, as through torch.ops: no meta function runs for
    an op that returns None (on meta tensors it would raise torch's raw NotImplementedError)."""

    @kg.op("tadmit::masked_write", mutates_args=("out",))
    def masked_write(x: torch.Tensor, out: torch.Tensor) -> None:
        keep = x > 0
        out[keep] = x[keep]

    x, out = torch.empty(6, device="meta"), torch.empty(6, device="meta")
    for call in (masked_write, torch.ops.tadmit.masked_write):
        assert call(x, out) is None


# ---------------------------------------------------------------- shapes that do not fit, under compile
def test_a_shape_mismatch_under_compile_names_the_op_and_its_arguments():
    x, y = torch.randn(3), torch.randn(4)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: add_relu(a, b), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception) as info:  # torch wraps it in its TorchRuntimeError
        compiled(x, y)
    text = str(info.value)
    assert "InputError" in text and "kgexamples::add_relu: the reference cannot compute output shapes" in text, text
    assert "x=" in text and "y=" in text and "(3,)" in text and "(4,)" in text, text
    assert "shapes do not fit together" in text
    with pytest.raises(kg.InputError, match=r"kgexamples::add_relu: .*x=Tensor\(shape=\(3,\).*y=Tensor\(shape=\(4,\)"):
        add_relu(x, y)


# ---------------------------------------------------------------- the native replay hands them back
_REPLAY_CHILD = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
sys.path.insert(0, sys.argv[1])
from kernelgraft import native as _native
from test_admission import double_op

assert _native.load() is not None, _native.reason()
double = double_op("tadmit_child::double")
x = torch.randn(4, 8)
for _ in range(3):
    double(x)
replay = double.dispatcher.current_replay()
report = {"replay": replay is not None}
cases = {
    "negative": torch._neg_view(x), "zero": torch._efficientzerotensor(4, 8),
    "sparse_coo": x.to_sparse(), "sparse_csr": x.to_sparse_csr(), "quantized": torch.quantize_per_tensor(x, 0.1, 0, torch.quint8),
    "nested": torch.nested.nested_tensor([x[0], x[1]]),
}
if torch.backends.mkldnn.is_available():
    cases["mkldnn"] = x.to_mkldnn()
for name, t in cases.items():
    try:
        out = double(t)
        want = t.resolve_neg() * 2 if name != "zero" else torch.zeros(4, 8)
        report[name] = "ok" if torch.equal(out, want) else f"wrong by {(out - want).abs().max().item()}"
    except Exception as exc:
        report[name] = type(exc).__name__ + ": " + str(exc).splitlines()[0]
report["calls"] = replay.stats()["calls"] if replay is not None else None
print(json.dumps(report))
"""


def test_the_native_replay_hands_back_what_the_rule_resolves_or_refuses(tmp_path):
    """A child process (a C++ exception through the replay used to abort it): after plain calls
    install a replay, a negative view and a ZeroTensor compute their values, and the tensors no
    kernel may read are refused by name instead of reaching the replay."""
    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("no C++ compiler: the native replay cannot be built")
    import os
    from pathlib import Path

    script = tmp_path / "child.py"
    script.write_text(_REPLAY_CHILD)
    here = str(Path(__file__).parent)  # this module, which the child imports; its helpers are in TESTS
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(script), here], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["replay"] is True
    assert report["negative"] == "ok" and report["zero"] == "ok", report
    for kind in ("sparse_coo", "sparse_csr", "quantized", "nested", "mkldnn"):
        if kind in report:
            assert report[kind].startswith("InputError: tadmit_child::double: argument 'x' expected a dense "
                                           "strided tensor"), (kind, report[kind])


# ---------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_every_add_relu_kernel_propagates_nan_as_torch_relu():
    """relu(NaN) is NaN in torch; a max(x, 0) (cuTile's ct.maximum, CUDA's fmaxf, CuTe DSL's fmax,
    Triton's tl.maximum) drops the NaN. The sign of a zero result is not compared: torch itself
    gives relu(-0.0) = -0.0 on the CPU and +0.0 on CUDA."""
    x = torch.randn(4099, device="cuda")
    y = torch.randn(4099, device="cuda")
    x[::7], y[::11] = float("nan"), float("inf")
    x[1::13], y[1::13] = -0.0, -0.0
    x[2::17] = float("-inf")
    want = torch.relu(x + y)
    for index, impl in enumerate(add_relu.impls):
        for config in range(len(impl.configs)):
            got = add_relu.run(x, y, impl=index, config=config)
            torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0,
                                       msg=f"{impl.backend}:{impl.display_name}[{config}]")
            assert torch.equal(got.isnan(), want.isnan()), f"{impl.backend}:{impl.display_name}[{config}]"


@pytest.mark.gpu
def test_views_with_deferred_values_on_the_gpu_and_through_the_native_replay():
    op = kg.op("tadmit_gpu::add_relu", impls=add_relu.impls, fallback="error", compete=False)(add_relu.reference)
    x, y = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    for _ in range(3):
        op(x, y)
    z = torch.randn(5000, dtype=torch.complex64, device="cuda")
    for _ in range(2):
        torch.testing.assert_close(op(torch._neg_view(x), y), torch.relu(y - x))
        torch.testing.assert_close(op(z.conj().imag, y), torch.relu(y - z.imag))
        torch.testing.assert_close(op(x, y), torch.relu(x + y))
    a = z.conj().imag[: 64 * 32].reshape(64, 32)
    b = torch.randn(32, 48, device="cuda")
    torch.testing.assert_close(gemm(a, b), -(z.imag[: 64 * 32].reshape(64, 32) @ b), rtol=1e-2, atol=1e-2)
