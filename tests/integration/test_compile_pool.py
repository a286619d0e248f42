"""Compiling a key's candidates in worker processes before timing (kernelgraft.tune.compile_pool).

On the CPU the workers cross-compile for sm_90 (Triton and NVRTC need no GPU for that); the test
then shows the launching side finds every kernel in the caches the workers wrote: NVRTC's disk
cache in this process, and Triton's on-disk cache through Triton's own JIT path with real tensors
(a subprocess: this one runs Triton's interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kernelgraft as kg
from kernelgraft.backends.cuda.jit import CudaRunner
from kernelgraft.backends.cuda.nvrtc import CACHE
from kernelgraft.tune import compile_pool as pool_mod
from kernelgraft.tune.compile_jobs import Target, describe, stand_in
from kernelgraft.tune.compile_pool import CompilePool, compile_ahead, jobs_for, source_of, workers

import _pool_ops  # noqa: E402  module level: its ops outlive each test (the workers import it too)
from _paths import TESTS

HERE = TESTS


def _args():
    torch.manual_seed(0)
    x = torch.randn(1001)[1:]  # 4 bytes past a 16-byte boundary: Triton specialises on that
    y = torch.randn(1000)
    y[3], y[7] = float("nan"), float("inf")
    return x, y, 0.75, torch.empty(1000)


def test_stand_ins_keep_what_compiles_depend_on():
    x, y, alpha, out = _args()
    for t in (x, y, torch.randn(6, 8).t(), torch.randn(4, 16)[:, 1:5]):
        m = stand_in(describe(t))
        assert m.device.type == "meta"
        assert (m.shape, m.stride(), m.dtype) == (t.shape, t.stride(), t.dtype)
        assert m.data_ptr() % 16 == t.data_ptr() % 16
    assert stand_in(describe(alpha)) == alpha and stand_in(describe(torch.bfloat16)) is torch.bfloat16


def test_pool_compiles_and_the_launching_side_hits_the_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "kg"))
    x, y, alpha, out = _args()
    cands = _pool_ops.axpy.candidates(x, y, alpha)
    jobs = jobs_for(_pool_ops.axpy, cands, (x, y, alpha, out), Target(90), source_of(_pool_ops.axpy))
    assert sorted(j.impl for j in jobs) == [0, 0, 1, 1]
    # a job that kills its worker (a compiler crash) fails alone; the pool replaces the worker
    dying = jobs_for(_pool_ops.die, _pool_ops.die.candidates(y)[:1], (y, out), Target(90), source_of(_pool_ops.die))
    pool = CompilePool(2)
    try:
        outcomes = pool.run(dying + jobs)
    finally:
        pool.close()
    assert not outcomes[0].ok and "exited (3)" in outcomes[0].detail
    outcomes = outcomes[1:]
    assert all(o.ok for o in outcomes), [o.detail for o in outcomes]

    # NVRTC: the variants compile again here as the launch would (same source, options, arch):
    # disk hits, no compile
    CACHE.clear_memory()
    misses, disk = CACHE.misses, CACHE.hits["disk"]
    for cand in cands:
        if cand.impl.backend == "cuda":
            launch = cand.impl.launch(x, y, alpha, out, **cand.config.as_dict())
            CudaRunner(cand.impl, cand.config).compile("sm_90", launch.template)
    assert CACHE.misses == misses and CACHE.hits["disk"] == disk + 2

    # Triton: the JIT's own launch path with the real tensors finds both configs compiled; the
    # same call with an aligned x is another specialisation (the control: a miss)
    script = textwrap.dedent(f"""
        import json, sys, torch, warnings
        warnings.filterwarnings("ignore")
        sys.path.insert(0, {str(HERE)!r})
        from triton import knobs
        import _pool_ops
        from kernelgraft.tune.compile_jobs import Target, compile_only_triton
        hits = []
        knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
        torch.manual_seed(0)
        x, y, out = torch.randn(1001)[1:], torch.randn(1000), torch.empty(1000)
        with compile_only_triton(Target(90)):
            _pool_ops.launch_axpy(x, y, 0.75, out, BLOCK=128)
            _pool_ops.launch_axpy(x, y, 0.75, out, BLOCK=256, num_warps=2)
            pooled = list(hits)
            _pool_ops.launch_axpy(torch.randn(1000), y, 0.75, out, BLOCK=128)
        print(json.dumps({{"pooled": pooled, "control": hits[len(pooled):]}}))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"pooled": [True, True], "control": [False]}


def test_workers_compile_into_the_caches_the_parent_reads_now(tmp_path, monkeypatch):
    """A worker started while the parent's Triton cache was one directory compiles a later job into
    the directory the parent uses when it makes the job (Inductor sets TRITON_CACHE_DIR at its
    first compile when unset: the workers started before must follow, or every gate compiles
    again); the same for kernelgraft's cache root, where NVRTC's cache lives."""
    before_t, before_k = tmp_path / "triton-at-start", tmp_path / "kg-at-start"
    now_t, now_k = tmp_path / "triton-now", tmp_path / "kg-now"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(before_t))
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(before_k))
    pool = CompilePool(2)
    try:
        pool.start()  # the workers' environment is this one
        monkeypatch.setenv("TRITON_CACHE_DIR", str(now_t))
        monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(now_k))
        x, y, alpha, out = _args()
        cands = _pool_ops.axpy.candidates(x, y, alpha)
        jobs = jobs_for(_pool_ops.axpy, cands, (x, y, alpha, out), Target(90), source_of(_pool_ops.axpy))
        assert all(dict(j.caches) == {"TRITON_CACHE_DIR": str(now_t), "KERNELGRAFT_CACHE_DIR": str(now_k)}
                   for j in jobs)
        outcomes = pool.run(jobs)
    finally:
        pool.close()
    assert all(o.ok for o in outcomes), [o.detail for o in outcomes]
    assert len(list(now_t.glob("*/_axpy_kernel.json"))) == 2  # both Triton configs, where the parent reads
    assert not before_t.exists() or not list(before_t.glob("*/_axpy_kernel.json"))
    assert any(now_k.rglob("*")) and not (before_k.exists() and any(before_k.rglob("*.cubin")))
    assert os.environ["TRITON_CACHE_DIR"] == str(now_t)  # nothing of a job's environment leaks here


def test_ops_a_worker_cannot_import_compile_serially():
    def local(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    op = kg.op(local, name="tpool::local", impls=[kg.triton(_pool_ops.launch_axpy, configs=[{"BLOCK": 64}])])
    assert source_of(_pool_ops.axpy).module == "_pool_ops"
    found = source_of(op)
    assert found.module == __name__  # the test module imports fine; the op is not in it
    x, y, alpha, out = _args()
    # a CPU call compiles nothing (Triton's interpreter): no pool
    assert compile_ahead(_pool_ops.axpy, _pool_ops.axpy.candidates(x, y, alpha), (x, y, alpha, out),
                         torch.device("cpu")) is None


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="no process priorities here")
def test_a_worker_yields_the_cpu_to_serving():
    """A compile worker lowers its CPU priority before its imports (so a pool importing torch and
    compiling takes the cores serving leaves); the process that started it keeps its own."""
    from kernelgraft.tune.compile_worker import WORKER_NICE, receive

    mine = os.getpriority(os.PRIO_PROCESS, 0)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.Popen([sys.executable, "-m", "kernelgraft.tune.compile_worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    try:
        assert receive(proc.stdout) == "ready"
        got = os.getpriority(os.PRIO_PROCESS, proc.pid)
        assert got == min(19, mine + WORKER_NICE) and (got > mine or mine == 19)
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        proc.stdout.close()
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine


def test_worker_count(monkeypatch):
    monkeypatch.setenv("KERNELGRAFT_COMPILE_WORKERS", "0")
    assert workers() == 0
    monkeypatch.setenv("KERNELGRAFT_COMPILE_WORKERS", "5")
    assert workers() == 5
    monkeypatch.delenv("KERNELGRAFT_COMPILE_WORKERS")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert workers() == pool_mod.MAX_WORKERS
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two ranks on this host: half the cores each
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert workers() == 7
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert workers() == 0  # one worker beside the tuning process gains nothing
    monkeypatch.setenv("KERNELGRAFT_COMPILE_WORKER", "1")
    monkeypatch.setenv("KERNELGRAFT_COMPILE_WORKERS", "8")
    assert workers() == 0  # never a pool inside a worker


@pytest.mark.gpu
def test_gpu_tuning_compiles_in_the_pool_and_the_gate_compiles_nothing(tmp_path, monkeypatch):
    """The GEMM example's key on the GPU: the pool compiles its Triton and CUDA candidates; the
    gate's first launch of each Triton candidate is a Triton cache hit, and builds no C launcher
    (a Triton that builds one per kernel finds the workers' builds), also where the process's
    Triton cache moved after the workers started."""
    from triton import knobs

    from kernelgraft.examples.gemm import gemm

    monkeypatch.setenv("KERNELGRAFT_COMPILE_WORKERS", "8")
    # the workers start under one Triton cache, then the process moves to another before tuning (as
    # Inductor's first compile does when TRITON_CACHE_DIR is unset): the jobs follow the process
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-at-start"))
    pool_mod.POOL.close()
    pool_mod.prestart()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "kg"))
    events = []
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: events.append(kw["cache_hit"]))
    import triton.backends.nvidia.driver as nvidia
    import triton.runtime.build as triton_build

    host_builds, built_here = [], []  # C launchers built by this process, and the kernels they launch
    real_build = triton_build._build
    monkeypatch.setattr(triton_build, "_build", lambda name, *a, **k: host_builds.append(name) or real_build(name, *a, **k))
    if hasattr(nvidia, "make_launcher"):  # a Triton that builds one per kernel: the workers built the candidates'
        real_init = nvidia.CudaLauncher.__init__

        def init(self, src, metadata):
            before = len(host_builds)
            real_init(self, src, metadata)
            if len(host_builds) > before:
                built_here.append(getattr(getattr(src, "fn", None), "__name__", "?"))

        monkeypatch.setattr(nvidia.CudaLauncher, "__init__", init)
    a = torch.randn(777, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16)
    before = dict(pool_mod.TOTALS)
    with kg.tune("on", compete=False):
        decision = kg.tune.pretune(gemm, a, b, force=True)
    assert decision is not None and decision.winner is not None
    assert pool_mod.TOTALS["compiled"] - before["compiled"] >= 30
    assert events and all(events), f"{events.count(False)} Triton compiles in the tuning process"
    assert "_gemm_kernel" not in built_here, f"{built_here.count('_gemm_kernel')} candidates' launchers built here"
    torch.testing.assert_close(gemm(a, b).float(), (a.float() @ b.float()), rtol=2e-2, atol=2e-1)


@pytest.mark.gpu
def test_gpu_inductor_compiling_beside_the_workers_leaves_their_kernels_where_the_gates_look(tmp_path):
    """A fresh process with Triton's cache unset: the softmax key's ``torch:compile`` gate (Inductor's
    first real compile there, which sets ``TRITON_CACHE_DIR``) runs while the workers compile the
    kernels. Triton's cache is settled where Inductor puts it before any job is made, so every
    kernel's gate finds its kernel: none compiles in the tuning process (16 did before, on the H200)."""
    script = textwrap.dedent("""
        import json, os, torch
        import kernelgraft as kg
        from kernelgraft.examples.softmax import softmax
        x = torch.randn(48, 20000, device="cuda", dtype=torch.bfloat16)
        d = kg.tune.pretune(softmax, x, force=True, progress=False)
        print(json.dumps({"phases": d.phases, "triton_cache": os.environ.get("TRITON_CACHE_DIR"),
                          "winner": str(d.winner)}))
    """)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               KERNELGRAFT_CACHE_DIR=str(tmp_path / "kg"), KERNELGRAFT_COMPILE_WORKERS="8")
    for name in ("TRITON_CACHE_DIR", "TRITON_INTERPRET"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    phases = got["phases"]
    assert phases.get("ahead_compiled", 0) >= 10, got
    assert not phases.get("compiled_here"), f"{phases.get('compiled_here')} Triton kernels compiled in the gates: {got}"
    assert got["triton_cache"] and got["triton_cache"].startswith(str(tmp_path / "inductor")), got


def test_triton_compiles_in_a_kernels_gate_count_in_the_tuning_record(tmp_path):
    """The tuning report says how many Triton kernels its gates compiled in the tuning process
    (``compiled_here``): a compile inside ``counted()`` counts, a cache hit does not, a compile
    outside it (Inductor's, in ``torch:compile``'s gate) does not, and a listener that was there
    before still gets every event (a subprocess: this one runs Triton's interpreter)."""
    script = textwrap.dedent(f"""
        import json, sys, torch, warnings
        warnings.filterwarnings("ignore")
        sys.path.insert(0, {str(HERE)!r})
        from triton import knobs
        import _pool_ops
        from kernelgraft.tune import phases, triton_compiles
        from kernelgraft.tune.compile_jobs import Target, compile_only_triton
        before = []
        knobs.compilation.listener = lambda **kw: before.append(kw["cache_hit"])
        triton_compiles.watch()
        triton_compiles.watch()  # once
        torch.manual_seed(0)
        x, y, out = torch.randn(1000), torch.randn(1000), torch.empty(1000)
        rec = phases.Phases()
        with rec.recording():
            with compile_only_triton(Target(90)), triton_compiles.counted():
                _pool_ops.launch_axpy(x, y, 0.75, out, BLOCK=128)  # compiled: counts
            with compile_only_triton(Target(90)), triton_compiles.counted():
                _pool_ops.launch_axpy(x, y, 0.75, out, BLOCK=128)  # Triton's cache: does not
            with compile_only_triton(Target(90)):
                _pool_ops.launch_axpy(x, y, 0.75, out, BLOCK=256, num_warps=2)  # outside counted()
        print(json.dumps({{"counted": rec.totals().get("compiled_here"), "before": before}}))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"counted": 1.0, "before": [False, True, False]}
