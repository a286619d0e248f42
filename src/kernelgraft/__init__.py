"""kernelgraft: GPU kernels (Triton, CUDA C++, CuTe DSL, cuTile) as real PyTorch operators.

Describe a kernel once (its launch function and configs) next to a plain PyTorch reference, and get
a ``torch.ops`` operator with schema, fake kernel, input checks, per-shape candidate selection and
a test harness.
"""

from . import driver
from .aot import Bundle, load_bundle
from .backends.cuda import CudaImpl, Launch, ctype, cuda
from .backends.cutedsl import CuteDSLImpl, cutedsl
from .backends.cutile import CuTileImpl, cutile
from .backends.triton import triton
from .errors import (
    BundleError,
    CompileError,
    FallbackWarning,
    GraftWarning,
    InputError,
    KernelgraftError,
    KernelgraftWarning,
    LaunchError,
    RegistrationError,
    SpecError,
    TuneWarning,
    UnsupportedError,
    VerificationError,
)
from .graft import GraftReport, graft, lower_as, ungraft
from .op.candidates import Candidate
from .op import KernelOp, op, unregister
from .spec import Config, ImplSpec
from .verify.compare import ties_by
from .version import __version__
from . import native, tune  # kg.native; kg.tune (a package that is also callable: kg.tune(...))
from .wiring import wire

wire()

__all__ = [
    "op",
    "ties_by",
    "triton",
    "cutile",
    "cutedsl",
    "CuTileImpl",
    "CuteDSLImpl",
    "cuda",
    "Launch",
    "ctype",
    "CudaImpl",
    "driver",
    "KernelOp",
    "unregister",
    "load_bundle",
    "Bundle",
    "ImplSpec",
    "Config",
    "Candidate",
    "KernelgraftError",
    "SpecError",
    "RegistrationError",
    "InputError",
    "UnsupportedError",
    "CompileError",
    "LaunchError",
    "BundleError",
    "KernelgraftWarning",
    "FallbackWarning",
    "GraftWarning",
    "VerificationError",
    "lower_as",
    "graft",
    "ungraft",
    "GraftReport",
    "TuneWarning",
    "tune",
    "native",
    "__version__",
]
