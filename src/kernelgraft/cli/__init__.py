"""``kernelgraft <command> ...``: each command lives in its own module ``cli/<command>.py`` that
defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``; ``_commands`` lists
them (adding a command is adding its module and one entry there)."""

from __future__ import annotations

import argparse
import logging
import sys

from ..version import __version__
from . import aot, bench, cache, check, demo, doctor, tune

__all__ = ["main"]


def _commands() -> dict[str, object]:
    """The commands, by name, in the order ``--help`` lists them (each module's top level is light:
    what a command needs is imported when it runs)."""
    return {"aot": aot, "bench": bench, "cache": cache, "check": check, "demo": demo, "doctor": doctor,
            "tune": tune}


def main(argv: list[str] | None = None) -> int:
    commands = _commands()
    parser = argparse.ArgumentParser(
        prog="kernelgraft", description="GPU kernels as real PyTorch operators."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"kernelgraft {__version__}")
    # -v also after the command (`kernelgraft aot x.py -v`); SUPPRESS keeps a -v given before it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name, module in commands.items():
        modules[name] = module
        p = sub.add_parser(name, help=module.HELP, description=module.HELP, parents=[common])
        module.add_arguments(p)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
