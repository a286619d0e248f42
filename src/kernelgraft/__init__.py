"""kernelgraft: GPU kernels (Triton, CUDA C++, CuTe DSL, cuTile) as real PyTorch operators.

Describe a kernel once (its launch function and configs) next to a plain PyTorch reference, and get
a ``torch.ops`` operator with schema, fake kernel, input checks, per-shape candidate selection and
a test harness.
"""

from . import driver
from .op.candidates import Candidate
from .spec import CudaImpl, Launch, ctype, cuda
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
from .op.operator import KernelOp, op, unregister
from .verify.compare import ties_by
from .aot import Bundle, load_bundle
from .spec import Config, ImplSpec, triton
from .graft import GraftReport, graft, lower_as, ungraft
from .spec import CuteDSLImpl, CuTileImpl, cutedsl, cutile
from . import tune  # noqa: E402  (installs the autotuner; kg.tune(...) is callable)
from . import native  # noqa: E402

__version__ = "0.1.0"

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
