"""``check_op``: the one call that checks an op, in this process or isolated in a child."""

from __future__ import annotations

from typing import Any

from .harness import CheckOptions, CheckReport, iter_check
from .isolate import check_isolated

__all__ = ["check_op"]


def check_op(
    op: Any,
    *,
    device: str | None = None,
    noncontiguous: bool = True,
    opcheck: bool = True,
    opcheck_samples: int = 2,
    compile_arch: str | None = "sm_90",
    isolate: bool = False,
) -> CheckReport:
    """Check every candidate of ``op`` on its sample inputs and the inputs derived from them;
    see the module docstring.

    ``noncontiguous=False`` checks the samples exactly as given (no strided copies, no derived
    inputs). ``opcheck=False`` skips torch's own checks of the registration: ``opcheck`` (over the
    op with its reference, and over each candidate) and tracing under ``torch.compile`` and
    ``torch.export``. A candidate that cannot run here (no GPU, a GPU older than it needs) is
    compiled for ``compile_arch`` instead (or the newer arch it needs): status ``compiled``, or
    ``fail`` with the compiler's message. ``compile_arch=None`` skips such candidates without
    compiling.

    ``isolate=True`` runs the candidates in a child process: one that crashes it (a segfault from
    an out-of-bounds store past the guards, a CUDA illegal address that kills the context) becomes
    that candidate's failure once it crashes again alone, and the check goes on. Off by default:
    in-process, a debugger, a profiler and the caller's state (tuning decisions, monkeypatches)
    see the kernels run, and nothing is re-imported. ``kernelgraft check`` isolates unless given
    ``--no-isolate``.
    """
    options = CheckOptions(device, noncontiguous, opcheck, opcheck_samples, compile_arch)
    if isolate:
        return check_isolated([op], options)
    return CheckReport([result for _, result in iter_check(op, options)])
