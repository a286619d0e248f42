"""Bundled kernels that are native code: a CuTe DSL candidate's shared library (``images["so"]``)
and the CUDA dialect runtime it needs (``images["runtime"]``), called through the shim's
``kg_cutedsl_launch`` (``_cutedsl_so`` documents it).

Loading one runs code from the bundle (its initialisers, then its host function), which a cubin
never does, so the loader opens these only when the caller allows it (``allow_native=True``) or the
bundle's signature was verified with a key. What is opened are the verified bytes themselves: each
library is copied into an anonymous in-memory file (``memfd_create``) and ``dlopen``-ed from there,
so a file swapped in ``bin/`` after the check is never what runs. The runtime library is opened
first; the candidate's ``DT_NEEDED`` names it by soname, which the dynamic loader matches to the
copy already open, and names ``libcuda.so.1``, which comes in from the system. (A process that
already loaded the wheel's own ``libcuda_dialect_runtime.so``, by running CuTe DSL JIT kernels,
has its library matched instead: the same soname, code the process loaded itself.)
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..driver import observe
from ..errors import BundleError
from .manifest import read_binary
from .runner import Kernel

__all__ = ["NativeKernel", "is_native", "check_library", "open_library"]

ENTRY = b"kg_cutedsl_launch"
_MACHINES = {"x86_64": 62, "aarch64": 183}   # e_machine of this host's shared libraries
_LOCK = threading.Lock()
_OPEN: dict[str, ctypes.CDLL] = {}           # sha256 -> library, once per process
_C = {"ptr": ctypes.c_void_p, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
      "i64": ctypes.c_int64, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
      "u64": ctypes.c_uint64, "f32": ctypes.c_float, "f64": ctypes.c_double}


_RANGES = {k: ((-1 << (b - 1), (1 << (b - 1)) - 1) if k[0] == "i" else (0, (1 << b) - 1))
           for k, b in (("i8", 8), ("i16", 16), ("i32", 32), ("i64", 64), ("u8", 8), ("u16", 16), ("u32", 32),
                        ("u64", 64))}


def is_native(entry: Mapping[str, Any]) -> bool:
    """Whether a kernel entry of the manifest is native code (a shared library)."""
    images = entry.get("images")
    return isinstance(images, Mapping) and "so" in images


def check_library(where: str, image: bytes, *, entry: bool) -> None:
    """A 64-bit little-endian ELF shared object for this host's machine (that defines the shim's
    entry point when ``entry``): other bytes under a recomputed sha256 are refused before dlopen."""
    machine = _MACHINES.get(platform.machine())
    if (len(image) < 64 or image[:6] != b"\x7fELF\x02\x01" or int.from_bytes(image[16:18], "little") != 3
            or (machine is not None and int.from_bytes(image[18:20], "little") != machine)):
        raise BundleError(f"{where}: the library is not a 64-bit ELF shared object for {platform.machine()}")
    if entry and ENTRY + b"\0" not in image:
        raise BundleError(f"{where}: the library does not define {ENTRY.decode()}")


def open_library(where: str, image: bytes) -> ctypes.CDLL:
    """``dlopen`` of exactly these (verified) bytes, once per process per sha256."""
    digest = hashlib.sha256(image).hexdigest()
    with _LOCK:
        lib = _OPEN.get(digest)
        if lib is not None:
            return lib
        fd = os.memfd_create(f"kernelgraft-{digest[:16]}", getattr(os, "MFD_CLOEXEC", 1))
        # The fd stays open for the process: the dynamic loader takes a path it has opened before
        # for the library already loaded, and a closed fd's number (so its /proc path) comes back.
        try:
            view = memoryview(image)
            while view:
                view = view[os.write(fd, view):]
            lib = ctypes.CDLL(f"/proc/self/fd/{fd}", mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as exc:
            os.close(fd)
            raise BundleError(f"{where}: the library does not load: {exc}") from None
        _OPEN[digest] = lib
        return lib


class NativeKernel(Kernel):
    """A CuTe DSL kernel of a bundle: the host function in its shared library."""

    def _load(self, root: Path, images: Mapping[str, Any], binaries: Mapping[str, bytes] | None) -> None:
        data = {}
        for kind, image in images.items():
            known = binaries.get(image.get("file")) if binaries is not None else None
            data[kind] = known if known is not None else read_binary(root, image)
        if "runtime" not in data:
            raise BundleError(f"{self.where}: no runtime image (the CUDA dialect runtime the library needs)")
        check_library(self.where, data["runtime"], entry=False)
        check_library(self.where, data["so"], entry=True)
        self._images = data  # opened on first use: a process without libcuda can still load the bundle
        self._lib = None
        self.function = None
        self.launcher = self._launch

    def _check_params(self, device: int) -> None:
        with _LOCK:
            opened = self._lib is not None
        if opened:
            return
        open_library(f"{self.where} (runtime)", self._images["runtime"])
        lib = open_library(self.where, self._images["so"])
        lib.kg_cutedsl_kinds.restype = ctypes.c_char_p
        kinds = lib.kg_cutedsl_kinds().decode().split(",") if lib.kg_cutedsl_num_args() else []
        if lib.kg_cutedsl_abi() != 1 or kinds != self.kinds:
            raise BundleError(f"{self.where}: the library takes {kinds} (ABI {lib.kg_cutedsl_abi()}), the manifest "
                              f"says {self.kinds} (ABI 1); the manifest or the library was modified")
        fn = lib.kg_cutedsl_launch
        fn.restype = ctypes.c_int32
        fn.argtypes = [ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p,
                       ctypes.c_size_t]
        self._fn = fn
        self._local = threading.local()
        self._lib = lib

    def prepare(self, args: Sequence[Any], n_inputs: int) -> tuple:
        grid, smem, template = super().prepare(args, n_inputs)
        for slot in self.scalar_slots:  # ctypes would wrap an out-of-range value silently
            kind, value = self.kinds[slot], template[slot]
            if kind in _RANGES and not (isinstance(value, int) and _RANGES[kind][0] <= value <= _RANGES[kind][1]):
                raise BundleError(f"{self.where}: parameter {slot} of kind {kind} cannot hold {value!r}")
        return grid, smem, template

    def _slots(self):
        try:
            return self._local.slots
        except AttributeError:
            values = [_C[k]() for k in self.kinds]
            packed = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
            self._local.slots = (values, packed, ctypes.create_string_buffer(512))
            return self._local.slots

    def _launch(self, device: int, grid, block, values: Sequence[Any], smem: int) -> None:
        from ..driver import current_stream

        slots, packed, error = self._slots()
        for slot, v in zip(slots, values):
            slot.value = v
        if observe.active() is not None:  # the shim's entry is not the packed ABI the replay calls
            observe.note(None, f"{self.name} is a bundled CuTe DSL library, called through ctypes")
        status = self._fn(device, current_stream(device), packed, len(slots), error, len(error))
        if status != 0:
            from ..errors import LaunchError

            raise LaunchError(f"{self.where}: {error.value.decode(errors='replace')}")
