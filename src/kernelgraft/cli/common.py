"""Helpers shared by CLI commands: loading a TARGET and its ops (``kernelgraft.op.targets``), the
tables, and the third-party warnings the tools hide."""

from __future__ import annotations

import warnings

from ..check.report import table_console  # one rule for every command's tables
from ..op.targets import load_target, ops_of, prepare_environment

__all__ = ["prepare_environment", "quiet_third_party_warnings", "load_target", "ops_of", "selected_ops",
           "table_console"]


def selected_ops(targets, filters) -> list:
    """The ops of every TARGET, in order, whose names contain one of ``filters`` (``--op``; every op
    when there is none)."""
    return [op for target in targets for op in ops_of(load_target(target))
            if not filters or any(s in op.name for s in filters)]


# Warnings that third-party code raises while a kernelgraft tool drives it, and that say nothing the
# user can act on: (category, module the warning is attributed to, message). Only these: warnings
# from kernelgraft and from the user's own modules (and any other from these packages) still show.
THIRD_PARTY_NOISE: tuple[tuple[type[Warning], str, str], ...] = (
    # numpy floating-point notes from Triton's CPU interpreter: outputs are poisoned with NaN before a
    # kernel runs, and masked-off lanes compute on garbage by design
    (RuntimeWarning, r"triton\.runtime\.interpreter", ""),
    # Triton 3.9's notices of defaults changing in 3.10: the knob is Triton's, not the user's kernel's
    (UserWarning, r"triton\.", r"TRITON_DEFAULT_FP_FUSION is unset|tl\.(cat|reshape)\(can_reorder=True\)"),
    # torch deprecating its own pytree class, which torch's export machinery still uses
    (FutureWarning, r"torch\.", r".*isinstance\(treespec, LeafSpec\)"),
)


def quiet_third_party_warnings() -> None:
    """Hide ``THIRD_PARTY_NOISE`` in this process (the CLI only: a library leaves filters to its
    user)."""
    for category, module, message in THIRD_PARTY_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
