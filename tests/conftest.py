"""Shared test set-up for tests/unit (fast, in-process), tests/integration (bundles, the C++ runtime,
the native replay, the CLI, child processes, model grafts, fuzzing) and tests/gpu (GPU only): a
private cache directory, Triton's interpreter on machines without a GPU,
hardware markers that skip by themselves, and a clean op registry, tuner and bundle state after
each test."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Tests live in unit/, integration/ and gpu/; the helpers they import (_aot_helpers, _fuzz_cases...)
# live here, beside this file.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Every kernelgraft cache (compiled code, the native replay build, the C++ runtime build, tuning
# decisions) lives under one root that kernelgraft reads from the environment: point it, and
# XDG_CACHE_HOME for the tools that follow it, at a directory of this run before anything imports
# kernelgraft, so the suite never reads or writes the user's ~/.cache. One directory per run, not
# per process: the process that starts the run (pytest-xdist's controller, or the only process)
# creates it, names it in the environment its workers inherit, and alone removes it at exit, so the
# native replay and the runtime are compiled once per run (their builds hold a file lock on their
# directory; a second builder waits and finds the build). KERNELGRAFT_TEST_CACHE_DIR names a
# directory to keep between runs instead.
_KEEP = os.environ.get("KERNELGRAFT_TEST_CACHE_DIR")
_RUN_CACHE_VAR = "KERNELGRAFT_TEST_RUN_CACHE"
_INHERITED = os.environ.get(_RUN_CACHE_VAR) if os.environ.get("PYTEST_XDIST_WORKER") else None
_SESSION_CACHE = _KEEP or _INHERITED or tempfile.mkdtemp(prefix="kernelgraft-test-cache-")
if not (_KEEP or _INHERITED):
    atexit.register(shutil.rmtree, _SESSION_CACHE, ignore_errors=True)
    os.environ[_RUN_CACHE_VAR] = _SESSION_CACHE
os.environ["KERNELGRAFT_CACHE_DIR"] = os.path.join(_SESSION_CACHE, "kernelgraft")
os.environ["XDG_CACHE_HOME"] = os.path.join(_SESSION_CACHE, "xdg")

# On a GPU a new shape is tuned off the caller's path by default; the suite's GPU tests pin what a
# first call decides, so they tune inside it (the tests of the background path ask for it).
os.environ.setdefault("KERNELGRAFT_TUNE_BLOCKING", "1")

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
    own modules define on import (the examples) stay: their module, imported once, keeps them.
    Ops rebuilt from a bundle's manifest are the test's own and go too."""
    from kernelgraft.op import registry as _registry

    before = set(_registry._OPS)
    yield
    for name in set(_registry._OPS) - before:
        module = getattr(_registry._OPS[name].reference, "__module__", "") or ""
        if not module.startswith("kernelgraft.") or module == "kernelgraft.aot.bundled":
            _registry.unregister(name)


@pytest.fixture(autouse=True)
def _reset_runtime_state():
    """Tuning decisions in memory, the tuner's view of the disk file and attached bundles are
    process-wide: a test must not see another's (a decision or bundle would change which kernel
    runs). Imported lazily so a test that never touches kernelgraft pays nothing."""
    yield
    import sys

    if "kernelgraft.tune.tuner" in sys.modules:
        from kernelgraft.tune.cache import DiskCache
        from kernelgraft.tune.tuner import TUNER

        TUNER.background.clear()  # a tuning left running off the caller's path stops at its next step
        assert TUNER.background.wait(120), "a background tuning did not stop"
        TUNER.background.stats.clear()
        TUNER.memory.clear()
        TUNER.stats.clear()
        TUNER.disk = DiskCache()
    if "kernelgraft.aot.load" in sys.modules:
        from kernelgraft.aot.load import reset_bundles

        reset_bundles()
    if "kernelgraft.op.select" in sys.modules:
        from kernelgraft.op import select as _select

        _select.bump_epoch()  # plans chosen under the old decisions or bundles are dropped


@pytest.fixture
def device() -> str:
    return "cuda" if _HAS_CUDA else "cpu"


def _run_dir(tmp_path_factory) -> Path:
    """A directory every process of this run shares: under pytest-xdist the parent of the worker's
    base temporary directory (the run's own), else the base temporary directory."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def example_bundle(tmp_path_factory):
    """The examples' bundle (``kernelgraft aot`` of add_relu and rmsnorm for sm_90), built once per
    run: the first process to ask builds it under a file lock, the others wait and read it.
    Shared, so read-only: a test that edits a bundle edits a copy. Checked unchanged at the end."""
    pytest.importorskip("cuda.bindings")
    from _aot_helpers import shared_bundle, tree_digest

    path = shared_bundle(_run_dir(tmp_path_factory), "kg-example-bundle")
    before = tree_digest(path)
    yield path
    assert tree_digest(path) == before, f"a test edited the shared bundle {path} in place (copy it first)"


@pytest.fixture(scope="session")
def signed_example_bundle(example_bundle, tmp_path_factory):
    """``example_bundle`` signed with ``_bundle_corpus.KEY``, made once per run like it."""
    from _aot_helpers import tree_digest
    from _bundle_corpus import real_bundle

    path = real_bundle(_run_dir(tmp_path_factory), unsigned=example_bundle)
    before = tree_digest(path)
    yield path
    assert tree_digest(path) == before, f"a test edited the shared bundle {path} in place (copy it first)"


def pytest_runtest_logreport(report):
    """KERNELGRAFT_TEST_INSTAFAIL=1 (the GPU session sets it) prints a failure's traceback when it
    happens: a run cut short by its time limit keeps what failed and why, not only an 'F'."""
    if report.failed and os.environ.get("KERNELGRAFT_TEST_INSTAFAIL") == "1":
        print(f"\n--- FAILED {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n---", flush=True)


def _broken_singletons() -> list[str]:
    """CPython shares one object per one-character Latin-1 string and per one-byte bytes value
    (every constant " " in every code object is the same object). Native code that writes through
    a pointer into a Python string's buffer corrupts all of them at once: on the H200 machine,
    every Inductor f-string "{type} {name}" came out without its space. Which ones changed."""
    broken = [f"chr({i}) is now {chr(i)!r}" for i in range(256) if len(chr(i)) != 1 or ord(chr(i)) != i]
    # encoding a one-character str hands back the shared one-byte bytes object, as b" " does
    broken += [f"bytes {i} is now {chr(i).encode('latin-1')!r}" for i in range(256)
               if chr(i).encode("latin-1")[0] != i]
    if f"{1} {2}" != "1 2":
        broken.append(f"f-string '{{1}} {{2}}' gives {f'{1} {2}'!r}")
    return broken


@pytest.fixture(autouse=True)
def _interpreter_intact():
    """No test may leave the interpreter's shared one-character strings or bytes changed."""
    yield
    broken = _broken_singletons()
    assert not broken, f"this test corrupted interpreter singletons: {broken[:8]}"
