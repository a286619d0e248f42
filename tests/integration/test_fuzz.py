"""Bad input never reaches a kernel, no autograd route drops a gradient, and re-declaring an op
while threads call it stays correct: a seeded fuzz run over every example op.

The cases (``_fuzz_cases.py``: inputs, autograd routes, re-declaration under threads) run in a
child process, so a crash (a kernel writing out of bounds, an abort) fails the test with the case
that caused it instead of killing pytest. Every case must end ``match`` (the oracle accepts the
result; a route gives the float64 reference's derivative; every call under threads is legal),
``refused`` (a kernelgraft error naming the op, where refusing is honest) or ``meta``; anything else
fails, printed with its case and the command that reruns it alone.

The default test runs every kind on every example op it applies to (``_fuzz_cases.applies``);
another reruns a sample of those cases alone, in a fresh process with another hash seed, and
expects the same verdicts (a case depends on its seed and index only). The slow variant runs
6,000 cases over three seeds.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import kernelgraft as kg

from _fuzz_cases import KINDS, OPS, applies  # noqa: E402
from _paths import TESTS

_HERE = TESTS
DEFAULT_SEED = 16


def _native() -> str:
    """Build the native replay here, once per session (the threads cases replay through it; a
    build in the child would cost the case's time); "1" when it is loaded."""
    from kernelgraft import native as _native_mod

    if shutil.which(os.environ.get("CXX", "c++")) is None or shutil.which(os.environ.get("CC", "cc")) is None:
        return "0"
    return "1" if _native_mod.load() is not None else "0"


@pytest.fixture(scope="module")
def native() -> str:
    return _native()


def _pairs(device: str, native_flag: str) -> list[tuple[str, str]]:
    """Every (op, kind) where the kind applies: the child's plan starts with these, in this order."""
    return [(name, kind) for kind in KINDS for name in OPS if applies(kind, name, device, native_flag == "1")]


def _run(seed: int, count: int, timeout: float, native_flag: str, device: str = "cpu",
         only: list[int] | None = None, hash_seed: str = "0") -> dict:
    env = dict(os.environ, KERNELGRAFT_TUNE="off", FUZZ_DEVICE=device, FUZZ_NATIVE=native_flag,
               PYTHONHASHSEED=hash_seed,
               PYTHONPATH=os.pathsep.join([str(Path(kg.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    argv = [sys.executable, str(_HERE / "_fuzz_cases.py"), str(seed), str(count)]
    if only is not None:
        argv += ["--only", ",".join(map(str, only))]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    cases, verdicts, na = {}, {}, []
    for line in proc.stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "case" in record:
            cases[record["case"]] = record
        elif "done" in record:
            verdicts[record["done"]] = record
        elif "na" in record:
            na.append((record["op"], record["kind"]))
    unfinished = sorted(set(cases) - set(verdicts))
    if proc.returncode != 0 or unfinished:
        last = cases[unfinished[0]] if unfinished else None
        pytest.fail(f"the fuzz child died (exit {proc.returncode}) during case {last}\n"
                    f"rerun: {' '.join(argv[1:])} --only {unfinished[0] if unfinished else '?'}\n"
                    f"stderr tail:\n{proc.stderr[-3000:]}")
    return {"cases": cases, "verdicts": verdicts, "na": na, "stderr": proc.stderr, "seed": seed, "count": count}


def _summarize(run: dict) -> tuple[collections.Counter, list[str]]:
    counts: collections.Counter = collections.Counter()
    failures = []
    for index, verdict in sorted(run["verdicts"].items()):
        case = run["cases"][index]
        outcome = verdict["outcome"]
        counts[outcome] += 1
        counts[f"{case['kind']}:{outcome}"] += 1
        counts[f"op:{case['op']}"] += 1
        if outcome == "refused":
            counts[f"refused by {verdict['error']}"] += 1
        if outcome == "FAIL":
            failures.append(f"[{index}] {case['op']} {case['kind']} ({case['detail']}; {case['args']}): {verdict['why']}"
                            f"\n    rerun: python tests/_fuzz_cases.py {run['seed']} {run['count']} --only {index}")
    return counts, failures


# Kinds refused on the CPU that CUDA kernels handle as documented instead: a slot past the cache is
# skipped like padding there (finding it would cost a host sync per call), and judged so.
_CUDA_SKIPS = ("slot_out_of_range",)


def _check(run: dict, *, pairs: list[tuple[str, str]] | None, device: str = "cpu") -> collections.Counter:
    """No failure; with ``pairs``: each of them ran, and every kind gave what it must somewhere."""
    counts, failures = _summarize(run)
    total = len(run["verdicts"])
    refusals = {k: v for k, v in counts.items() if k.startswith("refused by")}
    print(f"\nfuzz: {total} cases, {counts['match']} matched, {counts['refused']} refused "
          f"({refusals}), {counts['meta']} meta, {counts['FAIL']} failed")
    assert not failures, f"{len(failures)} of {total} fuzz cases failed:\n" + "\n".join(failures[:30])
    assert "ERROR" not in run["stderr"], f"ERROR log lines for bad input:\n{run['stderr'][-2000:]}"
    assert all(counts[f"op:{name}"] for name in OPS), "an example op was never called"
    if pairs is not None:
        ran = {(c["op"], c["kind"]) for c in run["cases"].values()}
        missing = [p for p in pairs if p not in ran]
        assert not missing, f"kinds that fit an op found no case for it: {missing} (no case drawn: {run['na']})"
        for kind, expect in KINDS.items():
            if expect in ("match", "either") and kind not in ("wrong_rank", "shape_mismatch", "broadcast",
                                                               "mixed_dtype", "slots_length"):
                assert counts[f"{kind}:match"] >= 1, f"no {kind!r} case matched"
            if expect == "refuse" and device == "cuda" and kind in _CUDA_SKIPS:
                assert counts[f"{kind}:match"] >= 1, f"no {kind!r} case matched the documented skip"
            elif expect == "refuse":
                assert counts[f"{kind}:refused"] >= 1, f"no {kind!r} case was refused"
    assert counts["match"] >= total // 4 and counts["refused"] >= total // 5, counts
    return counts


@pytest.fixture(scope="module")
def default_run(native):
    pairs = _pairs("cpu", native)
    start = time.perf_counter()
    run = _run(DEFAULT_SEED, len(pairs), timeout=600, native_flag=native)
    print(f"\nfuzz: {len(pairs)} cases in {time.perf_counter() - start:.1f} s")
    return run, pairs


def test_fuzz_every_kind_on_every_example_op(default_run):
    run, pairs = default_run
    _check(run, pairs=pairs)


def test_fuzz_a_case_is_the_same_alone_and_in_another_process(default_run, native):
    """Every 6th case of the default run, rerun alone in a fresh process with another hash seed:
    the same case (arguments, detail) and the same verdict."""
    run, pairs = default_run
    sample = list(range(0, len(pairs), 6))
    again = _run(DEFAULT_SEED, len(pairs), timeout=300, native_flag=native, only=sample, hash_seed="12345")
    assert sorted(again["verdicts"]) == sample
    for index in sample:
        first, second = run["cases"][index], again["cases"][index]
        assert first == second, f"case {index} differs:\n{first}\n{second}"
        v1, v2 = run["verdicts"][index], again["verdicts"][index]
        assert (v1["outcome"], v1.get("error")) == (v2["outcome"], v2.get("error")), (index, first, v1, v2)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fuzz_long(seed, native):
    """2,000 cases per seed (every applicable pair, then random ones): 6,000 in all."""
    _check(_run(seed=seed, count=2000, timeout=3600, native_flag=native), pairs=_pairs("cpu", native))


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_gpu_fuzz_every_example_op(native):
    """The same kinds on CUDA tensors (index bounds and overlap reach the GPU kernels; the threads
    cases serve every op's kernels through the native replay), every pair, then random cases."""
    pairs = _pairs("cuda", native)
    _check(_run(seed=DEFAULT_SEED, count=len(pairs) + 50, timeout=560, native_flag=native, device="cuda"),
           pairs=pairs, device="cuda")


@pytest.mark.gpu
def test_gpu_host_cost_per_call_with_the_checks():
    """Host cost per eager call of the native replay, plain and with a parameter that requires
    grad under no_grad (the inference case; the autograd branch must not be taken): printed for
    the report (timing is printed, never asserted: benchmarks/bench_host_overhead.py is the measure)."""
    import timeit

    from kernelgraft.examples.add_relu import add_relu
    from kernelgraft.examples.fp8_kcache_scatter import _case, fp8_kcache_scatter

    x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    w = torch.nn.Parameter(torch.randn(4096, device="cuda"))
    k, cache, slots = _case("cuda", torch.bfloat16, 16, 128, 128, 64, 2)
    calls = {
        "add_relu": lambda: add_relu(x, y),
        "add_relu(param) under no_grad": lambda: add_relu(w, y),
        "fp8_kcache_scatter (overlap guard)": lambda: fp8_kcache_scatter(k, cache, slots, 128, ""),
    }
    costs = {}
    for name, call in calls.items():
        with torch.no_grad():
            for _ in range(200):
                call()
            torch.cuda.synchronize()
            costs[name] = min(timeit.repeat(call, number=2000, repeat=5)) / 2000 * 1e6
        torch.cuda.synchronize()
    print("\nhost cost per call (us): " + ", ".join(f"{n} {c:.2f}" for n, c in costs.items()))
    assert set(costs) == set(calls)
