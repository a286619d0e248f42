"""Re-declaring ops as a notebook does: a cell defines an op, is edited and run again
(``replace=True``), or is run again unchanged; ``kg.unregister`` removes one. Cells are run the way
IPython runs them: their source is registered in ``linecache`` under a per-run file name, so op
fingerprints see the source exactly as in a notebook."""

from __future__ import annotations

import itertools
import linecache

import pytest
import torch

import kernelgraft as kg
from kernelgraft.op import registry as _registry

_RUNS = itertools.count()

CELL = '''
import torch, kernelgraft as kg

@kg.op("kgnotebook::cell"{options})
def cell(x: torch.Tensor) -> torch.Tensor:
    return x * {factor}
'''


class Notebook:
    """One kernel's namespace (``__main__`` as in Jupyter); ``run`` executes a cell in it."""

    def __init__(self) -> None:
        self.ns: dict = {"__name__": "__main__"}

    def run(self, source: str) -> dict:
        name = f"<ipython-input-{next(_RUNS)}-kgtest>"
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        exec(compile(source, name, "exec"), self.ns)
        return self.ns


def cell(factor: int, replace: bool = True) -> str:
    return CELL.format(options=", replace=True" if replace else "", factor=factor)


@pytest.fixture
def nb():
    yield Notebook()
    kg.unregister("kgnotebook::cell")
    kg.unregister("kgnotebook::other")


def test_a_redeclared_op_serves_the_new_kernel_everywhere(nb):
    x = torch.arange(4.0)
    first = nb.run(cell(2))["cell"]
    assert torch.equal(first(x), x * 2)
    compiled = torch.compile(lambda t: nb.ns["cell"](t) + 1, fullgraph=True)
    assert torch.equal(compiled(x), x * 2 + 1)

    second = nb.run(cell(3))["cell"]  # the cell, edited and run again
    assert second is not first and _registry.lookup("kgnotebook::cell") is second
    assert torch.equal(second(x), x * 3)
    assert torch.equal(torch.ops.kgnotebook.cell(x), x * 3)
    assert torch.equal(first(x), x * 3)  # an old reference forwards to the op of its name
    assert first.overload is second.overload
    assert "replaced" in repr(first)
    assert torch.equal(compiled(x), x * 3 + 1)  # compiled before the edit: sees the new op
    assert torch.equal(torch.compile(lambda t: first(t) - 1, fullgraph=True)(x), x * 3 - 1)

    again = nb.run(cell(3))["cell"]  # the same cell run again: the same op, nothing replaced
    assert again is second and torch.equal(again(x), x * 3)


def test_the_same_definition_run_again_needs_no_replace(nb):
    x = torch.ones(3)
    first = nb.run(cell(2, replace=False))["cell"]
    assert nb.run(cell(2, replace=False))["cell"] is first
    assert torch.equal(first(x), x * 2)


def test_an_edit_without_replace_says_how_to_redeclare(nb):
    nb.run(cell(2, replace=False))
    with pytest.raises(kg.RegistrationError, match="kgnotebook::cell") as info:
        nb.run(cell(5, replace=False))
    message = str(info.value)
    assert "__main__.cell" in message and "reference: the source differs" in message
    assert "replace=True" in message
    assert torch.equal(nb.ns["cell"](torch.ones(2)), torch.full((2,), 2.0))  # the old op still serves


def test_replacing_drops_the_old_ops_plans_and_tuning_decisions(nb):
    from kernelgraft.tune.tuner import TUNER, Decision

    first = nb.run(cell(2))["cell"]
    x = torch.ones(5)
    first(x)
    assert first._d.tables  # a plan was made for this signature
    TUNER.memory["kgtest-digest"] = Decision(key={"fingerprint": first.fingerprint}, ranking=[], excluded=[])
    try:
        nb.run(cell(7))
        assert not first._d.tables and first._d.replay is None and not first._d.runners
        assert "kgtest-digest" not in TUNER.memory
    finally:
        TUNER.memory.pop("kgtest-digest", None)


def test_replacing_one_op_leaves_its_namespace_neighbours_intact(nb):
    other = nb.run(CELL.replace("::cell", "::other").replace("def cell", "def other")
                   .format(options="", factor=10))["other"]
    overload = other.overload
    nb.run(cell(2))
    nb.run(cell(3))
    x = torch.ones(2)
    assert other.overload is overload  # its torch.library fragment was never touched
    assert torch.equal(overload(x), x * 10) and torch.equal(torch.ops.kgnotebook.other(x), x * 10)


def test_a_new_schema_can_replace_an_op(nb):
    nb.run(cell(2))
    changed = nb.run(CELL.replace("(x: torch.Tensor)", "(x: torch.Tensor, k: float)")
                     .replace("x * {factor}", "x * k").format(options=", replace=True", factor=0))["cell"]
    assert torch.equal(changed(torch.ones(2), 4.0), torch.full((2,), 4.0))
    assert "float k" in str(torch.ops.kgnotebook.cell.default._schema)


def test_unregister_removes_the_op_and_old_references_say_so(nb):
    op = nb.run(cell(2))["cell"]
    assert kg.unregister(op) is True
    assert _registry.lookup("kgnotebook::cell") is None
    with pytest.raises(kg.RegistrationError, match="no op holds this name"):  # the name stays, refusing
        torch.ops.kgnotebook.cell(torch.ones(2))
    with pytest.raises(kg.RegistrationError, match="was unregistered and no op holds the name"):
        op(torch.ones(2))
    with pytest.raises(kg.RegistrationError, match="register_meta on an op object that was unregistered"):
        op.register_meta(lambda x: x)
    assert kg.unregister("kgnotebook::cell") is False  # running the cell twice is harmless
    new = nb.run(cell(4, replace=False))["cell"]  # declared again: old references reach it
    assert torch.equal(op(torch.ones(2)), torch.full((2,), 4.0)) and new is not op


def test_unregister_of_a_replaced_op_object_leaves_the_new_op(nb):
    x = torch.ones(2)
    old = nb.run(cell(2))["cell"]
    new = nb.run(cell(3))["cell"]  # replace=True: old is retired and forwards to new
    assert kg.unregister(old) is False  # it no longer holds the name: nothing removed
    assert _registry.lookup("kgnotebook::cell") is new
    assert torch.equal(torch.ops.kgnotebook.cell(x), x * 3) and torch.equal(new(x), x * 3)
    assert kg.unregister(new) is True and _registry.lookup("kgnotebook::cell") is None
    assert kg.unregister(new) is False  # twice: harmless
    again = nb.run(cell(4, replace=False))["cell"]
    assert kg.unregister(new) is False and _registry.lookup("kgnotebook::cell") is again


def test_replace_and_unregister_reject_wrong_types():
    with pytest.raises(kg.SpecError, match="replace must be True or False"):
        kg.op("kgnotebook::bad", replace="yes")
    with pytest.raises(kg.SpecError, match="kg.unregister"):
        kg.unregister(3)


TRITON_CELL = '''
import torch, triton, triton.language as tl, kernelgraft as kg

@triton.jit
def _scale(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) * {factor}, mask=mask)

def launch_scale(x, out, *, BLOCK):
    n = x.numel()
    _scale[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)

@kg.op("kgnotebook::cell", impls=[kg.triton(launch_scale, configs=[{{"BLOCK": 256}}])], replace=True)
def cell(x: torch.Tensor) -> torch.Tensor:
    return x * {factor}
'''


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_an_edited_triton_kernel_serves_after_the_cell_runs_again(nb, device):
    """On CUDA the third call of a signature runs through the native replay: replacing the op must
    leave no replay, plan or compiled runner of the old kernel serving the name."""
    x = torch.arange(1000, dtype=torch.float32, device=device)
    first = nb.run(TRITON_CELL.format(factor=2))["cell"]
    for _ in range(4):
        assert torch.equal(first(x), x * 2)
    assert torch.equal(first.run(x, impl="triton"), x * 2)
    second = nb.run(TRITON_CELL.format(factor=3))["cell"]
    for _ in range(4):
        assert torch.equal(second(x), x * 3) and torch.equal(first(x), x * 3)
    assert torch.equal(second.run(x, impl="triton"), x * 3)  # the edited kernel, not the reference
    compiled = torch.compile(lambda t: first(t) + 1, fullgraph=True)
    assert torch.equal(compiled(x), x * 3 + 1)
