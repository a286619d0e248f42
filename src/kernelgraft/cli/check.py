"""kernelgraft check TARGET: every candidate of every op in TARGET against its reference."""

from __future__ import annotations

import json

HELP = "check every candidate of every op in TARGET against its reference"


def add_arguments(parser) -> None:
    parser.add_argument("target", nargs="+", help="a .py file or module defining ops (several allowed)")
    parser.add_argument("--op", action="append", help="only ops whose name contains this (repeatable)")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--no-opcheck", action="store_true",
                        help="skip torch's checks of the registration: torch.library.opcheck (over the op and "
                             "each candidate) and tracing under torch.compile and torch.export")
    parser.add_argument("--no-isolate", action="store_true",
                        help="run the kernels in this process (for a debugger); by default they run in a "
                             "child process, so one that crashes it is reported as that candidate's failure")
    parser.add_argument("--step-timeout", type=float, default=600.0, metavar="SECONDS",
                        help="stop a candidate that gives no result on a sample for this long, and fail it "
                             "(default 600; 0 waits forever; isolated runs only)")
    parser.add_argument("--json", help="also write every result to this JSON file")


def run(args) -> int:
    from .common import quiet_third_party_warnings

    quiet_third_party_warnings()
    from rich.markup import escape

    from ..check import CheckOptions, Printer, check_in_process, check_isolated, render
    from .common import selected_ops

    printer = Printer()
    printer.say(f"kernelgraft check: importing {escape(' '.join(args.target))}")

    ops = selected_ops(args.target, args.op)
    if not ops:
        print("kernelgraft check: no ops found in", " ".join(args.target))
        return 1
    options = CheckOptions(device=args.device, opcheck=not args.no_opcheck)
    try:
        if args.no_isolate:
            report = check_in_process(ops, options, events=printer)
        else:
            report = check_isolated(ops, options, targets=args.target, events=printer,
                                    prepare=quiet_third_party_warnings, step_timeout=args.step_timeout or None)
    finally:
        printer.close()
    render(report)
    if args.json:
        import dataclasses

        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in report.results], f, indent=1, default=str)
    return 0 if report.ok else 1
