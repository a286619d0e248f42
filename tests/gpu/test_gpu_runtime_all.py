"""Every example op from one bundle, served by the C++ runtime in a process where neither
kernelgraft nor triton imports: each op's sample inputs (what ``kernelgraft check`` and
``kernelgraft aot`` use) run through a copy of the bundle per backend (Triton, CUDA C++, cuTile,
CuTe DSL: only that backend's candidates), and what the runtime produced (returned tensors and
mutated arguments) is judged by kernelgraft's oracle against the reference, here in the parent.

Run on the GPU machine: ``pytest -m gpu tests/gpu/test_gpu_runtime_all.py``. The bundle is built there
(minutes; cuTile candidates only where tileiras is installed) unless ``KERNELGRAFT_TEST_BUNDLE_ALL``
names one built on a machine that has every toolchain::

    kernelgraft aot kernelgraft.examples.add_relu ... kernelgraft.examples.fp8_kcache_scatter \\
        --arch sm_90 --allow-partial -o DIR
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

from kernelgraft.verify import oracle as _verify
from kernelgraft.op.samples import samples

from _aot_helpers import gpu_bundle
from _runtime_helpers import WITHOUT_KERNELGRAFT, backend_only, json_child, so  # noqa: F401 (so: a fixture)

pytestmark = pytest.mark.gpu

EXAMPLES = ("add_relu", "rmsnorm", "rmsnorm_residual", "softmax", "swiglu", "gemm", "fp8_kcache_scatter")
BACKENDS = ("triton", "cuda", "cutile", "cutedsl")


def _op(short: str):
    return getattr(importlib.import_module(f"kernelgraft.examples.{short}"), short)


@pytest.fixture(scope="module")
def bundle_all(tmp_path_factory) -> Path:
    return gpu_bundle(tmp_path_factory, "KERNELGRAFT_TEST_BUNDLE_ALL", [f"kernelgraft.examples.{s}" for s in EXAMPLES],
                      allow_partial=True, timeout=1800)


def _backend_copies(bundle: Path, dst: Path) -> dict[str, str]:
    """``{backend: path}``: copies of ``bundle`` holding only that backend's candidates, their ops
    in the namespace ``kgrt_every_<backend>``; backends with no candidate at all are left out."""
    return {b: str(dst / b) for b in BACKENDS if any(backend_only(bundle, dst / b, f"kgrt_every_{b}", b))}


CHILD = WITHOUT_KERNELGRAFT + r"""
torch.ops.load_library(sys.argv[1])
bundles, cases = json.loads(sys.argv[2]), torch.load(sys.argv[3])
results = {}
for backend, path in bundles.items():
    torch.ops.kernelgraft.load_bundle(path, None, None, True)  # the test built it: native code allowed
    ns = getattr(torch.ops, "kgrt_every_" + backend)
    for short, (mutated, samples) in cases.items():
        for i, args in enumerate(samples):
            args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            try:
                out = getattr(ns, short)(*args)
                torch.cuda.synchronize()
            except RuntimeError as exc:
                results[f"{backend} {short} {i}"] = str(exc).splitlines()[0][:300]
                continue
            out = [] if out is None else [out] if isinstance(out, torch.Tensor) else list(out)
            results[f"{backend} {short} {i}"] = [t.cpu() for t in out + [args[m] for m in mutated]]
torch.save(results, sys.argv[4])
print(json.dumps({"modules": loaded_blocked()}))
"""


def test_every_example_op_from_a_bundle_matches_the_reference_without_kernelgraft(so, bundle_all, tmp_path):
    copies = _backend_copies(bundle_all, tmp_path / "copies")
    cases, refs = {}, {}
    for short in EXAMPLES:
        op = _op(short)
        args_list = [tuple(a) for a in samples(op, "cuda")][:8]
        cases[short] = (list(op.signature.mutated), args_list)
        refs[short] = [_verify.reference(op, args) for args in args_list]
    torch.save(cases, tmp_path / "cases.pt")
    report, _ = json_child(tmp_path, CHILD, so, json.dumps(copies), tmp_path / "cases.pt", tmp_path / "results.pt",
                           timeout=900)
    assert report == {"modules": []}
    results = torch.load(tmp_path / "results.pt")

    served: dict[tuple[str, str], int] = {}
    for key, got in results.items():
        backend, short, i = key.split()
        if isinstance(got, str):  # a shape or layout this backend's kernels were not built for
            assert "no bundled kernel serves these inputs" in got, (key, got)
            continue
        op = _op(short)
        verdict = _verify.verify(refs[short][int(i)], [t.cuda() for t in got], op.tolerances)
        assert verdict.ok, (key, str(verdict))
        served[(backend, short)] = served.get((backend, short), 0) + 1
    print("\nserved (backend, op): samples", dict(sorted(served.items())))
    for short in EXAMPLES:
        assert any(s == short for _, s in served), f"{short}: no backend of the bundle served any sample"
    for backend in copies:
        assert any(b == backend for b, _ in served), f"{backend}: its kernels served no sample"
    assert {"triton", "cuda", "cutedsl"} <= set(copies), copies  # cuTile: where tileiras built it
