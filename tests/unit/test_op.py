"""kg.op: schema from type hints, registration, naming, calls identical to torch.ops."""

import subprocess
import sys
import textwrap
import threading
from typing import Optional

import pytest
import torch

import kernelgraft as kg
from kernelgraft.op import registry as _registry

from _kernels import LAUNCHES, launch_add_inplace, launch_scale, launch_sum_diff
from _paths import TESTS

SCALE = kg.triton(launch_scale, configs=[{"BLOCK": 64}, {"BLOCK": 256}])


def test_op_equals_torch_ops_and_runs_the_kernel():
    @kg.op("kgtest::scale", impls=[SCALE])
    def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * alpha

    x = torch.randn(1000)
    LAUNCHES.clear()
    a = scale(x, 3.0)
    b = torch.ops.kgtest.scale(x, 3.0)
    c = torch.ops.kgtest.scale.default(x, alpha=3.0)
    torch.testing.assert_close(a, x * 3.0)
    assert torch.equal(a, b) and torch.equal(a, c)
    assert LAUNCHES == ["scale[64]"] * 3  # the Triton kernel ran each time (interpreter)
    assert scale.overload is torch.ops.kgtest.scale.default
    assert scale.__doc__ is None and scale.__name__ == "scale"


def test_schema_from_type_hints():
    @kg.op("kgtest::hints")
    def hints(
        x: torch.Tensor, maybe: Optional[torch.Tensor], many: list[torch.Tensor], n: int,
        f: float, flag: bool, mode: str, dt: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return x.to(dt) * n, x + f

    schema = str(torch.ops.kgtest.hints.default._schema)
    for part in ("Tensor x", "Tensor? maybe", "Tensor[] many", "SymInt n", "float f", "bool flag",
                 "str mode", "ScalarType dt", "-> (Tensor, Tensor)"):
        assert part in schema
    a, b = hints(torch.ones(3), None, [torch.ones(1)], 2, 0.5, True, "m", torch.float64)
    assert a.dtype == torch.float64 and a.tolist() == [2.0] * 3 and b.tolist() == [1.5] * 3


def test_mutating_op_gets_alias_annotation_and_mutates_in_place():
    @kg.op("kgtest::add_", impls=[kg.triton(launch_add_inplace, configs=[{"BLOCK": 128}])],
           mutates_args=("x",))
    def add_(x: torch.Tensor, y: torch.Tensor) -> None:
        x.add_(y)

    assert "Tensor(a0!) x" in str(torch.ops.kgtest.add_.default._schema)
    x, y = torch.randn(300), torch.randn(300)
    expected = x + y
    LAUNCHES.clear()
    assert add_(x, y) is None
    torch.testing.assert_close(x, expected)
    assert LAUNCHES == ["add_[128]"]


def test_multiple_outputs():
    @kg.op("kgtest::sum_diff", impls=[kg.triton(launch_sum_diff, configs=[{"BLOCK": 32}])])
    def sum_diff(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + y, x - y

    x, y = torch.randn(77), torch.randn(77)
    s, d = sum_diff(x, y)
    torch.testing.assert_close(s, x + y)
    torch.testing.assert_close(d, x - y)


def test_reference_outputs_that_alias_each_other_are_returned_as_separate_tensors():
    # The reference path cloned outputs that alias an input, but not an output that is a view of
    # another output: writing one changed the other (kernel plans always give fresh tensors).
    @kg.op("kgtest::pair_views")
    def pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        return y, y[:1]

    a, b = pair(torch.ones(3))
    a.add_(1)
    assert b.tolist() == [2.0]


@pytest.mark.parametrize("body", ["x", "x[1:]", "x.t()", "w", "(x * 2).t()", "x * 2", "torch.empty(0)"],
                         ids=["input", "view", "transposed-view", "other-input", "fresh-transposed", "fresh",
                              "empty"])
def test_a_single_reference_output_is_fresh_and_contiguous(body):
    # The eager path's single-tensor output (a PyTorch plan, the reference serving a call) is
    # checked against each tensor argument's storage (a fast path of _fresh_outputs): an output
    # that is an input or a view of one comes back as a copy, any other one contiguous.
    ns: dict = {}
    exec(f"def ref(x: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:\n    return {body}",
         {"torch": torch}, ns)
    op = kg.op(f"kgtest::fresh_{abs(hash(body)) % 10**6}")(ns["ref"])
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    for _ in range(2):  # the first call plans, the second takes the steady state
        out = op(x, w, 1.0)
        want = ns["ref"](x, w, 1.0)
        torch.testing.assert_close(out, want)
        assert out.is_contiguous()
        if out.numel():
            assert out.untyped_storage().data_ptr() not in (x.untyped_storage().data_ptr(),
                                                             w.untyped_storage().data_ptr())


def test_register_meta_overrides_output_allocation():
    calls = []

    @kg.op("kgtest::scale_meta", impls=[SCALE])
    def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * alpha

    @scale.register_meta
    def _(x, alpha):
        calls.append(type(x).__name__)
        return torch.empty_like(x)

    torch.testing.assert_close(scale(torch.ones(5), 2.0), torch.full((5,), 2.0))
    assert calls == ["FakeTensor"]


def test_default_name_is_deterministic_across_processes(tmp_path):
    source = textwrap.dedent(
        """
        import os, sys
        os.environ["TRITON_INTERPRET"] = "1"
        sys.path.insert(0, %r)
        import torch, kernelgraft as kg
        from _kernels import launch_scale
        @kg.op(impls=[kg.triton(launch_scale, configs=[{"BLOCK": 64}])])
        def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
            return x * alpha
        print(scale.name)
        """
    ) % str(TESTS)
    path = tmp_path / "mod.py"
    path.write_text(source)
    names = {
        subprocess.run([sys.executable, str(path)], capture_output=True, text=True, check=True).stdout.strip()
        for _ in range(2)
    }
    assert len(names) == 1
    name = names.pop()
    assert name.startswith("kernelgraft::") and "scale" in name


def test_same_op_twice_is_a_noop_and_different_op_under_taken_name_is_an_error():
    def ref(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * alpha

    first = kg.op("kgtest::dup", impls=[SCALE])(ref)
    assert kg.op("kgtest::dup", impls=[SCALE])(ref) is first
    with pytest.raises(kg.RegistrationError, match="already registered"):
        kg.op("kgtest::dup", impls=[kg.triton(launch_scale, configs=[{"BLOCK": 32}])])(ref)


def test_names_taken_by_torch_or_malformed_are_rejected():
    def ref(x: torch.Tensor) -> torch.Tensor:
        return x

    with pytest.raises(kg.RegistrationError, match="namespace::name"):
        kg.op("no_namespace")(ref)
    with pytest.raises(kg.RegistrationError, match="PyTorch"):
        kg.op("aten::my_thing")(ref)
    lib = torch.library.Library("kgforeign", "FRAGMENT")
    lib.define("taken(Tensor x) -> Tensor")
    try:
        with pytest.raises(kg.RegistrationError, match="outside kernelgraft"):
            kg.op("kgforeign::taken")(ref)
    finally:
        lib._destroy()


def test_concurrent_registration_yields_one_op():
    def ref(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * alpha

    results, errors = [], []
    barrier = threading.Barrier(8)

    def worker():
        barrier.wait()
        try:
            results.append(kg.op("kgtest::threads", impls=[SCALE])(ref))
        except Exception as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len({id(r) for r in results}) == 1
    assert _registry.lookup("kgtest::threads") is results[0]


def test_call_form_and_keyword_arguments():
    def ref(x: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
        return x * alpha

    scale = kg.op(ref, name="kgtest::call_form", impls=[SCALE])
    x = torch.randn(10)
    torch.testing.assert_close(scale(x), x * 2)
    torch.testing.assert_close(scale(x, alpha=0.5), x * 0.5)
    torch.testing.assert_close(scale(alpha=3.0, x=x), x * 3)


@pytest.mark.parametrize(
    "make, match",
    [
        pytest.param(lambda: kg.op("kgtest::bad1", impls=[lambda: 0]), "kernel specs", id="impl-not-spec"),
        pytest.param(lambda: kg.op("kgtest::bad2", fallback="maybe"), "fallback", id="bad-fallback"),
    ],
)
def test_bad_op_options(make, match):
    def ref(x: torch.Tensor) -> torch.Tensor:
        return x

    with pytest.raises(kg.SpecError, match=match):
        make()(ref)


@pytest.mark.parametrize(
    "ref_src, match",
    [
        ("def f(x): return x", "no type hint"),
        ("def f(x: torch.Tensor): return x", "no return annotation"),
        ("def f(x: torch.Tensor, *rest: int) -> torch.Tensor: return x", "VAR_POSITIONAL|variadic"),
        ("def f(x: dict) -> torch.Tensor: return x", "not supported"),
        ("def f(x: torch.Tensor) -> int: return 1", "return annotation"),
    ],
    ids=["no-hint", "no-return", "varargs", "bad-hint", "bad-return"],
)
def test_bad_reference_signatures(ref_src, match):
    ns = {"torch": torch}
    exec(ref_src, ns)
    with pytest.raises(kg.SpecError, match=match):
        kg.op("kgtest::badsig")(ns["f"])


def test_mutates_args_must_name_tensor_parameters():
    def ref(x: torch.Tensor, n: int) -> None:
        pass

    with pytest.raises(kg.SpecError, match="not parameters"):
        kg.op("kgtest::m1", mutates_args=("y",))(ref)
    with pytest.raises(kg.SpecError, match="not a Tensor"):
        kg.op("kgtest::m2", mutates_args=("n",))(ref)


def test_an_unregistered_op_raises_instead_of_calling_a_dangling_overload():
    # Destroying the torch.library fragment frees the schema the old overload points to; calling
    # it crashed the process (seen when a test fixture unregistered an example op).
    @kg.op("kgtest_op::unreg_twice")
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    x = torch.randn(4)
    assert torch.equal(twice(x), x * 2)
    _registry.unregister("kgtest_op::unreg_twice")
    with pytest.raises(kg.RegistrationError, match="unregistered"):
        torch.ops.kgtest_op.unreg_twice(x)
    with pytest.raises(kg.RegistrationError, match="unregistered"):
        twice.overload(x)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode, pytest.raises(kg.RegistrationError, match="register it again"):
        twice(mode.from_tensor(x))
    assert torch.equal(twice(x), x * 2)  # the eager path needs no dispatcher
    _registry.register(twice)  # and registering again restores it
    assert torch.equal(torch.ops.kgtest_op.unreg_twice(x), x * 2)
