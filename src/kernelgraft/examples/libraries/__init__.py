"""Ops whose candidates come from several kernel libraries, tuned per shape against each other
and against PyTorch behind one verified op.

- quack-kernels (CuTe DSL, ``pip install quack-kernels``; needs nvidia-cutlass-dsl 4.7 or later):
  RMSNorm (with and without a residual), softmax, cross-entropy forward;
- Liger-Kernel (Triton, ``pip install liger-kernel``): RMSNorm (its row and its block-of-rows
  kernels), fused add + RMSNorm, SwiGLU, softmax, RoPE;
- kernelgraft's own example kernels (softmax, SwiGLU);
- PyTorch: the tuner's ``torch:eager`` and ``torch:compile`` candidates.

None of these libraries is a dependency of kernelgraft: an impl whose library is not installed is
listed by ``op.candidates`` with the reason (``pip install ...``) and never chosen, like a backend
that is not installed. Each library kernel is called exactly as its library calls it (the same
kernel, the same launch settings), with kernelgraft allocating the outputs, so a bundle carries it
and the C++ runtime serves it with neither library installed.

Import a module to register its op (``kglib::<name>``). ``library_of(impl)`` says which library
an impl of these ops comes from, ``status(dist)`` whether that library imports here.
"""

from __future__ import annotations

from typing import Any

MODULES = ("rmsnorm", "add_rmsnorm", "softmax", "swiglu", "rope", "cross_entropy")
LIBRARIES = ("quack-kernels", "liger-kernel")  # the distributions whose kernels these ops wrap
OWN = "kernelgraft"  # the source of kernelgraft's own example kernels among the impls


def status(dist: str) -> tuple[str | None, str | None]:
    """(``"<dist> <version>"``, None) when ``dist`` (one of ``LIBRARIES``) imports here at the
    version these kernels need, else (None, why not, with how to install it)."""
    from ._sources import library

    return library(dist)


def library_of(impl: Any) -> str:
    """The distribution an impl of these ops comes from (one of ``LIBRARIES``), or ``OWN`` for
    any other kernel spec (kernelgraft's own kernels): by identity with the specs the module
    wrapping that library defines, whether the library is installed or not."""
    from . import _liger, _quack

    for module, dist in ((_quack, "quack-kernels"), (_liger, "liger-kernel")):
        if any(value is impl for value in vars(module).values()):
            return dist
    return OWN
