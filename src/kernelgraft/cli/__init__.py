"""``kernelgraft <command> ...``: each command lives in its own module ``cli/_<command>.py`` that
defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``. Commands are
discovered from the modules in this package, so adding one touches no other file."""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

__all__ = ["main"]


def _commands() -> dict[str, object]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") and not info.name.startswith("__") and info.name != "_common":
            found[info.name[1:]] = f"{__name__}.{info.name}"
    return dict(sorted(found.items()))


def main(argv: list[str] | None = None) -> int:
    commands = _commands()
    parser = argparse.ArgumentParser(
        prog="kernelgraft", description="GPU kernels as real PyTorch operators."
    )
    from ..version import __version__

    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"kernelgraft {__version__}")
    # -v also after the command (`kernelgraft aot x.py -v`); SUPPRESS keeps a -v given before it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name, path in commands.items():
        module = importlib.import_module(path)
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
