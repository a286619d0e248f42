"""kernelgraft's version: in tuning keys, bundle manifests and ``kernelgraft --version``."""

__version__ = "0.1.0"
