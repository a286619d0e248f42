"""Forward time of a small Llama (Hugging Face transformers, random weights) before and after
grafting kernelgraft ops: RMSNorm by module type (kgexamples::rmsnorm), the SwiGLU gate by pattern
(kgexamples::swiglu), in eager and under torch.compile (Inductor). Eager grafted also runs on the
ops' Python path (KERNELGRAFT_NATIVE=0 for new plans). Last, under torch.compile, each residual add
and the norm of its sum grafted by pattern as one kgexamples::rmsnorm_residual, with the SwiGLU
pattern.

Each variant is its own copy of the model (grafted, then compiled where it is compiled, in an order
that keeps the plain model's compile free of the pattern grafts, which act on every graph Inductor
compiles while they are active). Once all are built they are timed with their calls taken in turn
(``interleaved``: one call of each variant, in orders where each variant follows each other one
equally often, no synchronisation between calls), and each ratio is the median over turns of the
ratio of two calls a few milliseconds apart: timed
in blocks of 30 calls, one after the other, the same compiled model moved by 2-10% between blocks
(clock drift), more than the difference a graft makes. The quartiles of those paired ratios go
into the JSON beside them. The Python-path variant is timed where it is built, beside the grafted
model, and reported against it.

In eager only the module graft applies (a pattern graft acts inside torch.compile). Each section
runs in its own try/except, reports and continues. Each compiled variant's count of Dynamo guards
(which run on every call, on the host) goes into the JSON ("guard_lines"). Prints a ratio table
last; writes JSON to --out (default $OUT/bench_graft_llama.json). Runtime about 2-3 minutes on an
H200 (four or, with --cudagraphs, six Inductor compiles).

A control runs beside the variants: "compile_copy", a copy of the plain model (the grafted ones
are copies too) compiled the same way. It runs the plain model's program, so its ratio to
"compile" is the spread between two equal programs in that run, and each pair's
``turns_faster`` count (turns where each side was faster) says whether a ratio is more than it.
Copies of one compiled program read a few percent apart, each the same in every round (where its
objects landed, not the turns), so ``--copies N`` builds N plain and N grafted copies, a plain
one and a grafted one in turn, and compares them as groups, with a 95% interval over copies.

    python benchmarks/bench_graft_llama.py [--hidden 2048 --layers 4 --batch 4 --seq 1024] [--cudagraphs]
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import os
import platform
import random
import sys
import time
import traceback
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import add_llama_arguments, build_llama  # noqa: E402

from kernelgraft.timing.turns import balanced_orders  # noqa: E402


# (variant, baseline) pairs of the ratio table, each the median over turns of the ratio of a turn's calls
# "compile_copy" is the control: the plain model's code on a copy of it (as the grafted variants are
# copies), compiled the same way. Its ratio to "compile" is how far two equal programs read apart
# in this run: the resolution of the others.
PAIRS = (("eager_grafted", "eager"), ("compile_grafted", "compile"), ("compile_grafted_fused", "compile"),
         ("compile_copy", "compile"), ("compile_grafted", "compile_copy"),
         ("compile", "eager"), ("compile_grafted", "eager"))


def _time(fn, warmup: int, iters: int) -> float:
    """Median milliseconds per call, CUDA events, after warm-up."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def _own_code(model: torch.nn.Module, name: str) -> torch.nn.Module:
    """``model`` behind a module whose ``forward`` has a code object of its own. Dynamo keeps its
    compiled graphs on the code object of the frame it compiles and, with nn modules inlined (the
    default, the only mode in torch 2.13), guards on the modules' types and the tensors' shapes,
    not on which model it is: the fused copy (plain module types, its grafts acting inside
    Inductor) would otherwise be served the plain model's graph."""

    class Variant(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, ids, use_cache=False):
            return self.inner(ids, use_cache=use_cache)

    plain = Variant.forward
    Variant.forward = types.FunctionType(plain.__code__.replace(co_name=f"forward_{name}"), plain.__globals__,
                                         f"forward_{name}", plain.__defaults__, plain.__closure__)
    return Variant(model)


def guard_count(compiled: torch.nn.Module) -> int | None:
    """Dynamo's guards on the compiled ``_own_code`` variant (lines of its guard trees, every cache
    entry): each runs on every call, before the first kernel. A grafted variant has about the
    plain one's: a few more for the ops, once per compiled frame, none per grafted module (None
    where this torch keeps them elsewhere)."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        entries = _debug_get_cache_entry_list(type(compiled._orig_mod).forward.__code__)
        return sum(len(str(e.guard_manager).splitlines()) for e in entries)
    except Exception:
        return None


class Events:
    """The clock of ``interleaved``: CUDA events recorded on the current stream, read after a
    synchronisation."""

    @staticmethod
    def stamp():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def elapsed(start, end) -> float:
        return start.elapsed_time(end)

    @staticmethod
    def sync() -> None:
        torch.cuda.synchronize()


def interleaved(fns: dict, rounds: int, iters: int, clock=None) -> tuple[dict, dict, dict]:
    """Milliseconds per call of each of ``fns``, the calls taken in turn: each round makes one
    untimed call of each, then ``iters`` turns of one timed call of each (in ``balanced_orders``,
    where each variant follows each other one equally often, turn after turn), with no
    synchronisation until the round ends, so the GPU runs the calls back to back and two
    variants' calls in a turn are a few milliseconds apart: the clock's drift over a run (the same
    compiled model read 4.26 and 4.66 ms in rounds a minute apart) lands on both sides of a pair. The garbage collector runs between rounds, not inside one (as
    ``timeit`` does): an eager forward's garbage would otherwise be collected in whichever call
    comes next. A call's time is its start-to-end on the GPU's stream: its kernels, and any gap
    where the GPU waited for the host to launch them (a host-bound decode step).

    Returns each variant's median over rounds, its median per round (index r: round r) and its
    per-call times (index: turn; aligned across variants, so ``paired_ratio`` pairs the calls of a
    turn). ``clock`` (``stamp``, ``elapsed``, ``sync``) defaults to CUDA events."""
    clock = clock or Events()
    names = list(fns)
    orders = balanced_orders(len(names))
    per_round: dict[str, list[float]] = {name: [] for name in names}
    per_call: dict[str, list[float]] = {name: [] for name in names}
    collecting = gc.isenabled()
    try:
        for r in range(rounds):
            for name in names:
                fns[name]()
            clock.sync()
            gc.collect()
            gc.disable()
            stamps = []
            for i in range(iters):
                # round r relabels the orders by r (still balanced): over len(names) rounds each
                # variant takes each place in a turn equally often
                for k in ((x + r) % len(names) for x in orders[(r * iters + i) % len(orders)]):
                    start = clock.stamp()
                    fns[names[k]]()
                    stamps.append((names[k], start, clock.stamp()))
            clock.sync()
            if collecting:
                gc.enable()
            times: dict[str, list[float]] = {name: [] for name in names}
            for name, start, end in stamps:
                times[name].append(clock.elapsed(start, end))
            for name in names:
                per_round[name].append(statistics.median(times[name]))
                per_call[name].extend(times[name])
    finally:
        if collecting:
            gc.enable()
    return {name: statistics.median(v) for name, v in per_round.items()}, per_round, per_call


def _ratios(samples: dict[str, list[float]], a: str, b: str) -> list[float]:
    if a not in samples or b not in samples:
        return []
    return [x / y for x, y in zip(samples[a], samples[b]) if y > 0]


def paired_ratio(samples: dict[str, list[float]], a: str, b: str) -> float | None:
    """The median over aligned samples (calls of a turn, or rounds) of time(a) / time(b); None if
    either is missing."""
    ratios = _ratios(samples, a, b)
    return statistics.median(ratios) if ratios else None


def turns_faster(samples: dict[str, list[float]], a: str, b: str) -> list[int] | None:
    """[turns where a was faster, turns where b was] over aligned samples (ties in neither): with
    no difference between the two, each count is binomial around half the turns."""
    ratios = _ratios(samples, a, b)
    if not ratios:
        return None
    return [sum(r < 1.0 for r in ratios), sum(r > 1.0 for r in ratios)]


def group_ratios(samples: dict[str, list[float]], ours: list[str], plain: list[str]) -> dict:
    """Grafted copies against plain copies, as groups: per turn, the mean time of ``ours`` over
    the mean of ``plain``, its median over turns and the turns each side was faster; beside it
    each copy's paired ratio to the mean of ``plain`` (how far equal programs spread)."""
    turns = min(len(samples[n]) for n in ours + plain)
    mean = lambda names, t: statistics.fmean(samples[n][t] for n in names)  # noqa: E731
    group = {"ours": [mean(ours, t) for t in range(turns)], "plain": [mean(plain, t) for t in range(turns)]}
    each = {n: paired_ratio({n: samples[n][:turns], "plain": group["plain"]}, n, "plain") for n in ours + plain}
    return {"ours / plain": paired_ratio(group, "ours", "plain"), "quartiles": quartiles(group, "ours", "plain"),
            "turns_faster": turns_faster(group, "ours", "plain"), "each / plain": each,
            "interval_95": copies_interval([each[n] for n in ours], [each[n] for n in plain])}


def copies_interval(ours: list[float], plain: list[float], resamples: int = 4000, seed: int = 0) -> list[float] | None:
    """A 95% interval for mean(ours) / mean(plain) of the copies' ratios (``each / plain``), by a
    bootstrap over copies: each copy of a program reads its own few percent off (where its objects
    landed in memory, and not from turn to turn), so the copies, not the turns, are the samples
    the groups' difference must stand out from. None with fewer than two copies a side."""
    if len(ours) < 2 or len(plain) < 2:
        return None
    rng = random.Random(seed)
    draws = sorted(statistics.fmean(rng.choices(ours, k=len(ours))) / statistics.fmean(rng.choices(plain, k=len(plain)))
                   for _ in range(resamples))
    return [draws[int(0.025 * resamples)], draws[int(0.975 * resamples) - 1]]


def quartiles(samples: dict[str, list[float]], a: str, b: str) -> list[float] | None:
    """The first and third quartiles of the paired ratios time(a) / time(b): how wide they spread
    (None with fewer than two)."""
    ratios = _ratios(samples, a, b)
    if len(ratios) < 2:
        return None
    q = statistics.quantiles(ratios, n=4)
    return [q[0], q[2]]


def profile_kernels(fns: dict, calls: int = 5, top: int = 12) -> dict:
    """Per variant: GPU microseconds per forward by kernel name (torch.profiler), its kernel count and
    total, the ``top`` largest printed. Compiled variants name Inductor's fused kernels, grafted ones
    kernelgraft's, so two variants' lists show which kernels a graft replaced and what it cost."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for name, fn in fns.items():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        kernels = {}
        for evt in prof.key_averages():
            us = getattr(evt, "device_time_total", None)
            if us is None:
                us = getattr(evt, "cuda_time_total", 0)
            if us > 0:
                kernels[evt.key] = kernels.get(evt.key, 0.0) + us / calls
        ranked = sorted(kernels.items(), key=lambda kv: -kv[1])
        out[name] = {"total_us": round(sum(kernels.values()), 1), "kernels": len(kernels),
                     "by_kernel_us": {k: round(v, 2) for k, v in ranked}}
        print(f"    {name}: {out[name]['total_us']:.1f} us of GPU time per forward in {len(kernels)} kernels",
              flush=True)
        for k, v in ranked[:top]:
            print(f"        {v:9.1f}  {k[:110]}", flush=True)
    return out


def kernel_difference(profile: dict, a: str, b: str) -> dict | None:
    """The kernels (GPU us per forward) that only one of two profiled variants runs, and both totals:
    where two variants that should run the same code (every op site inlined) part ways."""
    if a not in profile or b not in profile:
        return None
    ka, kb = profile[a]["by_kernel_us"], profile[b]["by_kernel_us"]
    return {f"only {a}": {k: v for k, v in ka.items() if k not in kb},
            f"only {b}": {k: v for k, v in kb.items() if k not in ka},
            "total_us": {a: profile[a]["total_us"], b: profile[b]["total_us"]}}


def suspend_patterns(model) -> None:
    """Take ``model``'s pattern grafts out of Inductor's passes once its compiled variant exists:
    they act on every graph Inductor compiles while active, and a plain copy compiled later must
    stay plain (``kg.ungraft`` would also undo the module graft, and the compiled variant's guards
    with it)."""
    from kernelgraft.graft import apply as _graft, pattern as _pattern

    for pattern in _graft._MODEL_PATTERNS.get(model, []):
        _pattern.uninstall(pattern)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_llama_arguments(parser)
    parser.add_argument("--iters", type=int, default=30, help="calls timed per variant and round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds over the variants")
    parser.add_argument("--cudagraphs", action="store_true", help="also time mode='reduce-overhead'")
    parser.add_argument("--eager-only", action="store_true",
                        help="skip torch.compile (a decode-sized run: --batch 1 --seq 1 --eager-only)")
    parser.add_argument("--copies", type=int, default=1,
                        help="copies of the plain compiled model as controls, and of the compiled grafted one: "
                             "with more than one, each side's copies are timed in turn and compared as groups")
    parser.add_argument("--compiled-only", action="store_true",
                        help="time the compiled variants only (more turns in the time; eager is still built)")
    parser.add_argument("--profile", action="store_true",
                        help="after the timing, list each variant's GPU kernels (torch.profiler, CUDA time "
                             "per forward by kernel) beside the plain model's: where a ratio comes from")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_graft_llama.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    t_start = time.time()

    import transformers
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    import kernelgraft as kg
    from kernelgraft import native as _native
    from kernelgraft.examples.rmsnorm import rmsnorm
    from kernelgraft.examples.rmsnorm_residual import add_rmsnorm_pattern, rmsnorm_residual
    from kernelgraft.graft import inline as _inline

    # Build (or load) the native replay before timing: it otherwise builds in the background.
    print(f"native replay: {'ready' if _native.load() is not None else _native.reason()}", flush=True)
    from kernelgraft.examples.swiglu import swiglu, swiglu_pattern

    result: dict = {
        "config": vars(args),
        "versions": {
            "torch": torch.__version__, "transformers": transformers.__version__,
            "triton": getattr(sys.modules.get("triton"), "__version__", None),
            "python": platform.python_version(), "gpu": torch.cuda.get_device_name(),
        },
        "times_ms": {}, "errors": {}, "max_abs_diff_vs_eager": {}, "notes": [],
    }
    times, errors, diffs = result["times_ms"], result["errors"], result["max_abs_diff_vs_eager"]

    model, ids = build_llama(args)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 32)

    def run(m):
        with torch.no_grad():
            return m(ids, use_cache=False).logits

    expected = run(model)
    variants: dict = {}  # name -> the callable timed in the interleaved rounds

    def section(name, fn):
        print(f"[{time.time() - t_start:6.1f}s] {name} ...", flush=True)
        try:
            fn()
        except Exception as exc:  # report and continue with the next section
            errors[name] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()

    def add(name, m):
        out = run(m)
        diffs[name] = float((out.float() - expected.float()).abs().max())
        variants[name] = m
        print(f"    {name}: max |logits - eager| {diffs[name]:.3g}", flush=True)

    section("eager", lambda: add("eager", model))

    def compiled(name, m, mode=None):
        from torch._dynamo.utils import counters

        graphs = counters["stats"]["unique_graphs"]
        c = torch.compile(_own_code(m, name), fullgraph=True, mode=mode)
        t0 = time.time()
        run(c)
        result.setdefault("compile_s", {})[name] = round(time.time() - t0, 1)
        if counters["stats"]["unique_graphs"] == graphs:  # served an earlier variant's graph
            result["notes"].append(f"{name}: no new graph was compiled; it reuses an earlier variant's")
            print(f"    {result['notes'][-1]}", flush=True)
        result.setdefault("guard_lines", {})[name] = guard_count(c)
        print(f"    {name}: {result['guard_lines'][name]} lines of Dynamo guards", flush=True)
        add(name, c)

    # the plain model compiles before any pattern graft is active (they apply process-wide)
    if not args.eager_only:
        section("compile", lambda: compiled("compile", model))
    if args.cudagraphs and not args.eager_only:
        section("compile_cudagraphs", lambda: compiled("compile_cudagraphs", model, "reduce-overhead"))

    if not args.eager_only:  # the control: equal code on a copy, as the grafted variants are copies
        section("compile_copy", lambda: compiled("compile_copy", copy.deepcopy(model)))

    reports = {}
    grafted = copy.deepcopy(model)
    fused_model = copy.deepcopy(model)

    def do_graft(target, into: dict, name: str) -> None:
        inputs = ((ids,), {"use_cache": False})
        for key, rules, kw in (("module", {LlamaRMSNorm: rmsnorm}, {}),
                               ("pattern", None, {"pattern": swiglu_pattern, "replacement": swiglu})):
            call = (target, rules) if rules is not None else (target,)
            try:
                into[key] = kg.graft(*call, example_inputs=inputs, **kw)
            except kg.VerificationError as exc:  # keep timing; the numbers say how far off
                result["notes"].append(f"{name}: {key} graft failed verification, grafted unverified: {exc}")
                print(f"    {result['notes'][-1]}", flush=True)
                into[key] = kg.graft(*call, verify=False, **kw)
        result.setdefault("graft", {})[name] = {k: {"count": r.count, "verified": r.verified, "kept": r.kept}
                                                for k, r in into.items()}
        print(f"    {name}: module graft: {into['module']}; pattern graft: {into['pattern']}", flush=True)

    section("graft", lambda: do_graft(grafted, reports, "grafted"))
    section("eager_grafted", lambda: add("eager_grafted", grafted))

    def python_path():
        # The grafted model with the native replay off (new plans are not recorded): what the ops'
        # eager calls cost on kernelgraft's Python path, timed in alternation with the replay on.
        before = os.environ.get("KERNELGRAFT_NATIVE")

        def timed(native: str) -> float:
            os.environ["KERNELGRAFT_NATIVE"] = native
            rmsnorm.dispatcher.reset()
            run(grafted)  # plans again (and records the replay, where on) before the timing
            return _time(lambda: run(grafted), warmup=1, iters=args.iters)

        try:
            pairs = [(timed("0"), timed("1")) for _ in range(max(1, args.rounds // 2))]
            times["eager_grafted_python_path"] = statistics.median(p for p, _ in pairs)
            result["python_path_vs_native"] = statistics.median(p / n for p, n in pairs)
            print(f"    eager_grafted_python_path: {times['eager_grafted_python_path']:.3f} ms, "
                  f"{result['python_path_vs_native']:.3f}x the native replay's", flush=True)
        finally:
            if before is None:
                os.environ.pop("KERNELGRAFT_NATIVE", None)
            else:
                os.environ["KERNELGRAFT_NATIVE"] = before
            rmsnorm.dispatcher.reset()
            run(grafted)

    section("eager_grafted_python_path", python_path)
    if not args.eager_only:
        section("compile_grafted", lambda: compiled("compile_grafted", grafted))
    if args.cudagraphs and not args.eager_only:
        section("compile_cudagraphs_grafted",
                lambda: compiled("compile_cudagraphs_grafted", grafted, "reduce-overhead"))
    def grafted_copy(k: int) -> None:
        other = copy.deepcopy(model)
        try:
            do_graft(other, {}, f"grafted{k}")
            compiled(f"compile_grafted{k}", other)
        finally:  # a failed graft or compile leaves the plain copies after it plain too
            suspend_patterns(other)

    if not args.eager_only:
        suspend_patterns(grafted)
        # more copies, a plain one and a grafted one (grafted as the first was) in turn, so that
        # neither side is the one built later; each grafted copy's pattern graft acts on its own
        # compile alone
        for k in range(2, args.copies + 1):
            section(f"compile_copy{k}", lambda k=k: compiled(f"compile_copy{k}", copy.deepcopy(model)))
            section(f"compile_grafted{k}", lambda k=k: grafted_copy(k))
    if "pattern" in reports:
        result["pattern_matches_compiled"] = reports["pattern"].compiled

    def fused():
        # Under torch.compile an opaque RMSNorm keeps Inductor from fusing the residual add into
        # it; graft the add and the norm together (one rmsnorm_residual per add) instead.
        inputs = ((ids,), {"use_cache": False})
        fused_reports = {
            "add_rmsnorm": kg.graft(fused_model, pattern=add_rmsnorm_pattern, replacement=rmsnorm_residual,
                                    example_inputs=inputs),
            "swiglu": kg.graft(fused_model, pattern=swiglu_pattern, replacement=swiglu, example_inputs=inputs),
        }
        result["graft_fused"] = {k: {"count": r.count, "verified": r.verified} for k, r in fused_reports.items()}
        print("    fused graft: " + ", ".join(f"{k} {r.count} site(s), verified={r.verified}"
                                          for k, r in fused_reports.items()), flush=True)
        compiled("compile_grafted_fused", fused_model)

    if not args.eager_only:
        section("compile_grafted_fused", fused)

    def timing():
        from torch._dynamo.utils import counters

        graphs = counters["stats"]["unique_graphs"]
        fns = {name: (lambda m=m: run(m)) for name, m in variants.items()
               if not args.compiled_only or name.startswith("compile")}
        medians, per_round, per_call = interleaved(fns, args.rounds, args.iters)
        times.update(medians)
        result["per_round_ms"] = per_round
        result["per_call_ms"] = {k: [round(x, 4) for x in v] for k, v in per_call.items()}
        result["paired"] = {f"{a} / {b}": paired_ratio(per_call, a, b) for a, b in PAIRS}
        result["paired_by_round"] = {f"{a} / {b}": paired_ratio(per_round, a, b) for a, b in PAIRS}
        result["paired_quartiles"] = {f"{a} / {b}": quartiles(per_call, a, b) for a, b in PAIRS}
        result["turns_faster"] = {f"{a} / {b}": turns_faster(per_call, a, b) for a, b in PAIRS}
        plain = [n for n in per_call if n == "compile" or n.startswith("compile_copy")]
        ours = [n for n in per_call if n.startswith("compile_grafted") and "fused" not in n]
        if len(plain) > 1 and len(ours) > 1:
            result["groups"] = group_ratios(per_call, ours, plain)
        if counters["stats"]["unique_graphs"] != graphs:  # a recompile could have taken in the grafts
            result["notes"].append(f"{counters['stats']['unique_graphs'] - graphs} graph(s) compiled during the "
                                   "timing rounds: a compiled variant recompiled")
        for name in medians:
            print(f"    {name}: {medians[name]:.3f} ms", flush=True)

    section(f"timing ({args.rounds} interleaved rounds x {args.iters} calls)", timing)
    def profiled():
        result["profile"] = profile_kernels({name: (lambda m=m: run(m)) for name, m in variants.items()})
        diff = kernel_difference(result["profile"], "compile_grafted", "compile")
        if diff is not None:
            result["kernel_difference"] = diff
            print(f"    kernels of compile_grafted not in compile: {len(diff['only compile_grafted'])}, "
                  f"of compile not in compile_grafted: {len(diff['only compile'])}", flush=True)

    if args.profile:
        section("profile", profiled)
    for m in (grafted, fused_model):
        try:
            kg.ungraft(m)
        except Exception as exc:
            errors["ungraft"] = repr(exc)

    # Inductor's in-graph choice per op call site (kernelgraft.graft.inline): inlined reference or op
    result["inline_choices"] = [{"op": k[0], "args": [str(a) for a in k[3:]], "inlined": v[0], "why": v[1]}
                                for k, v in _inline.choices().items()]
    for c in result["inline_choices"]:
        print(f"    in-graph: {c['op']} {'inlined' if c['inlined'] else 'kept'}: {c['why']}", flush=True)
    result["total_s"] = round(time.time() - t_start, 1)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, default=str)

    def described(paired, q, won) -> str:
        return (f"{paired:.3f}" + (f" (quartiles {q[0]:.3f}-{q[1]:.3f})" if q else "")
                + (f", faster in {won[0]} of {sum(won)} turns" if won else ""))

    def ratio(a, b):
        paired = result.get("paired", {}).get(f"{a} / {b}")
        if paired is not None:
            return described(paired, result["paired_quartiles"].get(f"{a} / {b}"),
                             result["turns_faster"].get(f"{a} / {b}"))
        return f"{times[a] / times[b]:.3f}" if a in times and b in times else "n/a"

    rows = [(f"{a.replace('_', ' ')} / {b.replace('_', ' ')}", ratio(a, b)) for a, b in PAIRS]
    if result.get("groups", {}).get("ours / plain") is not None:
        g = result["groups"]
        rows.append(("grafted copies / plain copies", described(g["ours / plain"], g["quartiles"], g["turns_faster"])))
        if g.get("interval_95"):
            rows.append(("  95% interval over copies", "{:.3f}-{:.3f}".format(*g["interval_95"])))
        rows += [(f"  {n} / plain copies", f"{r:.3f}") for n, r in g["each / plain"].items() if r is not None]
    if "python_path_vs_native" in result:
        rows.append(("eager grafted, Python path / native replay", f"{result['python_path_vs_native']:.3f}"))
    if args.cudagraphs:
        rows.append(("cudagraphs grafted / cudagraphs", ratio("compile_cudagraphs_grafted", "compile_cudagraphs")))
    print(f"\nLlama {args.layers}x{args.hidden} bf16, {args.batch}x{args.seq} tokens, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}; times: "
          + ", ".join(f"{k} {v:.3f} ms" for k, v in times.items()))
    if errors:
        print("errors: " + "; ".join(f"{k}: {v[:200]}" for k, v in errors.items()))
    print(f"{'ratio (lower = grafted faster)':<34} value")
    for name, value in rows:
        print(f"{name:<34} {value}")
    return 0 if not errors else 2


if __name__ == "__main__":
    sys.exit(main())
