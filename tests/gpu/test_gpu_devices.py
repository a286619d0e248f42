"""Every example op, every backend it has, on a GPU that is not the current one.

Tensors on ``cuda:1`` while the current device is 0, and on ``cuda:0`` while it is 1, alternating:
eager through the Python path (every supported candidate forced with ``op.run``), through the
native replay (one op per impl, called several times per signature), tuned (``kg.tune("on")``
with a fresh cache), and captured in a CUDA graph on ``cuda:1`` and replayed. Every output is
compared with the op's reference run on CPU copies (float64 where the reference accepts it; in the
inputs' own dtypes, and exactly, for ops with integer or 8-bit outputs). Run with ``-s``: each test
prints one line per op and backend, the evidence kept with a run's results.

    pytest -m gpu -s tests/gpu/test_gpu_devices.py      # needs two GPUs
"""

from __future__ import annotations

import importlib
import dataclasses
import itertools
from collections import defaultdict

import pytest
import torch

import kernelgraft as kg
from kernelgraft.examples import MODULES

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"
    ),
]

# (device of the tensors, device made current): the tensors are never on the current device
CROSSINGS = ((1, 0), (0, 1))
_EXACT = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool)
_TOL = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float64: 1e-6}


def _op(name: str):
    return getattr(importlib.import_module(f"kernelgraft.examples.{name}"), name)


def _samples(name: str, limit: int | None = None) -> list[tuple]:
    """The example's sample inputs, made on the CPU with a fixed seed (moved to a GPU per use)."""
    module = importlib.import_module(f"kernelgraft.examples.{name}")
    torch.manual_seed(0)
    samples = [tuple(s) for s in module.sample_inputs("cpu")]
    if limit is not None and len(samples) > limit:  # first, middle and last: sizes and dtypes vary
        picks = sorted({0, len(samples) // 2, len(samples) - 1})[:limit]
        samples = [samples[i] for i in picks]
    return samples


def _to(args: tuple, device: str | torch.device, dtype64: bool = False) -> tuple:
    def move(a):
        if isinstance(a, torch.Tensor):
            a = a.detach().to(device).clone()
            return a.double() if dtype64 and a.is_floating_point() else a
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            return type(a)(move(t) for t in a)
        return a

    return tuple(move(a) for a in args)


def _mutated(op) -> list[int]:
    return [i for i, p in enumerate(op.signature.params) if p.mutated]


def _results(op, args: tuple, out) -> list[torch.Tensor]:
    """What a call produced: its outputs, then the arguments it mutates."""
    outs = [] if out is None else [out] if isinstance(out, torch.Tensor) else list(out)
    return outs + [args[i] for i in _mutated(op)]


def _expected(op, sample: tuple) -> list[torch.Tensor]:
    """The reference's results on CPU copies: float64 unless an output is integer/8-bit (then the
    inputs' own dtypes, compared exactly) or the reference refuses float64."""
    args = _to(sample, "cpu")
    plain = _results(op, args, op.reference(*args))
    if any(t.dtype in _EXACT for t in plain):
        return plain
    try:
        args64 = _to(sample, "cpu", dtype64=True)
        return _results(op, args64, op.reference(*args64))
    except Exception:  # a reference that only runs in its inputs' dtypes
        return plain


def _compare(got: list[torch.Tensor], want: list[torch.Tensor], where: str, op=None, sample=None) -> None:
    if op is not None and op.compare:  # outputs with more than one right answer: the op's own rules
        from kernelgraft.verify import oracle as _verify

        verdict = _verify.verify(_verify.reference(op, _to(sample, "cpu")), [g.detach().cpu() for g in got],
                                 op.tolerances)
        assert verdict.ok, f"{where}: {verdict}"
        return
    assert len(got) == len(want), f"{where}: {len(got)} results, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        g = g.detach().cpu()
        if g.dtype in _EXACT or w.dtype in _EXACT:
            torch.testing.assert_close(g, w.to(g.dtype), rtol=0, atol=0, msg=lambda m: f"{where}[{i}]: {m}")
            continue
        tol = _TOL.get(g.dtype, 1e-2)
        scale = max(1.0, float(w.abs().max())) if w.numel() else 1.0
        torch.testing.assert_close(g.double(), w.double(), rtol=tol, atol=tol * scale,
                                   msg=lambda m: f"{where}[{i}]: {m}")


def _crossings(n: int):
    """``n`` (tensor device, current device) pairs, alternating."""
    return itertools.islice(itertools.cycle(CROSSINGS), n)


@pytest.fixture(autouse=True)
def _device_zero():
    torch.cuda.set_device(0)
    yield
    torch.cuda.set_device(0)


_TWINS: dict[tuple[str, int], object] = {}


def _runs_here(op, index: int, config, sample) -> bool:
    """Whether a config launches on this GPU: a Triton config may need more shared memory than an
    H200 has, which only its compile tells (the tuner excludes it the same way)."""
    try:
        op.run(*_to(sample, "cuda:0"), impl=index, config=config.as_dict())
        return True
    except kg.LaunchError as exc:
        assert "out of resource" in str(exc), exc  # the candidate says why it cannot run
        return False


def _twin(name: str, index: int):
    """A copy of example op ``name`` with only its ``index``-th impl, restricted to the configs that
    launch on this GPU, so its default plan (and the native replay recorded from it) runs that
    backend."""
    key = (name, index)
    if key not in _TWINS:
        op = _op(name)
        spec = op.impls[index]
        sample = _samples(name, limit=1)[0]
        supported = {c.config for c in op.candidates(*_to(sample, "cuda:0")) if c.index == index and c.supported}
        configs = [c for c in spec.configs if c not in supported or _runs_here(op, index, c, sample)]
        spec = dataclasses.replace(spec, configs=[c.as_dict() for c in configs] or spec.configs)
        mutates = tuple(op.signature.params[i].name for i in _mutated(op))
        _TWINS[key] = kg.op(f"kgdevices::{name}_{index}", impls=[spec], mutates_args=mutates,
                            fallback="error")(op.reference)
    return _TWINS[key]


def _report(title: str, counts: dict) -> None:
    print(f"\n[{title}]")
    for (op, backend), n in sorted(counts.items()):
        if backend.endswith("(too big here)"):
            print(f"  {op:<22} {backend.split()[0]:<9} {n} calls refused: the config needs more shared memory")
        else:
            print(f"  {op:<22} {backend:<9} {n} calls match the reference")


@pytest.mark.parametrize("name", MODULES)
def test_every_candidate_on_the_other_device_python_path(name):
    op = _op(name)
    counts: dict = defaultdict(int)
    for sample, (data, current) in zip(_samples(name, limit=3) * 2, _crossings(6)):
        want = _expected(op, sample)
        args = _to(sample, f"cuda:{data}")
        torch.cuda.set_device(current)
        for cand in op.candidates(*args):
            if not cand.supported:
                continue
            args = _to(sample, f"cuda:{data}")  # fresh: mutated arguments start from the sample
            try:
                out = op.run(*args, impl=cand.index, config=cand.config.as_dict())
            except kg.LaunchError as exc:  # more shared memory than the GPU has: it says so
                assert "out of resource" in str(exc), exc
                counts[(name, cand.impl.backend + " (too big here)")] += 1
                continue
            assert torch.cuda.current_device() == current, "the call changed the current device"
            _compare(_results(op, args, out), want, f"{cand.label} on cuda:{data}, current {current}", op, sample)
            counts[(name, cand.impl.backend)] += 1
    assert counts, f"{name}: no candidate ran"
    _report("python path, every candidate", counts)


@pytest.mark.parametrize("name", MODULES)
def test_each_backend_through_the_native_replay_on_the_other_device(name):
    from kernelgraft import native as _native

    assert _native.load() is not None, f"the native replay is not available: {_native.reason()}"
    op = _op(name)
    counts: dict = defaultdict(int)
    replayed: dict = defaultdict(int)
    with kg.tune("off"):
        for index, spec in enumerate(op.impls):
            twin = _twin(name, index)
            for sample, (data, current) in zip(_samples(name, limit=3) * 2, _crossings(6)):
                want = _expected(op, sample)
                args = _to(sample, f"cuda:{data}")
                torch.cuda.set_device(current)
                if not any(c.supported for c in twin.candidates(*args)):
                    continue
                for _ in range(4):  # the second call records, the later ones replay
                    args = _to(sample, f"cuda:{data}")
                    out = twin(*args)
                    assert torch.cuda.current_device() == current
                    _compare(_results(op, args, out), want, f"{spec.backend}:{spec.display_name} "
                             f"(native) on cuda:{data}, current {current}", op, sample)
                    counts[(name, spec.backend)] += 1
            for plan in twin.dispatcher.plans().values():
                state = getattr(plan, "native", None)
                if state is not None and state.get("replay") is not None:
                    replayed[(name, spec.backend)] += state["replay"].stats()["calls"]
    assert counts, f"{name}: no backend ran"
    _report("native replay, each impl", counts)
    for (op_name, backend), n in sorted(replayed.items()):
        print(f"  {op_name:<22} {backend:<9} {n} calls replayed natively")


@pytest.mark.parametrize("name", MODULES)
def test_tuned_on_the_other_device(name, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path))
    kg.tune.clear()
    op = _op(name)
    counts: dict = defaultdict(int)
    with kg.tune("on", budget=20.0):
        for sample, (data, current) in zip(_samples(name, limit=2) * 2, _crossings(4)):
            want = _expected(op, sample)
            torch.cuda.set_device(current)
            for _ in range(2):  # the first call tunes this fresh signature, the second uses it
                args = _to(sample, f"cuda:{data}")
                out = op(*args)
                assert torch.cuda.current_device() == current
                _compare(_results(op, args, out), want, f"{name} tuned on cuda:{data}, current {current}", op, sample)
            plan = op.dispatcher.plan_for(args)
            chosen = getattr(getattr(plan, "candidate", None), "impl", None)
            counts[(name, chosen.backend if chosen is not None else "reference")] += 2
    kg.tune.clear()
    _report("tuned", counts)


@pytest.mark.parametrize("name", MODULES)
def test_each_backend_captured_in_a_cuda_graph_on_cuda1(name):
    op = _op(name)
    counts: dict = defaultdict(int)
    sample = _samples(name, limit=3)[-1]
    with kg.tune("off"):
        for index, spec in enumerate(op.impls):
            twin = _twin(name, index)
            static = _to(sample, "cuda:1")
            if not any(c.supported for c in twin.candidates(*static)):
                continue
            torch.cuda.set_device(0)
            with torch.cuda.device(1):
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):  # compile, record the replay, replay: nothing new in capture
                        twin(*_to(sample, "cuda:1"))
                torch.cuda.current_stream().wait_stream(side)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                # an explicit capture stream of cuda:1 (torch's default one belongs to whichever
                # device captured first in this process)
                with torch.cuda.graph(graph, stream=side):
                    out = twin(*static)
                # new values (same shapes) into the static inputs, then replay twice
                fresh = _to(sample, "cuda:1")
                for dst, src in zip(static, fresh):
                    if isinstance(dst, torch.Tensor):
                        if dst.is_floating_point():
                            src = torch.randn_like(src)
                        dst.copy_(src)
                new_sample = _to(static, "cpu")
                graph.replay()
                for i in _mutated(op):  # a mutating op starts again from the new values
                    static[i].copy_(new_sample[i].to("cuda:1"))
                graph.replay()
                torch.cuda.synchronize(1)
            assert torch.cuda.current_device() == 0
            _compare(_results(op, static, out), _expected(op, new_sample),
                     f"{spec.backend}:{spec.display_name} graph-replayed on cuda:1", op, new_sample)
            counts[(name, spec.backend)] += 1
            del graph
    assert counts, f"{name}: no backend was captured"
    _report("CUDA graph on cuda:1", counts)


def test_every_cuda_context_is_healthy_at_the_end():
    for d in range(torch.cuda.device_count()):
        torch.cuda.synchronize(d)
        x = torch.arange(1024, device=f"cuda:{d}", dtype=torch.float32)
        assert float((x * 2).sum()) == 2 * 1023 * 1024 / 2
    print(f"\n[context] {torch.cuda.device_count()} devices synchronize and compute after the run")
