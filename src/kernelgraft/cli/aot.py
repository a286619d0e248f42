"""kernelgraft aot TARGET --arch sm_90 [--arch sm_100] -o DIR [--sign KEYFILE] [--decisions TUNE_JSON]: an AOT bundle of every
candidate, optionally signed (HMAC-SHA256) so that ``load_bundle(DIR, key=KEYFILE)`` refuses changes."""

from __future__ import annotations

HELP = "compile every candidate of every op in TARGET into a bundle of cubins (no GPU needed)"


def add_arguments(parser) -> None:
    parser.add_argument("target", nargs="+", help="a .py file or module defining ops (several allowed)")
    parser.add_argument("--arch", action="append", help="target arch, e.g. sm_90 (repeatable; default sm_90)")
    parser.add_argument("-o", "--out", required=True, help="bundle directory to write")
    parser.add_argument("--op", action="append", help="only ops whose name contains this (repeatable)")
    parser.add_argument("--static", action="store_true",
                        help="compile each signature for its exact shapes (default: sizes as expressions)")
    parser.add_argument("--sign", metavar="KEYFILE",
                        help="sign the bundle with the key in KEYFILE (HMAC-SHA256, at least 16 bytes); "
                             "load it with kg.load_bundle(DIR, key=KEYFILE)")
    parser.add_argument("--decisions", metavar="TUNE_JSON",
                        help="a tuning cache file (tune.json, e.g. from a GPU machine after tuning), or "
                             "'cache' for this machine's: its decisions for these ops become the bundle's "
                             "decision table (which candidate serves which shapes; without it, the first "
                             "candidate that fits)")
    parser.add_argument("--allow-partial", action="store_true",
                        help="exit 0 even when some (candidate, signature) pairs failed to compile "
                             "(they are still listed); those calls run JIT or the reference at run time")


def run(args) -> int:
    import os

    # Compiling needs Triton's real JIT objects: keep the interpreter off while TARGET imports and
    # compiles, and put the caller's setting back afterwards (main() may run inside a test process).
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        return _run(args)
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def _run(args) -> int:
    from ..errors import BundleError
    from ..aot import build_bundle
    from ..aot.sign import load_key
    from .common import selected_ops

    if args.sign:
        try:
            load_key(args.sign)  # a bad key fails before the targets import and compile
        except BundleError as exc:
            print(f"kernelgraft aot: {exc}")
            return 2

    ops = selected_ops(args.target, args.op)
    if not ops:
        print("kernelgraft aot: no ops found in", " ".join(args.target))
        return 1
    manifest = build_bundle(ops, args.out, archs=args.arch or ["sm_90"], dynamic=not args.static,
                            progress=lambda line: print("  " + line, flush=True), sign=args.sign,
                            decisions=args.decisions)
    total = dropped = skipped = refused = unserved = 0
    for entry in manifest["ops"]:
        kernels = sum(len(c["kernels"]) for c in entry["candidates"])
        total += kernels
        rows = len(entry.get("decisions", ()))
        print(f"{entry['name']}: {len(entry['candidates'])} candidates, {kernels} kernels"
              + (f", {rows} tuned decisions" if rows else ""))
        failed = {d["candidate"] for d in entry.get("dropped", ())}
        for s in entry["skipped"]:
            skipped += 1
            if s["candidate"] not in failed:  # its dropped signatures say why, one by one
                print(f"  skipped {s['candidate']}: {s['reason']}")
        for d in entry.get("dropped", ()):
            dropped += 1
            where = f" for {d['arch']}" if d["arch"] else ""
            print(f"  DROPPED {d['candidate']} on {d['signature']}{where}: {_indent(d['reason'])}")
        declined: dict[str, list[tuple[str, str]]] = {}
        for r in entry.get("refused", ()):  # as eager dispatch declines them: not a loss of the bundle
            refused += 1
            declined.setdefault(r["candidate"], []).append((r["signature"], r["reason"]))
        alike: dict[tuple, list[str]] = {}  # candidates that decline the same signatures: one line
        for label, pairs in declined.items():
            alike.setdefault(tuple(pairs), []).append(label)
        for pairs, labels in alike.items():
            who = ", ".join(labels) if len(labels) <= 2 else f"{labels[0]} and {len(labels) - 1} other candidates"
            distinct = list(dict.fromkeys(reason for _, reason in pairs))
            print(f"  {who} decline{'s' if len(labels) == 1 else ''} {len(pairs)} signature(s), as eager "
                  "dispatch does: " + "; ".join(distinct[:2])
                  + (f"; ... ({len(distinct) - 2} more)" if len(distinct) > 2 else ""))
        for u in entry.get("unserved", ()):
            unserved += 1
            print(f"  NOT SERVED {u['signature']}: no bundled kernel takes it ({_indent('; '.join(u['reasons']))})")
        for w in entry.get("torch_wins", ()):
            kernel = (f"its best kernel {w['best_kernel']} ({w['best_kernel_ms']:.4g} ms)"
                      if w.get("best_kernel") and w.get("best_kernel_ms") is not None else "a kernel")
            took = f" ({w['ms']:.4g} ms)" if isinstance(w.get("ms"), (int, float)) else ""
            where = f" on {w['device']}" if w.get("device") else ""
            print(f"  note: on {w['signature']} {w['winner']} won tuning{where}{took}; bundles hold "
                  f"kernels only, so the bundle serves {kernel} there")
    print(f"wrote {args.out}/manifest.json ({total} kernels for {', '.join(manifest['archs'])}, "
          f"{manifest['build_seconds']} s{', signed' if args.sign else ''})")
    print(f"kernelgraft aot: built {total} kernels, dropped {dropped} (candidate, signature) pairs"
          + (" (--allow-partial)" if dropped and args.allow_partial else "")
          + f", skipped {skipped} candidates, {refused} (candidate, signature) pairs declined by their "
          f"candidate, {unserved} signatures served by no kernel")
    if dropped and not args.allow_partial:
        print("kernelgraft aot: the bundle is partial: fix the errors above, or pass --allow-partial "
              "to accept it (dropped calls run JIT or the reference at run time)")
        return 1
    return 0 if total else 1


def _indent(text: str) -> str:
    """A compiler's multi-line message, indented under its DROPPED line."""
    return text.strip().replace("\n", "\n      ")
