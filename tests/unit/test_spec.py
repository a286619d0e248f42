"""Kernel specs: frozen, hashable, validated on creation, stable fingerprints."""

import dataclasses

import pytest

import kernelgraft as kg
from kernelgraft.spec import Config, normalize_capability


def launch(x, out, *, BLOCK, num_warps=4):
    pass


def test_spec_is_frozen_and_hashable():
    spec = kg.triton(launch, configs=[{"BLOCK": 128}, {"BLOCK": 256, "num_warps": 8}])
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.configs = ()
    assert hash(spec) == hash(kg.triton(launch, configs=[{"BLOCK": 128}, {"BLOCK": 256, "num_warps": 8}]))
    assert spec == kg.triton(launch, configs=[{"BLOCK": 128}, {"num_warps": 8, "BLOCK": 256}])
    assert {spec: 1}[kg.triton(launch, configs=[{"BLOCK": 128}, {"BLOCK": 256, "num_warps": 8}])] == 1
    assert [c.as_dict() for c in spec.configs] == [{"BLOCK": 128}, {"BLOCK": 256, "num_warps": 8}]


@pytest.mark.parametrize(
    "configs, match",
    [
        pytest.param([], "configs is empty", id="empty"),
        pytest.param([{"BLOCK": 1}, 5], "must be a dict", id="non-dict"),
        pytest.param({"BLOCK": 1}, "must be a list of dicts", id="dict-not-list"),
        pytest.param([{"BLOCK": 1, "BLOCKK": 2}], "'BLOCKK'", id="unknown-key"),
        pytest.param([{"num_warps": 4}], "lacks 'BLOCK'", id="missing-required"),
        pytest.param([{"BLOCK": [1, object()]}], "not allowed", id="unhashable-value"),
        pytest.param([{"BLOCK": 1}, {"BLOCK": 1}], "duplicates", id="duplicates"),
    ],
)
def test_bad_configs_are_rejected_at_creation(configs, match):
    with pytest.raises(kg.SpecError, match=match):
        kg.triton(launch, configs=configs)


def test_unknown_key_error_names_launch_and_accepted_keys():
    with pytest.raises(kg.SpecError) as info:
        kg.triton(launch, configs=[{"BLOCK_SIZE": 128}])
    msg = str(info.value)
    assert "BLOCK_SIZE" in msg and "launch" in msg and "BLOCK" in msg and "num_warps" in msg


def test_launch_with_var_keywords_accepts_any_key():
    def loose(x, out, **config):
        pass

    assert kg.triton(loose, configs=[{"ANYTHING": 3}]).configs[0].as_dict() == {"ANYTHING": 3}


def test_non_callable_supports_rejected():
    with pytest.raises(kg.SpecError, match="supports must be callable"):
        kg.triton(launch, configs=[{"BLOCK": 1}], supports=True)


@pytest.mark.parametrize(
    "value, expected",
    [(90, (9, 0)), ((8, 6), (8, 6)), (8.9, (8, 9)), ("sm_90", (9, 0)), ("sm_90a", (9, 0)), ("10.0", (10, 0)), (None, None)],
    ids=str,
)
def test_capability_forms(value, expected):
    assert normalize_capability(value, where="t") == expected


def test_bad_capability():
    with pytest.raises(kg.SpecError, match="min_capability"):
        kg.triton(launch, configs=[{"BLOCK": 1}], min_capability="hopper")


def test_fingerprint_changes_with_configs_and_code_and_is_stable():
    a = kg.triton(launch, configs=[{"BLOCK": 128}])
    b = kg.triton(launch, configs=[{"BLOCK": 256}])

    def other(x, out, *, BLOCK):
        return x + 1

    c = kg.triton(other, configs=[{"BLOCK": 128}])
    assert len({a.fingerprint, b.fingerprint, c.fingerprint}) == 3
    assert a.fingerprint == kg.triton(launch, configs=[{"BLOCK": 128}]).fingerprint


def test_config_lookup_by_index_and_value():
    spec = kg.triton(launch, configs=[{"BLOCK": 128}, {"BLOCK": 256}])
    assert spec.config(1) == Config.of({"BLOCK": 256}, where="t")
    assert spec.config({"BLOCK": 512}).as_dict() == {"BLOCK": 512}
    with pytest.raises(kg.SpecError, match="out of range"):
        spec.config(5)
    with pytest.raises(kg.SpecError, match="BLOCKX"):
        spec.config({"BLOCKX": 1})


def test_reference_hints_resolve_torch_imported_locally():
    # A reference defined where torch is imported inside a function, under
    # ``from __future__ import annotations``: its hints are strings naming a non-global ``torch``.
    from kernelgraft.errors import SpecError
    from kernelgraft.op.schema import parse_signature

    ns: dict = {}
    exec("from __future__ import annotations\n"
         "def ref(x: torch.Tensor, n: int) -> torch.Tensor:\n    return x * n\n", {"__name__": "m"}, ns)
    sig = parse_signature(ns["ref"], (), "kg.op('t::ref')")
    assert sig.returns == "tensor" and [p.name for p in sig.params] == ["x", "n"]
    exec("from __future__ import annotations\n"
         "def bad(x: Tensr) -> torch.Tensor:\n    return x\n", {"__name__": "m"}, ns)
    with pytest.raises(SpecError, match=r"kg.op\('t::ref'\): could not read the type hints of bad.*Tensr"):
        parse_signature(ns["bad"], (), "kg.op('t::ref')")
