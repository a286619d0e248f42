"""kernelgraft cache show|clear|export|import: the autotuner's decisions on disk."""

from __future__ import annotations

import datetime
import json

HELP = "show, clear, export or import the autotuner's cached decisions"


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=("show", "clear", "export", "import"))
    parser.add_argument("path", nargs="?", help="file to export to / import from")
    parser.add_argument("--op", help="only entries of ops whose name contains this")


def _matches(entry: dict, op: str | None) -> bool:
    return op is None or op in str(entry.get("key", {}).get("op", ""))


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..tune import DiskCache, cache_path
    from ..tune._cache import _FORMAT
    from ..tune._key import _KEY_SCHEMA_VERSION

    console = Console()
    disk = DiskCache()
    if args.action == "show":
        entries = {d: e for d, e in disk.entries().items() if _matches(e, args.op)}
        table = Table(title=f"{cache_path()} ({len(entries)} entries)")
        for col in ("op", "inputs", "device", "winner", "ms", "excluded", "age"):
            table.add_column(col)
        now = datetime.datetime.now().timestamp()
        for digest, e in sorted(entries.items(), key=lambda kv: str(kv[1].get("key", {}).get("op"))):
            key = e.get("key", {})
            w = (e.get("ranking") or [None])[0]
            args_desc = "; ".join(
                f"{a[1].replace('torch.', '')}{a[2]}" for a in key.get("args", [])
                if isinstance(a, list) and a and a[0] == "T")
            age = now - float(e.get("created", now))
            table.add_row(str(key.get("op")), args_desc, str(key.get("env", {}).get("device")),
                          json.dumps(w["config"]) if w else "default", f"{w['ms']:.4f}" if w else "-",
                          str(len(e.get("excluded", []))), f"{age / 3600:.1f}h")
        console.print(table)
        return 0
    if args.action == "clear":
        n = disk.remove(None if args.op is None else (lambda d, e: _matches(e, args.op)))
        console.print(f"removed {n} entries from {cache_path()}")
        return 0
    if not args.path:
        console.print(f"kernelgraft cache {args.action}: give a file path")
        return 2
    if args.action == "export":
        entries = {d: e for d, e in disk.entries().items() if _matches(e, args.op)}
        with open(args.path, "w", encoding="utf-8") as fh:
            json.dump({"format": _FORMAT, "schema": _KEY_SCHEMA_VERSION, "entries": entries}, fh, indent=1)
        console.print(f"exported {len(entries)} entries to {args.path}")
        return 0
    try:
        with open(args.path, encoding="utf-8") as fh:
            data = json.load(fh)
        if data.get("format") != _FORMAT or not isinstance(data.get("entries"), dict):
            raise ValueError("not a kernelgraft tuning cache export")
        if data.get("schema") != _KEY_SCHEMA_VERSION:
            raise ValueError(f"key schema {data.get('schema')}, this kernelgraft uses {_KEY_SCHEMA_VERSION}")
    except (OSError, ValueError) as exc:
        console.print(f"kernelgraft cache import: cannot use {args.path}: {exc}")
        return 1
    entries = {d: e for d, e in data["entries"].items() if isinstance(e, dict) and _matches(e, args.op)}
    disk.put(entries)
    console.print(f"imported {len(entries)} entries into {cache_path()} (entries for another device or "
                  "version are kept but not used)")
    return 0
