"""Op identity: the fingerprint covers every option that changes behaviour, so re-declaring an op
differently under a taken name is a RegistrationError that names what differs, and the same
declaration is the same op."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import kernelgraft as kg
from kernelgraft import RegistrationError
from kernelgraft.tune import build_key

from _tune_ops import CONFIGS, launch_scale  # noqa: E402

IMPL = kg.triton(launch_scale, configs=CONFIGS)


def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def scale_other(x: torch.Tensor) -> torch.Tensor:
    return x + x


def samples(device="cpu"):
    return [(torch.randn(100, device=device),)]


def samples_other(device="cpu"):
    return [(torch.randn(7, device=device),)]


def cost(x):
    return (x.numel() * 8, 0)


def prune_first(candidates, x):
    return candidates[:1]


BASE = dict(impls=[IMPL], fallback="reference")

# option -> (changed options, what the error must say)
CHANGES = {
    "fallback": ({"fallback": "error"}, "fallback: 'reference' -> 'error'"),
    "dtypes": ({"dtypes": [torch.float32]}, "dtypes: {} -> {'x': ['float32']}"),
    "ndim": ({"ndim": {"x": 1}}, "ndim: {} -> {'x': [1]}"),
    "tolerances": ({"tolerances": {torch.float16: 1e-2}}, "tolerances: {} -> {'float16': 0.01}"),
    "impls": ({"impls": [kg.triton(launch_scale, configs=CONFIGS[:2])]}, "impls: impl 0 differs"),
    "impl-count": ({"impls": [IMPL, kg.triton(launch_scale, configs=CONFIGS[:1], name="one")]},
                   "impls: 1 impls -> 2"),
    "sample_inputs": ({"sample_inputs": samples}, "sample_inputs: None -> "),
    "cost": ({"cost": cost}, "cost: None -> "),
    "prune": ({"prune": prune_first}, "prune: None -> "),
    "buckets": ({"buckets": "exact"}, "buckets: "),
    "buckets-list": ({"buckets": {"x": [16, 64]}}, "'per_arg': {'x': [16, 64]}"),
}


@pytest.mark.parametrize("option", sorted(CHANGES))
def test_redeclared_with_an_option_changed_names_it(option):
    first = kg.op("tid::op", **BASE)(scale)
    changed, says = CHANGES[option]
    with pytest.raises(RegistrationError) as info:
        kg.op("tid::op", **{**BASE, **changed})(scale)
    message = str(info.value)
    assert "tid::op" in message and says in message
    assert option.split("-")[0] in message
    assert kg.op("tid::op", **BASE)(scale) is first  # the registered op is untouched


@pytest.mark.parametrize("first,second", [
    ({"sample_inputs": samples}, {"sample_inputs": samples_other}),
    ({"buckets": lambda n: n}, {"buckets": lambda n: 2 * n}),
    ({"cost": cost}, {"cost": lambda x: (0, 0)}),
], ids=["sample_inputs", "buckets-function", "cost"])
def test_callables_compare_by_source(first, second):
    kg.op("tid::src", **BASE, **first)(scale)
    option = next(iter(first))
    with pytest.raises(RegistrationError, match=f"{option}: the source differs"):
        kg.op("tid::src", **BASE, **second)(scale)


def test_reference_code_differs():
    kg.op("tid::ref", **BASE)(scale)
    with pytest.raises(RegistrationError, match="reference: the source differs"):
        kg.op("tid::ref", **BASE)(scale_other)


def test_mutates_args_differs():
    def fill(x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(x)

    kg.op("tid::mut", mutates_args=("out",))(fill)
    with pytest.raises(RegistrationError, match=r"mutates: \['out'\] -> \[\]"):
        kg.op("tid::mut")(fill)


@pytest.mark.parametrize("first,second", [
    ({}, {}),
    ({"dtypes": [torch.float32, torch.float16]}, {"dtypes": {"x": [torch.float16, torch.float32]}}),
    ({"ndim": {"x": 1}}, {"ndim": {"x": [1]}}),
    ({"tolerances": {torch.float16: 1e-2, torch.bfloat16: 2e-2}},
     {"tolerances": {torch.bfloat16: 0.02, torch.float16: 0.01}}),
    ({"buckets": None}, {"buckets": "pow2"}),
    ({"buckets": {"x": [64, 16]}}, {"buckets": {"x": [16, 64]}}),
    ({"sample_inputs": samples}, {"sample_inputs": samples}),
], ids=["plain", "dtypes-spelling", "ndim-int-or-list", "tolerances-order", "buckets-default",
        "buckets-order", "sample_inputs"])
def test_same_declaration_is_the_same_op(first, second):
    a = kg.op("tid::same", **BASE, **first)(scale)
    assert kg.op("tid::same", **BASE, **second)(scale) is a


def test_unnamed_ops_with_different_options_do_not_clash():
    a = kg.op(scale, impls=[IMPL])
    b = kg.op(scale, impls=[IMPL], fallback="error")
    assert a is not b and a.name != b.name
    assert kg.op(scale, impls=[IMPL]) is a


def test_fingerprint_is_the_same_in_another_process(tmp_path):
    (tmp_path / "tid_mod.py").write_text(textwrap.dedent("""
        import torch, kernelgraft as kg

        def sample(device="cpu"):
            return [(torch.randn(4, device=device),)]

        @kg.op("tidproc::scale", dtypes=[torch.float32], ndim={"x": [1, 2]}, fallback="error",
               tolerances={torch.float32: 1e-4}, sample_inputs=sample, buckets={"x": [8, 32]},
               cost=lambda x: (0, 0))
        def scale(x: torch.Tensor) -> torch.Tensor:
            return x * 2
    """))
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import tid_mod; print(tid_mod.scale.fingerprint)"
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        import tid_mod
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("tid_mod", None)
    assert runs[0].stdout.split() == runs[1].stdout.split() == [tid_mod.scale.fingerprint]


def test_tune_key_holds_the_tolerances():
    loose = kg.op("tid::loose", **BASE, tolerances={torch.float32: 1e-2})(scale)
    strict = kg.op("tid::strict", **BASE, tolerances={torch.float32: 1e-6})(scale)
    x = torch.randn(100)
    a, b = build_key(loose, (x,)), build_key(strict, (x,))
    assert a.as_json()["tolerances"] == {"float32": 0.01}
    assert b.as_json()["tolerances"] == {"float32": 1e-6}
    # same op name and code, only the tolerances differ: still two keys
    assert a.digest != type(a)(a.op, a.fingerprint, a.args, a.env, b.tolerances).digest


def _scaled_by(factor: float):
    def ref(x: torch.Tensor) -> torch.Tensor:
        return x * factor

    return ref


def test_a_value_captured_in_a_closure_is_part_of_the_op():
    # a factory's captured value changes what the reference computes: the same source is another op
    kg.op("tid::closure", **BASE)(_scaled_by(2.0))
    with pytest.raises(RegistrationError, match="reference: the source differs"):
        kg.op("tid::closure", **BASE)(_scaled_by(3.0))
    again = kg.op("tid::closure", **BASE, replace=True)(_scaled_by(3.0))
    assert "factor=3.0" in again.identity["reference"]


def test_an_edited_constant_is_another_op_where_the_source_cannot_be_read():
    # the plain Python REPL and exec of a string: no source text, so the code and its constants
    ns: dict = {}
    template = "import torch\ndef f(x: torch.Tensor) -> torch.Tensor:\n    return x * {}\n"
    exec(template.format(2), ns)
    kg.op("tid::nosource", **BASE)(ns["f"])
    exec(template.format(3), ns)
    with pytest.raises(RegistrationError, match="reference"):
        kg.op("tid::nosource", **BASE)(ns["f"])


def test_an_edited_triton_helper_changes_the_kernels_identity(tmp_path, monkeypatch):
    # the launch names the kernel, the kernel calls a @triton.jit helper: editing the helper alone
    # must be another op (tuning decisions and bundled kernels are keyed on the identity)
    source = textwrap.dedent('''
        import torch, triton, triton.language as tl

        @triton.jit
        def _helper(v):
            return v * {factor}

        @triton.jit
        def _kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, _helper(tl.load(x_ptr + offs, mask=mask)), mask=mask)

        def launch(x, out, *, BLOCK):
            _kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)
    ''')
    monkeypatch.syspath_prepend(str(tmp_path))
    specs = []
    for factor, folder in ((2.0, "v1"), (4.0, "v2")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"kmod_{folder}.py").write_text(source.format(factor=factor))
        monkeypatch.syspath_prepend(str(tmp_path / folder))
        module = __import__(f"kmod_{folder}")
        specs.append(kg.triton(module.launch, configs=[{"BLOCK": 64}]))
    assert specs[0].fingerprint != specs[1].fingerprint


def test_identity_is_the_same_under_any_hash_seed(tmp_path):
    # a frozenset constant (x in {"a", "b"}) or a captured frozenset iterates in hash-seed order
    (tmp_path / "seeded.py").write_text(textwrap.dedent('''
        def make(names):
            def f(x, name):
                return x if name in {"alpha", "beta", "gamma", "delta"} and name in names else -x
            return f
    '''))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import seeded; "
            "from kernelgraft.spec import callable_source; import hashlib; "
            "print(hashlib.sha256(callable_source(seeded.make(frozenset('xyzw'))).encode()).hexdigest())")
    out = {subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True,
                          env={**__import__("os").environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2", "3")}
    assert len(out) == 1
