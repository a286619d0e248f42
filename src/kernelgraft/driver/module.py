"""Modules (a cubin or PTX image) and functions (one kernel in it), loaded per device on demand.

An image is loaded into a device's primary context (the one torch uses) the first time a
function of it is needed on that device; handles are cached per (module, device), so a module can
serve several GPUs. Nothing here touches the GPU until the first launch or ``handle`` call.

Every driver object belongs to one device: a module is loaded, a kernel found and its shared-memory
limit raised with that device's primary context pushed (``_cu.device_context``), whatever device
the caller has current, and a launch for device ``d`` runs with ``d`` current and on ``d``'s
current torch stream (``Launcher``), so tensors on ``cuda:1`` launch correctly while the current
device is 0 (one process driving several GPUs: ``device_map="auto"``, pipeline stages).
"""

from __future__ import annotations

import hashlib
import struct
import logging
import threading
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import LaunchError
from . import cu as _cu, observe as _observe
from .params import KINDS, ParamBuffer, kind_of, value_of

__all__ = ["Module", "Function", "Launcher", "load_module", "current_stream", "current_device"]

log = logging.getLogger(__name__)
_MODULES: dict[tuple[str, str], "Module"] = {}
_LOCK = threading.Lock()
_DEFAULT_SMEM_LIMIT = 48 * 1024
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_get_device = getattr(torch._C, "_cuda_getDevice", None)


def current_device() -> int:
    """torch's current CUDA device on this thread (the runtime's, so the driver's current context);
    -1 where torch is built without CUDA (nothing to switch from: the driver says there is no GPU)."""
    if _get_device is not None:
        return _get_device()
    return -1


def current_stream(device_index: int) -> int:
    """The raw ``cudaStream_t`` of torch's current stream on a device (CUDA-graph capture safe)."""
    if _raw_stream is not None:
        return _raw_stream(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream  # pragma: no cover


def load_module(image: bytes, kind: str = "cubin", *, name: str = "") -> "Module":
    """A module from a cubin (ELF bytes) or PTX (text) image; the same image gives the same module.

    >>> from kernelgraft import driver
    >>> m = driver.load_module(b"\\x7fELF...", "cubin", name="demo")  # loads on first launch
    >>> m.kind
    'cubin'
    """
    if kind not in ("cubin", "ptx"):
        raise LaunchError(f"module kind must be 'cubin' or 'ptx', got {kind!r}")
    if isinstance(image, str):
        image = image.encode()
    if not isinstance(image, (bytes, bytearray)) or not image:
        raise LaunchError(f"a {kind} image must be non-empty bytes, got {type(image).__name__}")
    image = bytes(image)
    if kind == "ptx" and not image.endswith(b"\0"):
        image += b"\0"  # the driver reads PTX as a C string
    if kind == "cubin" and not image.startswith(b"\x7fELF"):
        raise LaunchError(f"module {name or '?'}: a cubin must be an ELF image (starts with \\x7fELF)")
    key = (kind, hashlib.sha256(image).hexdigest())
    module = _MODULES.get(key)
    if module is None:
        with _LOCK:
            module = _MODULES.setdefault(key, Module(image, kind, name or key[1][:12]))
    return module


class Module:
    """A loaded (or loadable) cubin/PTX image. Get kernels with ``function(name)``."""

    def __init__(self, image: bytes, kind: str, name: str) -> None:
        self.image = image
        self.kind = kind
        self.name = name
        self._handles: dict[int, Any] = {}
        self._functions: dict[str, Function] = {}

    def handle(self, device_index: int) -> Any:
        """The ``CUmodule`` in the device's primary context, loading the image the first time."""
        h = self._handles.get(device_index)
        if h is None:
            with _LOCK:
                h = self._handles.get(device_index)
                if h is None:
                    with _cu.device_context(device_index):
                        h = _cu.call("cuModuleLoadData", self.image,
                                     what=f"loading {self.kind} module {self.name} on device {device_index}")
                    self._handles[device_index] = h
                    log.debug("loaded %s module %s on device %d", self.kind, self.name, device_index)
        return h

    def function(self, name: str) -> "Function":
        """The kernel ``name`` (the mangled name for C++ kernels, unless ``extern "C"``)."""
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions.setdefault(name, Function(self, name))
        return fn

    def __repr__(self) -> str:
        return f"<kernelgraft.driver.Module {self.name} {self.kind} {len(self.image)} bytes>"


class Function:
    """One kernel of a module. ``launch`` for convenience, ``launcher`` for the hot path."""

    def __init__(self, module: Module, name: str) -> None:
        self.module = module
        self.name = name
        self._handles: dict[int, Any] = {}
        self._raw: dict[int, int] = {}
        self._smem_set: dict[int, int] = {}
        self._buffers: dict[tuple[str, ...], ParamBuffer] = {}

    def handle(self, device_index: int) -> Any:
        """The ``CUfunction`` on a device."""
        h = self._handles.get(device_index)
        if h is None:
            mod = self.module.handle(device_index)
            with _cu.device_context(device_index):
                h = _cu.call("cuModuleGetFunction", mod, self.name.encode(),
                             what=f"finding kernel {self.name!r} in module {self.module.name} "
                                  f"on device {device_index}")
            self._handles[device_index] = h
        return h

    def _raw_handle(self, device_index: int, handle: Any) -> int:
        """The CUfunction as an integer, for the ctypes launch path."""
        raw = self._raw.get(device_index)
        if raw is None:
            raw = self._raw[device_index] = int(handle)
        return raw

    def prepare_shared_memory(self, device_index: int, shared_mem: int) -> None:
        """Allow ``shared_mem`` bytes of dynamic shared memory (needed above 48 KiB)."""
        if shared_mem <= _DEFAULT_SMEM_LIMIT or self._smem_set.get(device_index, 0) >= shared_mem:
            return
        driver = _cu.cu()
        handle = self.handle(device_index)
        with _cu.device_context(device_index):
            _cu.call("cuFuncSetAttribute", handle,
                     driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                     int(shared_mem),
                     what=f"allowing {shared_mem} bytes of shared memory for {self.name} on device "
                          f"{device_index}")
        self._smem_set[device_index] = shared_mem

    def check_params(self, device_index: int, kinds: Sequence[str]) -> None:
        """Compare the parameter kinds with the kernel's own parameter list (sizes), read from the
        image by the driver (``cuFuncGetParamInfo``, CUDA 12.4+; skipped where missing)."""
        driver = _cu.cu()
        get = getattr(driver, "cuFuncGetParamInfo", None)
        if get is None:
            return
        handle = self.handle(device_index)
        sizes = []
        for i in range(len(kinds) + 1):
            err, _offset, size = get(handle, i)
            if int(err) != 0:
                if i == 0 and err != driver.CUresult.CUDA_ERROR_INVALID_VALUE:
                    return  # not supported by this driver
                break
            sizes.append(int(size))
        want = [struct.calcsize("=" + KINDS[k]) for k in kinds]
        if sizes != want:
            raise LaunchError(
                f"kernel {self.name} takes {len(sizes)} parameters of sizes {sizes} bytes, but the "
                f"launch passes {len(kinds)}: {list(kinds)} (sizes {want}); match the kernel's "
                "signature with driver.i32/i64/f32/... and tensors"
            )

    def launcher(self, kinds: Sequence[str]) -> "Launcher":
        """A reusable launcher for a fixed parameter list (kinds as in ``kernelgraft.driver``)."""
        kinds = tuple(kinds)
        buf = self._buffers.get(kinds)
        if buf is None:
            buf = self._buffers.setdefault(kinds, ParamBuffer(kinds))
        return Launcher(self, buf)

    def launch(
        self,
        grid: int | Sequence[int],
        block: int | Sequence[int],
        args: Sequence[Any],
        shared_mem: int = 0,
        stream: Any = None,
        device: int | torch.device | None = None,
    ) -> None:
        """Launch on ``stream`` (default: torch's current stream of the tensors' device).

        ``args``: tensors (passed as device pointers), ``None`` (a null pointer), typed scalars
        (``driver.i32(n)``, ``driver.f32(x)``) or ctypes values. The device is ``device``, else the
        first tensor's, else torch's current device.
        """
        kinds = [kind_of(a, i) for i, a in enumerate(args)]
        if device is None:
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        index = _device_index(device)
        self.launcher(kinds)(index, grid, block, [value_of(a) for a in args], shared_mem, stream)

    def __repr__(self) -> str:
        return f"<kernelgraft.driver.Function {self.name} of {self.module.name}>"


def _device_index(device: int | torch.device | None) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    if device.type != "cuda":
        raise LaunchError(f"kernels launch on CUDA devices, got tensors on {device}")
    return device.index if device.index is not None else current_device()


def _dims(value: int | Sequence[int], what: str) -> tuple[int, int, int]:
    # 3-tuples of ints (what runners cache) come back as they are: this is on the per-call path
    if type(value) is tuple and len(value) == 3:
        x, y, z = value
        if type(x) is int and type(y) is int and type(z) is int:
            return value  # type: ignore[return-value]
    if isinstance(value, int):
        return value, 1, 1
    dims = tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3:
        raise LaunchError(f"{what} must have 1 to 3 dimensions, got {value!r}")
    return dims + (1,) * (3 - len(dims))  # type: ignore[return-value]


class Launcher:
    """``launcher(device_index, grid, block, values, shared_mem=0, stream=None)``: pack raw values
    (addresses as ints, numbers) into the parameter buffer and call ``cuLaunchKernel``.

    An empty grid launches nothing. ``stream`` defaults to torch's current stream of the device, so
    launches are recorded into a CUDA graph being captured on that stream. When torch's current
    device is another one, the launch switches to ``device_index`` for its duration (through torch,
    which makes that device's primary context current and switches back after): the function
    handle and the stream are that device's and are only valid in its context. The check is one
    ``cudaGetDevice``; the switch happens only when the devices differ.
    """

    __slots__ = ("function", "buffer", "_launch")

    def __init__(self, function: Function, buffer: ParamBuffer) -> None:
        self.function = function
        self.buffer = buffer
        self._launch = None

    def __call__(
        self,
        device_index: int,
        grid: int | Sequence[int],
        block: int | Sequence[int],
        values: Sequence[Any],
        shared_mem: int = 0,
        stream: Any = None,
    ) -> None:
        gx, gy, gz = _dims(grid, "grid")
        if gx <= 0 or gy <= 0 or gz <= 0:
            return
        current = current_device()
        if current >= 0 and device_index != current:
            with torch.cuda.device(device_index):
                return self(device_index, grid, block, values, shared_mem, stream)
        bx, by, bz = _dims(block, "block")
        fn = self.function
        handle = fn._handles.get(device_index)
        if handle is None:
            handle = fn.handle(device_index)
        if shared_mem > _DEFAULT_SMEM_LIMIT:
            fn.prepare_shared_memory(device_index, shared_mem)
        if stream is None:
            stream = current_stream(device_index)
        elif hasattr(stream, "cuda_stream"):
            stream = stream.cuda_stream
        params = self.buffer.address(values)
        raw = self._launch
        if raw is None:
            raw = self._launch = _cu.raw_launch() or False
        if _observe.active() is not None:
            self._note(raw, device_index, handle, (gx, gy, gz), (bx, by, bz), shared_mem, stream, values)
        if raw:
            err = raw(fn._raw_handle(device_index, handle), gx, gy, gz, bx, by, bz, shared_mem,
                      stream or None, params, None)
        else:
            (err,) = _cu.cu().cuLaunchKernel(handle, gx, gy, gz, bx, by, bz, shared_mem, stream, params, 0)
        if int(err) != 0:
            self._fail(err, device_index, (gx, gy, gz), (bx, by, bz), shared_mem, values, stream)

    def _note(self, raw, device_index, handle, grid, block, shared_mem, stream, values) -> None:
        """Describe this launch to the calling thread's observer (driver/_observe.py)."""
        if not raw:
            _observe.note(None, "cuLaunchKernel is not reachable through ctypes here")
            return
        _observe.note(_observe.launch_record(
            raw, self.function._raw_handle(device_index, handle), grid, block, shared_mem, self.buffer,
            values, stream, device_index, owner=self,
        ))

    def _fail(self, err, device_index, grid, block, shared_mem, values, stream) -> None:
        driver = _cu.cu()
        try:
            err = driver.CUresult(int(err))  # the ctypes path returns a plain int
        except ValueError:
            pass
        if int(err) == int(driver.CUresult.CUDA_ERROR_INVALID_CONTEXT):
            # A thread that never touched CUDA has no current context: set it and retry once, on
            # the stream the caller asked for (a graph capture's, a side stream), not the current one.
            _cu.ensure_context(device_index)
            (err,) = driver.cuLaunchKernel(
                self.function.handle(device_index), *grid, *block, shared_mem,
                stream, self.buffer.address(values), 0)
            if int(err) == 0:
                return
        raise LaunchError(
            f"cuLaunchKernel of {self.function.name} failed: {_cu._name(driver, err)}; grid={grid} "
            f"block={block} shared_mem={shared_mem} params={list(self.buffer.kinds)}"
        )
