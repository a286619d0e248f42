"""What every kernel spec shares: ``Config``, the ``ImplSpec`` base class (frozen, hashable,
validated when created) and how a spec's code identity is read. Each backend's own spec class lives
in its folder (``kernelgraft.backends.<name>.spec``)."""

from .base import Config, ImplSpec, callable_source, normalize_capability, source_of, validate_launch_keywords
from .sources import inner_function, kernel_sources

__all__ = ["Config", "ImplSpec", "callable_source", "normalize_capability", "source_of",
           "validate_launch_keywords", "inner_function", "kernel_sources"]
