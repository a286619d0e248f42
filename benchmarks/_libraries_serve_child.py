"""The child process of ``bench_libraries.py --serve-check``: serves a bundle of the library ops
through kernelgraft's C++ runtime where neither library's Python package can be imported.

Before anything else it blocks ``quack``, ``liger_kernel`` and the CuTe DSL (``cutlass``) with a
meta-path finder (an import of them or of any submodule raises ModuleNotFoundError, installed or
not), and marks ``kernelgraft`` and ``triton`` absent (a None in sys.modules: torch's CUDA start
asks ``find_spec("triton")``, which must answer None rather than raise). Then it loads the runtime
library, the bundles, runs every op on every input of the inputs file and saves what each call
produced (returned tensors, then mutated arguments) or why it was refused; the parent judges them.

    python -P _libraries_serve_child.py --probe              # the blocking alone (JSON on stdout)
    python -P _libraries_serve_child.py RUNTIME_SO SPEC_JSON  # SPEC: bundles, inputs, outputs, mutated
"""

import importlib.abc
import json
import sys

FINDER_BLOCKED = ("quack", "liger_kernel", "cutlass")  # the libraries, and the DSL quack is written in
ABSENT = ("kernelgraft", "triton")
PROBES = ("quack", "quack.rmsnorm", "liger_kernel", "liger_kernel.ops.rms_norm", "cutlass", "kernelgraft", "triton")


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in FINDER_BLOCKED:
            raise ModuleNotFoundError(f"No module named {fullname!r}: blocked, the serve check runs without it",
                                      name=fullname)
        return None


def block() -> None:
    already = [m for m in sys.modules if m.split(".")[0] in FINDER_BLOCKED + ABSENT]
    if already:
        raise SystemExit(f"already imported before blocking: {already}")
    sys.meta_path.insert(0, Blocker())
    for name in ABSENT:
        sys.modules[name] = None


def probe() -> dict:
    """Each probed import: "blocked" when it raised ImportError, else "IMPORTED"."""
    out = {}
    for name in PROBES:
        try:
            __import__(name)
            out[name] = "IMPORTED"
        except ImportError:
            out[name] = "blocked"
    return out


def loaded() -> list:
    return sorted(m for m, v in list(sys.modules.items()) if v is not None and m.split(".")[0] in FINDER_BLOCKED + ABSENT)


def fresh(value):
    """A copy of a tensor with the same sizes, strides and offset (a strided view stays one)."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    base = torch.empty(value.untyped_storage().nbytes() // value.element_size(), dtype=value.dtype, device=value.device)
    view = base.as_strided(value.shape, value.stride(), value.storage_offset())
    view.copy_(value)
    return view


def serve(so: str, spec_path: str) -> dict:
    import torch

    with open(spec_path) as f:
        spec = json.load(f)
    torch.ops.load_library(so)
    bundles = {ns: list(torch.ops.kernelgraft.load_bundle(path, None, None, True)) for ns, path in spec["bundles"].items()}
    inputs = torch.load(spec["inputs"], map_location="cuda")
    outputs = {}
    for ns, names in bundles.items():
        for full in names:
            short = full.split("::", 1)[1]
            fn = getattr(getattr(torch.ops, ns), short)
            for i, case in enumerate(inputs[short]):
                args = tuple(fresh(a) for a in case)
                key = f"{ns}::{short}#{i}"
                try:
                    result = fn(*args)
                    torch.cuda.synchronize()
                except RuntimeError as exc:  # refused ("no bundled kernel serves these inputs") or failed
                    outputs[key] = f"{type(exc).__name__}: {exc}"[:400]
                    continue
                got = [result] if isinstance(result, torch.Tensor) else [t for t in (result or ())]
                outputs[key] = got + [args[j] for j in spec["mutated"].get(short, [])]
    torch.save(outputs, spec["outputs"])
    return {"bundles": bundles, "calls": len(outputs)}


def main(argv) -> int:
    block()
    report = {"imports": probe()}
    import torch  # noqa: F401  (after blocking: what torch pulls in is blocked too)

    if argv[1:] != ["--probe"]:
        report.update(serve(argv[1], argv[2]))
    report["loaded"] = loaded()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
