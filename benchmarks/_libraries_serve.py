"""``bench_libraries.py --serve-check``: kernelgraft's C++ runtime serves a bundle of the library
ops in a process where neither quack nor Liger-Kernel (nor the CuTe DSL, kernelgraft or triton) can
be imported, and what it serves matches the references.

1. The bundle: ``kernelgraft aot`` of the selected ``kernelgraft.examples.libraries`` modules for
   this GPU's arch (Triton and CuTe DSL compile here), or ``--bundle DIR`` built beforehand.
2. Variants of it, each in a namespace of its own: every candidate (``kglib_all``), and one per
   library holding only that library's kernels (``kglib_quack``, ``kglib_liger``, ``kglib_own``),
   so each library's kernels are shown served, not only the first that fits.
3. Inputs: each op's own samples (the signatures the bundle was built for, NaN and Inf included)
   and the strided copy of each, fresh values on the GPU.
4. The child (``_libraries_serve_child.py``, ``python -P``) blocks the imports, loads the runtime
   (``kernelgraft.runtime.library()``, built here), the variants (``allow_native``: CuTe DSL
   kernels are shared libraries) and calls every op; this process judges each output with the
   oracle against the float64 reference.

Passes when the child imported none of the blocked packages, every library's variant served at
least one input of each op it has kernels for, and every served output matches. Writes
``serve_check.json`` under the output directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import _libraries_common as common
from kernelgraft.examples import libraries

HERE = Path(__file__).resolve().parent
CHILD = HERE / "_libraries_serve_child.py"


def _env() -> dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # real cubins
    return env


def build(names, dest: Path, timeout: float) -> dict:
    """``kernelgraft aot`` of the modules for this GPU's arch; a report of how it went."""
    major, minor = torch.cuda.get_device_capability()
    cmd = [sys.executable, "-m", "kernelgraft", "aot",
           *(f"kernelgraft.examples.libraries.{n}" for n in names), "--arch", f"sm_{major}{minor}",
           "--allow-partial", "-o", str(dest)]
    t0 = time.monotonic()
    # at least 2 minutes: a cold machine's first build (Triton and the CuTe DSL compiling for the
    # first time) took longer than a short --time-limit left it
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=max(timeout, 120))
    return {"command": " ".join(cmd[1:]), "returncode": proc.returncode, "seconds": round(time.monotonic() - t0, 1),
            "tail": (proc.stdout + proc.stderr)[-3000:]}


def contents(bundle: Path, ops: dict) -> dict:
    """Per op of the bundle: its kernels by library, and what it skipped, dropped or left unserved."""
    from kernelgraft.aot import manifest as _manifest

    out = {}
    for entry in _manifest.read(bundle)["ops"]:
        op = ops.get(entry["name"])
        by: dict[str, int] = {}
        for c in entry["candidates"]:
            dist = libraries.library_of(op.impls[c["index"]]) if op is not None else "?"
            by[dist] = by.get(dist, 0) + 1
        out[entry["name"]] = {"kernels": by, "skipped": len(entry.get("skipped", ())),
                              "dropped": len(entry.get("dropped", ())), "unserved": len(entry.get("unserved", ())),
                              "skipped_why": sorted({str(s.get("reason", s))[:160] for s in entry.get("skipped", ())
                                                     if isinstance(s, dict)})[:4]}
    return out


def variant(bundle: Path, dest: Path, namespace: str, ops: dict, keep) -> list[str]:
    """A copy of ``bundle`` at ``dest`` whose ops live in ``namespace`` and hold only the
    candidates ``keep(op, candidate)`` accepts (all: the decision table too; else none); the op
    names kept (an op left without candidates is dropped)."""
    from kernelgraft.aot import manifest as _manifest
    from kernelgraft.aot.program import meta_rules

    shutil.copytree(bundle, dest)
    manifest = _manifest.read(dest)
    kept = []
    for entry in manifest["ops"]:
        op = ops[entry["name"]]
        chosen = [c for c in entry["candidates"] if keep(op, c)]
        if not chosen:
            continue
        if len(chosen) != len(entry["candidates"]):
            entry["candidates"], entry["decisions"] = chosen, []
            entry["meta"] = meta_rules(chosen)  # the output rules follow from the kernels kept
        kept.append(dict(entry, name=f"{namespace}::{entry['name'].split('::', 1)[1]}"))
    manifest["ops"] = kept
    if kept:
        _manifest.write(dest, manifest)
    else:
        shutil.rmtree(dest)
    return [e["name"] for e in kept]


def inputs_of(op) -> list[tuple]:
    from kernelgraft.op.samples import noncontiguous, samples

    out = []
    for sample in samples(op, "cuda"):
        out.append(tuple(sample))
        strided = noncontiguous(op, tuple(sample))
        if strided is not None:
            out.append(strided)
    return out


def _judge(op, refs: list, outputs: dict, ns: str, short: str) -> dict:
    from kernelgraft.verify import oracle

    served = refused = 0
    failed = []
    for i, ref in enumerate(refs):
        got = outputs.get(f"{ns}::{short}#{i}")
        if isinstance(got, str) or got is None:
            refused += 1
            if got is not None and "no bundled kernel serves" not in got:
                failed.append(f"input {i}: {got[:1500]}")
            continue
        served += 1
        verdict = oracle.verify(ref, got, op.tolerances)
        if not verdict.ok:
            failed.append(f"input {i}: {verdict}"[:1500])
    return {"served": served, "refused": refused, "failed": failed}


def _missing(report: dict, names) -> list[str]:
    """Each installed library with kernels for an op that the bundle does not serve it with; the
    libraries not installed go to ``report["not_checked"]``."""
    problems, report["not_checked"] = [], []
    for name in names:
        op = common.load(name)[1]
        for dist in common.impls_by_library(op):
            if dist != libraries.OWN and libraries.status(dist)[0] is None:
                report["not_checked"].append(f"{op.name}: {dist} {common.NOT_INSTALLED}")
            elif f"kglib_{common.SHORT[dist]}::{op.name.split('::')[1]}" not in report.get("results", {}):
                why = report.get("bundle", {}).get(op.name, {}).get("skipped_why")
                problems.append(f"{op.name}: the bundle holds no {dist} kernel" + (f" (skipped: {why})" if why else ""))
    return problems


def serve_check(names, out: Path, bundle: str | None, time_limit: float) -> int:
    from kernelgraft import runtime
    from kernelgraft.verify import oracle

    started = time.monotonic()
    loaded = {n: common.load(n)[1] for n in names}
    ops = {op.name: op for op in loaded.values()}
    report: dict = {"libraries": {d: libraries.status(d)[0] or libraries.status(d)[1] for d in libraries.LIBRARIES}}
    so = runtime.library()  # built once per torch and runtime source
    work = Path(tempfile.mkdtemp(prefix="kg-libserve-"))
    try:
        if bundle is None:
            bundle_dir = work / "bundle"
            report["build"] = build(names, bundle_dir, time_limit - (time.monotonic() - started) - 90)
            print(report["build"]["tail"][-1500:], flush=True)
        else:
            bundle_dir = Path(bundle)
            report["build"] = {"given": str(bundle_dir)}
        report["bundle"] = contents(bundle_dir, ops)
        namespaces = {"kglib_all": lambda op, c: True}
        for dist in (*libraries.LIBRARIES, libraries.OWN):
            namespaces[f"kglib_{common.SHORT[dist]}"] = lambda op, c, d=dist: libraries.library_of(op.impls[c["index"]]) == d
        bundles, served_ops = {}, {}
        for ns, keep in namespaces.items():
            kept = variant(bundle_dir, work / ns, ns, ops, keep)
            if kept:
                bundles[ns], served_ops[ns] = str(work / ns), kept
        cases = {op.name.split("::")[1]: inputs_of(op) for op in loaded.values()}
        refs = {short: [oracle.reference(ops[f"kglib::{short}"], args) for args in c] for short, c in cases.items()}
        torch.save(cases, work / "inputs.pt")
        spec = {"bundles": bundles, "inputs": str(work / "inputs.pt"), "outputs": str(work / "outputs.pt"),
                "mutated": {short: list(ops[f"kglib::{short}"].signature.mutated) for short in cases}}
        (work / "spec.json").write_text(json.dumps(spec))
        proc = subprocess.run([sys.executable, "-P", str(CHILD), str(so), str(work / "spec.json")], capture_output=True,
                              text=True, env=_env(), timeout=max(time_limit - (time.monotonic() - started), 60))
        report["child_returncode"] = proc.returncode
        if proc.returncode != 0:
            report["child_error"] = (proc.stdout + proc.stderr)[-3000:]
            child = {}
        else:
            child = json.loads(proc.stdout.strip().splitlines()[-1])
        report["child"] = {k: child.get(k) for k in ("imports", "loaded", "bundles", "calls")}
        outputs = torch.load(work / "outputs.pt", map_location="cuda") if proc.returncode == 0 else {}
        results = {}
        for ns, names_in in served_ops.items():
            for full in names_in:
                short = full.split("::", 1)[1]
                results[f"{ns}::{short}"] = _judge(ops[f"kglib::{short}"], refs[short], outputs, ns, short)
        report["results"] = results
    except Exception as exc:  # a bundle that did not build, a runtime that did not load: said, not raised
        report["error"] = f"{type(exc).__name__}: {exc}"[:1000]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.setdefault("child", {})
    imports = report["child"].get("imports") or {}
    problems = [report["error"]] if "error" in report else []
    problems += [f"child failed: {report.get('child_error', '')[-300:]}"] if report.get("child_returncode") else []
    problems += _missing(report, names)
    problems += [f"{m} imported in the child" for m, how in imports.items() if how != "blocked"]
    problems += [f"loaded in the child: {m}" for m in report["child"].get("loaded") or ()]
    for label, r in report.get("results", {}).items():
        if r["failed"]:
            problems.append(f"{label}: {len(r['failed'])} wrong or failed: {r['failed'][0]}")
        if not label.startswith("kglib_all") and r["served"] == 0:
            problems.append(f"{label}: the runtime served none of its {r['refused']} inputs")
    report["problems"], report["ok"] = problems, not problems
    report["seconds"] = round(time.monotonic() - started, 1)
    (out / "serve_check.json").write_text(json.dumps(report, indent=1, default=str))
    lines = ["| namespace::op | served | refused | wrong |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {k} | {r['served']} | {r['refused']} | {len(r['failed'])} |" for k, r in report.get("results", {}).items()]
    print("\n".join(lines))
    print(f"blocked in the child: {imports}; loaded anyway: {report['child'].get('loaded')}")
    for line in report["not_checked"]:
        print(f"not checked: {line}")
    print("serve check:", "ok" if report["ok"] else "FAILED\n  " + "\n  ".join(problems))
    print(f"wrote {out / 'serve_check.json'}")
    return 0 if report["ok"] else 1
