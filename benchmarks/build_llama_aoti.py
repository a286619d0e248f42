"""Build what examples/cpp/run_aoti needs to run the grafted small Llama with no Python: an
AOTInductor package of the model with RMSNorm (by module type) and SwiGLU (by pattern, on the
ExportedProgram) grafted, a bundle of those ops for this GPU, and an IO file (input ids and the
Python model's logits). Records the Python side's cold start (process start to first grafted
logits, JIT included) for the C++ program's to be compared with.

The model is bench_graft_llama.py's (same defaults, bfloat16 on CUDA). On the GPU machine:

    python benchmarks/build_llama_aoti.py --out-dir $OUT/llama_aoti
    cmake -S examples/cpp -B build -DCMAKE_PREFIX_PATH="$(python -c 'import torch; print(torch.utils.cmake_prefix_path)')"
    cmake --build build -j
    ./build/run_aoti $OUT/llama_aoti/bundle $OUT/llama_aoti/llama.pt2 $OUT/llama_aoti/io.pt --atol 5e-2 --rtol 5e-2 --runs 20

(``--seq 128 --batch 1`` makes a quicker first try; the tolerance is the graft tests' for bfloat16.)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import add_llama_arguments, build_llama  # noqa: E402


def _process_age_s() -> float:
    """Seconds since this process started (the kernel's start time), so imports are counted."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_llama_arguments(parser)
    parser.add_argument("--out-dir", default=os.path.join(os.environ.get("OUT", "."), "llama_aoti"))
    parser.add_argument("--cold-start-only", action="store_true",
                        help="only time process start to first grafted logits (run again: a warm kernelgraft "
                             "cache) and add it to OUT_DIR/report.json as python_warm_cache_start_s")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU (the package is compiled for the GPU the bundle serves)", file=sys.stderr)
        return 1
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    import kernelgraft as kg
    from kernelgraft.aot import build_bundle
    from kernelgraft.examples.rmsnorm import rmsnorm
    from kernelgraft.examples.swiglu import swiglu, swiglu_pattern

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"config": vars(args), "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    model, ids = build_llama(args)

    class Logits(torch.nn.Module):  # export wants tensors in, tensors out
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids, use_cache=False).logits

    reference_model = copy.deepcopy(model)  # ungrafted, for the float64 logits the outputs are judged by
    with torch.no_grad():
        plain = Logits(model)(ids)
        kg.graft(model, {LlamaRMSNorm: rmsnorm}, example_inputs=((ids,), {"use_cache": False}))
        grafted = Logits(model)(ids)  # the Python process's first grafted result (JIT included)
        torch.cuda.synchronize()
        report["python_cold_start_s"] = round(_process_age_s(), 3)
        if args.cold_start_only:
            path = out / "report.json"
            saved = json.loads(path.read_text()) if path.exists() else {}
            saved["python_warm_cache_start_s"] = report["python_cold_start_s"]
            path.write_text(json.dumps(saved, indent=2))
            print(f"process start to first grafted logits (warm kernelgraft cache): {report['python_cold_start_s']} s")
            return 0
        report["python_grafted_vs_plain_max_abs"] = (grafted.float() - plain.float()).abs().max().item()

        t = time.perf_counter()
        ep = torch.export.export(Logits(model), (ids,))
        swiglu_report = kg.graft(ep, pattern=swiglu_pattern, replacement=swiglu, example_inputs=(ids,))
        report["export_s"] = round(time.perf_counter() - t, 1)
        targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
        report["ops_in_graph"] = {name: targets.count(name) for name in
                                  ("kgexamples.rmsnorm.default", "kgexamples.swiglu.default")}
        report["swiglu_sites"] = swiglu_report.count
        eager = ep.module()(ids)
        report["exported_vs_grafted_max_abs"] = (eager.float() - grafted.float()).abs().max().item()
        # What the package must equal: the same exported program compiled by Inductor in Python (the
        # package is Inductor's code too; bf16 Inductor code differs from eager by its own roundings,
        # 0.09 in the largest logit for the plain model). Python's aoti_load_package crashes on the
        # GPU machine's torch 2.11, so torch.compile stands in for it.
        t = time.perf_counter()
        expected = torch.compile(ep.module(), fullgraph=True)(ids)
        report["python_compile_s"] = round(time.perf_counter() - t, 1)
        report["python_compiled_vs_eager_max_abs"] = (expected.float() - eager.float()).abs().max().item()
        # and the yardstick of accuracy: the ungrafted model in float64
        reference = Logits(reference_model.to(torch.float64))(ids)
        del reference_model

        t = time.perf_counter()
        # Builds failed here (2026-12-01, runs 3 and 4): kernelgraft's NVRTC path had written a NUL into CPython's shared
        # b" ", so every space Inductor's wrapper encoded became one (fixed in backends/_nvrtc.py).
        report["encoded_space_intact"] = list(" ".encode()) == [32]
        try:
            package = torch._inductor.aoti_compile_and_package(ep, package_path=str(out / "llama.pt2"))
        finally:
            (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
        report["aoti_compile_s"] = round(time.perf_counter() - t, 1)

    # The bundle holds the kernels for the shapes the package calls them with (bf16, rank 3).
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    h, i = args.hidden, args.intermediate
    b, s = args.batch, args.seq
    bf16 = torch.bfloat16
    inputs = {
        rmsnorm.name: [(torch.empty(b, s, h, dtype=bf16), torch.empty(h, dtype=bf16), model.config.rms_norm_eps)],
        swiglu.name: [(torch.empty(b, s, i, dtype=bf16), torch.empty(b, s, i, dtype=bf16))],
    }
    t = time.perf_counter()
    manifest = build_bundle([rmsnorm, swiglu], out / "bundle", archs=[arch], inputs=inputs)
    report["bundle_s"] = round(time.perf_counter() - t, 1)
    report["bundle_candidates"] = {op["name"]: [c["label"] for c in op["candidates"]] for op in manifest["ops"]}
    report["bundle_dropped"] = [d for op in manifest["ops"] for d in op["dropped"]]

    # run_aoti compares the package with "outputs" (--atol/--rtol) and, against "reference", checks it
    # is no less accurate than the Python model ("python": the eager and the compiled logits)
    torch.save({"inputs": [ids.cpu()], "outputs": [expected.cpu()], "reference": [reference.cpu()],
                "python": [eager.cpu(), expected.cpu()]}, out / "io.pt")
    report["package"] = str(package)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print(f"\nnow: ./build/run_aoti {out / 'bundle'} {package} {out / 'io.pt'} --atol 5e-2 --rtol 5e-2 --runs 20")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
