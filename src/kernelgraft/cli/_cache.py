"""kernelgraft cache show|clear|export|import: the autotuner's decisions on disk."""

from __future__ import annotations

import datetime
import json

HELP = "show, clear, export or import the autotuner's cached decisions"


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=("show", "clear", "export", "import"))
    parser.add_argument("path", nargs="?", help="file to export to / import from")
    parser.add_argument("--op", help="only entries of ops whose name contains this")


def _key_of(entry: dict) -> dict:
    key = entry.get("key") if isinstance(entry, dict) else None
    return key if isinstance(key, dict) else {}


def _matches(entry: dict, op: str | None) -> bool:
    return op is None or op in str(_key_of(entry).get("op", ""))


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
        for digest, e in sorted(entries.items(), key=lambda kv: str(_key_of(kv[1]).get("op"))):
            key = _key_of(e)
            ranking = e.get("ranking") if isinstance(e.get("ranking"), list) else []
            w = ranking[0] if ranking and isinstance(ranking[0], dict) and "config" in ranking[0] else None
            args_desc = "; ".join(
                f"{str(a[1]).replace('torch.', '')}{a[2]}" for a in (key.get("args") or [])
                if isinstance(a, list) and len(a) > 2 and a[0] == "T")
            try:
                age = f"{(now - float(e.get('created', now))) / 3600:.1f}h"
                ms = f"{float(w['ms']):.4f}" if w and w.get("ms") is not None else "-"
            except (TypeError, ValueError):  # a mistyped entry: shown, marked, not a crash
                age, ms = "?", "?"
            env = key.get("env") if isinstance(key.get("env"), dict) else {}
            excluded = e.get("excluded") if isinstance(e.get("excluded"), list) else []
            table.add_row(str(key.get("op")), args_desc, str(env.get("device")),
                          json.dumps(w["config"]) if w else "default", ms, str(len(excluded)), age)
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
        if not isinstance(data, dict) or data.get("format") != _FORMAT or not isinstance(data.get("entries"), dict):
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
