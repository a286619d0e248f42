"""The C++ runtime's Meta kernels on symbolic sizes: ``torch.export`` with a ``Dim`` and fake tensors
with a ShapeEnv keep a dynamic dimension symbolic through a bundled op (the output size is an
expression of the input's symbol, not its sample value), in a process where kernelgraft's Python
never imports, and every output-size operator gives Python's value for any value of the symbol."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelgraft.symbolic.expr import compile_exprs
from kernelgraft.aot.rpn import compile_rpn

from _runtime_helpers import json_child, so, variant  # noqa: F401 (so: a fixture)


@pytest.fixture(scope="module")
def bundle(example_bundle) -> Path:
    return example_bundle  # built once per run (conftest); read-only


def _serve(bundle: Path, dst: Path, namespace: str, edit=None) -> None:
    """Serve a copy of ``bundle`` under ``namespace``; ``edit(op_entry)`` changes each op first."""
    torch.ops.kernelgraft.load_bundle(str(variant(bundle, dst, namespace, edit_op=edit)), None, "sm_90")


def _symbolic(shape_env, t: torch.Tensor, dynamic: list[bool]):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=shape_env) if not isinstance(shape_env, FakeTensorMode) else shape_env
    sizes = [DimDynamic.DYNAMIC if d else DimDynamic.STATIC for d in dynamic]
    return mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes))


def _serve_rmsnorm_rules(bundle: Path, dst: Path, namespace: str, **fields) -> None:
    """Serve a copy of ``bundle`` whose rmsnorm meta rules all take ``fields`` (guard, shapes): its
    kernels' programs take them, and the rules are derived from the kernels (the bundle spec)."""
    def edit(op):
        if op["name"].endswith("::rmsnorm"):
            for cand in op["candidates"]:
                for k in cand["kernels"]:
                    if "guard" in fields:  # one guard (its text a placeholder: the runtime reads programs)
                        k["guards"] = ["True"]
                        k["program"]["guards"] = [fields["guard"]]
                    if "shapes" in fields:  # the texts are the Python loader's; the runtime reads programs
                        k["program"]["outputs"] = fields["shapes"]
                        k["outputs"]["shapes"] = [["0"] * len(s) for s in fields["shapes"]]

    _serve(bundle, dst, namespace, edit)


def _fake_rmsnorm(namespace: str, weight_dynamic: bool):
    """(output, x, shape_env) of the served rmsnorm on fake float32 [9, 768] x (both dims dynamic)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env)
    x = _symbolic(mode, torch.randn(9, 768), [True, True])
    w = _symbolic(mode, torch.randn(768), [weight_dynamic])
    with mode:
        out = getattr(torch.ops, namespace).rmsnorm(x, w, 1e-6)
    return out, x, shape_env


def _free(size) -> set:
    return set(size.node.expr.free_symbols) if isinstance(size, torch.SymInt) else set()


EXPORT_CHILD = r"""
import json, sys
sys.modules["kernelgraft"] = None  # the bundled ops come from the C++ runtime alone
sys.modules["triton"] = None
import torch
torch.ops.load_library(sys.argv[1])
torch.ops.kernelgraft.load_bundle(sys.argv[2], None, "sm_90")

class Block(torch.nn.Module):
    def forward(self, x, w, y):
        return torch.ops.kgexamples.add_relu(torch.ops.kgexamples.rmsnorm(x, w, 1e-6), y)

n = torch.export.Dim("n", min=2, max=4096)
ep = torch.export.export(Block(), (torch.randn(9, 768), torch.randn(768), torch.randn(9, 768)),
                         dynamic_shapes={"x": {0: n}, "w": None, "y": {0: n}})
shapes = {node.name: [str(s) for s in node.meta["val"].shape] for node in ep.graph.nodes
          if node.op in ("placeholder", "call_function")}
ranges = {str(k): [int(v.lower), int(v.upper)] for k, v in ep.range_constraints.items()}
print(json.dumps({"shapes": shapes, "ranges": ranges,
                  "targets": [str(node.target) for node in ep.graph.nodes if node.op == "call_function"]}))
"""


def test_export_with_a_dim_keeps_it_symbolic_through_bundled_ops(so, bundle, tmp_path):
    report, _ = json_child(tmp_path, EXPORT_CHILD, so, bundle)
    symbol = report["shapes"]["x"][0]
    assert not symbol.isdigit(), report  # the dim stayed dynamic: no specialisation to 9
    assert report["ranges"] == {symbol: [2, 4096]}
    assert report["targets"] == ["kgexamples.rmsnorm.default", "kgexamples.add_relu.default"]
    assert report["shapes"]["rmsnorm"] == [symbol, "768"] and report["shapes"]["add_relu"] == [symbol, "768"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_fake_tensors_with_a_shape_env_keep_sizes_symbolic(so, bundle, tmp_path, dtype):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    namespace = f"kgrt_sym_{str(dtype)[6:]}"
    _serve(bundle, tmp_path / "b", namespace)
    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env)
    x = _symbolic(mode, torch.randn(9, 768, dtype=dtype), [True, True])
    w = _symbolic(mode, torch.randn(768, dtype=dtype), [True])
    y = _symbolic(mode, torch.randn(9, 768, dtype=dtype), [True, True])
    ops = getattr(torch.ops, namespace)
    with mode:
        normed = ops.rmsnorm(x, w, 1e-6)
        out = ops.add_relu(normed, y)
    for t in (normed, out):
        assert t.dtype == dtype
        assert [s.node.expr for s in t.shape] == [s.node.expr for s in x.shape]
    # the rules' guards (x.shape[1] == weight.shape[0], ...) relate symbols; none became a number
    assert _free(out.shape[0]) and _free(out.shape[1])
    assert not any(v.is_number for v in shape_env.replacements.values()), shape_env.replacements


EXPRESSIONS = [  # output sizes as a bundle's meta rule could hold them, over a symbolic x.shape[0]
    "x.shape[0] // 3", "-((-x.shape[0]) // 4)", "x.shape[0] % 7 + x.shape[1]", "min(x.shape[0], 64)",
    "max(x.shape[0] * 2, x.shape[1] - 5)", "(x.shape[0] + 15) // 16 * 16", "x.shape[0] - 1",
]


def test_every_symbolic_output_size_equals_python_for_any_value(so, bundle, tmp_path):
    names = ["x", "weight", "eps"]
    rule_shape = [compile_rpn(e, names) for e in EXPRESSIONS] + [compile_rpn("x.shape[1] ** 2", names)]
    _serve_rmsnorm_rules(bundle, tmp_path / "b", "kgrt_symexpr", shapes=[rule_shape])
    out, x, _ = _fake_rmsnorm("kgrt_symexpr", weight_dynamic=False)
    s0 = x.shape[0].node.expr
    *symbolic, power = out.shape
    # ** has no SymInt form: its operand's value is taken, which specialises x.shape[1] (768 already,
    # by the guard x.shape[1] == weight.shape[0]); the others stay expressions of x.shape[0]
    assert power == 768 ** 2
    for text, size in zip(EXPRESSIONS, symbolic):
        assert _free(size) == {s0}, (text, size)
        for rows in (2, 3, 9, 16, 17, 100, 4095):
            value = size.node.expr.xreplace({s0: rows})
            want = compile_exprs(names, [text])(torch.empty(rows, 768, device="meta"), None, 1e-6)[0]
            assert int(value) == want, (text, rows, value, want)


def test_a_dtype_no_rule_holds_for_names_the_symbolic_sizes(so, bundle, tmp_path):
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from torch._subclasses.fake_tensor import FakeTensorMode

    _serve(bundle, tmp_path / "b", "kgrt_symerr")
    mode = FakeTensorMode(shape_env=ShapeEnv())
    x = _symbolic(mode, torch.randn(9, 768, dtype=torch.float64), [True, False])
    w = _symbolic(mode, torch.randn(768, dtype=torch.float64), [False])
    with mode, pytest.raises(RuntimeError, match=r"kgrt_symerr::rmsnorm: no output rule of the bundle holds for "
                                                 r"these inputs \(x: float64\[s\d+, 768\], weight: float64\[768\]"):
        torch.ops.kgrt_symerr.rmsnorm(x, w, 1e-6)


def test_next_pow2_in_a_rule_guards_a_range_not_a_value(so, bundle, tmp_path):
    """A rule whose guard holds only through next_pow2 (no other rule holds): the runtime puts the
    size in its power-of-two bucket, (512, 1024] for 768, and keeps it symbolic there."""
    names = ["x", "weight", "eps"]
    guard = compile_rpn("(next_pow2(x.shape[1]) == 1024) and (x.shape[1] == weight.shape[0])", names)
    shape = [compile_rpn("x.shape[0]", names), compile_rpn("x.shape[1]", names)]
    _serve_rmsnorm_rules(bundle, tmp_path / "b", "kgrt_sympow2", guard=guard, shapes=[shape])
    out, x, shape_env = _fake_rmsnorm("kgrt_sympow2", weight_dynamic=True)
    s1 = x.shape[1].node.expr
    assert _free(out.shape[1]) and not any(v.is_number for v in shape_env.replacements.values())
    bounds = shape_env.var_to_range[shape_env.replacements.get(s1, s1)]
    assert (int(bounds.lower), int(bounds.upper)) == (513, 1024)
