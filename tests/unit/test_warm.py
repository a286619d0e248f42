"""``kg.tune.warm()``: a process's one-time tuning costs paid at start-up. In a fresh interpreter it
imports what the first tuning would (``torch._dynamo``, through the first fake tensors); steps that
cannot run here are recorded with the reason, a failing step never raises; ``wait=False`` returns at
once. On a GPU: the compile workers start, ``torch.compile`` is warmed and the native replay loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import kernelgraft as kg
from kernelgraft.tune import warmup as _warm

from _paths import ROOT


def test_warm_in_a_fresh_process_imports_what_the_first_tuning_would():
    code = (
        "import json, sys\n"
        "import kernelgraft as kg\n"
        "before = 'torch._dynamo' in sys.modules\n"
        "w = kg.tune.warm('cpu')\n"
        "print(json.dumps({'before': before, 'after': 'torch._dynamo' in sys.modules,\n"
        "                  'seconds': w.seconds, 'skipped': w.skipped, 'text': str(w)}))\n"
    )
    path = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "KERNELGRAFT_NATIVE": "0"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["before"] is False and out["after"] is True  # importing kernelgraft does not; warm does
    assert set(out["seconds"]) == {"fake_tensors", "triton"} and out["seconds"]["fake_tensors"] >= 0
    assert out["skipped"] == {
        "compile_workers": "compile workers serve CUDA devices only",
        "torch_compile": "torch.compile is warmed on CUDA devices only (Inductor for the CPU compiles C++)",
        "native_replay": "turned off by KERNELGRAFT_NATIVE=0",
    }
    assert out["text"].startswith("kernelgraft warm on cpu: fake_tensors ")


def test_a_failing_step_is_recorded_not_raised(monkeypatch):
    def broken():
        raise RuntimeError("no disk left for Dynamo's cache")

    monkeypatch.setattr(_warm, "_fake_tensors", broken)
    w = kg.tune.warm("cpu", compile_reference=False, native=False)
    assert w.skipped == {"compile_workers": "compile workers serve CUDA devices only",
                         "fake_tensors": "RuntimeError: no disk left for Dynamo's cache"}
    assert set(w.seconds) == {"triton"}  # the other steps ran


def test_wait_false_returns_at_once_and_wait_joins():
    w = kg.tune.warm("cpu", compile_reference=False, native=False, wait=False)
    assert w.wait(120)
    assert "fake_tensors" in w.seconds and w._thread is not None and not w._thread.is_alive()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_warm_on_cuda_starts_the_workers_and_warms_inductor():
    from kernelgraft import native as _native
    from kernelgraft.tune import compile_pool as _pool, compile_zygote

    w = kg.tune.warm()
    assert w.device.startswith("cuda") and {"fake_tensors", "torch_compile"} <= set(w.seconds), w
    if _pool.workers() >= 2:
        assert "compile_workers" in w.seconds and _pool.POOL.pool is not None and _pool.POOL.pool.running >= 2
        if compile_zygote.available():  # the workers fork from a zygote that has imported
            assert "compile_zygote" in w.seconds, w
    if _native.enabled() and _native.reason() is None:
        assert "native_replay" in w.seconds and _native.get() is not None


def test_warming_triton_locates_libcuda_once_for_the_process(monkeypatch):
    """Triton's first launcher runs ``ldconfig -p`` to find libcuda (cached per process): warming
    does it, so a first launch, and a compile worker forked after the warm-up, does not. Where
    libcuda is missing (this CPU machine) warming goes on."""
    import triton.backends.nvidia.driver as nvidia

    from kernelgraft.backends.triton.ahead import warm_process

    asked = []
    monkeypatch.setattr(nvidia, "libcuda_dirs", lambda: asked.append(1) or ["/usr/lib/x86_64-linux-gnu"])
    warm_process()
    assert asked == [1]

    def missing():
        raise AssertionError("libcuda.so cannot found!")

    monkeypatch.setattr(nvidia, "libcuda_dirs", missing)
    warm_process()  # recorded in the debug log, not raised


def test_warming_launches_asks_each_backend_of_the_candidates_once(monkeypatch):
    """The off-path job warms, while the workers compile, what the first launch of each candidate's
    backend computes once (``warm_launches``): once per backend, whatever the candidates' count;
    a backend that fails to warm leaves the rest warmed (its first gate says what is wrong)."""
    from types import SimpleNamespace

    from kernelgraft import backends
    from kernelgraft.tune import compile_jobs

    asked = []

    class Warms:
        def __init__(self, name, fails=False):
            self.name, self.fails = name, fails

        def warm_launches(self, device):
            asked.append((self.name, device))
            if self.fails:
                raise RuntimeError("no ptxas here")

    found = {"a": Warms("a", fails=True), "b": Warms("b"), "c": object()}
    monkeypatch.setattr(backends, "get", lambda name: found[name])
    cands = [SimpleNamespace(impl=SimpleNamespace(backend=n)) for n in ("a", "b", "a", "c", "b")]
    where = torch.device("cuda", 1)
    compile_jobs.warm_launches(cands, where)
    assert asked == [("a", where), ("b", where)]


def test_warming_triton_launches_off_a_gpu_computes_nothing(monkeypatch):
    """On the CPU (the interpreter compiles nothing) Triton's warm-up for launches does no work:
    neither Triton's cache key nor a backend."""
    import triton.runtime.cache as cache

    from kernelgraft.backends.triton import ahead

    monkeypatch.setattr(cache, "triton_key", lambda: (_ for _ in ()).throw(AssertionError("computed")))
    ahead.warm_launches(torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_warming_triton_launches_on_a_gpu_computes_the_backend_hash():
    """On a GPU, the warm-up computes what Triton's first compile or cache load computes once per
    process: ptxas's version (a subprocess) and libdevice's hash, both cached in Triton."""
    from triton.backends.nvidia import compiler

    from kernelgraft.backends.triton import ahead

    ahead.warm_launches(torch.device("cuda"))
    assert compiler.get_ptxas_version.cache_info().currsize >= 1
    assert compiler.file_hash.cache_info().currsize >= 1


def test_triton_cache_is_settled_where_inductor_would_move_it(monkeypatch, tmp_path):
    """Before a tuning whose ``torch:compile`` candidate compiles, Triton's cache goes where
    Inductor's first compile in the process would put it (``TRITON_CACHE_DIR`` unset: Inductor's
    own ``triton/<device>`` folder), so the workers compile into the cache the gates read after
    Inductor ran. A cache set by the variable, or in code, stays; a CPU tuning changes nothing."""
    from torch._inductor.runtime.cache_dir_utils import triton_cache_dir
    from triton import knobs

    from kernelgraft.tune.compile_jobs import cache_env, settle_inductor_triton_cache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    settle_inductor_triton_cache(torch.device("cpu"))
    assert "TRITON_CACHE_DIR" not in os.environ
    settle_inductor_triton_cache(torch.device("cuda", 1))
    assert os.environ["TRITON_CACHE_DIR"] == triton_cache_dir(1) and triton_cache_dir(1).startswith(str(tmp_path))
    assert dict(cache_env())["TRITON_CACHE_DIR"] == triton_cache_dir(1) == str(knobs.cache.dir)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    settle_inductor_triton_cache(torch.device("cuda", 0))
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine")
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.setitem(vars(knobs.cache), "dir", str(tmp_path / "in-code"))
    settle_inductor_triton_cache(torch.device("cuda", 0))
    assert "TRITON_CACHE_DIR" not in os.environ


def test_inductor_compile_workers_start_ahead_for_a_tuning_whose_torch_compile_will_compile(monkeypatch):
    """A tuning whose ``torch:compile`` candidate will compile on a GPU starts Inductor's compile
    workers when it starts (``maybe_warm_pool``, as Inductor's first compile would, seconds later);
    a CPU tuning, one without ``torch:compile`` or one whose reference Dynamo refused starts none.
    A failure to start them is Inductor's to meet at its compile, not the tuning's."""
    import torch._inductor.async_compile as async_compile

    from kernelgraft.examples.rmsnorm import rmsnorm
    from kernelgraft.tune.compile_jobs import start_inductor_workers
    from kernelgraft.tune.trials import start_for_inductor

    started = []
    monkeypatch.setattr(async_compile, "maybe_warm_pool", lambda: started.append(True))
    start_inductor_workers(torch.device("cpu"))
    assert started == []
    start_inductor_workers(torch.device("cuda", 0))
    assert started == [True]

    x, w = torch.randn(4, 64), torch.randn(64)
    with kg.tune("on", compete=True):
        cands = rmsnorm.candidates(x, w, 1e-6)
    assert "torch:compile" in [c.label for c in cands]
    started.clear()
    start_for_inductor(rmsnorm, [c for c in cands if c.label != "torch:compile"], torch.device("cuda", 0))
    start_for_inductor(rmsnorm, cands, torch.device("cpu"))
    assert started == []
    start_for_inductor(rmsnorm, cands, torch.device("cuda", 0))
    assert started == [True]
    monkeypatch.setattr(rmsnorm.dispatcher.compile_state, "error", "Dynamo refused it")
    start_for_inductor(rmsnorm, cands, torch.device("cuda", 0))
    assert started == [True]

    def refused():
        raise RuntimeError("Inductor async compile process pools are disabled in daemonic processes")

    monkeypatch.setattr(async_compile, "maybe_warm_pool", refused)
    start_inductor_workers(torch.device("cuda", 0))  # not raised


def test_a_summary_whose_caches_moved_is_compiled_again(monkeypatch, tmp_path):
    """``moved``: the caches the jobs compiled into are not the ones this process reads now (as
    when Inductor sets ``TRITON_CACHE_DIR`` while the workers compile): the tuner compiles ahead
    again rather than each gate compiling its kernel here. Nothing done, or nothing moved: not."""
    from kernelgraft.tune.compile_jobs import cache_env
    from kernelgraft.tune.compile_pool import Summary, moved

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "before"))
    summary = Summary(jobs=3, compiled=3, caches=cache_env())
    assert not moved(summary) and not moved(None) and not moved(Summary())
    assert not moved(Summary(jobs=3, compiled=3))  # caches not recorded: nothing to compare
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "after"))
    assert moved(summary)
