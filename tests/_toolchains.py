"""Skip markers for tests that need a compiler kernelgraft drives (shared by several test folders)."""

from __future__ import annotations

import pytest

import kernelgraft as kg
from kernelgraft.backends.cuda import nvrtc as _nvrtc

nvrtc_missing = None
try:
    _nvrtc.nvrtc_version()
except kg.CompileError as exc:  # pragma: no cover - CI installs the [ci] extra with NVRTC
    nvrtc_missing = str(exc)
needs_nvrtc = pytest.mark.skipif(nvrtc_missing is not None, reason=f"NVRTC missing: {nvrtc_missing}")
