"""Bad input never reaches a kernel: a seeded fuzz run over every example op.

The cases (``_fuzz_cases.py``) run in a child process, so a crash (a kernel writing out of bounds,
an abort) fails the test with the case that caused it instead of killing pytest. Every call must
match the reference under ``kernelgraft.verify.oracle`` or be refused with a kernelgraft error naming the
op (and the bad argument); the counts are printed and every kind of case must have been exercised.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import kernelgraft as kg

from _fuzz_cases import KINDS, OPS  # noqa: E402
from _paths import TESTS

_HERE = TESTS


def _run(seed: int, count: int, timeout: float, device: str = "cpu") -> dict:
    env = dict(os.environ, KERNELGRAFT_TUNE="off", FUZZ_DEVICE=device,
               PYTHONPATH=os.pathsep.join([str(Path(kg.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(_HERE / "_fuzz_cases.py"), str(seed), str(count)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    cases, verdicts = {}, {}
    for line in proc.stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "case" in record:
            cases[record["case"]] = record
        elif "done" in record:
            verdicts[record["done"]] = record
    unfinished = sorted(set(cases) - set(verdicts))
    if proc.returncode != 0 or unfinished:
        last = cases[unfinished[0]] if unfinished else None
        pytest.fail(f"the fuzz child died (exit {proc.returncode}) during case {last}\n"
                    f"stderr tail:\n{proc.stderr[-3000:]}")
    return {"cases": cases, "verdicts": verdicts, "stderr": proc.stderr}


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
            failures.append(f"{case['op']} {case['kind']} ({case['detail']}; {case['args']}): {verdict['why']}")
    return counts, failures


def _check(run: dict, *, every_kind: bool) -> None:
    counts, failures = _summarize(run)
    total = len(run["verdicts"])
    refusals = {k: v for k, v in counts.items() if k.startswith("refused by")}
    print(f"\nfuzz: {total} cases, {counts['match']} matched, {counts['refused']} refused "
          f"({refusals}), {counts['meta']} meta, {counts['FAIL']} failed")
    assert not failures, f"{len(failures)} of {total} fuzz cases failed:\n" + "\n".join(failures[:30])
    assert "ERROR" not in run["stderr"], f"ERROR log lines for bad input:\n{run['stderr'][-2000:]}"
    assert all(counts[f"op:{name}"] for name in OPS), "an example op was never called"
    if every_kind:
        for kind, expect in KINDS.items():
            seen = sum(counts[f"{kind}:{o}"] for o in ("match", "refused", "meta"))
            assert seen, f"no case of kind {kind!r} ran"
            if expect == "refuse":
                assert counts[f"{kind}:refused"] == seen, kind
            elif expect == "match":
                # good inputs match; only a layout every kernel refuses may be refused instead
                assert counts[f"{kind}:match"] >= 1, f"no {kind!r} case matched"
    assert counts["match"] >= total // 4 and counts["refused"] >= total // 4, counts


def test_fuzz_every_example_op():
    start = time.perf_counter()
    run = _run(seed=16, count=300, timeout=240)
    _check(run, every_kind=True)
    print(f"fuzz: {time.perf_counter() - start:.1f} s")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fuzz_long(seed):
    _check(_run(seed=seed, count=2000, timeout=1800), every_kind=True)


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_gpu_fuzz_every_example_op():
    """The same cases on CUDA tensors (index bounds and overlap reach the GPU kernels)."""
    _check(_run(seed=16, count=400, timeout=600, device="cuda"), every_kind=False)


@pytest.mark.gpu
def test_gpu_host_cost_per_call_with_the_checks():
    """Host cost per eager call of the native replay, plain and with a parameter that requires
    grad under no_grad (the inference case; the autograd branch must not be taken): printed for
    the report, and bounded loosely so a regression to the Python path shows."""
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
    assert all(c < 30 for c in costs.values()), costs
