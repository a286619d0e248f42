"""First calls of new shapes: served at once while their tuning runs off the caller's path.

Part 1, first calls. For each of five bf16 shapes of the example ops (``gemm`` 777x4096x4096 with
its 36 candidates, ``rmsnorm`` 1500x5120, ``softmax`` 33x50257, ``swiglu`` 300x13824, ``gemm``
3x11008x4096), in a fresh process with an empty cache and the default settings (torch and CUDA
warmed up first, on other shapes, without the op). Each process has a fresh kernelgraft cache
directory (decisions, compiled modules, the native replay's build); Triton's own compile cache is
the machine's unless ``--cold``.

- ``first_ms``: wall time of the first call (synchronised); target <= 50 ms;
- ``reference_first_ms`` (the table's floor): the first call of the op's plain PyTorch reference
  in another fresh process warmed the same way, no kernelgraft call made: the first use of each
  torch kernel loads its module, which a first call served by the reference pays too;
- ``import_floor_s`` (the reference's process, after its calls): a fresh process's first fake
  tensors (``torch._dynamo``'s import) and Inductor's first compile of the reference, which a
  process that never tuned pays once before its first decision lands (``kg.tune.warm()`` pays them
  at start-up);
- ``land_s``: from the first call until its decision lands (``kg.tune.wait``); targets <= 5 s for
  the norm, softmax and elementwise shapes, <= 15 s for the 36-candidate GEMM;
- ``first_land_s``: when a first decision, made without ``torch:compile`` (whose gate is Inductor
  compiling the reference), landed and began to serve, from the job's queueing (by the first call);
  ``land_s`` is then the whole decision's, ``torch:compile`` included; ``first_served`` the first
  decision's winner (seen every 20 ms while waiting) and ``first_choice`` it against blocking mode's;
- ``served``: what the next call runs, against what a blocking-mode process (another fresh process,
  empty cache, ``KERNELGRAFT_TUNE_BLOCKING=1``) chose: the same, or within the tuner's tie margin
  by the blocking process's own timings (``slower``: the background choice's time over the
  blocking winner's there).

Part 2, serving during tuning. In one process ``rmsnorm`` 1500x5120 is tuned (blocking), then
called eagerly in a loop for ``--serve-seconds``: with nothing tuning, while a background tuning of
``gemm`` 777x4096x4096 runs, and after it landed. ``serve_ratio``: calls/s during over calls/s
without (the mean of before and after); target >= 0.90. ``tuning_left``: whether the tuning was
still running when the window closed (else part of the window had nothing to slow it), and its
report's paused time and units timed under load.

``--also-two-pass``: each case runs a second background process in which a key whose kernels
the compile workers build still decides first without ``torch:compile``, then with it, as a cold
process did before one pass was made the rule there (``two_pass`` in each row, beside the
default's numbers: the A/B of that rule, in one run).

``--repeat N``: each case's background process runs N times (``again`` in each row: the later
runs' numbers, each against the one blocking-mode process), for the spread between fresh processes.

``--warm``: each case's process calls ``kg.tune.warm()`` after warming torch, as a server does at
start-up (the first tuning's one-time imports, compile workers and native replay paid there); the
first call and the landing then measure the new shape's own work. The native replay is built once,
before the cases, and copied into each warmed process's fresh cache directory (as a server finds
its machine's build there): its tuning cache stays empty.

Prints a short table of ratios last; writes JSON to ``$OUT/bench_first_call.json`` (``--out``).
``--smoke`` runs all of it on the CPU, in this process, with a fake timer and small shapes of
``add_relu`` and ``rmsnorm`` (the CPU test does, so the script does not rot).

    python benchmarks/bench_first_call.py [--cases gemm_777,rmsnorm] [--serve-seconds 5] [--cold] [--profile]
        [--profile-landing] [--sample-landing] [--warm] [--also-two-pass] [--repeat N] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _landing_sampler import Sampler  # noqa: E402

# name -> (example module, op attribute, shapes); gemm shapes are (M, N, K)
CASES = {
    "gemm_777": ("gemm", "gemm", (777, 4096, 4096)),
    "rmsnorm": ("rmsnorm", "rmsnorm", (1500, 5120)),
    "softmax": ("softmax", "softmax", (33, 50257)),
    "swiglu": ("swiglu", "swiglu", (300, 13824)),
    "gemm_3": ("gemm", "gemm", (3, 11008, 4096)),
}
SMOKE_CASES = {"add_relu": ("add_relu", "add_relu", (4096,)), "rmsnorm": ("rmsnorm", "rmsnorm", (5, 64))}
LAND_TARGET_S = {"gemm_777": 15.0}  # the others: 5 s
FIRST_TARGET_MS = 50.0
SERVE_TARGET = 0.90
WARM = [False]  # --warm: each case's process calls kg.tune.warm() first, as a server at start-up
PROFILE = [False, False, False]  # --profile: the first call under cProfile; --profile-landing: until it
# lands; --sample-landing: every other thread's stack sampled until it lands (wall time, low overhead)


def _inputs(module: str, shape: tuple, device: str):
    import torch

    dt = torch.bfloat16 if device == "cuda" else torch.float32
    r = lambda *s: torch.randn(*s, device=device, dtype=dt)  # noqa: E731
    if module == "gemm":
        m, n, k = shape
        return (r(m, k), r(k, n))
    if module == "rmsnorm":
        rows, cols = shape
        return (r(rows, cols), r(cols), 1e-6)
    if module == "swiglu":
        return (r(*shape) * 3, r(*shape))
    if module == "add_relu":
        return (r(*shape), r(*shape))
    return (r(*shape),)


def _op(module: str, name: str):
    import importlib

    return getattr(importlib.import_module(f"kernelgraft.examples.{module}"), name)


def _label(op, args) -> str:
    plan = op.dispatcher.plan_for(tuple(args))
    if plan is None:
        return "?"
    return "reference" if plan.candidate is None else plan.candidate.label


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _warm_torch(device: str) -> None:
    """CUDA context, cuBLAS and the allocator warm, on shapes no case uses (what a serving process
    has done before it meets a new shape)."""
    import torch

    dt = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(64, 96, device=device, dtype=dt)
    (a @ a.t()).float().softmax(-1)
    torch.nn.functional.silu(a) * a
    _sync(device)


def first_call(case: str, *, device: str, background: bool, cases: dict, tune_options: dict) -> dict:
    """One case in this process (empty tuning state): the first call, the landing, the choice."""
    import torch

    import kernelgraft as kg
    from kernelgraft.tune.tuner import entry_label

    module, name, shape = cases[case]
    op = _op(module, name)
    _warm_torch(device)
    warmed = kg.tune.warm(device) if WARM[0] else None  # before the op's shapes: the imports, the workers
    args = _inputs(module, shape, device)
    options = dict(tune_options)
    if background and device != "cuda":
        options["blocking"] = False  # the CPU smoke run: off the path on every device
    with kg.tune(**options):
        _sync(device)
        sampler = Sampler() if PROFILE[2] and background else None  # from the first call on
        profiler = cProfile.Profile() if PROFILE[0] else None
        t0 = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        op(*args)
        _sync(device)
        first_s = time.perf_counter() - t0
        if sampler is not None:
            sampler.first_call_returned()
            sampler.first_call_s = first_s
        if profiler is not None:
            profiler.disable()
        meanwhile = _label(op, args)
        landing = None
        if PROFILE[1] and background:  # until it lands: every thread (cProfile on Python >= 3.12)
            landing = cProfile.Profile()
            landing.enable()
        landed, first_served = (_wait_watching_first(op, args, 600.0) if background else (True, None))
        land_s = time.perf_counter() - t0
        if landing is not None:
            landing.disable()
        samples = sampler.stop() if sampler is not None else None
        op(*args)
        _sync(device)
        served = _label(op, args)
    d = kg.tune.decision(op, *args)
    report = kg.tune.report(op)
    phases = report.keys[0].phases if report.keys else {}
    first_land = phases.get("first_landing")  # from the job's queueing, which the first call made
    return {"case": case, "background": background, "first_ms": round(first_s * 1e3, 2),
            "meanwhile": meanwhile, "landed": landed, "land_s": round(land_s, 3), "served": served,
            "first_land_s": None if first_land is None else round(first_land, 3),
            "first_served": first_served,
            "ranking": [(entry_label(e), e.get("ms")) for e in (d.ranking if d else [])],
            "phases": phases, "report": str(report),
            "torch": torch.__version__, **({"first_call_profile": _top(profiler)} if profiler else {}),
            **({"warm": {"seconds": warmed.seconds, "skipped": warmed.skipped}} if warmed is not None else {}),
            **({"landing_profile": _top(landing, 60, "tottime")} if landing is not None else {}),
            **({"landing_samples": samples} if samples is not None else {})}


def reference_first(case: str, *, device: str, cases: dict) -> dict:
    """The floor: the first call of the op's plain PyTorch reference in a process warmed as the
    cases are, no kernelgraft call made (the first use of each torch kernel it runs loads that
    kernel's module, which any first call serving the reference pays too)."""
    module, name, shape = cases[case]
    op = _op(module, name)
    _warm_torch(device)
    args = _inputs(module, shape, device)
    _sync(device)
    t0 = time.perf_counter()
    op.reference(*args)
    _sync(device)
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    op.reference(*args)
    _sync(device)
    out = {"case": case, "reference_first_ms": round(first_s * 1e3, 2),
           "reference_second_ms": round((time.perf_counter() - t0) * 1e3, 3)}
    if device == "cuda":
        out["import_floor_s"] = _import_floor(op, args, device)
    return out


def _import_floor(op, args, device: str) -> dict:
    """What a process that never tuned pays once before its first decision, kernelgraft aside: the
    first fake tensors (output shapes are worked out on them; they import ``torch._dynamo``) and
    Inductor's first compile of the reference (``torch:compile``'s gate: Inductor's imports and
    that compile), timed here, after the reference's first calls."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    t0 = time.perf_counter()
    with FakeTensorMode():
        torch.empty(2, 3).sum(0)
    fake_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch.compile(op.reference, dynamic=False)(*args)
    _sync(device)
    return {"fake_tensors": round(fake_s, 3), "inductor_reference": round(time.perf_counter() - t0, 3)}


def _top(profiler: cProfile.Profile, n: int = 40, by: str = "cumulative") -> list[str]:
    """The ``n`` costliest functions by ``by`` (where the milliseconds go)."""
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats(by).print_stats(n)
    return [line for line in text.getvalue().splitlines() if line.strip()]


def _wait_watching_first(op, args, timeout: float) -> tuple[bool, str | None]:
    """``kg.tune.wait``, looking every 20 ms at the key's decision in memory: (landed, the winner
    of the first decision seen; a first one, made without ``torch:compile``, where it landed first)."""
    import kernelgraft as kg
    from kernelgraft.tune.pretune import prepare
    from kernelgraft.tune.tuner import TUNER, entry_label

    key = prepare(op, tuple(args), {})[2]
    deadline, first = time.perf_counter() + timeout, None
    while True:
        landed = kg.tune.wait(0.02)
        if first is None and key is not None:
            found = TUNER.memory.get(key.digest)  # a dict lookup: nothing that competes with the job
            if found is not None and found.winner is not None:
                first = entry_label(found.winner)
        if landed or time.perf_counter() > deadline:
            return landed, first


def same_choice(background: dict, blocking: dict, margin: float) -> tuple[str, float | None]:
    """('equal' | 'tie' | 'differs', background's choice's time over the blocking winner's, in the
    blocking process's ranking)."""
    if not blocking["ranking"]:
        return ("equal" if background["served"] == blocking["served"] else "differs"), None
    won_label, won_ms = blocking["ranking"][0]
    if background["served"] == won_label:
        return "equal", 1.0
    times = dict(blocking["ranking"])
    ms = times.get(background["served"])
    if ms is None or not won_ms:
        return "differs", None
    ratio = ms / won_ms
    return ("tie" if ratio <= 1.0 + margin else "differs"), round(ratio, 4)


def serving(*, device: str, seconds: float, cases: dict, serve_case: str, tune_case: str,
            tune_options: dict) -> dict:
    """Calls/s of an already-tuned op: before, while a background tuning runs, after it landed."""
    import kernelgraft as kg

    s_mod, s_name, s_shape = cases[serve_case]
    t_mod, t_name, t_shape = cases[tune_case]
    serve_op, tune_op = _op(s_mod, s_name), _op(t_mod, t_name)
    serve_args, tune_args = _inputs(s_mod, s_shape, device), _inputs(t_mod, t_shape, device)
    options = dict(tune_options)
    with kg.tune(**{**options, "blocking": True}):
        serve_op(*serve_args)  # tuned and planned
    if device == "cuda":
        from kernelgraft import native as _native

        _native.load()  # its native replay built now (a compiler in a child process), not while timed
    with kg.tune(**{**options, "blocking": True}):
        serve_op(*serve_args)
    _warm_torch(device)

    def rate() -> float:
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(50):
                serve_op(*serve_args)
            calls += 50
        _sync(device)
        return calls / (time.perf_counter() - t0)

    with kg.tune(**options):
        rate()  # warm
        before = rate()
        if device != "cuda":
            options["blocking"] = False
        with kg.tune(**options):
            tune_op(*tune_args)  # a new shape: tuned off the path
        queued = kg.tune.pending()
        during = rate()
        left = kg.tune.pending()
        landed = kg.tune.wait(900)
        after = rate()
    report = kg.tune.report(tune_op)
    phases = report.keys[0].phases if report.keys else {}
    return {"serve": serve_case, "tune": tune_case, "calls_per_s": {"before": round(before), "during": round(during),
            "after": round(after)}, "serve_ratio": round(during / ((before + after) / 2), 4),
            "queued": queued, "tuning_left": left, "landed": landed, "phases": phases}


def _child(args) -> None:
    # the process's tuning mode is set before kernelgraft reads it (benchmarks/_common sets the
    # blocking default for the other scripts)
    if args.mode == "blocking":
        os.environ["KERNELGRAFT_TUNE_BLOCKING"] = "1"
    else:
        os.environ.pop("KERNELGRAFT_TUNE_BLOCKING", None)
    if args.mode == "reference":
        out = reference_first(args.child, device="cuda", cases=CASES)
    elif args.child == "serve":
        out = serving(device="cuda", seconds=args.serve_seconds, cases=CASES, serve_case="rmsnorm",
                      tune_case="gemm_777", tune_options={})
    else:
        if args.two_pass:  # the A/B's other side: a first pass without torch:compile, pooled or not
            from kernelgraft.tune import offpath

            one_pass = offpath._first_pass
            offpath._first_pass = lambda op, candidates, pooled: one_pass(op, candidates, False)
        out = first_call(args.child, device="cuda", background=args.mode == "background", cases=CASES,
                         tune_options={})
    print("RESULT " + json.dumps(out, default=str), flush=True)


_NATIVE_SEED: list[str | None] = [None]  # --warm: a cache directory holding one native replay build


def _seed_native() -> None:
    """Build the native replay once into a cache directory of its own; each warmed process gets a
    copy (a server finds its machine's build in its cache; the tuning cache stays empty)."""
    seed = tempfile.mkdtemp(prefix="kg-first-call-native-")
    env = {**os.environ, "KERNELGRAFT_CACHE_DIR": seed}
    proc = subprocess.run([sys.executable, "-c", "import kernelgraft as kg; print(kg.native.build())"],
                          capture_output=True, text=True, timeout=300, env=env)
    print(f"native replay built once for the warmed processes: rc {proc.returncode} "
          f"{(proc.stdout or proc.stderr).strip()[-300:]}", flush=True)
    if proc.returncode == 0 and os.path.isdir(os.path.join(seed, "native")):
        _NATIVE_SEED[0] = seed


def _spawn(what: str, mode: str, serve_seconds: float, timeout: float, cold: bool = False,
           two_pass: bool = False) -> dict:
    cache = tempfile.mkdtemp(prefix="kg-first-call-")
    if _NATIVE_SEED[0] is not None and WARM[0] and mode != "reference":
        import shutil

        shutil.copytree(os.path.join(_NATIVE_SEED[0], "native"), os.path.join(cache, "native"))
    env = {**os.environ, "KERNELGRAFT_CACHE_DIR": cache}
    if cold:  # Triton's compile cache empty too (kernelgraft's own caches live under its directory)
        env["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    env.pop("KERNELGRAFT_TUNE_BLOCKING", None)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", what, "--mode", mode,
           "--serve-seconds", str(serve_seconds)] + (["--profile"] if PROFILE[0] else []) + (
           ["--profile-landing"] if PROFILE[1] else []) + (["--sample-landing"] if PROFILE[2] else []) + (
           ["--warm"] if WARM[0] and mode != "reference" else []) + (["--two-pass"] if two_pass else [])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"case": what, "error": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"case": what, "error": (proc.stderr or proc.stdout)[-3000:]}


@contextlib.contextmanager
def _fresh_state():
    """The smoke run's stand-in for a fresh process: an empty cache directory, no decisions. The
    native replay is not built there (``KERNELGRAFT_NATIVE=0`` meanwhile): its build, a child
    process, would outlive the directory, and a failed build stays failed for the process."""
    import kernelgraft as kg

    saved = {name: os.environ.get(name) for name in ("KERNELGRAFT_CACHE_DIR", "KERNELGRAFT_NATIVE")}
    with tempfile.TemporaryDirectory(prefix="kg-first-call-") as cache:
        os.environ["KERNELGRAFT_CACHE_DIR"] = cache
        os.environ["KERNELGRAFT_NATIVE"] = "0"
        kg.tune.wait(60)
        kg.tune.clear()
        try:
            yield
        finally:
            kg.tune.wait(60)
            kg.tune.clear()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def smoke_timer(trial, settings) -> float:
    """A fake timing (ms) by candidate, stable across runs: the CPU tunes nothing without one."""
    trial.run(0)
    return 1.0 + sum(map(ord, trial.candidate.label)) % 7 / 10


def _imports_text(floor: dict | None) -> str:
    """A fresh process's fake tensors + Inductor's first compile, seconds (``import_floor_s``)."""
    return "-" if not floor else f"{floor['fake_tensors']:.1f}+{floor['inductor_reference']:.1f}"


def table(rows: list[dict], serve: dict | None) -> str:
    lines = [f"{'case':10} {'first ms':>9} {'floor ms':>9} {'1st land s':>10} {'land s':>8} {'target':>7} "
             f"{'choice':>8} {'slower':>7} {'imports s':>10}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['case']:10} error: {str(r['error']).splitlines()[-1][:80] if r['error'] else ''}")
            continue
        target = LAND_TARGET_S.get(r["case"], 5.0)
        floor = r.get("reference_first_ms")
        first_land = r.get("first_land_s")
        lines.append(f"{r['case']:10} {r['first_ms']:9.1f} {'-' if floor is None else f'{floor:.1f}':>9} "
                     f"{'-' if first_land is None else f'{first_land:.2f}':>10} {r['land_s']:8.2f} {target:7.0f} "
                     f"{r.get('choice', '-'):>8} {r.get('slower') or '-':>7} "
                     f"{_imports_text(r.get('import_floor_s')):>10}")
        lines += [_brief_line("  again", again) for again in r.get("again", [])]
        if r.get("two_pass"):
            lines.append(_brief_line("  2-pass", r["two_pass"]))
    if serve is not None:
        if "error" in serve:
            lines.append(f"serving during tuning: error: {str(serve['error'])[-200:]}")
        else:
            lines.append(f"serving during tuning: {serve['serve_ratio']:.3f} of the calls/s without "
                         f"(target >= {SERVE_TARGET}); tuning still running at the end: {bool(serve['tuning_left'])}")
    return "\n".join(lines)


def _brief(bg: dict, bl: dict, margin: float) -> dict:
    """Another background process's numbers (``two_pass``, ``again``), against blocking mode's."""
    out = {k: bg.get(k) for k in ("error", "first_ms", "first_land_s", "land_s", "served", "first_served",
                                   "phases") if k in bg}
    if "error" not in bg and "error" not in bl:
        out["choice"], out["slower"] = same_choice(bg, bl, margin)
    return out


def _brief_line(name: str, two: dict) -> str:
    if "error" in two:
        return f"{name:10} error: {str(two['error']).splitlines()[-1][:80] if two['error'] else ''}"
    first_land = two.get("first_land_s")
    return (f"{name:10} {two['first_ms']:9.1f} {'':>9} {'-' if first_land is None else f'{first_land:.2f}':>10} "
            f"{two['land_s']:8.2f} {'':>7} {two.get('choice', '-'):>8} {two.get('slower') or '-':>7}")


def run(args) -> dict:
    from kernelgraft.tune.tuner import TIE_MARGIN

    if args.cases == "none":  # part 2 only
        names = []
    else:
        names = args.cases.split(",") if args.cases else list(SMOKE_CASES if args.smoke else CASES)
    rows = []
    if WARM[0] and not args.smoke and names:
        _seed_native()
    for case in names:
        if args.smoke:
            with _fresh_state():
                bg = first_call(case, device="cpu", background=True, cases=SMOKE_CASES,
                                tune_options={"timer": smoke_timer})
            with _fresh_state():
                bl = first_call(case, device="cpu", background=False, cases=SMOKE_CASES,
                                tune_options={"timer": smoke_timer, "blocking": True})
            floor = reference_first(case, device="cpu", cases=SMOKE_CASES)
        else:
            bg = _spawn(case, "background", args.serve_seconds, args.timeout, args.cold)
            bl = _spawn(case, "blocking", args.serve_seconds, args.timeout, args.cold)
            floor = _spawn(case, "reference", args.serve_seconds, args.timeout, args.cold)
        row = dict(bg)
        if "error" not in floor:
            row["reference_first_ms"], row["reference_second_ms"] = (floor["reference_first_ms"],
                                                                     floor["reference_second_ms"])
            if "import_floor_s" in floor:
                row["import_floor_s"] = floor["import_floor_s"]
        if "error" not in bg and "error" not in bl:
            row["choice"], row["slower"] = same_choice(bg, bl, TIE_MARGIN)
            if bg.get("first_served"):  # the first decision against blocking mode's, too
                row["first_choice"], row["first_slower"] = same_choice({"served": bg["first_served"]}, bl, TIE_MARGIN)
            row["blocking_first_ms"], row["blocking_served"] = bl["first_ms"], bl["served"]
        elif "error" in bl:
            row["blocking_error"] = bl["error"]
        if args.also_two_pass and not args.smoke:
            two = _spawn(case, "background", args.serve_seconds, args.timeout, args.cold, two_pass=True)
            row["two_pass"] = _brief(two, bl, TIE_MARGIN)
        if args.repeat > 1 and not args.smoke:
            row["again"] = [_brief(_spawn(case, "background", args.serve_seconds, args.timeout, args.cold), bl,
                                   TIE_MARGIN) for _ in range(args.repeat - 1)]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("report", "ranking")}, default=str), flush=True)
    serve = None
    if args.serve_seconds > 0:
        if args.smoke:
            with _fresh_state():
                serve = serving(device="cpu", seconds=args.serve_seconds, cases=SMOKE_CASES, serve_case="add_relu",
                                tune_case="rmsnorm", tune_options={"timer": smoke_timer})
        else:
            serve = _spawn("serve", "background", args.serve_seconds, args.timeout)
    return {"rows": rows, "serving": serve, "table": table(rows, serve)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", help=f"comma-separated, of {list(CASES)} ('none': part 2 only)")
    parser.add_argument("--serve-seconds", type=float, default=5.0, help="each serving window (0: skip part 2)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per child process")
    parser.add_argument("--out", help="folder for bench_first_call.json (default $OUT)")
    parser.add_argument("--cold", action="store_true",
                        help="Triton's compile cache empty too in each process (default: the machine's)")
    parser.add_argument("--smoke", action="store_true", help="on the CPU, in this process, with a fake timer")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile each first call; its top functions go into the JSON (first_call_profile)")
    parser.add_argument("--profile-landing", action="store_true",
                        help="cProfile from the first call until its decision lands (every thread on Python >= 3.12; "
                             "slows the landing): its top functions by own time go into the JSON (landing_profile)")
    parser.add_argument("--sample-landing", action="store_true",
                        help="sample every thread's stack (10 ms) from the first call until its decision lands: "
                             "seconds by function and the tuning worker's timeline go into the JSON (landing_samples)")
    parser.add_argument("--warm", action="store_true",
                        help="each case's process calls kg.tune.warm() first (imports, compile workers, the native "
                             "replay), as a server does at start-up; the reference's floor process does not")
    parser.add_argument("--also-two-pass", action="store_true",
                        help="per case, a second background process that lands a first decision without torch:compile")
    parser.add_argument("--two-pass", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=1, help="background processes per case (the spread)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="background", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    PROFILE[0], PROFILE[1], PROFILE[2] = args.profile, args.profile_landing, args.sample_landing
    WARM[0] = args.warm
    if args.child:
        _child(args)
        return {}
    result = run(args)
    from _common import environment, write_json

    result["environment"] = environment()
    if args.out or os.environ.get("OUT"):
        print(f"wrote {write_json('bench_first_call', result, args.out)}")
    print(result["table"])
    return result


if __name__ == "__main__":
    main()
