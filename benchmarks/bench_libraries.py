"""The library-backed ops (kernelgraft.examples.libraries) against the kernel libraries they come
from: correctness against each library's own function and the float64 reference, and the tuned
cross-library op timed beside each single library, the libraries' own functions and PyTorch.

For every op (kglib::rmsnorm, add_rmsnorm, softmax, swiglu, rope_, cross_entropy) and every shape
of its ``BENCH_SHAPES["llm"]`` (built by ``kernelgraft.bench.module_inputs(module, "cuda", "llm")``):

1. the op is tuned (``kg.tune("on", blocking=True)``, graph-replay regime) and its output, and each
   library-backed candidate forced (``op.run(*args, impl=..., config=...)``), are checked against
   the library's own public function on the same inputs (``_libraries_common``: bit-equal where the
   same kernel runs with the same launch settings, else within the oracle's tolerance) and against
   the reference in float64 (``kernelgraft.verify.oracle``);
2. the tuned op, every supported kernel candidate forced, each installed library's own function,
   torch eager and ``torch.compile`` of the reference (dynamic shapes, once per op) are timed
   together by CUDA-graph replay in balanced turns (``kernelgraft.bench.measure_interleaved``),
   ``--rounds`` times; ratios are medians of per-round ratios. Per shape: tuned / the best single
   library (each library's best candidate; quack, Liger and kernelgraft's own kernels), tuned / each
   library, tuned / the fastest library function, tuned / eager, tuned / compile, and the choice.

A library that is not installed (or does not import) has its rows say "not installed" and the
ratios are against the libraries present. ``--serve-check`` instead serves a bundle of the ops
through the C++ runtime in a process where neither library imports (``_libraries_serve``).

    python benchmarks/bench_libraries.py --out $OUT [--quick] [--ops rmsnorm,softmax] [--time-limit 460]
    python benchmarks/bench_libraries.py --serve-check --out $OUT [--bundle DIR]
    python benchmarks/bench_libraries.py --dry-run [--quick]     # the plan, on the meta device; no GPU

Writes ``libraries.json`` (everything, rewritten after each shape) and ``libraries.md`` (the table)
under ``--out`` (else $OUT, else benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _libraries_common as common  # noqa: E402
from kernelgraft.examples import libraries  # noqa: E402

WARMUP_MS, REP_MS = 30.0, 40.0  # per round, as benchmarks/bench_llm_suite.py times


def installed() -> dict[str, tuple[str | None, str | None]]:
    return {dist: libraries.status(dist) for dist in libraries.LIBRARIES}


def dry_run(names: Sequence[str], quick: bool) -> str:
    """The plan: the libraries here, each op's impls by library and own functions, every shape
    (built on the meta device) with the impl its library functions run."""
    status = installed()
    lines = ["## Libraries"] + [f"- {dist}: {source or 'not installed: ' + why}" for dist, (source, why) in status.items()]
    shapes = common.plan(names, quick)
    for name in names:
        op = common.load(name)[1]
        lines += ["", f"## {op.name}"]
        for dist, impls in common.impls_by_library(op).items():
            mark = "" if dist == libraries.OWN or status[dist][0] else f" ({common.NOT_INSTALLED})"
            fn = common.function_label(name, dist)
            lines.append(f"- {dist}{mark}: {', '.join(impls)}" + (f"; its function: {fn}" if fn else ""))
        lines += ["", "| regime | dims | inputs MB | same kernel as the library's function |", "| --- | --- | ---: | --- |"]
        for _, regime, dims in (s for s in shapes if s[0] == name):
            args = common.meta_case(name, dims)
            same = [f"{common.SHORT[d]}: {common.same_kernel(name, d, args) or 'another kernel'}"
                    for d in libraries.LIBRARIES if common.function_label(name, d)]
            lines.append(f"| {regime} | {'x'.join(map(str, dims))} | {common.megabytes(args):.1f} | {', '.join(same)} |")
    lines.append(f"\n{len(shapes)} shapes")
    return "\n".join(lines)


# --------------------------------------------------------------------------------- one shape
def _compiled(op):
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):  # every shape of the op in one process
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))
    return torch.compile(op.reference, dynamic=True)


def _together(fns: dict, rounds: int) -> dict[str, dict]:
    """Each callable's per-call GPU time, all timed at once by ``measure_interleaved`` in each of
    ``rounds`` rounds (the order rotating by one per round)."""
    from kernelgraft.bench import measure_interleaved

    labels = list(fns)
    out = {label: {"samples": [], "method": None, "calls": None, "error": None} for label in labels}
    for r in range(rounds):
        order = labels[r % len(labels):] + labels[:r % len(labels)]
        try:
            got = measure_interleaved([fns[lb] for lb in order], warmup_ms=WARMUP_MS, rep_ms=REP_MS)
        except Exception as exc:  # the whole round failed
            got = [exc] * len(order)
        for label, timing in zip(order, got):
            entry = out[label]
            if isinstance(timing, BaseException):
                entry["samples"].append(None)
                entry["error"] = f"{type(timing).__name__}: {timing}"[:300]
            else:
                entry["samples"].append(timing.median_us)
                entry["method"], entry["calls"] = timing.method, timing.calls
    for entry in out.values():
        done = [s for s in entry["samples"] if s is not None]
        entry["median_us"] = statistics.median(done) if done else None
    return out


def _forced(op, cand):
    config = cand.config.as_dict()
    return lambda *a: op.run(*a, impl=cand.index, config=config)


def bench_shape(name: str, op, case, status: dict, compiled, rounds: int, time_it: bool) -> dict:
    import kernelgraft as kg
    from kernelgraft.tune.tuner import entry_label
    from kernelgraft.verify import oracle

    args = tuple(case)
    present = {dist: status[dist][0] is not None for dist in status}
    entry = {"op": op.name, "regime": case.regime, "dims": "x".join(map(str, case.dims)),
             "inputs_mb": round(common.megabytes(args), 1)}
    with kg.tune("on", blocking=True, cold_l2=False):
        common.run(op, op, args)  # tunes this shape (blocking) before anything is timed
        plan = op.dispatcher.plan_for(args)
        chosen = getattr(plan, "candidate", None)
        entry["chosen"] = getattr(chosen, "label", None)
        decision = kg.tune.decision(op, *args)
        entry["ranking"] = [[entry_label(e), e.get("ms")] for e in (decision.ranking if decision else [])][:6]
        groups: dict[str, list[str]] = {}
        subjects, kinds, unsupported = {"tuned": op}, {}, {}
        for cand in op.candidates(*args):
            if cand.impl.backend == "torch":
                continue
            dist = libraries.library_of(cand.impl)
            groups.setdefault(dist, [])
            if not cand.supported:
                unsupported[cand.label] = cand.reason
                continue
            groups[dist].append(cand.label)
            subjects[cand.label] = _forced(op, cand)
            kinds[cand.label] = (dist, cand.impl.display_name)
        entry["unsupported"] = unsupported
        functions, missing = common.library_functions(name, present)
        # correctness: everything against the float64 reference, and against each library's function
        ref = oracle.reference(op, args)
        outputs = {}
        checks = [{"what": why.split(":")[0], "against": "its own import", "ok": False, "detail": why}
                  for why in missing.values()]
        for label, fn in subjects.items():
            try:
                outputs[label] = common.run(op, fn, args)
                checks.append({"what": label, "against": "reference (float64)",
                               **common.against_reference(op, ref, outputs[label])})
            except Exception as exc:
                checks.append({"what": label, "against": "reference (float64)", "ok": False,
                               "detail": f"raised {type(exc).__name__}: {exc}"[:300]})
        chosen_impl = getattr(getattr(chosen, "impl", None), "display_name", None)
        elsewhere = {dist: common.not_runnable_here(dist, args) for dist in functions}
        for dist, why in elsewhere.items():
            if why:  # a check that cannot run here is said so (ok None), never passed or failed
                checks.append({"what": functions[dist].label, "against": "its own run", "ok": None, "detail": why})
        functions = {dist: lf for dist, lf in functions.items() if not elsewhere[dist]}
        for dist, lf in functions.items():
            try:
                want = common.run(op, lf.fn, args)
            except Exception as exc:
                checks.append({"what": lf.label, "against": "its own run", "ok": False,
                               "detail": f"raised {type(exc).__name__}: {exc}"[:300]})
                continue
            checks.append({"what": lf.label, "against": "reference (float64)", **common.against_reference(op, ref, want)})
            same = lf.same(args)
            for label in ["tuned"] + [lb for lb in groups.get(dist, ()) if lb in outputs]:
                impl = chosen_impl if label == "tuned" else kinds[label][1]
                if label in outputs:
                    checks.append({"what": label, "against": lf.label, "same_kernel_impl": same,
                                   **common.against_function(op, outputs[label], want, same is not None and impl == same)})
            del want
        del outputs, ref
        entry["checks"] = checks
        entry["functions"] = {dist: lf.label for dist, lf in functions.items()}
        if not time_it:
            entry["times"], entry["ratios"] = {}, common.ratios({}, groups, {}, present)
            return entry
        fns = {"tuned": lambda: op(*args)}
        fns.update({label: (lambda f=fn: f(*args)) for label, fn in subjects.items() if label != "tuned"})
        fns.update({lf.label: (lambda f=lf.fn: f(*args)) for lf in functions.values()})
        fns["eager"] = lambda: op.reference(*args)
        if compiled is not None:
            fns["compile"] = lambda: compiled(*args)
        with torch.no_grad():
            entry["times"] = _together(fns, rounds)
    entry["ratios"] = common.ratios(entry["times"], groups, {d: lf.label for d, lf in functions.items()}, present)
    if entry["chosen"] in entry["times"]:  # the op against its own choice forced: about 1
        entry["tuned_over_chosen_forced"] = common.ratio(entry["times"], "tuned", [entry["chosen"]])
    return entry


# ----------------------------------------------------------------------------------- the run
def _write(out: Path, doc: dict) -> None:
    tmp = out / "libraries.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(out / "libraries.json")


def run(args, out: Path) -> int:
    from _common import environment

    from kernelgraft.bench import module_inputs

    status = installed()
    for dist, (source, why) in status.items():
        print(f"{dist}: {source or 'not installed: ' + why}", flush=True)
    names = common.select(args.ops)
    shapes = common.plan(names, args.quick)
    doc = {"environment": environment(), "libraries": {d: {"source": s, "reason": w} for d, (s, w) in status.items()},
           "settings": {"rounds": args.rounds, "quick": args.quick, "time_limit": args.time_limit,
                        "compile": "dynamic" if not args.no_compile else "off", "warmup_ms": WARMUP_MS, "rep_ms": REP_MS},
           "shapes": [], "skipped": []}
    started = time.monotonic()
    deadline = started + args.time_limit
    longest = 0.0  # no shape starts unless the longest one so far would still end before the deadline
    for name in names:
        module, op = common.load(name)
        wanted = {dims for n, _, dims in shapes if n == name}
        compiled = None if args.no_compile else _compiled(op)
        t0 = time.monotonic()
        for case in module_inputs(module, "cuda", "llm"):
            if case.dims not in wanted:
                continue
            if time.monotonic() + longest > deadline:
                doc["skipped"].append(f"{op.name} {case.regime} {case.dims}")
                continue
            t1 = time.monotonic()
            try:
                entry = bench_shape(name, op, case, status, compiled, args.rounds, not args.check_only)
            except Exception as exc:  # one shape failing must not lose the others
                entry = {"op": op.name, "regime": case.regime, "dims": "x".join(map(str, case.dims)),
                         "error": f"{type(exc).__name__}: {exc}"[:500]}
            doc["shapes"].append(entry)
            longest = max(longest, time.monotonic() - t1)
            print(f"  {op.name} {entry['dims']}: {entry.get('error') or entry.get('chosen')}", flush=True)
            del case
            torch.cuda.empty_cache()
            _write(out, doc)
        print(f"{op.name}: {len(wanted)} shapes in {time.monotonic() - t0:.1f} s", flush=True)
    doc["seconds"] = round(time.monotonic() - started, 1)
    doc["summary"] = common.summarize(doc["shapes"])
    _write(out, doc)
    text = common.table(doc["shapes"])
    s = doc["summary"]
    vs = s["vs_best_library"]
    worst = "-" if vs["worst"] is None else "{} {} {:.3f}".format(*vs["worst"])
    text += (f"\n\ntuned / best single library: {vs['at_most_1']} of {vs['timed']} shapes at most 1.00, "
             f"{vs['below_1']} under 1.00; worst {worst}; checks: {s['checks']['run'] - len(s['checks']['failed'])}"
             f"/{s['checks']['run']} ok" + (f" ({len(s['checks']['not_run'])} not run on this device)" if s['checks']['not_run'] else "")
             + f"; bit-equal where the same kernel runs: {s['bit_equal']['held']}/"
             f"{s['bit_equal']['expected']}")
    events = sorted({f"{e['op'].split('::')[-1]}: {label}" for e in doc["shapes"]
                     for label, t in e.get("times", {}).items() if t.get("median_us") and t.get("method") != "graph"})
    if events:  # not capturable: timed alone by per-call events (warm L2), not in the turns
        text += "\nnot timed by graph replay (per-call events, alone): " + "; ".join(events)
    if doc["skipped"]:
        text += f"\nskipped by --time-limit {args.time_limit:.0f} s: {len(doc['skipped'])} shapes ({', '.join(doc['skipped'])})"
    text = common.bit_equal_table(doc["shapes"]) + "\n\n" + text  # the ratios last
    (out / "libraries.md").write_text(text + "\n")
    for c in s["checks"]["failed"][:10]:
        print(f"FAILED CHECK: {c['what']} vs {c['against']}: {c['detail'][:200]}")
    print(text)
    print(f"wrote {out / 'libraries.json'} and {out / 'libraries.md'}")
    return 0 if doc["shapes"] and not s["checks"]["failed"] and not s["failed_shapes"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", action="append", help="only these ops (comma-separated, repeatable): "
                        + ", ".join(common.OPS))
    parser.add_argument("--quick", action="store_true", help="two shapes per op: its first and last")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (meta tensors), time nothing")
    parser.add_argument("--out", help="directory for libraries.json and libraries.md (default $OUT)")
    parser.add_argument("--time-limit", type=float, default=460.0,
                        help="no shape starts unless the longest so far would end within this many seconds "
                        "(the rest are listed as skipped); libraries.json is rewritten after every shape")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per shape")
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile column")
    parser.add_argument("--check-only", action="store_true", help="the correctness checks, no timing")
    parser.add_argument("--serve-check", action="store_true",
                        help="serve a bundle of the ops through the C++ runtime where neither library imports")
    parser.add_argument("--bundle", help="--serve-check: a bundle built beforehand (default: build one here)")
    args = parser.parse_args(argv)
    names = common.select(args.ops)
    if args.dry_run:
        print(dry_run(names, args.quick))
        return 0
    if not torch.cuda.is_available():
        print("bench_libraries: needs a CUDA GPU (use --dry-run to see the plan here)")
        return 2
    out = Path(args.out or os.environ.get("OUT") or HERE / "results")
    out.mkdir(parents=True, exist_ok=True)
    if args.serve_check:
        from _libraries_serve import serve_check

        return serve_check(names, out, args.bundle, args.time_limit)
    return run(args, out)


if __name__ == "__main__":
    sys.exit(main())
