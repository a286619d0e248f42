"""kernelgraft doctor: what this machine can run, and why not where it cannot."""

from __future__ import annotations

import importlib.metadata
import os
import platform

HELP = "report the environment: torch, GPU, each backend's availability and why"

_PACKAGES = (
    "torch", "triton", "cuda-core", "cuda-bindings", "nvidia-cuda-nvrtc", "cuda-tile",
    "nvidia-cuda-tileiras", "nvidia-cutlass-dsl", "filelock", "rich", "ninja",
)


def add_arguments(parser) -> None:
    parser.add_argument("target", nargs="?", help="optionally a .py file or module: show its ops' candidates")
    parser.add_argument("--build", action="store_true",
                        help="build the native replay's extension now (10-15 s, once per torch and Python)")


def run(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from .common import load_target, ops_of, prepare_environment

    prepare_environment()
    import torch

    from .. import backends
    from ..version import __version__

    console = Console(width=None if Console().is_terminal else 160)
    console.print(f"kernelgraft {__version__} | python {platform.python_version()} | {platform.machine()}")
    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability()
        console.print(escape(
            f"GPU: {torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]}), CUDA {torch.version.cuda}, "
            f"{torch.cuda.device_count()} device(s)"
        ))
    else:
        console.print(escape(
            "GPU: none; ops run their reference on CPU tensors, Triton kernels through its "
            f"interpreter when TRITON_INTERPRET=1 (now {os.environ.get('TRITON_INTERPRET', 'unset')})"
        ))
    packages = Table(title="packages")
    packages.add_column("package")
    packages.add_column("version")
    for name in _PACKAGES:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "-"
        packages.add_row(name, escape(version))
    console.print(packages)
    table = Table(title="backends")
    table.add_column("backend")
    table.add_column("status")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for name in backends.names():
        backend = backends.get(name)
        reason = backend.available() or backend.device_reason(device)
        # reasons hold pip commands such as `pip install 'kernelgraft[cuda]'`: never markup
        table.add_row(name, f"[red]{escape(reason)}" if reason else f"[green]ready on {device.type}")
    console.print(table)
    console.print("native replay (eager CUDA C++, cuTile, CuTe DSL calls): " + _native_status(args.build))
    if args.target:
        for op in ops_of(load_target(args.target)):
            console.print(escape(f"{op.name}{op.signature.schema}: {len(op.impls)} impls, "
                                 f"{sum(len(i.configs) for i in op.impls)} candidates"))
            for impl in op.impls:
                reason = backends.get(impl.backend).available()
                console.print(f"  {escape(repr(impl))}" + (f" [red](unavailable: {escape(reason)})" if reason else ""))
    return 0


def _native_status(build: bool) -> str:
    """Loads a finished build (milliseconds); builds only with ``--build``."""
    from rich.markup import escape

    from .. import native as _native
    from ..errors import CompileError

    if build and _native.enabled():
        try:
            _native.build()
        except CompileError as exc:
            return f"[red]{escape(str(exc))}"
    native = _native.get()
    if native is not None:
        return f"[green]ready[/green] ({escape(str(native.__file__))})"
    if _native.busy() or (_native.enabled() and _native.reason() is None):
        return ("[yellow]not built yet[/yellow]: building in the background now; "
                "`kernelgraft doctor --build` builds it ahead of time")
    return f"[red]{escape(str(_native.reason()))}"
