"""kernelgraft check TARGET: every candidate of every op in TARGET against its reference."""

from __future__ import annotations

import json

HELP = "check every candidate of every op in TARGET against its reference"


def add_arguments(parser) -> None:
    parser.add_argument("target", nargs="+", help="a .py file or module defining ops (several allowed)")
    parser.add_argument("--op", action="append", help="only ops whose name contains this (repeatable)")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--no-opcheck", action="store_true", help="skip torch.library.opcheck")
    parser.add_argument("--json", help="also write every result to this JSON file")


def run(args) -> int:
    from ..check import CheckReport, check_op, render
    from ._common import load_target, ops_of

    report = CheckReport()
    for target in args.target:
        for op in ops_of(load_target(target)):
            if args.op and not any(s in op.name for s in args.op):
                continue
            report.extend(check_op(op, device=args.device, opcheck=not args.no_opcheck))
    render(report)
    if args.json:
        import dataclasses

        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in report.results], f, indent=1, default=str)
    if not report.results:
        print("kernelgraft check: no ops found in", " ".join(args.target))
        return 1
    return 0 if report.ok else 1
