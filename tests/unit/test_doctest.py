"""Docstring examples are tests: every module of the package is run through doctest."""

import doctest
import importlib
import pkgutil

import pytest

import kernelgraft

OPTIONAL = ("kernelgraft.backends._cute", "kernelgraft.backends.cutile.jit")


def _modules():
    for info in pkgutil.walk_packages(kernelgraft.__path__, "kernelgraft."):
        if not info.name.endswith("__main__"):
            yield info.name


@pytest.mark.parametrize("name", sorted(_modules()))
def test_docstrings(name):
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # optional backends without their package
        pytest.skip(f"{name} needs an optional package: {exc}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
