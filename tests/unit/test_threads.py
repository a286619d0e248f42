"""Threads: per-thread tuning settings, plans per settings scope, serialized first-call tuning,
replays that are not installed after plans moved on, and dtypes the reference refuses."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
import torch.nn.functional as F

import kernelgraft as kg
from kernelgraft.op import modes as _modes

from _torch_backend import kg_torch  # noqa: E402

# Config k multiplies by 2 and then adds k * 0: every config is correct; OFFSET plants a wrong one.
CONFIGS = [{"K": k} for k in range(4)]


def _launch(x, out, *, K, OFFSET=0.0):
    torch.mul(x, 2, out=out)
    if OFFSET:
        out.add_(OFFSET)


@pytest.fixture(autouse=True)
def _fresh_tuner(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KERNELGRAFT_TUNE", raising=False)
    kg.tune.clear()
    yield
    kg.tune.clear()


def _double_op(name, configs=CONFIGS):
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    return kg.op(double, name=name, impls=[kg_torch(_launch, configs=configs)])


def _timer_preferring(k, seen=None, mode=None):
    """A fake timer under which config K=k is fastest; records the settings each call saw."""

    def timer(trial, settings):
        if seen is not None:
            seen.append((threading.get_ident(), settings.mode, mode))
        trial.run(0)
        return 1.0 if trial.candidate.config.as_dict()["K"] == k else 2.0 + trial.candidate.config.as_dict()["K"]

    return timer


def _chosen(op, x):
    plan = op.dispatcher.plan_for((x,))
    return None if plan is None or plan.candidate is None else plan.candidate.config.as_dict()["K"]


def test_eight_threads_each_see_their_own_settings():
    op = _double_op("tthreads::double8")
    seen: list = []
    barrier = threading.Barrier(8)
    errors: list = []
    results: dict[int, tuple] = {}
    # thread i: (mode, the config its fake timer makes fastest)
    plan = [("on", 2), ("off", None), ("cached", None), ("on", 3), ("off", None), ("on", 1),
            ("cached", None), ("on", 2)]

    def work(i):
        mode, best = plan[i]
        try:
            options = {"timer": _timer_preferring(best, seen, mode)} if best is not None else {}
            with kg.tune(mode, **options):
                barrier.wait(timeout=30)  # all eight threads are inside their blocks at once
                assert kg.tune.settings().mode == mode
                x = torch.randn(2 ** (6 + i))  # a fresh signature (and tuning bucket) per thread
                out = op(x)
                barrier.wait(timeout=30)
                assert kg.tune.settings().mode == mode
                results[i] = (torch.equal(out, x * 2), _chosen(op, x))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append((i, repr(exc)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for i, (mode, best) in enumerate(plan):
        correct, chosen = results[i]
        assert correct, i
        # 'off' and 'cached' (nothing on disk for a fresh signature) run the first candidate
        assert chosen == (best if mode == "on" else 0), (i, mode, chosen)
    # every timing ran under the settings of the thread that asked for it
    assert seen and all(mode_seen == mode for _, mode_seen, mode in seen)
    assert kg.tune.settings().mode == "on"  # nothing leaked into this thread


def test_a_decorated_function_keeps_settings_per_thread():
    @kg.tune("off")
    def handler(barrier):
        barrier.wait(timeout=30)
        time.sleep(0.01)
        return kg.tune.settings().mode

    barrier = threading.Barrier(4)
    modes: list = []
    threads = [threading.Thread(target=lambda: modes.append(handler(barrier))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert modes == ["off"] * 4
    assert kg.tune.settings().mode == "on"


def test_entering_a_mode_keeps_the_plans_of_other_scopes():
    op = _double_op("tthreads::keep")
    x = torch.randn(64)
    op(x)
    before = op.dispatcher.plans()
    for _ in range(3):
        with kg.tune("off"):
            op(x)
    after = op.dispatcher.plans()
    assert before and all(after[k] is p for k, p in before.items())


def test_plans_differ_by_scope():
    op = _double_op("tthreads::scopes")
    x = torch.randn(64)
    timer = _timer_preferring(3)
    with kg.tune("on", timer=timer):
        op(x)
        assert _chosen(op, x) == 3
    with kg.tune("off"):
        op(x)
        assert _chosen(op, x) == 0
    with kg.tune("on", timer=timer):
        assert _chosen(op, x) == 3  # still the plan made there, not re-planned


def test_first_call_tuning_is_serialized_per_device():
    op = _double_op("tthreads::serial")
    windows: list = []

    def timer(trial, settings):
        start = time.perf_counter()
        trial.run(0)
        time.sleep(0.002)
        windows.append((start, time.perf_counter()))
        return 1.0 + trial.candidate.config.as_dict()["K"]

    barrier = threading.Barrier(6)
    errors: list = []

    def work(i):
        try:
            with kg.tune("on", timer=timer):
                barrier.wait(timeout=30)
                x = torch.randn(2 ** (6 + i))  # six different keys on one device
                assert torch.equal(op(x), x * 2)
        except Exception as exc:  # pragma: no cover
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(windows) == 6 * len(CONFIGS)
    # Each key's trials ran alone: no two timing windows overlap in time.
    windows.sort()
    assert all(b[0] >= a[1] for a, b in zip(windows, windows[1:]))


def test_same_key_from_many_threads_is_tuned_once():
    op = _double_op("tthreads::once")
    kg.tune.TUNER.stats.clear()
    barrier = threading.Barrier(6)
    x = torch.randn(333)

    def work():
        with kg.tune("on", timer=_timer_preferring(1)):
            barrier.wait(timeout=30)
            assert torch.equal(op(x), x * 2)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert kg.tune.stats().get("tuned") == 1


@pytest.mark.parametrize("error", [RuntimeError("the trials broke"), torch.OutOfMemoryError("CUDA out of memory")])
def test_a_failed_tuning_is_not_redone_by_each_waiting_thread(monkeypatch, error):
    """Tuning that raises gives the default candidate; the threads that waited on the same key
    use that outcome instead of each failing the same tuning again (a transient failure too)."""
    from kernelgraft.tune import tuner as _tuner

    op = _double_op(f"tthreads::failonce_{type(error).__name__}")
    barrier = threading.Barrier(5)
    x = torch.randn(517)
    attempts = []

    def broken(*args, **kwargs):
        attempts.append(threading.get_ident())
        time.sleep(0.05)
        raise error

    monkeypatch.setattr(_tuner, "run_trials", broken)

    def work(errors):
        try:
            with kg.tune("on", timer=_timer_preferring(1)):
                barrier.wait(timeout=30)
                assert torch.equal(op(x), x * 2)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    errors: list = []
    threads = [threading.Thread(target=work, args=(errors,), daemon=True) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(set(attempts)) == 1, f"{len(set(attempts))} threads each tuned and failed"


def test_nested_tuning_on_two_devices_in_opposite_orders_does_not_deadlock(monkeypatch):
    """Thread 1 tunes op A (holding A's device lock) whose candidate calls op B on another device;
    thread 2 does the opposite. Waiting for the second lock while holding the first would
    deadlock (ABBA); the nested call takes the default candidate instead and tunes later."""
    locks = {"tthreads::abba_a": threading.RLock(), "tthreads::abba_b": threading.RLock()}
    monkeypatch.setattr(kg.tune.TUNER, "_device_lock", lambda op, args: locks[op.name])
    both_hold = threading.Barrier(2)
    inner: dict = {}

    def calling(other):
        def launch(x, out, *, K):
            torch.mul(x, 2, out=out)
            if other in inner and threading.current_thread().name.startswith("abba"):
                key = (threading.current_thread().name, other)
                if key not in inner["done"]:
                    inner["done"].add(key)
                    both_hold.wait(timeout=10)  # each thread now holds its own op's lock
                    inner[other](x)  # and tunes the other op nested
        return launch

    def make(name, other):
        def double(x: torch.Tensor) -> torch.Tensor:
            return x * 2
        return kg.op(double, name=name, impls=[kg_torch(calling(other), configs=CONFIGS)])

    a = make("tthreads::abba_a", "b")
    b = make("tthreads::abba_b", "a")
    inner.update(a=a, b=b, done=set())
    errors: list = []

    later: dict = {}

    def work(op):
        try:
            with kg.tune("on", timer=_timer_preferring(1)):
                x = torch.randn(77)
                assert torch.equal(op(x), x * 2)
                # the nested call served the default for that call only: the other op's next call
                # here (same scope, same key) gets the tuned choice, K=1, not a pinned default K=0
                me = threading.current_thread().name
                inner["done"].update({(me, "a"), (me, "b")})
                other = b if op is a else a
                assert torch.equal(other(x), x * 2)
                later[op.name] = _chosen(other, x)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(op,), name=f"abba-{op.name}", daemon=True) for op in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "deadlock: both threads still wait"
    assert not errors, errors
    # the first nested attempt finds the other lock held (neither thread has released its own)
    assert kg.tune.stats().get("nested_busy", 0) >= 1
    assert later == {"tthreads::abba_a": 1, "tthreads::abba_b": 1}


def test_a_nested_tuning_that_meets_a_busy_device_keeps_no_plan(monkeypatch):
    """Nested inside another device's tuning, with this op's device busy: the default candidate
    serves that call, no plan is kept and nothing is remembered, and the next call tunes."""
    from kernelgraft.tune import tuner as _tuner

    mine, busy = threading.RLock(), threading.RLock()
    monkeypatch.setattr(kg.tune.TUNER, "_device_lock", lambda op, args: busy)
    op = _double_op("tthreads::nested_busy")
    x = torch.randn(91)
    held, release = threading.Event(), threading.Event()

    def holder():  # another thread tuning on this op's device
        with busy:
            held.set()
            release.wait(30)

    t = threading.Thread(target=holder, daemon=True)
    t.start()
    assert held.wait(10)
    with kg.tune("on", timer=_timer_preferring(1)):
        _tuner.TUNER._held.locks = [mine]  # this thread is inside a tuning on another device
        try:
            assert torch.equal(op(x), x * 2)
        finally:
            _tuner.TUNER._held.locks = []
        assert op.dispatcher.plan_for((x,)) is None
        assert kg.tune.stats().get("nested_busy") == 1 and not kg.tune.stats().get("tuned")
        release.set()
        t.join(10)
        assert torch.equal(op(x), x * 2)
        assert _chosen(op, x) == 1 and kg.tune.stats().get("tuned") == 1
        assert not busy._is_owned()  # the lock taken for tuning was released


def test_a_transient_tuning_failure_is_tuned_again_after_a_backoff(monkeypatch):
    """Out of memory while tuning: the default serves until the backoff passes, then the key is
    tuned again (the tuner's and the dispatcher's deadlines read time.monotonic: a fake clock)."""
    from kernelgraft.tune import tuner as _tuner

    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    real = _tuner.run_trials
    errors = [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
              torch.OutOfMemoryError("CUDA out of memory")]
    attempts = []

    def flaky(*args, **kwargs):
        attempts.append(time.monotonic())
        if errors:
            raise errors.pop(0)
        return real(*args, **kwargs)

    monkeypatch.setattr(_tuner, "run_trials", flaky)
    op = _double_op("tthreads::oom")
    x = torch.randn(301)
    with kg.tune("on", timer=_timer_preferring(1)):
        with pytest.warns(kg.TuneWarning, match=r"OutOfMemoryError.*tuning again in 2 s"):
            assert torch.equal(op(x), x * 2)
        now[0] += 1.9
        assert _chosen(op, x) == 0 and torch.equal(op(x), x * 2) and len(attempts) == 1
        now[0] += 0.2
        with pytest.warns(kg.TuneWarning, match="tuning again in 4 s"):  # the backoff doubles
            assert torch.equal(op(x), x * 2)
        assert len(attempts) == 2 and _chosen(op, x) == 0
        now[0] += 4.1
        assert torch.equal(op(x), x * 2)  # the backoff passed: this call tunes, and succeeds
        assert len(attempts) == 3 and _chosen(op, x) == 1 and kg.tune.stats().get("tuned") == 1
        assert not _tuner.TUNER._retry


def test_a_lasting_tuning_failure_is_not_retried(monkeypatch):
    from kernelgraft.tune import tuner as _tuner

    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    attempts = []

    def broken(*args, **kwargs):
        attempts.append(1)
        raise ValueError("a bug in a trial")

    monkeypatch.setattr(_tuner, "run_trials", broken)
    op = _double_op("tthreads::broken")
    x = torch.randn(303)
    with kg.tune("on", timer=_timer_preferring(1)):
        with pytest.warns(kg.TuneWarning, match="for this process"):
            op(x)
        now[0] += 3600.0
        for _ in range(3):
            assert torch.equal(op(x), x * 2)
        assert len(attempts) == 1 and _chosen(op, x) == 0
    kg.tune.clear()  # forgets it: the next call tunes again
    with kg.tune("on", timer=_timer_preferring(1)), pytest.warns(kg.TuneWarning):
        op(x)
    assert len(attempts) == 2


def test_a_replay_is_not_installed_after_plans_moved_on():
    op = _double_op("tthreads::replay")
    d = op.dispatcher
    op(torch.randn(8))
    epoch = d.epoch
    assert d.install_replay(object(), _modes.scope(), epoch)
    kg.tune.clear()  # another thread clears: plans of the old epoch are stale
    assert not d.install_replay(object(), _modes.scope(), epoch)
    op(torch.randn(8))  # re-planned in the new epoch
    assert d.current_replay() is None


# ---------------------------------------------------------------- dtypes the reference refuses
def _gelu_mul_launch(x, y, out):
    out.copy_(x * y)  # a "kernel" that runs on anything: only the dispatcher's rule can refuse


def test_a_dtype_the_reference_refuses_never_reaches_a_kernel():
    @kg.op("tthreads::gelu_mul", impls=[kg_torch(_gelu_mul_launch)])
    def gelu_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.gelu(x) * y

    a = torch.arange(6, dtype=torch.int64)
    with pytest.raises(kg.InputError, match=r"tthreads::gelu_mul.*x=int64, y=int64.*GELU|tthreads::gelu_mul.*x=int64"):
        gelu_mul(a, a)
    x, y = torch.randn(6), torch.randn(6)
    torch.testing.assert_close(gelu_mul(x, y), x * y)  # the kernel: floats are accepted
    with pytest.raises(kg.InputError, match="declares no dtypes="):
        gelu_mul.run(a, a, impl=0)


def test_declared_dtypes_are_the_rule_without_running_the_reference():
    calls = []

    @kg.op("tthreads::declared", impls=[kg_torch(_gelu_mul_launch)], dtypes=[torch.float32])
    def declared(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        calls.append(type(x))
        return x * y

    x = torch.randn(4)
    declared(x, x)
    declared(x, x)
    # the reference ran once, on fake tensors, for the output shapes; never on real data
    assert len(calls) == 1 and calls[0] is not torch.Tensor


def test_shape_errors_are_input_errors():
    @kg.op("tthreads::add", impls=[kg_torch(_gelu_mul_launch)])
    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    with pytest.raises(kg.InputError, match=r"tthreads::add: the reference cannot compute output shapes"):
        add(torch.randn(3, 4), torch.randn(5))


def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_a_candidate_short_of_memory_while_tuning_is_tuned_again_not_saved(monkeypatch):
    """The fastest config runs out of memory in its trial (the workload's tensors filled the GPU
    for a moment): the others' ranking serves, nothing reaches the disk (where "excluded" would
    stand for every later process), and after the backoff the key is tuned again with it."""
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    short = [True]

    def launch(x, out, *, K):
        if K == 1 and short[0]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        torch.mul(x, 2, out=out)

    op = kg.op(_twice, name="tthreads::short", impls=[kg_torch(launch, configs=CONFIGS[:2])])
    x = torch.randn(307)
    with kg.tune("on", timer=_timer_preferring(1)):
        with pytest.warns(kg.TuneWarning, match=r"1 candidate\(s\) ran out of memory .* serving "
                                                r"kgtest_torch:launch\[K=0\]; tuning again in 2 s"):
            assert torch.equal(op(x), x * 2)
        assert _chosen(op, x) == 0
        assert kg.tune.decision(op, x).provisional and kg.tune.stats().get("tuned") is None
        assert not kg.tune.cache_path().exists()
        short[0] = False
        now[0] += 2.1
        assert torch.equal(op(x), x * 2)  # the backoff passed: tuned again, every candidate this time
        assert _chosen(op, x) == 1
    saved = json.loads(kg.tune.cache_path().read_text())["entries"]
    assert len(saved) == 1 and [e["config"]["K"] for e in next(iter(saved.values()))["ranking"]] == [1, 0]


def test_a_launch_short_of_memory_is_an_out_of_memory_error_naming_the_op():
    # code that handles running out of memory (a smaller batch) must still catch it
    def launch(x, out, *, K):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    op = kg.op(_twice, name="tthreads::oom_call", impls=[kg_torch(launch, configs=CONFIGS[:1])])
    with kg.tune("off"), pytest.raises(torch.OutOfMemoryError, match="tthreads::oom_call") as info:
        op(torch.randn(8))
    assert isinstance(info.value, kg.LaunchError)


def test_a_cuda_library_that_cannot_allocate_is_out_of_memory_too():
    """cuBLAS, cuDNN and the like allocate outside PyTorch's allocator and say so in their status
    codes: a launch failing that way is an out-of-memory error naming the op (not a kernel's
    fault), and the gate and the tuner treat it as a shortage that may pass."""
    from kernelgraft.errors import memory_note, out_of_memory
    from kernelgraft.tune.gate import classify_error

    cublas = RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
    assert out_of_memory(cublas) and classify_error(cublas) == "memory"
    assert out_of_memory(RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"))
    assert not out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx`"))
    assert not out_of_memory(ValueError("CUBLAS_STATUS_ALLOC_FAILED"))  # not an error CUDA raises
    assert memory_note("cpu") == "" and memory_note(torch.device("cpu")) == ""

    def launch(x, out, *, K):
        raise cublas

    op = kg.op(_twice, name="tthreads::cublas_alloc", impls=[kg_torch(launch, configs=CONFIGS[:1])])
    with kg.tune("off"), pytest.raises(torch.OutOfMemoryError, match="tthreads::cublas_alloc") as info:
        op(torch.randn(8))
    assert isinstance(info.value, kg.LaunchError) and "CUBLAS_STATUS_ALLOC_FAILED" in str(info.value)


def test_short_of_memory_never_serves_a_candidate_the_gate_found_wrong(monkeypatch):
    # K=0 is wrong, K=1 runs out of memory: the default (K=0) must not serve; K=1 may, it was
    # never judged
    def launch(x, out, *, K):
        if K == 1:
            raise torch.OutOfMemoryError("CUDA out of memory")
        torch.mul(x, 3, out=out)

    op = kg.op(_twice, name="tthreads::short_wrong", impls=[kg_torch(launch, configs=CONFIGS[:2])])
    x = torch.randn(311)
    with kg.tune("on", timer=_timer_preferring(1)), pytest.warns(kg.TuneWarning, match="ran out of memory"):
        with pytest.raises(torch.OutOfMemoryError):  # K=1 serves, and runs out of memory again
            op(x)


def test_candidates_short_of_memory_tuning_after_tuning_are_saved_as_not_fitting(monkeypatch):
    from kernelgraft.tune import tuner as _tuner

    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])

    def launch(x, out, *, K):
        if K == 1:  # never fits beside the workload
            raise torch.OutOfMemoryError("CUDA out of memory")
        torch.mul(x, 2, out=out)

    op = kg.op(_twice, name="tthreads::never_fits", impls=[kg_torch(launch, configs=CONFIGS[:2])])
    x = torch.randn(313)
    with kg.tune("on", timer=_timer_preferring(1)):
        for _ in range(_tuner.SHORT_LIMIT):
            with pytest.warns(kg.TuneWarning, match="ran out of memory"):
                op(x)
            now[0] += _tuner.RETRY_MAX_S + 1
        op(x)  # the next tuning saves K=1 as excluded
        assert kg.tune.stats().get("tuned") == 1 and _chosen(op, x) == 0
    entry = next(iter(json.loads(kg.tune.cache_path().read_text())["entries"].values()))
    assert [e["kind"] for e in entry["excluded"]] == ["memory"]
