"""Inductor's in-graph choice (graft._inline): inside a graph Inductor compiles, an op whose kernel
does not beat Inductor's code for its reference by more than the kernel's call costs gives way to
the reference, traced into the graph; and the op's own torch:compile candidate is never rewritten
into a call of the op by an active pattern graft. CPU: Inductor's C++ backend, kernels through
Triton's interpreter, a fake timer that says GPU and host times."""

from __future__ import annotations


import pytest
import torch
import torch._inductor.config as inductor_config
from torch._inductor.utils import run_and_get_code

import kernelgraft as kg
from kernelgraft.op import compete as _compete
from kernelgraft.graft import inline as _inline

from _tune_ops import FAKE_MS, launch_scale, make_scale  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELGRAFT_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("KERNELGRAFT_TUNE", "KERNELGRAFT_COMPETE", "KERNELGRAFT_INLINE"):
        monkeypatch.delenv(var, raising=False)
    kg.tune.clear()
    torch._dynamo.reset()
    yield
    kg.tune.clear()
    torch._dynamo.reset()


def timer(compile_gpu_ms: float, kernel_host_ms: float, torch_host_ms: float = 3.0):
    """Kernels by BLOCK (256: 1.0 ms of GPU time; 1.0 ms without one), torch:eager 5 ms, torch:compile at
    ``compile_gpu_ms``; host time per call ``kernel_host_ms`` for kernels, else ``torch_host_ms``.
    Every trial runs once, so what is timed really runs."""

    def time(trial, settings):
        trial.run(0)
        if _compete.is_torch(trial.candidate):
            return {"eager": 5.0, "compile": compile_gpu_ms}[trial.candidate.impl.name]
        return FAKE_MS.get(trial.candidate.config.as_dict().get("BLOCK"), 1.0)  # 1 ms: other ops' configs

    time.host_ms = lambda trial: torch_host_ms if _compete.is_torch(trial.candidate) else kernel_host_ms
    return time


def compiled_code(fn, *args):
    torch._dynamo.reset()
    with torch.no_grad(), inductor_config.patch(fx_graph_cache=False):
        return run_and_get_code(lambda: torch.compile(fn)(*args))


def test_entries_record_gpu_and_host_time_and_the_score():
    op = make_scale("tin::parts")
    x = torch.randn(1000)
    with kg.tune("on", timer=timer(1.2, 0.5), compete=True):
        op(x)
        d = kg.tune.decision(op, x)
    by = {(e["backend"], e["impl_name"], e["config"].get("BLOCK")): e for e in d.ranking}
    kernel = by[("triton", "launch_scale", 256)]
    assert (kernel["ms"], kernel["gpu_ms"], kernel["host_ms"]) == (1.0, 1.0, 0.5)  # the host is not scored
    comp = by[("torch", "compile", None)]
    assert (comp["ms"], comp["gpu_ms"], comp["host_ms"]) == (3.0, 1.2, 3.0)  # scored by max(GPU, host)
    assert d.ranking[0] is kernel  # eagerly, the kernel serves


@pytest.mark.parametrize("kernel_host_ms, inlined", [(1.5, True), (0.5, False)])
def test_the_reference_is_inlined_only_where_the_kernel_call_takes_longer_than_inductors_code(
        kernel_host_ms, inlined):
    """torch:compile 1.2 ms of GPU time against the kernel's 1.0 ms: with 1.5 ms of host time per
    kernel launch (a call takes max(1.0, 1.5) in a stream of calls) Inductor's code serves the
    graph, with 0.5 ms the kernel does (1.0 < 1.2). Eager calls are served by the kernel either way
    (torch:compile scores 3 ms with its host time)."""
    op = make_scale(f"tin::choice{int(inlined)}")
    choice = choose_in_a_compile(op, timer(1.2, kernel_host_ms), "triton:launch_scale[BLOCK=256]", inlined)
    assert ("Inductor's code for the reference serves it" if inlined else "launch_scale serves it") in choice
    assert "1200.00 us of GPU time" in choice


def choose_in_a_compile(op, time, serves: str, inlined: bool) -> str:
    """Tune ``op`` eagerly (``serves`` wins), compile a graph calling it, check that the op's call
    is in Inductor's code unless ``inlined``; the choice's reason."""
    x = torch.randn(1000)
    with kg.tune("on", timer=time, compete=True):
        op(x)  # tuned before compiling: tuning cannot run inside a compile
        assert op.dispatcher.plan_for((x,)).candidate.label == serves
        got, code = compiled_code(lambda t: op(t) + 1.0, x)
    torch.testing.assert_close(got, x * 2 + 1)
    assert (op.name.replace("::", ".") in "\n".join(code)) is not inlined
    (choice,) = [v for k, v in _inline.choices().items() if k[0] == op.name]
    assert choice[0] is inlined
    return choice[1]


@pytest.mark.parametrize("eager_host_ms, inlined", [(3.0, True), (0.2, False)])
def test_where_the_eager_reference_serves_it_is_what_inductors_code_is_weighed_against(eager_host_ms, inlined):
    """The eager reference won the tuning (0.5 ms of GPU time, faster than every kernel): the choice
    weighs torch:compile (0.6 ms) against what serves the calls, the eager reference's GPU time and
    its host time per call, not against the best kernel."""
    op = make_scale(f"tin::eagerwins{int(inlined)}")
    t = timer(0.6, kernel_host_ms=0.1)

    def time(trial, settings):
        got = t(trial, settings)
        return 0.5 if _compete.is_torch(trial.candidate) and trial.candidate.impl.name == "eager" else got

    time.host_ms = lambda trial: eager_host_ms if _compete.is_torch(trial.candidate) else 0.1
    assert "torch:eager 500.00 us of GPU time" in choose_in_a_compile(op, time, "torch:eager", inlined)


def test_untuned_shapes_and_switches_keep_the_op(monkeypatch):
    op = make_scale("tin::keep")
    x = torch.randn(1000)
    with kg.tune("on", timer=timer(0.5, 0.5), compete=True):
        assert _inline.choose(op, (torch.randn(77),)) == (
            False, "not tuned for these inputs yet (call the op once, or kg.graft with example_inputs, "
                   "before compiling)")
        got, code = compiled_code(lambda t: op(t) * 3.0, torch.randn(77))  # never tuned: kept
        assert "tin.keep" in "\n".join(code)
        assert _inline.choose(op, (torch.randn(77),))[0] is True  # the compiled call tuned it: next time
        op(x)
        assert _inline.choose(op, (x,))[0] is True
        monkeypatch.setenv("KERNELGRAFT_INLINE", "0")
        assert _inline.choose(op, (x,)) == (False, "KERNELGRAFT_INLINE=0")
        got, code = compiled_code(lambda t: op(t) * 3.0, x)
        assert "tin.keep" in "\n".join(code)
        torch.testing.assert_close(got, x * 6)
    monkeypatch.delenv("KERNELGRAFT_INLINE")
    with kg.tune(compete=False):
        inline, why = _inline.choose(op, (x,))
        assert not inline and "does not compete" in why
    with kg.tune("off"):
        assert _inline.choose(op, (x,)) == (False, "tuning is off (kg.tune(mode='off'))")


def test_a_tuple_returning_op_inlines_each_output():
    from kernelgraft.examples.rmsnorm_residual import rmsnorm_residual

    x, r, w = torch.randn(8, 64), torch.randn(8, 64), torch.randn(64)
    with kg.tune("on", timer=timer(0.1, 0.5), compete=True):
        rmsnorm_residual(x, r, w, 1e-6)

        def fn(a, b, c):
            y, s = rmsnorm_residual(a, b, c, 1e-6)
            return y * 2.0, s - 1.0

        (y, s), code = compiled_code(fn, x, r, w)
    assert "rmsnorm_residual" not in "\n".join(code)
    (choice,) = [v for k, v in _inline.choices().items() if k[0] == rmsnorm_residual.name]
    assert choice[0] is True and "launch_rmsnorm_residual 1000.00 us of GPU time" in choice[1]
    ref_y, ref_s = rmsnorm_residual.reference(x, r, w, 1e-6)
    torch.testing.assert_close(y, ref_y * 2.0)
    torch.testing.assert_close(s, ref_s - 1.0)


def test_an_active_pattern_graft_does_not_rewrite_its_ops_own_compiled_reference():
    """With ``silu(g) * u`` grafted onto swiglu, Inductor compiling swiglu's reference for its
    torch:compile candidate matched the pattern and called swiglu inside it: tuning recursed
    until RecursionError and torch:compile stopped competing (H200, 2026-12-02)."""
    from kernelgraft.examples.swiglu import swiglu, swiglu_pattern

    class MLP(torch.nn.Module):
        def forward(self, g, u):
            return swiglu_pattern(g, u) * 2

    g, u = torch.randn(16, 32), torch.randn(16, 32)
    model = MLP()
    kg.graft(model, pattern=swiglu_pattern, replacement=swiglu, example_inputs=(g, u))
    try:
        with kg.tune("on", timer=timer(0.9, 0.5), compete=True), inductor_config.patch(fx_graph_cache=False):
            swiglu(g, u)
            assert swiglu.dispatcher.compile_state.error is None
            d = kg.tune.decision(swiglu, g, u)
            assert ("torch", "compile") in {(e["backend"], e["impl_name"]) for e in d.ranking}
    finally:
        kg.ungraft(model)


def test_graft_with_example_inputs_tunes_the_op_so_the_compiled_model_can_choose():
    op = make_scale("tin::grafted")

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.twice = Double()

        def forward(self, x):
            return self.twice(x) + 1.0

    model, x = Model(), torch.randn(1000)
    try:
        with kg.tune("on", timer=timer(1.2, 1.5), compete=True):
            assert kg.graft(model, {Double: op}, example_inputs=(x,)).verified is True
            assert kg.tune.decision(op, x) is not None  # tuned by the graft, not by a first call
            got, code = compiled_code(model, x)
        assert "tin.grafted" not in "\n".join(code)
        torch.testing.assert_close(got, x * 2 + 1)
    finally:
        kg.ungraft(model)


def test_aotinductor_compiles_keep_every_op_and_jit_compiles_inline_it():
    from torch._inductor.virtualized import V

    op = make_scale("tin::aot")
    x = torch.randn(1000)

    def graph() -> torch.fx.Graph:
        return _one_call_graph(op, x)[0]

    with kg.tune("on", timer=timer(0.5, 0.5), compete=True):
        op(x)
        with V.set_aot_compilation(True):
            kept = graph()
            assert _inline.inline_pass(kept) == 0
        assert any(n.target is op.overload for n in kept.nodes)
        inlined = graph()
        assert _inline.inline_pass(inlined) == 1
    assert not any(n.target is op.overload for n in inlined.nodes)
    assert torch.fx.GraphModule(torch.nn.Module(), inlined)(x).equal(x * 2)


def _one_call_graph(op, x: torch.Tensor) -> tuple[torch.fx.Graph, torch.fx.Node]:
    g = torch.fx.Graph()
    p = g.placeholder("x")
    p.meta["val"] = x
    call = g.call_function(op.overload, (p,))
    call.meta["val"] = torch.empty_like(x)
    g.output(call)
    return g, call


@pytest.mark.parametrize("reference, why", [
    (lambda x: x.view(8, 8).t().t().reshape(-1), "returns a view of an input"),
    (lambda x: x.mul_(1), "writes a tensor in place"),  # returns its (written) input
    (lambda x: (x.mul_(2) + 0.0), "writes a tensor in place"),
])
def test_a_reference_that_aliases_or_writes_an_input_is_not_inlined(reference, why):
    """The op's outputs are fresh and its inputs untouched; a reference that returns a view of an
    input or writes one in place would, inlined, alias or mutate inside the user's graph."""

    def ref(x: torch.Tensor) -> torch.Tensor:
        return reference(x)

    op = kg.op(ref, name=f"tin::alias{abs(hash(why)) % 1000}{len(why)}",
               impls=[kg.triton(launch_scale, configs=[{"BLOCK": 256}])])
    x = torch.randn(64)
    g, call = _one_call_graph(op, x)
    reason = _inline._inline(g, call, op)
    assert isinstance(reason, str) and why in reason
    assert any(n is call for n in g.nodes)  # left as it was


def test_a_failing_choice_never_breaks_the_compile(monkeypatch):
    op = make_scale("tin::robust")
    x = torch.randn(1000)

    def broken(*args):
        raise RuntimeError("planted")

    with kg.tune("on", timer=timer(0.5, 0.5), compete=True):
        op(x)
        monkeypatch.setattr(_inline, "choose", broken)
        got, code = compiled_code(lambda t: op(t) * 3.0, x)
    assert "tin.robust" in "\n".join(code)
    torch.testing.assert_close(got, x * 6)


def test_choices_follow_kg_tune_clear():
    op = make_scale("tin::clear")
    x = torch.randn(1000)
    with kg.tune("on", timer=timer(0.5, 0.5), compete=True):
        op(x)
        assert _inline.choose(op, (x,))[0] is True
        kg.tune.clear(disk=True)  # memory only would find it again on disk
        assert _inline.choose(op, (x,))[0] is False  # no decision now: not tuned yet


def test_a_users_own_post_grad_passes_keep_running_beside_kernelgraft():
    """The setting may hold a list of passes, some inference-aware (called with is_inference):
    kernelgraft adds its pass to the list and takes only its own out, so Inductor runs the user's
    as it would without kernelgraft."""
    from torch._inductor.custom_graph_pass import CustomGraphPass, CustomInferenceAwareGraphPass

    seen: list[str] = []

    class Plain(CustomGraphPass):
        def __call__(self, graph):
            seen.append("plain")

        def uuid(self):
            return "plain"

    class Aware(CustomInferenceAwareGraphPass):
        def __call__(self, graph, is_inference):
            seen.append(f"aware:{is_inference}")

        def uuid(self):
            return "aware"

    mine = [Plain(), Aware()]
    # (config.patch, not monkeypatch: undoing a setting Inductor's config module holds deletes it)
    with inductor_config.patch(post_grad_custom_post_pass=list(mine)):
        _inline._SLOT.install()
        assert inductor_config.post_grad_custom_post_pass[:2] == mine and _inline._SLOT.installed()
        op = make_scale("tin::beside")
        x = torch.randn(1000)
        with kg.tune("on", timer=timer(0.5, 0.5), compete=True):
            op(x)
            got, code = compiled_code(lambda t: op(t) + 1.0, x)
        torch.testing.assert_close(got, x * 2 + 1)
        assert "tin.beside" not in "\n".join(code)  # kernelgraft's pass ran too
        assert seen[-2:] == ["plain", "aware:True"]  # (the reference's own compile, for torch:compile, ran them too)
        _inline._SLOT.uninstall()
        assert inductor_config.post_grad_custom_post_pass == mine
