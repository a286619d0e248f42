"""Shared test set-up: Triton's interpreter on machines without a GPU, hardware markers that skip
by themselves, and a clean op registry after each test."""

from __future__ import annotations

import os

# Triton decides at decoration time whether a kernel is interpreted, so this must come before any
# test module defines a kernel.
try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest


_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def pytest_collection_modifyitems(config, items):
    # Triton picks interpreter or GPU per process, when a kernel is defined: CPU tests (which launch
    # Triton kernels on CPU tensors) need the interpreter, gpu tests need it off.
    if not _HAS_CUDA or _INTERPRET:
        skip = pytest.mark.skip(reason="needs a CUDA GPU with TRITON_INTERPRET unset (pytest -m gpu)")
        kind = "gpu"
    else:
        skip = pytest.mark.skip(
            reason="CPU test: launches Triton kernels through the interpreter; on a GPU machine run "
            "TRITON_INTERPRET=1 pytest -m 'not gpu'"
        )
        kind = "cpu"
    for item in items:
        if ("gpu" in item.keywords) == (kind == "gpu"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _clean_registry():
    """Ops created inside a test are removed from torch.ops when it ends. Ops that kernelgraft's
    own modules define on import (the examples) stay: their module, imported once, keeps them."""
    from kernelgraft._op import _registry

    before = set(_registry._OPS)
    yield
    for name in set(_registry._OPS) - before:
        module = getattr(_registry._OPS[name].reference, "__module__", "") or ""
        if not module.startswith("kernelgraft."):
            _registry.unregister(name)


@pytest.fixture
def device() -> str:
    return "cuda" if _HAS_CUDA else "cpu"
