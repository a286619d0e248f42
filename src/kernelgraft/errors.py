"""Every error and warning kernelgraft raises, in one place.

Messages follow one shape: what happened, in which op and argument, the value that came, what is
allowed, and how to fix it. The same check always uses the same words (see ``describe``).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "KernelgraftError",
    "SpecError",
    "RegistrationError",
    "InputError",
    "UnsupportedError",
    "CompileError",
    "LaunchError",
    "LaunchOutOfMemoryError",
    "out_of_memory",
    "memory_note",
    "BundleError",
    "KernelgraftWarning",
    "FallbackWarning",
    "TuneWarning",
    "VerificationError",
    "GraftWarning",
    "describe",
]


class KernelgraftError(Exception):
    """Base class of every kernelgraft error."""


class SpecError(KernelgraftError, ValueError):
    """A kernel spec (impl, configs, predicate) is malformed; raised when it is created."""


class RegistrationError(KernelgraftError):
    """An op name is malformed or already taken by a different op."""


class InputError(KernelgraftError, ValueError):
    """An op was called with arguments it does not accept (device, dtype, rank, layout, type)."""


class UnsupportedError(KernelgraftError):
    """No candidate can run these inputs and no fallback is allowed, or a forced candidate refuses."""


class CompileError(KernelgraftError):
    """A kernel failed to compile; the message carries the compiler log."""


class LaunchError(KernelgraftError):
    """A kernel launch failed."""


# What CUDA libraries report when an allocation of their own fails (cuBLAS creating a handle or its
# workspace, cuDNN, cuSOLVER): they allocate outside PyTorch's caching allocator, so memory that
# allocator holds cached, or that another process on the GPU holds, is memory they cannot have.
_LIBRARY_ALLOC_FAILED = ("CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED", "CUSOLVER_STATUS_ALLOC_FAILED",
                         "CUSPARSE_STATUS_ALLOC_FAILED", "CUFFT_ALLOC_FAILED")


def out_of_memory(exc: BaseException) -> bool:
    """Running out of GPU or host memory (a failure that may pass, and no kernel's fault),
    PyTorch's own or a CUDA library's (``CUBLAS_STATUS_ALLOC_FAILED`` and the like)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc)
    return "out of memory" in text.lower() or any(code in text for code in _LIBRARY_ALLOC_FAILED)


def memory_note(device: Any) -> str:
    """The device's memory when an allocation failed, for the failure's message: free and total
    (every process on the GPU), and what this process's PyTorch allocator holds and uses; '' for
    a device other than CUDA or when it cannot be read."""
    try:
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_initialized():
            return ""
        free, total = torch.cuda.mem_get_info(device)
        reserved, allocated = torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device)
    except Exception:  # a broken context says nothing useful here; the failure itself is reported
        return ""
    gib = 1024 ** 3
    return (f"device memory {free / gib:.1f} GiB free of {total / gib:.1f} GiB; this process's PyTorch "
            f"allocator holds {reserved / gib:.1f} GiB ({allocated / gib:.1f} GiB in use)")


class LaunchOutOfMemoryError(LaunchError, torch.OutOfMemoryError):
    """A kernel launch ran out of GPU memory: a ``LaunchError`` naming the op and candidate that is
    also a ``torch.OutOfMemoryError``, so code that handles running out of memory (smaller
    batches, freeing caches) still catches it."""


class BundleError(KernelgraftError):
    """An AOT bundle is malformed, tampered with, or built for another machine."""


class VerificationError(KernelgraftError):
    """A grafted model's outputs differ from the original's beyond tolerance."""


class KernelgraftWarning(UserWarning):
    """Base class of kernelgraft warnings."""


class FallbackWarning(KernelgraftWarning):
    """The PyTorch reference ran because no candidate supports the inputs."""


class TuneWarning(KernelgraftWarning):
    """Tuning was skipped or degraded (during capture/tracing, unusable cache, pruning failed)."""


class GraftWarning(KernelgraftWarning):
    """A graft kept a module's original forward, matched nothing, or could not be verified."""


def describe(value: Any) -> str:
    """A short, stable description of an argument value for error messages."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:  # no single shape, no strides
            return f"Tensor(nested, dtype={value.dtype}, device={value.device})"
        if value.layout is not torch.strided:  # sparse, mkldnn: no strides
            return f"Tensor(shape={tuple(value.shape)}, dtype={value.dtype}, device={value.device}, {value.layout})"
        layout = "contiguous" if value.is_contiguous() else f"strides {tuple(value.stride())}"
        return (
            f"Tensor(shape={tuple(value.shape)}, dtype={value.dtype}, device={value.device}, {layout})"
        )
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}[{', '.join(describe(v) for v in value)}]"
    return f"{type(value).__name__} {value!r}"
