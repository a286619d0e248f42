"""The examples' CUDA C++ sources, kept as ``.cu`` files in ``cuda/`` beside them (package data),
so a kernel reads as CUDA and the Python modules stay short."""

from __future__ import annotations

from pathlib import Path

__all__ = ["cuda_source"]

_DIR = Path(__file__).with_name("cuda")


def cuda_source(name: str) -> str:
    """The text of ``cuda/<name>``, exactly as the op's identity (its fingerprint) reads it."""
    return (_DIR / name).read_text(encoding="utf-8")
