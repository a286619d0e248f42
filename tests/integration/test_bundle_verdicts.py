"""Both bundle loaders hold bundles to one spec (``kernelgraft/aot/bundle_spec.py``, its table in
``runtime/csrc/bundle_spec.h``): every case of one corpus of tampered bundles
(``tests/_bundle_corpus.py``, derived from one real bundle) gets the same verdict from the Python
loader and from the C++ runtime, each in a child process: loaded, or refused with a message naming
the field, never a crash. The children's time limit only guards against a hang; the per-case times
are printed (``-s``) and measured by ``benchmarks/bench_bundle_verdicts.py``.

A few cases are loaded on purpose (a consistent extra parameter, every kind of default, JSON
nested exactly to the cap), so a loader that refused everything would fail too."""

from __future__ import annotations

import json

import pytest

from _bundle_corpus import CASES, LOADED, derive, verdicts


@pytest.fixture(scope="module")
def corpus(signed_example_bundle, tmp_path_factory) -> dict:
    from kernelgraft import runtime

    bundle = signed_example_bundle
    out = tmp_path_factory.mktemp("corpus")
    found = verdicts(derive(bundle, out), runtime.library(), out)
    print("\ncase: python s, c++ s")
    for name, v in found.items():
        print(f"  {name}: {v['python'][2]:.3f} s, {v['cpp'][2]:.3f} s")
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_both_loaders_give_the_same_verdict(corpus, case):
    expected = CASES[case][1]
    got = corpus[case]
    for loader in ("python", "cpp"):
        verdict, message, _ = got[loader]
        if expected == LOADED:
            assert verdict == "loaded", (loader, message)
        else:
            assert verdict == "refused", (loader, verdict, message)
            assert expected in message, (loader, message)
    assert got["python"][0] == got["cpp"][0]


def test_the_loaders_read_the_table_they_are_built_with():
    """The Python side parses the very rows the C++ runtime includes."""
    from kernelgraft.aot.bundle_spec import SPEC_FILE, table
    from kernelgraft.runtime import SOURCE_DIR

    assert SPEC_FILE == SOURCE_DIR / "bundle_spec.h"
    spec = table()
    rows = [line for line in SPEC_FILE.read_text().splitlines() if line.startswith("KG_LIMIT(")]
    assert len(spec.limits) == len(rows) > 20
    assert {"aten", "prim", "prims", "torch"} <= spec.reserved_namespaces
    import keyword

    assert set(keyword.kwlist) <= spec.reserved_params


@pytest.mark.parametrize("signature", [
    "(Tensor x, Tensor y) -> Tensor",
    "(Tensor(a0!) x, Tensor? y=None, float eps=1e-06, SymInt n=3, bool flag=True, str mode=\"mean\", "
    "ScalarType? dt=None, Tensor[] xs=None, ScalarType d=float16, float big=1e+300) -> (Tensor, Tensor)",
    "(Tensor x, Tensor(a1!)[] ys, SymInt? k=None, float f=2) -> ()",
    "(Tensor x) -> ((Tensor))",
])
def test_the_schema_grammar_is_what_torch_infers(signature):
    """The grammar's rendering of a signature's params is torch.library.infer_schema's."""
    import inspect
    import typing

    import torch

    from kernelgraft.aot.build import _param_entry
    from kernelgraft.aot.bundle_spec import parse_schema, schema_of
    from kernelgraft.op.schema import parse_signature

    params, returns = parse_schema(signature)
    hints = {"Tensor": torch.Tensor, "SymInt": int, "float": float, "bool": bool, "str": str, "ScalarType": torch.dtype}
    values = {"None": None, "True": True, "False": False}
    ps, annotations = [], {}
    for p in params:
        hint = list[torch.Tensor] if p.is_list else hints[p.type]
        hint = typing.Optional[hint] if p.optional else hint
        default = inspect.Parameter.empty
        if p.default is not None:
            default = (values[p.default] if p.default in values else p.default[1:-1] if p.default.startswith('"')
                       else getattr(torch, p.default) if p.type == "ScalarType" else json.loads(p.default))
        ps.append(inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=hint))
        annotations[p.name] = hint
    ret = {"Tensor": torch.Tensor, "()": None, "((Tensor))": tuple[torch.Tensor]}.get(returns, tuple[torch.Tensor, torch.Tensor])

    def fn(*args):
        raise NotImplementedError

    fn.__signature__ = inspect.Signature(ps, return_annotation=ret)
    fn.__annotations__ = annotations | {"return": ret}
    sig = parse_signature(fn, tuple(p.name for p in params if p.alias is not None), "test")
    assert sig.schema == signature
    entries = [json.loads(json.dumps(_param_entry(p))) for p in sig.params]  # as a manifest holds them
    assert schema_of(entries, sig.returns, sig.n_returns) == signature
