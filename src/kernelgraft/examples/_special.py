"""NaN and Inf in the examples' sample inputs, so ``kernelgraft check`` judges their semantics."""

from __future__ import annotations

import torch


def nan_inf(t: torch.Tensor) -> torch.Tensor:
    """``t`` with a NaN in its first row and +Inf and -Inf in its last (elements 0, 1 and 2 of a
    1-d tensor): the rows around them stay finite, so a kernel that spreads a NaN fails too."""
    rows = t.view(-1, t.shape[-1]) if t.dim() > 1 else t.view(1, -1)
    rows[0, 0] = float("nan")
    rows[-1, min(1, rows.shape[1] - 1)] = float("inf")
    rows[-1, min(2, rows.shape[1] - 1)] = float("-inf")
    return t
