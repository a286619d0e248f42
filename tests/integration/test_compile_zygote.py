"""Compile workers forked from a zygote that imported once (kernelgraft.tune.compile_zygote).

Real processes, real Triton and NVRTC cross-compiles for sm_90 (as tests/integration/test_compile_pool.py):
forked workers compile what workers started on their own compile; they are the zygote's children;
a dead worker is replaced; nothing outlives ``close()`` or the pool's process; where the zygote is
turned off, dies or refuses, the workers start on their own. Op modules named to the zygote are
imported in a trial child, which forks the workers where they leave a fork safe; where one does not,
the zygote forks them itself, without the modules, having imported torch and Triton once."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from kernelgraft.tune import compile_zygote
from kernelgraft.tune.compile_jobs import Target
from kernelgraft.tune import compile_pool as pool_mod
from kernelgraft.tune.compile_jobs import Source
from kernelgraft.tune.compile_pool import CompilePool, jobs_for, preload_for, source_of
from kernelgraft.tune.compile_worker import WORKER_NICE

import _pool_ops  # noqa: E402  module level: the workers import it too
from _paths import TESTS

pytestmark = pytest.mark.skipif(not compile_zygote.available(), reason="no fork and pidfds on this platform")


def _jobs():
    """The test's jobs, for the caches set now (each job carries them: ``compile_jobs.cache_env``)."""
    torch.manual_seed(0)
    x = torch.randn(1001)[1:]
    y = torch.randn(1000)
    y[3], y[7] = float("nan"), float("inf")
    out = torch.empty(1000)
    axpy = jobs_for(_pool_ops.axpy, _pool_ops.axpy.candidates(x, y, 0.75), (x, y, 0.75, out), Target(90),
                    source_of(_pool_ops.axpy))
    die = jobs_for(_pool_ops.die, _pool_ops.die.candidates(y)[:1], (y, out), Target(90), source_of(_pool_ops.die))
    meet = jobs_for(_pool_ops.meet, _pool_ops.meet.candidates(x, y, 0.75), (x, y, 0.75, out), Target(90),
                    source_of(_pool_ops.meet))
    assert sorted(j.impl for j in axpy) == [0, 0, 1, 1] and len(die) == 1 and len(meet) == 2
    return axpy, die, meet


def _meeting(monkeypatch, where):
    """Where the compiles of tpool::meet wait until two workers came (``_pool_ops.meet_here``): sent
    two meet jobs, a pool of two workers compiles one on each, whatever else either compiles."""
    where.mkdir()
    monkeypatch.setenv(_pool_ops.MEET, f"2:{where}")  # before the pool starts: its workers inherit it
    return where


def _met(where) -> set[int]:
    """The pids of the workers that compiled a meet job there."""
    return {int(p.name) for p in where.iterdir()}


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _pidfds(pids):
    return [os.pidfd_open(p) for p in pids]


def _exited(pidfds, timeout: float = 0.0) -> list[bool]:
    """Whether each process has exited (a bound to wait, not a measurement: the answer is what counts)."""
    out = []
    for fd in pidfds:
        out.append(bool(select.select([fd], [], [], timeout)[0]))
        os.close(fd)
    return out


def _fresh_caches(monkeypatch, root):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(root / "triton"))
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(root / "kg"))


def _comparable(outcomes):
    return [(o.ok, o.detail, o.backend, o.artifacts) for o in outcomes]


def test_forked_workers_compile_as_started_ones_are_replaced_and_leave_nothing(tmp_path, monkeypatch):
    # a replacement forks at its first job, and the surviving worker may compile every job left
    # before the death is noticed: so each run sends, after the dying job, one meet job per worker
    # (each waits for the other's), and the replacement provably takes one
    # workers started on their own (the zygote turned off): the reference outcomes
    monkeypatch.setenv(compile_zygote.ENV, "0")
    _fresh_caches(monkeypatch, tmp_path / "started")
    met = _meeting(monkeypatch, tmp_path / "met-started")
    axpy, die, meet = _jobs()
    pool = CompilePool(2)
    try:
        started = pool.run(die + meet + axpy)
        assert pool.zygote_pid is None
        assert {_parent(p) for p in pool.pids} == {os.getpid()}
        assert _met(met) == set(pool.pids)
    finally:
        pool.close()
    monkeypatch.delenv(compile_zygote.ENV)

    _fresh_caches(monkeypatch, tmp_path / "forked")
    met = _meeting(monkeypatch, tmp_path / "met")
    axpy, die, meet = _jobs()
    pool = CompilePool(2)
    try:
        forked = pool.run(die + meet + axpy)  # the dying job takes its worker with it: replaced, the run goes on
        assert all(o.ok for o in forked[1:]), [o.detail for o in forked]
        zygote = pool.zygote_pid
        assert zygote is not None
        first = pool.pids
        assert len(first) == 2 and {_parent(p) for p in first} == {zygote}  # forks of the zygote
        assert _met(met) == set(first)  # the surviving worker and the replacement each compiled
        # its start until it could fork (what a cold pool waits for) is recorded once it forked; its
        # size is the benchmark's to print, not a test's to bound
        assert isinstance(pool.zygote_imports_s, float) and pool.zygote_imports_s >= 0
        assert _comparable(forked) == _comparable(started)
        assert not forked[0].ok and forked[0].detail == "the compile worker exited (3)"

        # a worker killed between runs is replaced by a new fork; the next key compiles on both
        victim = first[0]
        (fd,) = _pidfds([victim])
        os.kill(victim, signal.SIGKILL)
        assert _exited([fd], timeout=60) == [True]
        _fresh_caches(monkeypatch, tmp_path / "again")
        axpy, _, meet = _jobs()
        for p in met.iterdir():  # a new meeting, in the directory the zygote's forks were told
            p.unlink()
        again = pool.run(meet + axpy)
        assert all(o.ok for o in again), [o.detail for o in again]
        assert victim not in pool.pids and len(pool.pids) == 2
        assert _met(met) == set(pool.pids)
        assert {_parent(p) for p in pool.pids} == {zygote} and pool.zygote_pid == zygote
        # the zygote lowered its priority before its imports: its forks yield the CPU to serving too
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert {os.getpriority(os.PRIO_PROCESS, p) for p in (zygote, *pool.pids)} == {min(19, mine + WORKER_NICE)}
        alive = _pidfds([zygote, *pool.pids])
    finally:
        pool.close()
    # close() waited for all of them: the zygote and every worker have exited
    assert _exited(alive) == [True, True, True]
    assert pool.running == 0 and pool.zygote_pid is None


@pytest.mark.parametrize("preload", [False, True])
def test_the_zygote_and_its_workers_end_with_the_pools_process(preload):
    # preload: the op's module is named; the zygote's trial child imports it and forks the workers
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(TESTS)!r})
        import torch, _pool_ops
        from kernelgraft.tune.compile_jobs import Target
        from kernelgraft.tune.compile_pool import CompilePool, jobs_for, preload_for, source_of
        x, y, out = torch.randn(1000), torch.randn(1000), torch.empty(1000)
        cands = [c for c in _pool_ops.axpy.candidates(x, y, 0.5) if c.impl.backend == "triton"]
        jobs = jobs_for(_pool_ops.axpy, cands, (x, y, 0.5, out), Target(90), source_of(_pool_ops.axpy))
        pool = CompilePool(2)
        pool.start(preload_for([_pool_ops.axpy]) if {preload!r} else ())
        outcomes = pool.run(jobs)
        print(json.dumps({{"ok": [o.ok for o in outcomes], "zygote": pool.zygote_pid, "workers": pool.pids}}),
              flush=True)
        sys.stdin.read()  # killed here, the pool never closed
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        seen = json.loads(proc.stdout.readline())
        assert seen["ok"] == [True, True] and seen["zygote"] and len(seen["workers"]) == 2
        started = _parent(seen["zygote"]) if preload else seen["zygote"]  # the process the pool started
        pids = [started, seen["zygote"], *seen["workers"]] if preload else [started, *seen["workers"]]
        fds = _pidfds(pids)  # opened while they run: a pid reused later cannot fool the check
        parents = [proc.pid, started, seen["zygote"], seen["zygote"]] if preload else [proc.pid, started, started]
        assert [_parent(p) for p in pids] == parents
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
    # EOF on the zygote's socket and on each worker's request pipe ends them (the process the pool
    # started exits with the trial child that served)
    assert _exited(fds, timeout=120) == [True] * len(pids)


def _run_started_on_their_own(monkeypatch, tmp_path, break_zygote) -> list:
    _fresh_caches(monkeypatch, tmp_path)
    axpy, _, _ = _jobs()
    pool = CompilePool(2)
    try:
        break_zygote(pool)
        outcomes = pool.run(axpy)
        assert all(o.ok for o in outcomes), [o.detail for o in outcomes]
        assert len(pool.pids) == 2 and {_parent(p) for p in pool.pids} == {os.getpid()}
    finally:
        pool.close()
    return outcomes


def test_workers_start_on_their_own_when_the_zygote_dies(tmp_path, monkeypatch, caplog):
    def kill_it(pool):
        pool.start()
        (fd,) = _pidfds([pool.zygote_pid])
        os.kill(pool.zygote_pid, signal.SIGKILL)
        assert _exited([fd], timeout=60) == [True]

    with caplog.at_level(logging.WARNING, logger="kernelgraft.tune.compile_zygote"):
        _run_started_on_their_own(monkeypatch, tmp_path, kill_it)
    assert "compile workers start on their own: the zygote did not start" in caplog.text


def test_a_zygote_whose_imports_start_a_thread_refuses_to_fork(tmp_path, monkeypatch, caplog):
    """A fork copies only the forking thread (a lock another one holds stays held in the child): the
    zygote checks, after its imports, that it is alone; here a sitecustomize starts a thread."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""
        import threading, time
        threading.Thread(target=time.sleep, args=(3600,), name="stray", daemon=True).start()
    """))
    monkeypatch.syspath_prepend(str(site))  # the pool passes sys.path on as PYTHONPATH
    with caplog.at_level(logging.WARNING, logger="kernelgraft.tune.compile_zygote"):
        _run_started_on_their_own(monkeypatch, tmp_path / "caches", lambda pool: None)
    assert "refused: the imports started threads" in caplog.text


def _preload_jobs(tmp_path, monkeypatch):
    log = tmp_path / "imports.log"
    monkeypatch.setenv("KERNELGRAFT_TEST_PRELOAD_LOG", str(log))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "kg"))
    import _preload_ops

    torch.manual_seed(0)
    x, y, out = torch.randn(1000), torch.randn(1000), torch.empty(1000)
    jobs = jobs_for(_preload_ops.axpy, _preload_ops.axpy.candidates(x, y, 0.75), (x, y, 0.75, out), Target(90),
                    source_of(_preload_ops.axpy))
    assert len(jobs) == 2
    return _preload_ops.axpy, jobs, log


def _imports(log) -> list[int]:
    return [int(p) for p in log.read_text().split()] if log.exists() else []


def test_the_zygote_imports_the_op_modules_it_is_named_once_for_all_its_workers(tmp_path, monkeypatch):
    """Named the op's module, the zygote imports it before forking (in its trial child, which then
    forks the workers): its workers compile the op's jobs without importing it again (each worker
    paid that import at its first job before). The control: a zygote named nothing forks the
    workers itself and leaves the import to each worker."""
    op, jobs, log = _preload_jobs(tmp_path, monkeypatch)
    for named in (True, False):
        log.unlink(missing_ok=True)
        pool = CompilePool(2)
        try:
            pool.start(preload_for([op]) if named else ())
            outcomes = pool.run(jobs + jobs)  # both workers get jobs
            zygote, workers_, started = pool.zygote_pid, pool.pids, pool._zygote._proc.pid
            preloaded = pool._zygote.preloaded
            parents = [_parent(p) for p in (zygote, *workers_)]  # while they run
        finally:
            pool.close()
        assert all(o.ok for o in outcomes), [o.detail for o in outcomes]
        assert zygote is not None and len(workers_) == 2
        assert parents == [started if named else os.getpid(), zygote, zygote]
        assert (zygote != started) == named == preloaded
        if named:
            assert _imports(log) == [zygote]  # once, in the zygote's trial child; no worker imported it
        else:
            assert zygote not in _imports(log) and set(_imports(log)) <= set(workers_) and _imports(log)


def test_an_op_module_whose_import_starts_a_thread_costs_the_zygote_only_that_import(tmp_path, monkeypatch,
                                                                                   caplog):
    """An op module whose import starts a thread leaves a process unsafe to fork: the zygote's trial
    child, which imported it, ends, and a second trial child of the same zygote (torch and Triton
    imported once, no second zygote) imports the other named module and forks the workers, which
    compile without importing it again; the log says which module was left out, and the pool names
    it to no zygote again."""
    monkeypatch.setattr(pool_mod, "_not_preloaded", set())
    op, jobs, log = _preload_jobs(tmp_path, monkeypatch)
    stray = Source("_preload_threads")
    pool = CompilePool(2)
    with caplog.at_level(logging.INFO, logger="kernelgraft.tune"):
        try:
            pool.start((stray, *preload_for([op])))
            zygote = pool._zygote
            outcomes = pool.run(jobs + jobs)
            assert pool._zygote is zygote  # the one zygote the pool started
            server, workers_, preloaded = pool.zygote_pid, pool.pids, zygote.preloaded
            parents = [_parent(p) for p in (server, *workers_)]  # while they run
        finally:
            pool.close()
    assert all(o.ok for o in outcomes), [o.detail for o in outcomes]
    started = zygote._proc.pid
    assert server != started and parents == [started, server, server]  # one lineage: zygote, trial, workers
    assert preloaded and list(zygote.left_out) == [stray]
    assert "leaves _preload_threads to its workers" in caplog.text
    assert "importing _preload_threads started threads" in caplog.text
    assert [p for p in _imports(log) if p != os.getpid()] == [server]  # the op's module: once, in the trial
    assert pool_mod._not_preloaded == {stray}
    again = CompilePool(2)
    try:
        again.start((stray, *preload_for([op])))
        assert again._zygote is not None and again._zygote.preload == preload_for([op])
    finally:
        again.close()


@pytest.mark.parametrize("module, why", [("_preload_threads", "importing _preload_threads started threads"),
                                         ("_preload_exits", "importing _preload_exits ended the process "
                                                            "importing it (exit code 7)")])
def test_waiting_for_the_zygote_learns_the_op_module_it_left_out(tmp_path, monkeypatch, module, why):
    """``zygote_ready`` (what ``kg.tune.warm()`` waits for last) waits for the trials too: then the
    zygote the pool started can fork (from a second trial child, which imported the op's module),
    and the module it left out (its import started a thread, or ended the first trial child) is
    known and named to no zygote again."""
    monkeypatch.setattr(pool_mod, "_not_preloaded", set())
    op, _, log = _preload_jobs(tmp_path, monkeypatch)
    stray = Source(module)
    pool = CompilePool(2)
    try:
        pool.start((stray, *preload_for([op])))
        started = pool._zygote
        assert pool.zygote_ready()
        server = pool.zygote_pid
        assert pool._zygote is started and server != started._proc.pid and _parent(server) == started._proc.pid
        assert started.preloaded
        assert started.imports_s is not None  # ready: its imports are done
        assert list(started.left_out) == [stray] and started.left_out[stray].startswith(why)
        assert pool_mod._not_preloaded == {stray}  # known once ready
    finally:
        pool.close()
    assert [p for p in _imports(log) if p != os.getpid()] == [server]  # the second trial only
    alone = CompilePool(2)
    try:  # the module it left out is named to no zygote again
        alone.start((stray,))
        assert alone._zygote.preload == () and alone.zygote_ready() and alone._zygote.left_out == {}
    finally:
        alone.close()


def test_a_zygote_whose_every_named_module_is_unsafe_forks_the_workers_itself(tmp_path, monkeypatch):
    """Each trial leaves out the module that made it unsafe (one starts a thread, one ends the
    process importing it); with none left, the zygote forks the workers itself, which compile."""
    monkeypatch.setattr(pool_mod, "_not_preloaded", set())
    _, jobs, _ = _preload_jobs(tmp_path, monkeypatch)
    strays = (Source("_preload_threads"), Source("_preload_exits"))
    pool = CompilePool(2)
    try:
        pool.start(strays)
        started = pool._zygote
        assert pool.zygote_ready()
        assert pool.zygote_pid == started._proc.pid and not started.preloaded
        assert set(started.left_out) == set(strays)
        outcomes = pool.run(jobs + jobs)
        parents = [_parent(p) for p in pool.pids]
    finally:
        pool.close()
    assert all(o.ok for o in outcomes), [o.detail for o in outcomes]
    assert parents == [started._proc.pid] * 2
    assert pool_mod._not_preloaded == set(strays)


@pytest.mark.parametrize("end", ["close", "kill"])
def test_a_trial_stuck_in_an_op_modules_import_ends_with_the_zygote(tmp_path, monkeypatch, end):
    """The trial child never outlives the zygote: closing the pool (EOF on the zygote's socket) or
    killing the zygote (the child's parent-death signal) ends a child whose import never returns."""
    log = tmp_path / "imports.log"
    monkeypatch.setenv("KERNELGRAFT_TEST_PRELOAD_LOG", str(log))
    pool = CompilePool(2)
    try:
        pool.start((Source("_preload_stuck"),))
        started = pool.zygote_pid
        for _ in range(1200):  # its imports first, then the trial (a bound, not a measurement)
            if _imports(log):
                break
            select.select([], [], [], 0.1)
        assert _imports(log), "no trial child started importing _preload_stuck in 120 s"
        (trial,) = _imports(log)
        assert _parent(trial) == started
        fds = _pidfds([started, trial])
        if end == "kill":
            os.kill(started, signal.SIGKILL)
    finally:
        pool.close()
    assert _exited(fds, timeout=60) == [True, True]
