"""What bench_libraries.py knows about the kernel libraries behind kernelgraft.examples.libraries:
the plan of shapes, each library's own public function for each op (called the way its users call
it, returning what the op returns), which of the op's impls runs the same kernel with the same
launch settings as that function (so the two must be bit-equal), the correctness checks, and the
ratios of one shape's timings.

The library functions, for liger-kernel 0.8.5 and quack-kernels 0.6.5 (each writes every output
the op writes, so the work timed is the same):

- rmsnorm: ``liger_kernel.ops.rms_norm.rms_norm_forward(x, w, eps, 0.0, "gemma", None)`` (what
  ``LigerRMSNormFunction`` runs; it also returns the rstd the op returns); ``quack.rmsnorm.rmsnorm_fwd(
  x, w, eps=eps, store_rstd=True)`` (what ``quack.rmsnorm.rmsnorm`` runs, with the rstd the op returns);
- add_rmsnorm: ``liger_kernel.ops.fused_add_rms_norm.fused_add_rms_norm_forward(x, r, w, eps, 0.0,
  "gemma")``; ``quack.rmsnorm.rmsnorm_fwd(x, w, residual=r, eps=eps, store_rstd=True)``;
- softmax: ``LigerSoftmaxFunction.apply(x)``; ``quack.softmax.softmax(x)``;
- swiglu: ``LigerSiLUMulFunction.apply(gate, up)``;
- rope_: ``LigerRopeFunction.apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin)`` (it takes
  (batch, heads, seq, dim) views and rotates their memory in place);
- cross_entropy: ``quack.cross_entropy.cross_entropy_fwd(logits, target)`` (``quack.cross_entropy.
  cross_entropy`` also writes the log-sum-exp, which the op does not).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernelgraft.bench import module_inputs, shape_plan
from kernelgraft.examples import libraries
from kernelgraft.verify import oracle

from bench_llm_suite import paired  # ratios paired by round, as the LLM suite pairs them

OPS = {name: name.replace("rope", "rope_") for name in libraries.MODULES}  # module -> op attribute
SHORT = {"quack-kernels": "quack", "liger-kernel": "liger", libraries.OWN: "own"}
NOT_INSTALLED = "not installed"


def load(name: str) -> tuple[Any, Any]:
    """(module, op) of ``kernelgraft.examples.libraries.<name>``."""
    module = importlib.import_module(f"kernelgraft.examples.libraries.{name}")
    return module, getattr(module, OPS[name])


def select(wanted: Sequence[str] | None) -> list[str]:
    """The modules ``--ops`` names (comma-separated or repeated; ``rope_`` and ``kglib::x`` too)."""
    names = [n.strip().removeprefix("kglib::").rstrip("_") for w in (wanted or ()) for n in w.split(",") if n.strip()]
    unknown = [n for n in names if n not in OPS]
    if unknown:
        raise SystemExit(f"--ops: unknown op {', '.join(unknown)}; the ops are {', '.join(OPS)}")
    return [n for n in OPS if not names or n in names]


def plan(names: Sequence[str], quick: bool) -> list[tuple[str, str, tuple]]:
    """``[(module, regime, dims)]``: each op's ``BENCH_SHAPES["llm"]``; with ``quick`` its first and
    last shape (the smallest and the largest regime)."""
    out = []
    for name in names:
        shapes = shape_plan(load(name)[0].BENCH_SHAPES, "llm")
        if quick and len(shapes) > 2:
            shapes = [shapes[0], shapes[-1]]
        out += [(name, regime, dims) for regime, dims in shapes]
    return out


def meta_case(name: str, dims: tuple) -> tuple:
    """The shape's arguments built on the meta device (nothing allocated)."""
    for case in module_inputs(load(name)[0], "meta", "llm"):
        if case.dims == dims:
            return tuple(case)
    raise KeyError(f"{name}: no llm shape {dims}")


def megabytes(args: tuple) -> float:
    return sum(t.numel() * t.element_size() for t in args if isinstance(t, torch.Tensor)) / 1e6


# ------------------------------------------------------------------ the libraries' own functions
# The device types each library's own functions take tensors on: quack's CuTe DSL kernels run on
# CUDA only; Liger's Triton kernels also run on the CPU under the Triton interpreter.
DEVICES = {"quack-kernels": ("cuda",), "liger-kernel": ("cuda", "cpu")}


def not_runnable_here(dist: str, args: tuple) -> str | None:
    """Why ``dist``'s own function cannot take ``args`` (a device it does not run on), or None."""
    devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
    off = sorted(devices - set(DEVICES.get(dist, devices)))
    if off:
        return f"not run: {dist} takes tensors on {' or '.join(DEVICES[dist])} only, these are on {', '.join(off)}"
    return None


@dataclasses.dataclass(frozen=True)
class LibraryFunction:
    label: str  # what is called, as its users write it
    fn: Callable[..., Any]  # takes the op's arguments, returns (or mutates) what the op does
    same: Callable[[tuple], str | None]  # the op's impl running the same kernel and launch, or None


def _rows_cols(x: torch.Tensor) -> tuple[int, int]:
    return x.numel() // max(x.shape[-1], 1), x.shape[-1]


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _liger_rms_kernel(args: tuple) -> str:
    # Liger's rms_norm_forward: the block-of-rows kernel (BLOCK_ROW 16) for rows of at most 256
    # elements when there are 32768 rows or more, else the row kernel
    rows, cols = _rows_cols(args[0])
    return "liger_rmsnorm_block" if _next_pow2(cols) <= 256 and rows >= 4096 * 8 else "liger_rmsnorm"


def _liger_swiglu_kernel(args: tuple) -> str | None:
    # Liger tiles rows of 16384 or more (next power of two) on Blackwell: another kernel there
    gate = args[0]
    if gate.is_cuda and torch.cuda.get_device_capability(gate.device)[0] >= 10 and _next_pow2(gate.shape[-1]) >= 16384:
        return None
    return "liger_swiglu"


_LABELS = {
    ("rmsnorm", "liger-kernel"): "liger_kernel.ops.rms_norm.rms_norm_forward(x, w, eps, 0.0, 'gemma', None)",
    ("rmsnorm", "quack-kernels"): "quack.rmsnorm.rmsnorm_fwd(x, w, eps=eps, store_rstd=True)",
    ("add_rmsnorm", "liger-kernel"): "liger_kernel.ops.fused_add_rms_norm.fused_add_rms_norm_forward(x, r, w, eps, 0.0, 'gemma')",
    ("add_rmsnorm", "quack-kernels"): "quack.rmsnorm.rmsnorm_fwd(x, w, residual=r, eps=eps, store_rstd=True)",
    ("softmax", "liger-kernel"): "liger_kernel.ops.softmax.LigerSoftmaxFunction.apply(x)",
    ("softmax", "quack-kernels"): "quack.softmax.softmax(x)",
    ("swiglu", "liger-kernel"): "liger_kernel.ops.swiglu.LigerSiLUMulFunction.apply(gate, up)",
    ("rope", "liger-kernel"): "liger_kernel.ops.rope.LigerRopeFunction.apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin)",
    ("cross_entropy", "quack-kernels"): "quack.cross_entropy.cross_entropy_fwd(logits, target)",
}
_SAME = {
    ("rmsnorm", "liger-kernel"): _liger_rms_kernel,
    ("rmsnorm", "quack-kernels"): lambda args: "quack_rmsnorm",
    ("add_rmsnorm", "liger-kernel"): lambda args: "liger_add_rmsnorm",
    ("add_rmsnorm", "quack-kernels"): lambda args: "quack_add_rmsnorm",
    ("softmax", "liger-kernel"): lambda args: "liger_softmax",  # one block per row up to 65536 columns
    ("softmax", "quack-kernels"): lambda args: "quack_softmax",
    ("swiglu", "liger-kernel"): _liger_swiglu_kernel,
    ("rope", "liger-kernel"): lambda args: "liger_rope",
    ("cross_entropy", "quack-kernels"): lambda args: "quack_cross_entropy",
}


def function_label(name: str, dist: str) -> str | None:
    """What the benchmark calls as ``dist``'s own function for op ``name`` (None: it has none)."""
    return _LABELS.get((name, dist))


def same_kernel(name: str, dist: str, args: tuple) -> str | None:
    """The op's impl that runs the kernel ``dist``'s function runs for ``args``, with its launch."""
    rule = _SAME.get((name, dist))
    return rule(args) if rule is not None else None


def _callable(name: str, dist: str) -> Callable[..., Any]:
    """The library function itself (imports the library: call only where it is installed)."""
    if dist == "liger-kernel":
        if name == "rmsnorm":
            from liger_kernel.ops.rms_norm import rms_norm_forward

            return lambda x, w, eps: (lambda r: (r[0], r[2]))(rms_norm_forward(x, w, eps, 0.0, "gemma", None))
        if name == "add_rmsnorm":
            from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward

            return lambda x, r, w, eps: fused_add_rms_norm_forward(x, r, w, eps, 0.0, "gemma")[:3]
        if name == "softmax":
            from liger_kernel.ops.softmax import LigerSoftmaxFunction

            return LigerSoftmaxFunction.apply
        if name == "swiglu":
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction

            return LigerSiLUMulFunction.apply
        if name == "rope":
            from liger_kernel.ops.rope import LigerRopeFunction

            def rope(q, k, cos, sin):
                LigerRopeFunction.apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # in place, as the op

            return rope
    if dist == "quack-kernels":
        if name in ("rmsnorm", "add_rmsnorm"):
            from quack.rmsnorm import rmsnorm_fwd

            if name == "rmsnorm":
                return lambda x, w, eps: (lambda r: (r[0], r[2]))(rmsnorm_fwd(x, w, eps=eps, store_rstd=True))
            return lambda x, r, w, eps: tuple(rmsnorm_fwd(x, w, residual=r, eps=eps, store_rstd=True))
        if name == "softmax":
            from quack.softmax import softmax

            return softmax
        if name == "cross_entropy":
            from quack.cross_entropy import cross_entropy_fwd

            return cross_entropy_fwd
    raise KeyError(f"{dist} has no function for {name}")


def library_functions(name: str, installed: dict[str, bool]) -> tuple[dict[str, LibraryFunction], dict[str, str]]:
    """The own functions of the installed libraries that have op ``name``, and why any of them
    could not be had (an import that failed)."""
    out, errors = {}, {}
    for dist in libraries.LIBRARIES:
        label = function_label(name, dist)
        if label is not None and installed.get(dist):
            try:
                fn = _callable(name, dist)
            except Exception as exc:  # the library imports, this function's module does not
                errors[dist] = f"{label}: {type(exc).__name__}: {exc}"[:300]
                continue
            out[dist] = LibraryFunction(label, fn, lambda args, d=dist: same_kernel(name, d, args))
    return out, errors


def impls_by_library(op: Any) -> dict[str, list[str]]:
    """The op's impl names grouped by the library they come from (``libraries.library_of``)."""
    out: dict[str, list[str]] = {}
    for impl in op.impls:
        out.setdefault(libraries.library_of(impl), []).append(impl.display_name)
    return out


# ------------------------------------------------------------------------------- correctness
def clone(args: tuple) -> tuple:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def produced(op: Any, result: Any, args: tuple) -> list[torch.Tensor]:
    """What a call produced, in the oracle's order: returned tensors, then mutated arguments."""
    return list(oracle.tensors(result)) + [args[i] for i in op.signature.mutated]


def run(op: Any, fn: Callable[..., Any], args: tuple) -> list[torch.Tensor]:
    """``fn`` on a fresh copy of ``args`` (a mutating op's inputs stay as they are)."""
    fresh = clone(args)
    with torch.no_grad():
        return produced(op, fn(*fresh), fresh)


def against_reference(op: Any, ref: Any, got: list[torch.Tensor]) -> dict:
    verdict = oracle.verify(ref, got, op.tolerances)
    return {"ok": verdict.ok, "detail": str(verdict)}


def against_function(op: Any, got: list[torch.Tensor], want: list[torch.Tensor], same: bool) -> dict:
    """One output set against a library function's: bit-equal (required when ``same``: the same
    kernel with the same launch), else within the oracle's tolerance for two native computations."""
    bit = len(got) == len(want) and all(
        oracle.compare(g, w, what=f"output {i}", rtol=0.0).ok for i, (g, w) in enumerate(zip(got, want)))
    problem = None if bit else oracle.compare_trees(want, got, tolerances=op.tolerances, what="output")
    return {"same_kernel": same, "bit_equal": bit, "within_tolerance": problem is None,
            "ok": bit if same else problem is None,
            "detail": ("bit-equal" if bit else f"{'NOT bit-equal (same kernel): ' if same else ''}"
                       + (problem or "within tolerance"))}


# ------------------------------------------------------------------------------------ ratios
def ratio(times: dict, ours: str, theirs: Sequence[str]) -> float | None:
    """Paired by round, else the ratio of medians."""
    have = [t for t in theirs if times.get(t, {}).get("median_us")]
    if not times.get(ours, {}).get("median_us") or not have:
        return None
    got = paired(times[ours].get("samples"), [times[t].get("samples") for t in have])
    return got if got is not None else times[ours]["median_us"] / min(times[t]["median_us"] for t in have)


def ratios(times: dict[str, dict], groups: dict[str, list[str]], functions: dict[str, str],
           installed: dict[str, bool]) -> dict:
    """One shape's comparison from its timings (label -> {"median_us", "samples"}): each library's
    best candidate (``groups``: library -> its candidates' labels), tuned / each, tuned / the best
    single library (against the libraries present; "not installed" for the others), tuned / the
    fastest library function (``functions``: library -> its label), eager and compile."""
    per, best = {}, {}
    for dist, labels in groups.items():
        timed = [lb for lb in labels if times.get(lb, {}).get("median_us")]
        if not installed.get(dist, True):
            per[dist] = {"status": NOT_INSTALLED}
        elif not timed:
            per[dist] = {"status": "no candidate timed for this shape"}
        else:
            best[dist] = min(timed, key=lambda lb: times[lb]["median_us"])
            per[dist] = {"status": "ok", "best": best[dist], "best_us": times[best[dist]]["median_us"],
                         "tuned_over": ratio(times, "tuned", [best[dist]])}
    for dist, label in functions.items():
        per.setdefault(dist, {"status": "ok"}).update(function_us=times.get(label, {}).get("median_us"),
                                                      tuned_over_function=ratio(times, "tuned", [label]))
    winner = min(best, key=lambda d: times[best[d]]["median_us"]) if best else None
    return {
        "libraries": per,
        "best_library": winner,
        "best_library_candidate": best.get(winner),
        "tuned_over_best_library": ratio(times, "tuned", list(best.values())),
        "tuned_over_best_function": ratio(times, "tuned", list(functions.values())),
        "tuned_over_eager": ratio(times, "tuned", ["eager"]),
        "tuned_over_compile": ratio(times, "tuned", ["compile"]),
    }


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def table(shapes: list[dict]) -> str:
    """The short table printed last: per shape the ratios and the tuner's choice."""
    head = ["op", "dims", "tuned us", "choice", "/best lib", "/quack", "/liger", "/own", "/lib fn", "/eager",
            "/compile", "checks"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for e in shapes:
        if "error" in e:
            lines.append(f"| {e['op']} | {e['dims']} | failed: {e['error'][:80]} |" + " |" * (len(head) - 3))
            continue
        r = e["ratios"]

        def lib(dist: str) -> str:
            got = r["libraries"].get(dist)
            if got is None:
                return "-"
            return "n/i" if got["status"] == NOT_INSTALLED else _x(got.get("tuned_over"))

        checks = e["checks"]
        bad = sum(c["ok"] is False for c in checks)
        skipped = sum(c["ok"] is None for c in checks)
        lines.append("| " + " | ".join([
            e["op"].split("::")[-1], e["dims"], _x(e["times"].get("tuned", {}).get("median_us")),
            e.get("chosen") or "-", _x(r["tuned_over_best_library"]) + (f" ({SHORT[r['best_library']]})" if r["best_library"] else ""),
            lib("quack-kernels"), lib("liger-kernel"), lib(libraries.OWN), _x(r["tuned_over_best_function"]),
            _x(r["tuned_over_eager"]), _x(r["tuned_over_compile"]), f"{len(checks) - bad - skipped}/{len(checks)} ok" + (f", {skipped} not run" if skipped else ""),
        ]) + " |")
    return "\n".join(lines)


def bit_equal_table(shapes: list[dict]) -> str:
    """Where the same kernel runs with the same launch as a library's function: per op, kernel
    and function, on how many shapes the output was bit-equal (forced, and the tuned op where it
    chose that kernel)."""
    groups: dict[tuple, list[int]] = {}
    for e in shapes:
        for c in e.get("checks", ()):
            if c.get("same_kernel"):
                who = "tuned op" if c["what"] == "tuned" else "forced"
                got = groups.setdefault((e["op"].split("::")[-1], c["same_kernel_impl"], who, c["against"]), [0, 0])
                got[0] += c["bit_equal"]
                got[1] += 1
    lines = ["| op | kernel (same launch) | run as | library function | bit-equal shapes |", "| --- | --- | --- | --- | ---: |"]
    lines += [f"| {op} | {impl} | {who} | `{fn}` | {held}/{total} |" for (op, impl, who, fn), (held, total) in groups.items()]
    return "\n".join(lines)


def summarize(shapes: list[dict]) -> dict:
    """Counts over the shapes: tuned / best single library at most 1.00 and under 1.00, the worst,
    failed checks, and bit-equality expected (the same kernel) against held."""
    vs = [(e["op"], e["dims"], e["ratios"]["tuned_over_best_library"]) for e in shapes if "ratios" in e]
    have = [v for v in vs if v[2] is not None]
    checks = [c for e in shapes for c in e.get("checks", ())]
    same = [c for c in checks if c.get("same_kernel")]
    return {
        "shapes": len(shapes), "failed_shapes": sum("error" in e for e in shapes),
        "vs_best_library": {"timed": len(have), "at_most_1": sum(v <= 1.0 for *_, v in have),
                            "below_1": sum(v < 1.0 for *_, v in have),
                            "worst": max(have, key=lambda v: v[2]) if have else None,
                            "no_library": [f"{o} {d}" for o, d, v in vs if v is None]},
        "checks": {"run": sum(c["ok"] is not None for c in checks), "failed": [c for c in checks if c["ok"] is False],
                   "not_run": [c for c in checks if c["ok"] is None]},
        "bit_equal": {"expected": len(same), "held": sum(c["bit_equal"] for c in same)},
    }
