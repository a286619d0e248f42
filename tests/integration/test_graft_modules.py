"""kg.graft by module type: attribute binding, signature checks, modes, verification, ungraft."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

import kernelgraft as kg
from kernelgraft.examples.rmsnorm import rmsnorm
from kernelgraft.examples.swiglu import swiglu


class MyRMSNorm(torch.nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        h = hidden_states.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(hidden_states.dtype)


class OffsetNorm(MyRMSNorm):
    """Gemma-style (1 + weight): not what rmsnorm computes."""

    def forward(self, hidden_states):
        h = hidden_states.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (1 + self.weight) * h


class Gate(torch.nn.Module):
    def forward(self, gate, up):
        return torch.nn.functional.silu(gate) * up


class Net(torch.nn.Module):
    def __init__(self, n=32):
        super().__init__()
        self.lin = torch.nn.Linear(n, 2 * n)
        self.norm1 = MyRMSNorm(n)
        self.norm2 = MyRMSNorm(n, eps=1e-5)
        self.gate = Gate()

    def forward(self, x):
        h = self.norm1(x)
        g, u = self.lin(h).chunk(2, dim=-1)
        return self.norm2(self.gate(g, u))


def _ops_in(fn, *args) -> set[str]:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return {str(n.target) for g in graphs for n in g.graph.nodes if "kgexamples" in str(n.target)}


def test_graft_replaces_binds_attributes_and_ungrafts():
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(4, 7, 32)
    with torch.no_grad():
        expected = net(x)
    report = kg.graft(net, {MyRMSNorm: rmsnorm}, example_inputs=(x,))
    assert report.count == 2 and set(report.replaced) == {"norm1", "norm2"}
    assert report.verified is True
    with torch.no_grad():
        torch.testing.assert_close(net(x), expected, atol=1e-5, rtol=1e-5)
        assert _ops_in(net, x) == {"kgexamples.rmsnorm.default"}
    # the attribute is read at call time: a changed eps reaches the op
    net.norm2.variance_epsilon = 0.5
    with torch.no_grad():
        h = net.gate(*net.lin(net.norm1(x)).chunk(2, dim=-1))
        torch.testing.assert_close(net.norm2(h), rmsnorm.reference(h, net.norm2.weight, 0.5))
    net.norm2.variance_epsilon = 1e-5
    assert kg.ungraft(net) == 2
    assert "forward" not in net.norm1.__dict__
    with torch.no_grad():
        assert _ops_in(net, x) == set()
        torch.testing.assert_close(net(x), expected)


def test_graft_by_class_name_and_explicit_mapping():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale_vec = torch.nn.Parameter(torch.randn(16))
            self.tiny = 1e-3

        def forward(self, x):
            return rmsnorm.reference(x, self.scale_vec, self.tiny)

    m = torch.nn.Sequential(Odd())
    x = torch.randn(3, 16)
    with pytest.raises(kg.SpecError, match="'weight'.*has no source"):
        kg.graft(m, {"Odd": rmsnorm}, example_inputs=(x,))
    report = kg.graft(m, {"Odd": (rmsnorm, {"weight": "scale_vec", "eps": "tiny"})}, example_inputs=(x,))
    assert report.count == 1
    with torch.no_grad():
        torch.testing.assert_close(m(x), rmsnorm.reference(x, m[0].scale_vec, 1e-3))


def test_incompatible_forward_is_refused():
    class TwoInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(8))
            self.eps = 1e-6

        def forward(self, x, residual):
            return rmsnorm.reference(x + residual, self.weight, self.eps)

    with pytest.raises(kg.SpecError, match="'residual' is required"):
        kg.graft(torch.nn.Sequential(TwoInputs()), {TwoInputs: rmsnorm})


def test_verification_failure_keeps_the_original():
    torch.manual_seed(1)
    m = torch.nn.Sequential(OffsetNorm(32))
    x = torch.randn(5, 32)
    with pytest.warns(kg.GraftWarning, match="verification failed"):
        report = kg.graft(m, {OffsetNorm: rmsnorm}, example_inputs=(x,))
    assert report.count == 0 and "0" in report.kept
    assert "forward" not in m[0].__dict__


def test_verification_without_example_inputs_uses_op_samples():
    m = torch.nn.Sequential(MyRMSNorm(64))  # rmsnorm has a (5, 64) sample
    report = kg.graft(m, {MyRMSNorm: rmsnorm})
    assert report.verified is True and report.count == 1
    bad = torch.nn.Sequential(OffsetNorm(64))
    with pytest.warns(kg.GraftWarning, match="verification failed"):
        assert kg.graft(bad, {OffsetNorm: rmsnorm}).count == 0


def test_training_mode_needs_a_backward():
    net = Net()
    with pytest.warns(kg.GraftWarning, match="no backward"):
        report = kg.graft(net, {MyRMSNorm: rmsnorm, Gate: swiglu}, mode="training")
    assert set(report.replaced) == {"gate"} and set(report.kept) == {"norm1", "norm2"}
    # gradients through the grafted op equal the original's
    x = torch.randn(3, 32, requires_grad=True)
    out = net(x)
    assert _ops_in(net, x) == {"kgexamples.swiglu.default"}
    out.square().sum().backward()
    grads = [p.grad.clone() for p in net.parameters()] + [x.grad.clone()]
    kg.ungraft(net)
    net.zero_grad()
    x.grad = None
    net(x).square().sum().backward()
    for got, want in zip(grads, [p.grad for p in net.parameters()] + [x.grad]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_inference_mode_runs_the_original_when_gradients_are_needed():
    norm = MyRMSNorm(64)
    kg.graft(torch.nn.Sequential(norm), {MyRMSNorm: rmsnorm})
    x = torch.randn(2, 64)
    with pytest.warns(kg.GraftWarning, match="gradients are enabled"):
        out = norm(x)
    assert out.grad_fn is not None and "Mul" in type(out.grad_fn).__name__  # the original ran
    with torch.no_grad():
        assert _ops_in(norm, x) == {"kgexamples.rmsnorm.default"}


def test_compiled_grafted_model_has_no_graph_breaks():
    from torch._dynamo.utils import counters

    net = Net().eval()
    kg.graft(net, {MyRMSNorm: rmsnorm, Gate: swiglu})
    x = torch.randn(2, 5, 32)
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        out = torch.compile(net, backend="aot_eager", fullgraph=True)(x)
        torch.testing.assert_close(out, net(x))
    assert not counters["graph_break"]
    assert counters["stats"]["unique_graphs"] == 1


def test_regraft_is_refused_until_ungrafted():
    m = torch.nn.Sequential(MyRMSNorm(64))
    kg.graft(m, {MyRMSNorm: rmsnorm})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = kg.graft(m, {MyRMSNorm: rmsnorm})
    assert report.count == 0 and "already grafted" in report.kept["0"]
    assert any(issubclass(w.category, kg.GraftWarning) for w in caught)
    kg.ungraft(m)
    assert kg.graft(m, {MyRMSNorm: rmsnorm}).count == 1


class Stack(torch.nn.Module):
    def __init__(self, n, width=16):
        super().__init__()
        self.norms = torch.nn.ModuleList(MyRMSNorm(width) for _ in range(n))

    def forward(self, x):
        for norm in self.norms:
            x = norm(x) + 1
        return x


def _guards(model, x) -> int:
    """How many guards Dynamo installs for the compiled forward (torch._dynamo.explain)."""
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(x)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    return len(explained.out_guards)


def test_a_compiled_grafted_model_has_no_guards_per_grafted_module():
    # Every guard runs on every call of the compiled model, before its first kernel. With the
    # grafted forward set on the instance, Dynamo traced nn.Module.__call__ and guarded that
    # forward and its closure for each module: about 12 more per module here, 25 in a Llama.
    import copy

    x = torch.randn(2, 16)
    extra = {}
    for n in (1, 8):
        plain = Stack(n).eval()
        grafted = copy.deepcopy(plain)
        assert kg.graft(grafted, {MyRMSNorm: rmsnorm}, example_inputs=(x,)).count == n
        extra[n] = _guards(grafted, x) - _guards(plain, x)
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(grafted, backend="eager", fullgraph=True)(x), plain(x),
                                       atol=1e-5, rtol=1e-5)
    # the few globals of the grafted class's forward (the op...), once per compiled frame
    assert extra[8] == extra[1] <= 8, extra


def test_the_grafted_class_stands_in_for_the_modules_own():
    net = Net().eval()
    other = MyRMSNorm(32)
    kg.graft(net, {MyRMSNorm: rmsnorm})
    norm = net.norm1
    assert type(norm) is not MyRMSNorm and isinstance(norm, MyRMSNorm)
    assert type(norm).__name__ == "MyRMSNorm" and type(norm).__qualname__ == MyRMSNorm.__qualname__
    assert type(net.norm2) is type(norm)  # one grafted class per module class and call
    assert type(other) is MyRMSNorm and MyRMSNorm.forward.__name__ == "forward"  # nothing else changed
    assert "forward" not in norm.__dict__ and "MyRMSNorm" in repr(net)
    assert kg.ungraft(net) == 2
    assert type(net.norm1) is MyRMSNorm and type(net.norm2) is MyRMSNorm


def test_every_call_of_a_grafted_forward_gives_the_originals_result():
    # The grafted class's forward serves the common call (the required arguments, positionally)
    # in straight-line code; keyword arguments, a trailing default passed or not, an argument the
    # op cannot take, and attributes by any name or function go through the general forward.
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gain = torch.nn.Parameter(torch.randn(16))
            setattr(self, "eps-value", 1e-5)  # not a Python name

        def forward(self, hidden_states, eps=1e-6, scale=1.0):
            out = rmsnorm.reference(hidden_states, self.gain, eps)
            return out * scale

    m = Scaled()
    mapping = {"weight": "gain"}
    kg.graft(torch.nn.Sequential(m), {Scaled: (rmsnorm, mapping)}, verify=False)
    x = torch.randn(3, 16).t().contiguous().t()  # not dense: the op gets a dense copy
    with torch.no_grad():
        want = rmsnorm.reference(x, m.gain, 1e-6)
        torch.testing.assert_close(m(x), want)
        torch.testing.assert_close(m(hidden_states=x), want)
        torch.testing.assert_close(m(x, 1e-2), rmsnorm.reference(x, m.gain, 1e-2))
        torch.testing.assert_close(m(x, scale=2.0), want * 2)  # the op cannot scale: the original runs
    kg.ungraft(m)

    calls = []
    kg.graft(torch.nn.Sequential(m), {Scaled: (rmsnorm, {"weight": lambda mod: calls.append(1) or mod.gain,
                                                         "eps": "eps-value"})}, verify=False)
    calls.clear()  # the graft read the attributes once to check them
    with torch.no_grad():
        torch.testing.assert_close(m(x), rmsnorm.reference(x, m.gain, 1e-5))
    assert calls == [1]
    kg.ungraft(m)


def test_a_module_with_its_own_instance_forward_keeps_it_under_the_graft():
    norm = MyRMSNorm(32)
    norm.forward = types.MethodType(lambda self, h: MyRMSNorm.forward(self, h) * 1.0, norm)
    kg.graft(torch.nn.Sequential(norm), {MyRMSNorm: rmsnorm})
    assert type(norm) is MyRMSNorm and "forward" in norm.__dict__
    x = torch.randn(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(norm(x), rmsnorm.reference(x, norm.weight, 1e-6), atol=1e-5, rtol=1e-5)
        assert _ops_in(norm, x) == {"kgexamples.rmsnorm.default"}
    kg.ungraft(norm)
    assert norm.__dict__["forward"].__func__.__name__ == "<lambda>"


def test_a_class_that_refuses_a_subclass_gets_the_grafted_forward_on_the_instance():
    class Meta(type):  # a metaclass that needs an argument to make a class
        def __new__(mcls, name, bases, namespace, *, flavor):
            return super().__new__(mcls, name, bases, namespace)

        def __init__(cls, name, bases, namespace, *, flavor):
            super().__init__(name, bases, namespace)

    class Picky(MyRMSNorm, metaclass=Meta, flavor="plain"):
        pass

    norm = Picky(32)
    assert kg.graft(torch.nn.Sequential(norm), {Picky: rmsnorm}, verify=False).count == 1
    assert type(norm) is Picky and "forward" in norm.__dict__
    x = torch.randn(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(norm(x), rmsnorm.reference(x, norm.weight, 1e-6), atol=1e-5, rtol=1e-5)
    kg.ungraft(norm)
    assert "forward" not in norm.__dict__


def test_a_grafted_model_saves_as_the_original_and_a_deep_copy_stays_grafted(tmp_path):
    import copy
    import io

    net = Net().eval()
    kg.graft(net, {MyRMSNorm: rmsnorm})
    x = torch.randn(2, 32)
    # torch.save / pickle: the class it stands in for, so the saved model loads without kernelgraft
    buf = io.BytesIO()
    torch.save(net, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded.norm1) is MyRMSNorm
    # deepcopy: the same class, grafted, and kg.ungraft gives the copy its class back
    twin = copy.deepcopy(net)
    assert type(twin.norm1) is type(net.norm1) and twin.norm1.weight is not net.norm1.weight
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), twin(x), atol=1e-5, rtol=1e-5)
        assert "kgexamples.rmsnorm.default" in _ops_in(twin, x)
    assert kg.graft(twin, {MyRMSNorm: rmsnorm}).count == 0  # already grafted
    assert kg.ungraft(twin) == 2 and type(twin.norm1) is MyRMSNorm
    assert type(net.norm1) is not MyRMSNorm  # the original stays grafted
    kg.ungraft(net)


def test_a_class_with_init_subclass_keeps_its_registry_clean():
    registry = {}

    class Registered(MyRMSNorm):
        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            registry[cls.__name__] = cls

    class Norm(Registered):
        pass

    registry.clear()
    norm = Norm(32)
    assert kg.graft(torch.nn.Sequential(norm), {Norm: rmsnorm}, verify=False).count == 1
    assert registry == {} and type(norm) is Norm and "forward" in norm.__dict__  # the instance path
    kg.ungraft(norm)


def test_ungraft_refuses_a_module_whose_class_was_swapped_again():
    net = Net().eval()
    kg.graft(net, {MyRMSNorm: rmsnorm})
    grafted = type(net.norm1)
    wrapper = type("FSDPMyRMSNorm", (type("FSDPModule", (), {}), grafted), {})  # as fully_shard does
    net.norm1.__class__ = wrapper
    with pytest.warns(kg.GraftWarning, match="set after it was grafted"):
        assert kg.ungraft(net) == 1  # norm2 only
    assert type(net.norm1) is wrapper  # not unwrapped behind the wrapper's back
    net.norm1.__class__ = grafted
    assert kg.ungraft(net) == 1 and type(net.norm1) is MyRMSNorm


def test_keyword_only_forward_parameters_are_never_taken_by_position():
    class KwNorm(MyRMSNorm):
        def forward(self, hidden_states, *, eps=1e-6):
            return rmsnorm.reference(hidden_states, self.weight, eps)

    norm = KwNorm(32)
    kg.graft(torch.nn.Sequential(norm), {KwNorm: rmsnorm}, verify=False)
    x = torch.randn(2, 32)
    with torch.no_grad():
        with pytest.raises(TypeError):
            norm(x, 1e-2)  # as the original refuses it
        torch.testing.assert_close(norm(x, eps=1e-2), rmsnorm.reference(x, norm.weight, 1e-2))
    kg.ungraft(norm)


@pytest.mark.parametrize("path", ["class", "instance"])
def test_a_dtype_the_op_does_not_take_runs_the_original_forward(path):
    # model.double() after grafting: rmsnorm takes float32/16/bf16, the original takes anything.
    # Eager only: under torch.compile the check would cost guards per grafted module.
    norm = MyRMSNorm(32)
    if path == "instance":  # its own instance forward: grafted on the instance
        norm.forward = types.MethodType(lambda self, h: MyRMSNorm.forward(self, h), norm)
    model = torch.nn.Sequential(norm)
    kg.graft(model, {MyRMSNorm: rmsnorm})
    model.double()
    x = torch.randn(2, 32, dtype=torch.float64)
    with torch.no_grad():
        with pytest.warns(kg.GraftWarning, match="torch.float64, which kgexamples::rmsnorm does not take"):
            got = model(x)
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, MyRMSNorm.forward(norm, x))
        model.float()  # back in the op's dtypes: the op serves again
        assert _ops_in(model, x.float()) == {"kgexamples.rmsnorm.default"}
    kg.ungraft(model)
