"""Where the test helpers and the repository are, for test modules in any folder under tests/ and
the child processes they start (helpers such as ``_layout_ops.py`` live in tests/ itself)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent  # tests/: conftest.py and the _*.py helpers
ROOT = TESTS.parent  # the repository
