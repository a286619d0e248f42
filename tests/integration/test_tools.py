"""Honest tools: ``check`` compiles what it cannot run, ``aot`` names what it drops, the CLI prints
what the user typed, and ``kg.op`` argument mistakes are ``SpecError``s that say how to fix them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kernelgraft as kg
from kernelgraft.check import check_op

from _toolchains import needs_nvrtc

SRC_DIR = str(Path(kg.__file__).resolve().parents[1])

SCALE = r"""
#include <cuda_fp16.h>
template <typename T> __global__ void scale(const T* x, T* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (T)((float)x[i] * a);
}"""
SYNTAX_ERROR = SCALE.replace("int i =", "int i = =")  # line 4 of the source
NO_FP16_INCLUDE = SCALE.replace("#include <cuda_fp16.h>\n", "")

OPS_FILE = '''
import torch, kernelgraft as kg

SRC = {src!r}

def launch_scale(x, a, out, *, BLOCK):
    n = x.numel()
    return kg.Launch(grid=(n + BLOCK - 1) // BLOCK, block=BLOCK,
                     args=(x, out, kg.driver.f32(a), kg.driver.i32(n)),
                     template={{"T": kg.ctype(x.dtype)}})

def samples(device="cpu"):
    for dtype in (torch.float32, torch.float16):
        yield torch.randn(300, device=device).to(dtype), 1.5

@kg.op({name!r}, impls=[kg.cuda(SRC, "scale<{{T}}>", launch=launch_scale, configs=[{{"BLOCK": 128}}])],
       sample_inputs=samples)
def scale(x: torch.Tensor, a: float) -> torch.Tensor:
    return x * a
'''


def _scale_op(name: str, src: str):
    def samples(device="cpu"):
        yield torch.randn(300, device=device), 1.5

    def launch_scale(x, a, out, *, BLOCK):
        n = x.numel()
        return kg.Launch(grid=(n + BLOCK - 1) // BLOCK, block=BLOCK,
                         args=(x, out, kg.driver.f32(a), kg.driver.i32(n)),
                         template={"T": kg.ctype(x.dtype)})

    @kg.op(name, impls=[kg.cuda(src, "scale<{T}>", launch=launch_scale, configs=[{"BLOCK": 128}])],
           sample_inputs=samples)
    def scale(x: torch.Tensor, a: float) -> torch.Tensor:
        return x * a

    return scale


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC_DIR, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "kernelgraft", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)


def _write_ops(tmp_path: Path, src: str, name: str, stem: str = "scale_ops") -> Path:
    path = tmp_path / f"{stem}.py"
    path.write_text(OPS_FILE.format(src=src, name=name))
    return path


# ---------------------------------------------------------------- check compiles what it cannot run
@needs_nvrtc
def test_check_compiles_a_cuda_candidate_it_cannot_run():
    report = check_op(_scale_op("kgtools::compiles", SCALE), device="cpu", opcheck=False)
    rows = [r for r in report.results if r.candidate.startswith("cuda:")]
    assert report.ok, report.results
    assert [r.status for r in rows if r.variant == "contiguous"] == ["compiled"]
    assert "sm_90" in rows[0].note and "CUDA tensors" in rows[0].note


@needs_nvrtc
def test_check_fails_a_cuda_syntax_error_with_the_nvrtc_line():
    report = check_op(_scale_op("kgtools::syntax", SYNTAX_ERROR), device="cpu", opcheck=False)
    fail = next(r for r in report.failures if r.candidate.startswith("cuda:"))
    assert fail.candidate == "cuda:scale[BLOCK=128]"
    assert "does not compile" in fail.note and "scale.cu(4): error" in fail.note, fail.note


@needs_nvrtc
def test_check_cli_exits_1_on_a_cuda_syntax_error_naming_candidate_and_line(tmp_path):
    ops = _write_ops(tmp_path, SYNTAX_ERROR, "kgtools::a_rather_long_operator_name_kept_whole_in_pipes")
    run = _cli("check", str(ops), "--no-opcheck", "--device", "cpu")
    assert run.returncode == 1, run.stdout + run.stderr
    row = next(line for line in run.stdout.splitlines() if "cuda:scale[BLOCK=128]" in line)
    # piped output: the full op name, the candidate and the compiler's error with its line
    assert "kgtools::a_rather_long_operator_name_kept_whole_in_pipes" in row
    assert "FAIL" in row and "scale.cu(4): error" in row, run.stdout


# ---------------------------------------------------------------- aot names what it drops
@needs_nvrtc
def test_aot_fails_naming_the_dropped_fp16_variants_and_allow_partial_builds_the_rest(tmp_path):
    ops = _write_ops(tmp_path, NO_FP16_INCLUDE, "kgtools::no_fp16_include")
    run = _cli("aot", str(ops), "-o", str(tmp_path / "bundle"))
    assert run.returncode == 1, run.stdout + run.stderr
    dropped = [line for line in run.stdout.splitlines() if "DROPPED" in line]
    # only the float16 signature is dropped, with the compiler's own words
    assert len(dropped) == 1 and "cuda:scale[BLOCK=128] on float16[300] 1.5 for sm_90" in dropped[0], run.stdout
    assert "__half" in run.stdout and "error" in run.stdout
    assert "built 1 kernels, dropped 1 (candidate, signature) pairs" in run.stdout

    partial = _cli("aot", str(ops), "-o", str(tmp_path / "partial"), "--allow-partial")
    assert partial.returncode == 0, partial.stdout + partial.stderr
    assert "DROPPED" in partial.stdout and "--allow-partial" in partial.stdout
    manifest = json.loads((tmp_path / "partial" / "manifest.json").read_text())
    (entry,) = manifest["ops"]
    kernels = [k for c in entry["candidates"] for k in c["kernels"]]
    assert [k["dtypes"] for k in kernels] == [{"x": "float32"}]
    assert [d["signature"] for d in entry["dropped"]] == ["float16[300] 1.5"]


@needs_nvrtc
def test_aot_with_the_include_builds_every_variant(tmp_path):
    ops = _write_ops(tmp_path, SCALE, "kgtools::with_include")
    run = _cli("aot", str(ops), "-o", str(tmp_path / "bundle"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "built 2 kernels, dropped 0" in run.stdout and "DROPPED" not in run.stdout


# ---------------------------------------------------------------- the CLI prints what it means
def test_version_flag(capsys):
    from kernelgraft.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"kernelgraft {kg.__version__}"


@pytest.mark.parametrize("argv", [["-v", "doctor"], ["doctor", "-v"], ["doctor", "--verbose"]],
                         ids=["before", "after", "long-after"])
def test_verbose_is_accepted_before_or_after_the_command(argv, monkeypatch):
    import logging

    from kernelgraft.cli import doctor as _doctor, main

    levels = []
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: levels.append(kw["level"]))
    monkeypatch.setattr(_doctor, "_native_status", lambda build: "not asked in this test")
    assert main(argv) == 0
    assert levels == [logging.DEBUG]


def test_doctor_prints_pip_extras_literally(monkeypatch, capsys):
    from kernelgraft import backends
    from kernelgraft.cli import doctor as _doctor, main

    cuda = backends.get("cuda")
    # what the backend says where cuda-bindings is missing
    monkeypatch.setattr(cuda, "available", lambda: "CUDA C++ kernels need cuda-bindings and NVRTC "
                                                   "(pip install 'kernelgraft[cuda]')")
    monkeypatch.setattr(_doctor, "_native_status", lambda build: "not asked in this test")
    assert main(["doctor"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the table may wrap the reason
    assert "pip install 'kernelgraft[cuda]'" in out, out


# ---------------------------------------------------------------- kg.op argument mistakes
def _ref(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def _triton_spec():
    from _kernels import launch_scale

    return kg.triton(launch_scale, configs=[{"BLOCK": 64}])


@pytest.mark.parametrize("options, words", [
    (dict(ndim=2), ["ndim must map", "got int 2", "ndim={'x': 2}"]),
    (dict(ndim={"x": "two"}), ["ndim['x']", "rank"]),
    (dict(impls="spec"), ["impls must be a list", "impls=[kg.triton"]),
    (dict(dtypes=torch.float32), ["single dtype torch.float32", "write [torch.float32]"]),
    (dict(dtypes={"x": torch.float16}), ["dtypes['x']", "write [torch.float16]"]),
    (dict(dtypes={"y": [torch.float16]}), ["'y'", "Tensor parameters are ['x']"]),
    (dict(sample_input=lambda: []), ["unknown option sample_input=", "did you mean sample_inputs=",
                                     "impls, mutates_args, sample_inputs"]),
], ids=["ndim-int", "ndim-value", "impls-str", "dtypes-single", "dtypes-map-single", "dtypes-map-name",
        "unknown-keyword"])
def test_kg_op_argument_mistakes_are_spec_errors_that_say_how_to_fix(options, words):
    with pytest.raises(kg.SpecError) as err:
        kg.op("kgtools::mistake", **options)(_ref)
    for word in words:
        assert word in str(err.value), str(err.value)


def test_a_single_impl_spec_is_a_spec_error():
    spec = _triton_spec()
    with pytest.raises(kg.SpecError, match=r"single spec .*write impls=\[spec\]"):
        kg.op("kgtools::single_impl", impls=spec)(_ref)


def test_py_typed_ships_with_the_package():
    assert (Path(kg.__file__).parent / "py.typed").is_file()
    pyproject = (Path(kg.__file__).resolve().parents[2] / "pyproject.toml")
    if pyproject.is_file():  # a source checkout: package-data names it
        assert '"py.typed"' in pyproject.read_text()


def test_fallback_warning_points_at_the_callers_line():
    from _kernels import launch_scale

    refuses = kg.triton(launch_scale, configs=[{"BLOCK": 64}], supports=lambda x, alpha, BLOCK: "not here")

    @kg.op("kgtools::falls_back", impls=[refuses])
    def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * alpha

    x = torch.randn(8)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scale(x, 2.0)  # the line the warning must name
        line = sys._getframe().f_lineno - 1
    fallbacks = [w for w in caught if issubclass(w.category, kg.FallbackWarning)]
    assert fallbacks, [str(w.message) for w in caught]
    assert fallbacks[0].filename == __file__ and fallbacks[0].lineno == line
