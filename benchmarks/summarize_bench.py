"""Turn a `kernelgraft bench` JSON report into a markdown summary table and check the must-hold items.

    python benchmarks/summarize_bench.py $OUT/bench.json [more.json ...] [--md summary.md]

Several reports (e.g. two runs over different examples) are merged; ceilings come from the first.

Checks, each printed as PASS/FAIL with the numbers:
1. memory-bound ops (flops/byte < 1, every example but the GEMM) reach >= 85% of the measured
   copy bandwidth at their largest shape (best of the tuned op and the best backend);
2. the tuned op is at least as fast as the best single backend on every shape (2% noise allowance);
3. the tuned op is at least as fast as torch.compile of the reference on add_relu,
   rmsnorm_residual and swiglu (2% noise allowance), on every shape.
Checks 2 and 3 use the head-to-head ratios the bench records on tuned rows (``vs_best``,
``vs_compile``: the two sides timed alternately, see ``kernelgraft.bench.run.head_to_head``)
when present.
Exit status 1 when a check fails or the report holds no results. Prints the ratio table last.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

BW_TARGET = 0.85
NOISE = 1.02
FUSED = ("add_relu", "rmsnorm_residual", "swiglu")


def _load(path):
    doc = json.load(open(path))
    if doc.get("schema") != "kernelgraft.bench/1":
        raise SystemExit(f"{path}: not a kernelgraft bench report (schema {doc.get('schema')!r})")
    return doc


def _short(op: str) -> str:
    return op.split("::")[-1]


def _group(rows):
    """{op: {size: {kind/variant: row}}}"""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        if r.get("time_us"):
            key = r["variant"] if r["kind"] in ("backend", "candidate") else r["kind"]
            out[r["op"]][r["size"]][key] = r
            out[r["op"]][r["size"]].setdefault("_shape", r["shape"])
    return out


def _us(row):
    if not row:
        return "-"
    t = row["time_us"]
    return f"{t:.1f}" if t >= 10 else f"{t:.2f}"


def markdown(doc) -> str:
    env, ceil = doc.get("environment", {}), doc.get("ceilings") or {}
    lines = [
        f"Device: {env.get('device', '?')} ({env.get('capability', '?')}), torch {env.get('torch')}, "
        f"triton {env.get('triton')}, CUDA {env.get('cuda')}, {env.get('date', '')}. Measured ceilings: "
        f"copy {ceil.get('copy_gbps', float('nan')):.0f} GB/s, bf16 GEMM "
        f"{ceil.get('bf16_tflops', float('nan')):.0f} TFLOP/s.",
        "",
        "| op | inputs | backends (best, us) | torch eager us | torch.compile us | tuned us | tuned GB/s (% copy) | tuned TFLOP/s | tuned vs compile |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for op, sizes in _group(doc["rows"]).items():
        for size in sorted(sizes):
            cell = sizes[size]
            backends = ", ".join(
                f"{k.removeprefix('best ')} {_us(v)}" for k, v in sorted(cell.items())
                if k.startswith("best ") and isinstance(v, dict)
            ) or "-"
            tuned, comp, eager = cell.get("tuned"), cell.get("compile"), cell.get("eager")
            gbps = f"{tuned['gbps']:.0f} ({100 * (tuned.get('bw_frac') or 0):.0f}%)" if tuned and tuned.get("gbps") else "-"
            tfl = f"{tuned['tflops']:.1f}" if tuned and tuned.get("flops") else "-"
            vs = f"{comp['time_us'] / tuned['time_us']:.2f}x" if tuned and comp else "-"
            lines.append(f"| {_short(op)} | `{cell['_shape']}` | {backends} | {_us(eager)} | {_us(comp)} | "
                         f"{_us(tuned)} | {gbps} | {tfl} | {vs} |")
    return "\n".join(lines)


def checks(doc) -> list[tuple[bool, str]]:
    results = []
    groups = _group(doc["rows"])
    for op, sizes in groups.items():
        name = _short(op)
        largest = sizes[max(sizes)]
        tuned = largest.get("tuned")
        ref = tuned or {}
        memory_bound = ref.get("bytes") and (ref.get("flops") or 0) / ref["bytes"] < 1.0
        if memory_bound:
            fracs = [r.get("bw_frac") or 0 for k, r in largest.items()
                     if isinstance(r, dict) and (k == "tuned" or k.startswith("best "))]
            best = max(fracs, default=0)
            results.append((best >= BW_TARGET,
                            f"{name}: {100 * best:.0f}% of copy bandwidth at `{largest['_shape']}` (need >= {100 * BW_TARGET:.0f}%)"))
        for size in sorted(sizes):
            cell = sizes[size]
            t = cell.get("tuned")
            bests = [v for k, v in cell.items() if k.startswith("best ") and isinstance(v, dict)]
            if t and bests:
                b = min(bests, key=lambda r: r["time_us"])
                h2h = t.get("vs_best")
                if h2h is not None:  # judged head to head (timed alternately), not across the run
                    results.append((h2h <= NOISE, f"{name} `{cell['_shape']}`: tuned / {b['variant']} = "
                                    f"{h2h:.3f} head to head (separately: {_us(t)} vs {_us(b)} us)"))
                else:
                    results.append((t["time_us"] <= b["time_us"] * NOISE,
                                    f"{name} `{cell['_shape']}`: tuned {_us(t)} us vs {b['variant']} {_us(b)} us"))
            c = cell.get("compile")
            if name in FUSED and t and c:
                h2h = t.get("vs_compile")
                ratio = h2h if h2h is not None else t["time_us"] / c["time_us"]
                results.append((ratio <= NOISE,
                                f"{name} `{cell['_shape']}`: tuned / torch.compile = {ratio:.3f}"
                                f"{' head to head' if h2h is not None else ''} ({_us(t)} vs {_us(c)} us)"))
            elif name in FUSED and t and not c:
                results.append((False, f"{name} `{cell['_shape']}`: no torch.compile timing"))
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+")
    parser.add_argument("--md", help="also write the markdown table here")
    args = parser.parse_args(argv)
    doc = _load(args.json[0])
    for extra in args.json[1:]:
        doc["rows"] += _load(extra)["rows"]
    errors = [r for r in doc["rows"] if r.get("error")]
    md = markdown(doc)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md + "\n")
    results = checks(doc)
    print("## must-hold checks")
    for ok, text in results:
        print(("PASS " if ok else "FAIL ") + text)
    if errors:
        print(f"\n{len(errors)} variants failed to run, e.g.:")
        for r in errors[:8]:
            print(f"  {_short(r['op'])} {r['shape']} {r['variant']}: {r['error']}")
    print("\n## summary (ratios: tuned vs torch.compile, % of copy bandwidth)\n")
    print(md)
    failed = sum(1 for ok, _ in results if not ok)
    print(f"\n{len(results) - failed}/{len(results)} checks passed")
    return 0 if results and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
