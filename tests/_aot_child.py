"""Child process for AOT tests: blocks ``import triton``, loads a bundle and exercises it.

usage: python tests/_aot_child.py BUNDLE MODE OUT_JSON
MODE 'record': launches are recorded by a patched Launcher (CPU machines);
MODE 'driver': the first launch goes to the real driver (expect LaunchError without a GPU);
MODE 'run': real launches on the GPU, inputs and outputs saved next to OUT_JSON for comparison.
"""

import json
import zlib
import sys


# As if triton were not installed: `import triton` raises ModuleNotFoundError and
# importlib.util.find_spec("triton") returns None (torch asks that while initializing CUDA).
sys.modules["triton"] = None  # type: ignore[assignment]

import torch  # noqa: E402

import kernelgraft as kg  # noqa: E402

CASES = {
    "kgexamples::add_relu": [((3000,), torch.float32), ((128, 1024), torch.float32), ((7,), torch.float32),
                             ((33, 97), torch.float16), ((33, 97), torch.bfloat16), ((4096,), torch.float32)],
    "kgexamples::rmsnorm": [((5, 64), torch.float32), ((3, 1000), torch.float32), ((17, 4096), torch.float32),
                            ((9, 768), torch.float16), ((9, 768), torch.bfloat16), ((1, 7), torch.float32)],
}


def inputs(op_name, shape, dtype, device):
    g = torch.Generator().manual_seed(zlib.crc32(f"{op_name}{shape}{dtype}".encode()))
    if op_name.endswith("add_relu"):
        return (torch.randn(shape, generator=g).to(device, dtype), torch.randn(shape, generator=g).to(device, dtype))
    return (torch.randn(shape, generator=g).to(device, dtype), torch.randn(shape[-1:], generator=g).to(device, dtype), 1e-6)


def main(path, mode, out_json):
    device = "cuda" if mode == "run" else "cpu"
    calls = []
    if mode == "record":
        from kernelgraft.driver import module as _module

        def fake(self, device_index, grid, block, values, shared_mem=0, stream=None):
            calls.append({"kernel": self.function.name, "grid": list(grid), "block": list(block),
                          "values": list(values), "shared_mem": shared_mem, "kinds": list(self.buffer.kinds)})

        _module.Launcher.__call__ = fake
        from kernelgraft.aot.native_kernel import NativeKernel

        def fake_native(self, device_index, grid, block, values, shared_mem=0):
            calls.append({"kernel": self.name, "grid": list(grid), "block": list(block), "values": list(values),
                          "shared_mem": shared_mem, "kinds": list(self.kinds)})

        NativeKernel._launch = fake_native  # CuTe DSL libraries: recorded, never opened (no driver here)
        NativeKernel._check_params = lambda self, device: None
    # CuTe DSL candidates are native code that needs the driver to load ('driver' mode leaves them out)
    bundle = kg.load_bundle(path, arch=None if mode == "run" else "sm_90", allow_native=mode != "driver")
    report = {"triton_imported": sys.modules.get("triton") is not None, "rebuilt": bundle.rebuilt, "runs": [],
              "attached": bundle.attached}
    saved = {}
    for entry in bundle.manifest["ops"]:
        name = entry["name"]
        for cand in entry["candidates"]:
            if cand["label"] not in bundle.attached.get(name, ()):
                continue  # CuTe DSL libraries off the GPU (see allow_native above)
            runner = bundle.runner(name, cand["index"], cand["config"])
            for shape, dtype in CASES.get(name, []):
                args = inputs(name, shape, dtype, device)
                if runner.covers(args) is not None:
                    continue
                out = torch.full(shape, float("nan"), dtype=dtype, device=device)
                ptrs = [a.data_ptr() for a in args if isinstance(a, torch.Tensor)] + [out.data_ptr()]
                try:
                    runner(*args, out)
                    error = None
                except kg.KernelgraftError as exc:
                    error = f"{type(exc).__name__}: {exc}"
                key = f"{name}|{cand['label']}|{shape}|{dtype}"
                report["runs"].append({"key": key, "op": name, "label": cand["label"], "shape": list(shape),
                                       "dtype": str(dtype), "ptrs": ptrs, "error": error,
                                       "call": calls[-1] if calls and error is None and mode == "record" else None})
                if mode == "run":
                    saved[key] = ([a.cpu() if isinstance(a, torch.Tensor) else a for a in args], out.cpu())
                if mode == "driver":
                    break
    if mode == "run":
        torch.cuda.synchronize()
        torch.save(saved, out_json + ".pt")
        # one call through the op itself (selection, plan, output allocation)
        op = bundle.ops["kgexamples::add_relu"]
        x = torch.randn(4096, device="cuda")
        report["op_call_ok"] = bool(torch.equal(op(x, x), torch.relu(x + x)))
    with open(out_json, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
