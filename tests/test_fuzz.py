"""Bad input never reaches a kernel: a seeded fuzz run over every example op (issue 16).

The cases (``_fuzz_cases.py``) run in a child process, so a crash (a kernel writing out of bounds,
an abort) fails the test with the case that caused it instead of killing pytest. Every call must
match the reference under ``kernelgraft._verify`` or be refused with a kernelgraft error naming the
op (and the bad argument); the counts are printed and every kind of case must have been exercised.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import kernelgraft as kg

sys.path.insert(0, str(Path(__file__).parent))
from _fuzz_cases import KINDS, OPS  # noqa: E402

_HERE = Path(__file__).parent


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


# ------------------------------------------------------------------ the fixes the fuzzer asked for
def test_backward_through_an_op_without_one_raises_naming_it():
    from kernelgraft.examples.add_relu import add_relu

    g = torch.randn(3, 4, requires_grad=True)
    out = add_relu(g, g)
    assert out.requires_grad
    with pytest.raises(kg.UnsupportedError, match=r"kgexamples::add_relu has no backward.*register_autograd"):
        out.sum().backward()
    assert g.grad is None
    with torch.no_grad():
        assert not add_relu(g, g).requires_grad
    with torch.inference_mode():
        assert torch.equal(add_relu(g, g), torch.relu(2 * g.detach()))


def test_compiled_inference_with_parameters_works_and_backward_raises():
    from kernelgraft.examples.add_relu import add_relu

    w = torch.nn.Parameter(torch.randn(3, 4))
    x = torch.randn(3, 4)
    f = torch.compile(lambda w, x: add_relu(w, x) * 2, backend="aot_eager", fullgraph=True)
    out = f(w, x)
    assert torch.equal(out.detach(), torch.relu(w.detach() + x) * 2)
    with pytest.raises(kg.UnsupportedError, match="kgexamples::add_relu has no backward"):
        out.sum().backward()
    with torch.no_grad():
        assert torch.equal(f(w, x), torch.relu(w.detach() + x) * 2)


def test_a_backward_registered_later_replaces_the_refusal():
    @kg.op("fuzztest::double")
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    x = torch.randn(4, requires_grad=True)
    with pytest.raises(kg.UnsupportedError, match="fuzztest::double has no backward"):
        double(x).sum().backward()
    double.register_autograd(lambda ctx, grad: grad * 2)
    double(x).sum().backward()
    assert torch.equal(x.grad, torch.full((4,), 2.0))


def test_shape_mismatch_is_an_input_error_without_error_logs(caplog):
    from kernelgraft.examples.add_relu import add_relu

    with caplog.at_level(logging.DEBUG):
        with pytest.raises(kg.InputError, match=r"kgexamples::add_relu: .*\(5,\).*shapes do not fit together"):
            add_relu(torch.randn(3, 4), torch.randn(5))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_an_output_that_cannot_be_allocated_is_refused():
    from kernelgraft.examples.rmsnorm import rmsnorm

    x = torch.zeros(1, 64).expand(2**36, 64)
    with pytest.raises(kg.InputError, match=r"kgexamples::rmsnorm: output 0 would be .* TiB, more than"):
        rmsnorm(x, torch.ones(64), 1e-6)


def test_bf16_gemm_on_the_interpreter_matches_and_check_sees_bf16():
    from kernelgraft import _verify
    from kernelgraft.examples.gemm import gemm, sample_inputs

    samples = list(sample_inputs("cpu"))
    assert any(a.dtype == torch.bfloat16 for a, _ in samples)
    assert any(not torch.isfinite(a).all() for a, _ in samples)
    for a, b in samples:
        ref = _verify.reference(gemm, (a, b))
        verdict = _verify.verify(ref, [gemm.run(a, b, impl=0)], gemm.tolerances)
        assert verdict.ok, (tuple(a.shape), a.dtype, str(verdict))


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
