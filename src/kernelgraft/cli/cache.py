"""kernelgraft cache show|clear|export|import: the autotuner's decisions on disk.

Every action works on any file found there: a tuning cache that cannot be used is reported and
set aside (see ``kernelgraft.tune.cache``), never a crash; entries are shown as plain text.
"""

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


def _row(entry: dict, now: float) -> list[str]:
    key = _key_of(entry)
    ranking = entry.get("ranking") if isinstance(entry.get("ranking"), list) else []
    w = ranking[0] if ranking and isinstance(ranking[0], dict) and "config" in ranking[0] else None
    args = key.get("args") if isinstance(key.get("args"), list) else []
    args_desc = "; ".join(
        f"{str(a[1]).replace('torch.', '')}{a[2]}" for a in args
        if isinstance(a, list) and len(a) > 2 and a[0] == "T")
    try:
        age = f"{(now - float(entry.get('created', now))) / 3600:.1f}h"
    except (TypeError, ValueError, OverflowError):
        age = "?"
    try:
        ms = f"{float(w['ms']):.4f}" if w and w.get("ms") is not None else "-"
    except (TypeError, ValueError, OverflowError):  # a mistyped field: shown, marked, not a crash
        ms = "?"
    env = key.get("env") if isinstance(key.get("env"), dict) else {}
    excluded = entry.get("excluded") if isinstance(entry.get("excluded"), list) else []
    return [str(key.get("op")), args_desc, str(env.get("device")),
            _winner(w), ms, str(len(excluded)), age]


def _winner(w: dict | None) -> str:
    if not w:
        return "default"
    if w.get("backend") == "torch":  # PyTorch competing won (kernelgraft.op.compete)
        return f"torch:{w.get('impl_name')}"
    return json.dumps(w["config"])


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from ..tune.cache import FORMAT, BadFile, DiskCache, cache_path, read_json, set_aside_files
    from ..tune.key import KEY_SCHEMA_VERSION

    console = Console()
    path = cache_path()
    if path is None:
        console.print(f"kernelgraft cache {args.action}: disk caching is off (KERNELGRAFT_CACHE_DIR=off); "
                      "decisions live in each process's memory only")
        return 0 if args.action in ("show", "clear") else 2
    disk = DiskCache()
    if args.action == "show":
        entries = {d: e for d, e in disk.entries().items() if _matches(e, args.op)}
        table = Table(title=Text(f"{path} ({len(entries)} entries)"))
        for col in ("op", "inputs", "device", "winner", "ms", "excluded", "age"):
            table.add_column(col)
        now = datetime.datetime.now().timestamp()
        for _, e in sorted(entries.items(), key=lambda kv: str(_key_of(kv[1]).get("op"))):
            # Text, not str: rich would read brackets in an op name or config as markup.
            table.add_row(*(Text(cell) for cell in _row(e, now)))
        console.print(table)
        if disk.dropped:
            console.print(Text(f"{disk.dropped} entries with fields of the wrong type are not shown "
                               "(they are misses; `kernelgraft cache clear` removes them)"))
        aside = set_aside_files(path)
        if aside:
            console.print(Text(f"{len(aside)} unusable cache files set aside: "
                               + ", ".join(p.name for p in aside)))
        return 0
    if args.action == "clear":
        n = disk.remove(None if args.op is None else (lambda d, e: _matches(e, args.op)))
        aside = set_aside_files(path) if args.op is None else []
        for p in aside:
            p.unlink(missing_ok=True)
        extra = f" and {len(aside)} set-aside files" if aside else ""
        console.print(Text(f"removed {n} entries{extra} from {path}"))
        return 0
    if not args.path:
        console.print(f"kernelgraft cache {args.action}: give a file path")
        return 2
    if args.action == "export":
        entries = {d: e for d, e in disk.entries().items() if _matches(e, args.op)}
        with open(args.path, "w", encoding="utf-8") as fh:
            json.dump({"format": FORMAT, "schema": KEY_SCHEMA_VERSION, "entries": entries}, fh, indent=1)
        console.print(Text(f"exported {len(entries)} entries to {args.path}"))
        return 0
    try:
        data = read_json(args.path)
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            raise ValueError("not a kernelgraft tuning cache export")
        if data.get("schema") != KEY_SCHEMA_VERSION:
            raise ValueError(f"key schema {data.get('schema')!r}, this kernelgraft uses {KEY_SCHEMA_VERSION}")
    except (OSError, ValueError, BadFile) as exc:
        console.print(Text(f"kernelgraft cache import: cannot use {args.path}: {exc}"))
        return 1
    entries = {d: e for d, e in data["entries"].items() if isinstance(e, dict) and _matches(e, args.op)}
    if not disk.put(entries):
        console.print(Text(f"kernelgraft cache import: could not write {path}"))
        return 1
    console.print(Text(f"imported {len(entries)} entries into {path} (entries for another device or "
                       "version are kept but not used)"))
    return 0
