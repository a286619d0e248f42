"""A fifth backend from a folder outside the package: ``tests/fixtures/toy_backend/kgtoy`` (CUDA C++
through NVRTC, launched through ``kernelgraft.driver``; a host build of the same source runs it on
the CPU with ``KGTOY_INTERPRET=1``), registered through the ``kernelgraft.backends`` entry point and
directly. It checks, tunes and bundles like the built-in backends: ``kernelgraft check`` compiles it
for sm_90, the tuner measures and chooses it, ``kernelgraft aot`` bundles its cubins and the loaders
launch them without the backend installed. On a GPU (``pytest -m gpu``) it runs for real, JIT and
from a bundle.

Also here: two impls whose launches look alike are two kernels (check and bundles compiled the
second as the first), and a spec of a backend nothing registered is a candidate that cannot run."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernelgraft as kg
from kernelgraft import backends
from kernelgraft.aot import build_bundle, load_bundle
from kernelgraft.backends.cuda import nvrtc
from kernelgraft.check import check_op
from kernelgraft.tune import key as tune_key

from _paths import ROOT, TESTS

FIXTURE = TESTS / "fixtures" / "toy_backend"
SRC = ROOT / "src"
sys.path.insert(0, str(FIXTURE))

import kgtoy  # noqa: E402
import toy_ops  # noqa: E402  module level: its op outlives each test (compile workers import it too)
from kgtoy.example import SOURCE, make_scale, toy_scale  # noqa: E402
from kgtoy.jit import compile_for  # noqa: E402

try:
    nvrtc.nvrtc_version()
    NVRTC_MISSING = None
except kg.CompileError as exc:  # pragma: no cover - CI installs NVRTC (the [ci] extra)
    NVRTC_MISSING = str(exc)
needs_nvrtc = pytest.mark.skipif(NVRTC_MISSING is not None, reason=f"NVRTC missing: {NVRTC_MISSING}")

BROKEN = SOURCE.replace("y[i] = x[i] * alpha;", "y[i] = x[i] * alpha + undeclared_name;")
WRONG = SOURCE.replace("y[i] = x[i] * alpha;", "y[i] = x[i] * alpha + 1.0f;")
FAST = "toy:toy_scale[BLOCK=128,ITEMS=4]"


def entry_point_dir(root: Path) -> Path:
    """A directory that, on sys.path, declares kgtoy's backend under the entry point group, as an
    installed distribution would."""
    info = root / "kgtoy-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kgtoy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{backends.ENTRY_POINT_GROUP}]\ntoy = kgtoy\n")
    return root


def cli_env(tmp_path: Path, **extra: str) -> dict:
    """A child's environment: kernelgraft and kgtoy importable, kgtoy declared as an entry point,
    Triton's interpreter off (bundles compile real cubins) unless asked for."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KGTOY_INTERPRET")}
    paths = [str(SRC), str(FIXTURE), str(entry_point_dir(tmp_path / "entry_points"))]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return {**env, **extra}


def cli(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelgraft", *args], capture_output=True, text=True,
                          env=cli_env(tmp_path, **extra), timeout=600)


@pytest.fixture(scope="module", autouse=True)
def toy_registered():
    """The toy backend registered directly for this module's in-process tests, gone after."""
    backends.register(kgtoy.BACKEND)
    yield
    backends.unregister("toy")


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("KGTOY_INTERPRET", "1")


@pytest.fixture
def fresh_tuner(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "cache"))
    kg.tune.clear()
    yield
    kg.tune.clear()


def fresh(n: int, seed: int) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    x[:: max(n // 7, 1)] = float("nan")
    x[1 :: max(n // 5, 1)] = float("-inf")
    return x


# ---------------------------------------------------------------- registering
def test_the_entry_point_and_register_both_install_the_toy_backend(tmp_path, monkeypatch):
    backends.unregister("toy")
    assert "toy" not in backends.names()
    monkeypatch.syspath_prepend(str(entry_point_dir(tmp_path)))
    importlib.invalidate_caches()
    declared = importlib.metadata.entry_points(group=backends.ENTRY_POINT_GROUP)
    assert [e.value for e in declared if e.name == "toy"] == ["kgtoy"]
    assert "toy" in backends.load_entry_points()
    assert backends.get("toy") is kgtoy.BACKEND and backends.aot_path("toy") is kgtoy.aot
    backends.unregister("toy")
    assert backends.register(kgtoy.BACKEND) is kgtoy.BACKEND and backends.get("toy") is kgtoy.BACKEND


def test_a_spec_of_an_unregistered_backend_cannot_run_and_says_why(interpret):
    op = make_scale("kgtoytest::unregistered")
    x = fresh(300, 1)
    backends.unregister("toy")
    try:
        toy = [c for c in op.candidates(x, 1.5) if c.impl.backend == "toy"]
        assert toy and all(c.category == "backend" and "no kernelgraft backend named 'toy'" in c.reason for c in toy)
        with pytest.raises(kg.UnsupportedError, match="toy_scale.*no kernelgraft backend named 'toy'"):
            op.run(x, 1.5, impl=1)
        torch.testing.assert_close(op(x, 1.5), x * 1.5, equal_nan=True)  # the Triton candidate serves
    finally:
        backends.register(kgtoy.BACKEND)


def test_the_tuning_key_names_the_toy_compiler():
    op = make_scale("kgtoytest::key")
    env = dict(tune_key.build_key(op, (fresh(64, 2), 1.5), ["toy", "triton"]).env)
    assert env["compiler:toy"].startswith("nvidia-cuda-nvrtc") and env["compiler:triton"].startswith("triton==")


# ---------------------------------------------------------------- the CPU mode
def test_the_host_build_runs_the_toy_kernel_on_the_cpu(interpret):
    op = make_scale("kgtoytest::host")
    for n, seed in ((1, 3), (7, 4), (4099, 5)):
        x = fresh(n, seed)
        for config in range(2):
            torch.testing.assert_close(op.run(x, -2.5, impl=1, config=config), x * -2.5, equal_nan=True)


def test_a_launch_argument_of_the_wrong_kind_does_not_build(interpret):
    from kgtoy import host

    with pytest.raises(kg.CompileError, match="does not match the size of the kernel parameter"):
        host.library(SOURCE, "toy_scale", (), ("ptr", "ptr", "f64", "i32"), "toy:test")


# ---------------------------------------------------------------- check
@needs_nvrtc
def test_check_compiles_the_toy_candidate_for_sm_90():
    report = check_op(make_scale("kgtoytest::check"), device="cpu", opcheck=False)
    assert report.ok, [r for r in report.failures]
    rows = [r for r in report.results if r.candidate.startswith("toy:") and r.variant == "contiguous"]
    assert len(rows) == 8 and {r.status for r in rows} == {"compiled"}
    assert all("compiled the toy kernel (NVRTC) for sm_90" in r.note and "KGTOY_INTERPRET" in r.note for r in rows)
    assert {r.status for r in report.results if r.candidate.startswith("triton:")} >= {"pass"}


@needs_nvrtc
def test_the_check_command_finds_the_backend_through_its_entry_point(tmp_path):
    run = cli(tmp_path, "check", str(FIXTURE / "toy_ops.py"), "--no-opcheck", "--device", "cpu",
              TRITON_INTERPRET="1")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [line for line in run.stdout.splitlines() if "toy:toy_scale" in line]
    assert len(rows) == 2 and all("compiled the toy kernel (NVRTC) for sm_90" in r for r in rows), run.stdout


@needs_nvrtc
def test_check_fails_a_toy_candidate_that_does_not_compile():
    report = check_op(make_scale("kgtoytest::broken", toy_impl=toy_scale(BROKEN)), device="cpu", opcheck=False)
    fails = [r for r in report.failures if r.candidate.startswith("toy:")]
    assert fails and all("does not compile" in r.note and "undeclared_name" in r.note for r in fails)


def _lookalike_op(name: str):
    """Two CUDA C++ impls whose launches are the same (grid, parameters, config); the second does
    not compile."""
    good = ('extern "C" __global__ void k(const float* x, float* y, int n) {\n'
            "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 2 * x[i]; }\n")
    bad = good.replace("2 * x[i]", "2 * x[i] + undeclared_name")

    def launch(x, out):
        return kg.Launch(grid=(x.numel() + 127) // 128, block=128, args=(x, out, kg.driver.i32(x.numel())))

    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    impls = [kg.cuda(good, "k", launch=launch), kg.cuda(bad, "k", launch=launch, name="bad")]
    return kg.op(twice, name=name, impls=impls, sample_inputs=lambda: [(fresh(1000, 6),)])


@needs_nvrtc
@pytest.mark.filterwarnings("ignore::kernelgraft.FallbackWarning")  # the reference runs on the CPU
def test_an_impl_whose_launch_looks_like_another_is_compiled_on_its_own(tmp_path):
    op = _lookalike_op("kgtoytest::lookalike")
    report = check_op(op, device="cpu", opcheck=False)
    assert [r.status for r in report.results if r.candidate == "cuda:k[-]" and r.variant == "contiguous"] == ["compiled"]
    bad = [r for r in report.results if r.candidate == "cuda:bad[-]" and r.variant == "contiguous"]
    assert [r.status for r in bad] == ["fail"] and "undeclared_name" in bad[0].note
    (entry,) = build_bundle([op], tmp_path / "bundle", archs=["sm_90"])["ops"]
    assert [c["label"] for c in entry["candidates"]] == ["cuda:k[-]"]
    assert any(d["candidate"] == "cuda:bad[-]" and "undeclared_name" in d["reason"] for d in entry["dropped"])


# ---------------------------------------------------------------- tune
def _timer(ms: dict):
    def timer(trial, settings):
        trial.run(0)
        return ms[trial.candidate.label]

    return timer


MS = {"triton:launch_triton[BLOCK=128]": 2.0, "toy:toy_scale[BLOCK=64,ITEMS=1]": 3.0, FAST: 1.0}


def test_tuning_measures_the_toy_candidates_and_chooses_the_fastest(interpret, fresh_tuner):
    op = make_scale("kgtoytest::tune")
    x = fresh(3000, 7)
    with kg.tune("on", timer=_timer(MS)):
        out = op(x, 0.75)
        assert op.dispatcher.plan_for((x, 0.75)).candidate.label == FAST
    torch.testing.assert_close(out, x * 0.75, equal_nan=True)
    ranking = kg.tune.decision(op, x, 0.75).ranking
    assert [(e["backend"], e["ms"]) for e in ranking] == [("toy", 1.0), ("triton", 2.0), ("toy", 3.0)]


def test_the_tuning_gate_excludes_a_wrong_toy_kernel(interpret, fresh_tuner):
    op = make_scale("kgtoytest::wrong", toy_impl=toy_scale(WRONG))
    x = fresh(1000, 8)
    with kg.tune("on", timer=_timer(MS)):
        torch.testing.assert_close(op(x, 1.5), x * 1.5, equal_nan=True)
    decision = kg.tune.decision(op, x, 1.5)
    assert [e["backend"] for e in decision.ranking] == ["triton"]
    assert sorted(e["kind"] for e in decision.excluded if e["backend"] == "toy") == ["wrong", "wrong"]


@needs_nvrtc
def test_the_toy_backend_compiles_ahead_for_the_compile_pool(tmp_path, monkeypatch):
    from kernelgraft.tune.compile_jobs import Target, run_job
    from kernelgraft.tune.compile_pool import jobs_for, source_of

    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "kg"))
    x = fresh(1000, 14)
    cands = [c for c in toy_ops.scale.candidates(x, 1.5) if c.index >= 0]
    jobs = jobs_for(toy_ops.scale, cands, (x, 1.5, torch.empty(1000)), Target(90), source_of(toy_ops.scale))
    assert sorted(j.impl for j in jobs) == [0, 1, 1]  # Triton's and both toy configs
    nvrtc.CACHE.clear_memory()  # as in a worker: nothing compiled yet
    outcomes = [run_job(j) for j in jobs if j.impl == 1]  # here: a worker would do the same
    assert all(o.ok and o.backend == "toy" and o.artifacts == () for o in outcomes), [o.detail for o in outcomes]
    nvrtc.CACHE.clear_memory()
    misses, disk = nvrtc.CACHE.misses, nvrtc.CACHE.hits["disk"]
    for cand in cands[1:]:  # what the launch compiles is on disk: no compile
        compile_for(cand.impl, cand.config, "sm_90")
    assert nvrtc.CACHE.misses == misses and nvrtc.CACHE.hits["disk"] == disk + 2


# ---------------------------------------------------------------- bundles
@pytest.fixture(scope="module")
def toy_bundle(tmp_path_factory) -> Path:
    """``kernelgraft aot`` of the toy op in a fresh process, which finds the backend through its
    entry point."""
    root = tmp_path_factory.mktemp("toy_aot")
    if NVRTC_MISSING:
        pytest.skip(f"NVRTC missing: {NVRTC_MISSING}")
    run = cli(root, "aot", str(FIXTURE / "toy_ops.py"), "--arch", "sm_90", "-o", str(root / "bundle"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return root / "bundle"


def _toy_candidates(bundle: Path) -> list[dict]:
    manifest = json.loads((bundle / "manifest.json").read_text())
    (entry,) = manifest["ops"]
    assert entry["name"] == "kgtoy::scale" and manifest["toolchain"]["toy"].startswith("nvrtc ")
    return [c for c in entry["candidates"] if c["backend"] == "toy"]


def test_aot_bundles_the_toy_candidates_as_cubins(toy_bundle):
    toy = _toy_candidates(toy_bundle)
    assert [c["label"] for c in toy] == ["toy:toy_scale[BLOCK=64,ITEMS=1]", FAST]
    for cand in toy:
        assert cand["kernels"] and all(k["kernel"] == "toy_scale" and list(k["images"]) == ["cubin"]
                                       for k in cand["kernels"])
        for k in cand["kernels"]:
            assert (toy_bundle / k["images"]["cubin"]["file"]).read_bytes()[:4] == b"\x7fELF"
            assert [p["kind"] for p in k["params"]] == ["ptr", "ptr", "f32", "i32"]
            assert k["params"][2]["expr"] == "alpha"  # the op's argument, not the sample's value


def test_the_loader_attaches_the_toy_candidates_to_the_op_in_this_process(toy_bundle):
    from kernelgraft.aot.runner import BundledRunner

    op = toy_ops.scale  # the op the bundle was built from, defined in this process
    loaded = load_bundle(toy_bundle, arch="sm_90")
    try:
        attached = loaded.attached["kgtoy::scale"]
        assert "toy:toy_scale[BLOCK=64,ITEMS=1]" in attached and FAST in attached
        x = fresh(300, 9)
        cand = next(c for c in op.candidates(x, 1.5) if c.label == FAST)
        assert isinstance(op.dispatcher.runner(cand), BundledRunner)
    finally:
        loaded.detach()


def test_the_loader_launches_the_toy_cubins_without_the_backend(toy_bundle, tmp_path):
    """A child without kgtoy (its import blocked) rebuilds the op from the manifest and launches the
    toy kernels through the driver, recorded up to the launch (no GPU here)."""
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, str(FIXTURE / "bundle_child.py"), str(toy_bundle), "record", str(out)],
                         capture_output=True, text=True, env=cli_env(tmp_path), timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["kgtoy_imported"] is False and report["rebuilt"] == ["kgtoy::scale"]
    runs = [r for r in report["runs"] if r["label"].startswith("toy:")]
    assert {r["label"] for r in runs} == {"toy:toy_scale[BLOCK=64,ITEMS=1]", FAST}
    for r in runs:
        n, per = r["n"], 64 if "BLOCK=64" in r["label"] else 512
        call = r["call"]
        assert call["kernel"] == "toy_scale" and call["kinds"] == ["ptr", "ptr", "f32", "i32"]
        assert call["values"][:2] == r["ptrs"] and call["values"][2] == pytest.approx(r["alpha"])
        assert call["values"][3] == n and call["grid"] == [(n + per - 1) // per, 1, 1]
        assert call["block"] == [per if per == 64 else 128, 1, 1]


# ---------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_the_toy_backend_runs_jit_tuned_and_from_a_bundle(tmp_path, fresh_tuner):
    op = toy_ops.scale
    for n, seed in ((1, 10), (1000, 11), (1 << 20, 12)):
        x = fresh(n, seed).cuda()
        for config in range(2):
            torch.testing.assert_close(op.run(x, 1.5, impl=1, config=config), x * 1.5, equal_nan=True)
    x = fresh(1 << 16, 13).cuda()
    with kg.tune("on"):
        for _ in range(4):  # tuned, then the plan (and the native replay of a toy launch)
            torch.testing.assert_close(op(x, -3.0), x * -3.0, equal_nan=True)
    assert {"triton", "toy"} <= {e["backend"] for e in kg.tune.decision(op, x, -3.0).ranking}
    major, minor = torch.cuda.get_device_capability()
    bundle = tmp_path / "bundle"
    run = cli(tmp_path, "aot", str(FIXTURE / "toy_ops.py"), "--arch", f"sm_{major}{minor}", "-o", str(bundle))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = tmp_path / "report.json"
    child = subprocess.run([sys.executable, str(FIXTURE / "bundle_child.py"), str(bundle), "run", str(out)],
                           capture_output=True, text=True, env=cli_env(tmp_path), timeout=300)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    report = json.loads(out.read_text())
    runs = [r for r in report["runs"] if r["label"].startswith("toy:")]
    assert len(runs) == 6 and all(r["error"] is None and r["exact"] for r in runs), runs
    assert report["op_call_ok"] and report["kgtoy_imported"] is False
