"""Backends: one folder each (``triton/``, ``cuda/``, ``cutile/``, ``cutedsl/``), behind the protocols
of ``base`` and the registry of ``registry``. Nothing registers itself on import:
``kernelgraft.wiring`` registers the built-in backends and the ``kernelgraft.backends`` entry points."""

from .base import AotPath, Backend, CompilesAhead, Runner
from .device import current_device, on_tensor_device, tensor_device, use_device
from .registry import ENTRY_POINT_GROUP, aot_path, get, load_entry_points, names, register, unregister

__all__ = ["Backend", "AotPath", "CompilesAhead", "Runner", "get", "names", "aot_path", "register", "unregister",
           "load_entry_points", "ENTRY_POINT_GROUP", "on_tensor_device", "tensor_device", "current_device", "use_device"]
