"""CuTe DSL: ``launch`` returns ``(host_fn, args)``; kernelgraft compiles ``host_fn`` with
``cute.compile`` once per key and calls the compiled function with raw values.

Key (``compile_key``): the host function, every tensor's dtype and 16-byte alignment, the values of
``cutlass.Constexpr`` parameters (static shape parts, tile sizes), the type of other scalars, the
target arch (``sm_90a`` on Hopper: WGMMA/TMA need the ``a`` target), opt level, ptxas options and
the cutlass version. ``stats["compiles"]`` counts real compilations.

The per-call path builds no DLPack tensors and no ``cute.Pointer`` objects: tensors reach the host
function as ``cute.Pointer`` (the user builds layouts inside it from the sizes it is given), and the
compiled function's packed C ABI (one ``void*`` per runtime argument pointing at its value, then the
executor's result slot and kernel handles, as ``JitExecutor._get_invoke_packed_args`` lays out in
nvidia-cutlass-dsl 4.3) is filled from per-thread ctypes slots. The first launch checks that layout
against the library's own packing and refuses the candidate (``CompileError``) if they differ. Any
``torch.Tensor`` subclass (an ``nn.Parameter`` weight) is a tensor here: keyed, compiled and packed
as a pointer. The
stream is torch's current raw stream, so a CUDA graph being captured records the launch.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...errors import CompileError, LaunchError, describe
from ...spec import Config, ImplSpec
from ...driver import observe
from ...driver.params import packed_slots
from ..device import on_tensor_device, tensor_device

__all__ = ["CuteDSLBackend", "compile_key", "compile_for", "stats", "default_arch", "abi_mismatch"]

log = logging.getLogger(__name__)
_Tensor = torch.Tensor
_LOCK = threading.Lock()
_COMPILED: dict[tuple, Any] = {}
stats = {"compiles": 0}


@functools.cache
def _cute():
    import cutlass
    import cutlass.cute as cute

    return cutlass, cute


@functools.cache
def _version() -> str:
    try:
        from importlib.metadata import version

        return version("nvidia-cutlass-dsl")
    except Exception:
        return "unknown"


def default_arch(capability: tuple[int, int]) -> str:
    """The CuTe DSL target for a device: ``sm_90a`` for (9, 0), the ``a`` suffix from Hopper on."""
    major, minor = capability
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


class CuteDSLBackend:
    name = "cutedsl"
    replayable = True  # its calls go through _FastCall, which notes them
    # cute.compile keeps compiled functions in the process's memory only: no compile_ahead
    distributions = ("nvidia-cutlass-dsl",)

    @functools.cache
    def available(self) -> str | None:
        if importlib.util.find_spec("cutlass") is None:
            return "CuTe DSL is not installed (pip install 'kernelgraft[cutedsl]', nvidia-cutlass-dsl)"
        try:
            _cute()
        except Exception as exc:
            return f"cutlass.cute failed to import: {type(exc).__name__}: {exc}"
        return None

    def device_reason(self, device: torch.device) -> str | None:
        if device.type == "cuda":
            return None
        return f"CuTe DSL kernels run on CUDA tensors, got {device.type} tensors"

    def bind(self, spec: ImplSpec, config: Config) -> Callable[..., Any]:
        return on_tensor_device(_Runner(spec, config))


# ---------------------------------------------------------------- keys and compilation
@functools.cache
def _dtype_map() -> dict[torch.dtype, Any]:
    cutlass, _ = _cute()
    pairs = {
        torch.float32: "Float32", torch.float16: "Float16", torch.bfloat16: "BFloat16",
        torch.float64: "Float64", torch.int8: "Int8", torch.int16: "Int16", torch.int32: "Int32",
        torch.int64: "Int64", torch.uint8: "Uint8", torch.bool: "Boolean",
        getattr(torch, "float8_e4m3fn", None): "Float8E4M3FN",
        getattr(torch, "float8_e5m2", None): "Float8E5M2",
    }
    return {k: getattr(cutlass, v) for k, v in pairs.items() if k is not None and hasattr(cutlass, v)}


@functools.lru_cache(maxsize=None)
def _params(host_fn: Any) -> tuple[tuple[str, ...], tuple[bool, ...]]:
    """Parameter names of a ``@cute.jit`` function and which are ``cutlass.Constexpr``."""
    cutlass, _ = _cute()
    fn = inspect.unwrap(getattr(host_fn, "func", host_fn))
    sig = inspect.signature(fn)
    names, const = [], []
    for p in sig.parameters.values():
        ann = p.annotation
        names.append(p.name)
        const.append(ann is cutlass.Constexpr or getattr(ann, "__origin__", None) is cutlass.Constexpr)
    return tuple(names), tuple(const)


def _arg_key(args: Sequence[Any], constants: tuple[bool, ...]) -> tuple:
    parts = []
    for a, const in zip(args, constants):
        # isinstance, not ``type(a) is``: a module's weight arrives as an nn.Parameter (inside
        # compiled graphs too) and must key, compile and pack exactly like a plain tensor.
        if isinstance(a, _Tensor):
            parts.append((a.dtype, a.data_ptr() % 16 == 0))
        elif const:
            parts.append((type(a), a))
        else:
            parts.append(type(a))
    return tuple(parts)


def compile_key(spec: ImplSpec, host_fn: Any, args: Sequence[Any], arch: str) -> tuple:
    """Everything that changes the code ``cute.compile`` produces for this call."""
    _, constants = _params(host_fn)
    return (
        host_fn, _arg_key(args, constants), arch, getattr(spec, "opt_level", 3),
        getattr(spec, "ptxas_options", ""), _version(),
    )


def _unpack(result: Any, where: str) -> tuple[Any, tuple]:
    try:
        host_fn, args = result
    except (TypeError, ValueError):
        raise LaunchError(
            f"{where}: a CuTe DSL launch function must return (host_fn, args), got {describe(result)}"
        ) from None
    return host_fn, tuple(args)


def _compile_args(host_fn: Any, args: Sequence[Any], where: str) -> list:
    cutlass, cute = _cute()
    names, constants = _params(host_fn)
    if len(args) + 1 != len(names):
        raise LaunchError(
            f"{where}: {getattr(host_fn, '__name__', host_fn)} takes {len(names)} parameters "
            f"(the last one the stream), launch returned {len(args)} arguments"
        )
    dtypes = _dtype_map()
    out = []
    for i, a in enumerate(args):
        if isinstance(a, _Tensor):
            if a.dtype not in dtypes:
                raise LaunchError(f"{where}: argument {names[i]!r} has dtype {a.dtype}, unknown to CuTe DSL")
            align = 16 if a.data_ptr() % 16 == 0 else a.element_size()
            out.append(cute.runtime.make_ptr(dtypes[a.dtype], a.data_ptr(), cute.AddressSpace.gmem,
                                             assumed_align=align))
        else:
            out.append(a)
    from cuda.bindings import driver as cu

    out.append(cu.CUstream(0))
    return out


def compile_for(spec: ImplSpec, config: Config, args: Sequence[Any], arch: str) -> tuple[Any, Any, tuple]:
    """``(compiled, host_fn, launch args)`` for inputs+outputs ``args``; compiles at most once per
    ``compile_key``. Works without a GPU when ``arch`` is given (compile only)."""
    where = f"kg.cutedsl({spec.display_name})[{config.label()}]"
    host_fn, largs = _unpack(spec.launch(*args, **config.as_dict()), where)  # type: ignore[misc]
    key = compile_key(spec, host_fn, largs, arch)
    compiled = _COMPILED.get(key)
    if compiled is None:
        with _LOCK:
            compiled = _COMPILED.get(key)
            if compiled is None:
                compiled = _compile(spec, host_fn, largs, arch, where)
                _COMPILED[key] = compiled
    return compiled, host_fn, largs


def _compile(spec: ImplSpec, host_fn: Any, args: Sequence[Any], arch: str, where: str) -> Any:
    _, cute = _cute()
    options = f"--gpu-arch {arch} --opt-level {getattr(spec, 'opt_level', 3)}"
    ptxas = getattr(spec, "ptxas_options", "")
    if ptxas:
        options += f" --ptxas-options '{ptxas}'"
    try:
        compiled = cute.compile(host_fn, *_compile_args(host_fn, args, where), options=options)
    except LaunchError:
        raise
    except Exception as exc:
        raise CompileError(f"{where}: cute.compile for {arch} failed: {type(exc).__name__}: {exc}") from exc
    stats["compiles"] += 1
    log.info("%s: compiled %s for %s", where, getattr(host_fn, "__name__", host_fn), arch)
    return compiled


# ---------------------------------------------------------------- the per-call path
_SLOT_TYPES = {"Int8": ctypes.c_int8, "Int16": ctypes.c_int16, "Int32": ctypes.c_int32,
               "Int64": ctypes.c_int64, "Uint8": ctypes.c_uint8, "Uint32": ctypes.c_uint32,
               "Uint64": ctypes.c_uint64, "Float32": ctypes.c_float, "Float64": ctypes.c_double,
               "Boolean": ctypes.c_bool}


def _runtime_parameters(compiled: Any) -> list[tuple[str, Any]]:
    """(name, annotation) of each runtime parameter of a compiled host function (constexprs left
    out), as the compiled function describes them: ``execution_args.signature`` from 4.4 on,
    ``args_spec`` in 4.3."""
    execution = getattr(compiled, "execution_args", None)
    signature = getattr(execution, "signature", None)
    if isinstance(signature, inspect.Signature):
        return [(p.name, p.annotation) for p in signature.parameters.values()]
    spec = compiled.args_spec.args_spec
    return [(name, spec.annotations.get(name)) for name in spec.args + spec.kwonlyargs]


def slot_kinds(compiled: Any) -> list[tuple[str, type]]:
    """(name, ctypes type) of each runtime argument of a compiled host function, stream last:
    pointers and the stream are ``c_void_p``, numbers their C type."""
    out = []
    for name, ann in _runtime_parameters(compiled):
        label = getattr(ann, "__name__", str(ann)).rsplit(".", 1)[-1]
        if label in ("Pointer", "CUstream"):
            out.append((name, ctypes.c_void_p))
        elif label in _SLOT_TYPES:
            out.append((name, _SLOT_TYPES[label]))
        else:
            raise CompileError(
                f"CuTe DSL host parameter {name!r} is annotated {label}; kernelgraft passes "
                "cute.Pointer, cutlass numeric types (Int32, Float32...), cutlass.Constexpr and the "
                "stream (cuda.CUstream)"
            )
    return out


class _FastCall:
    """Calls a compiled host function through its packed C ABI with per-thread value slots."""

    def __init__(self, compiled: Any, device_index: int) -> None:
        self.device = device_index
        self.kinds = [t for _, t in slot_kinds(compiled)]
        self.executor = compiled.to(device_index)
        self.capi = self.executor.jit_module.capi_func
        self.result = self.executor.cuda_result
        ctx = self.executor.exec_context
        self.tail = ([ctypes.addressof(self.result)] if self.result is not None else []) + (
            list(ctx.kernel_functions_ptrs) if ctx is not None else [])
        self.local = threading.local()

    def _slots(self):
        try:
            return self.local.slots, self.local.packed
        except AttributeError:
            slots = [t() for t in self.kinds]
            addrs = [ctypes.addressof(s) for s in slots] + self.tail
            packed = (ctypes.c_void_p * len(addrs))(*addrs)
            self.local.slots, self.local.packed = slots, packed
            return slots, packed

    def __call__(self, values: Sequence[Any]) -> None:
        slots, packed = self._slots()
        for slot, v in zip(slots, values):
            slot.value = v
        if observe.active() is not None:
            self._note(values)
        self.capi(packed)
        if self.result is not None and self.result.value != 0:
            raise LaunchError(f"CuTe DSL launch failed with CUDA error {self.result.value}")


    def _note(self, values: Sequence[Any]) -> None:
        """Describe this call to the native replay's recorder (kernelgraft.native.record)."""
        fn = observe.address_of(self.capi) if isinstance(self.capi, ctypes._CFuncPtr) else 0
        if not fn or (self.result is not None and not isinstance(self.result, ctypes.c_int32)):
            observe.note(None, f"the compiled CuTe DSL entry point is a {type(self.capi).__name__}, "
                               f"its result slot a {type(self.result).__name__}")
            return
        buffer, offsets, pointers = packed_slots(self.kinds, values)
        observe.note(observe.Record(
            kind=1, fn=fn, function=0, grid=(1, 1, 1), block=(1, 1, 1), smem=0, buffer=buffer,
            offsets=offsets, pointers=pointers, stream=int(values[-1] or 0), device=self.device,
            tail=tuple(self.tail), stream_offset=offsets[-1],
            result=ctypes.addressof(self.result) if self.result is not None else 0, owner=self,
        ))


def check_abi(compiled: Any, exe_args: Sequence[Any], values: Sequence[Any]) -> str | None:
    """None when the library's own packed arguments ``exe_args`` hold ``values`` (pointers and
    stream as addresses, numbers as C values) the way ``_FastCall`` lays them out, else why not."""
    kinds = [t for _, t in slot_kinds(compiled)]
    if len(exe_args) != len(kinds):
        return f"{len(exe_args)} packed arguments, expected {len(kinds)}"
    for i, (addr, kind, want) in enumerate(zip(exe_args, kinds, values)):
        address = addr.value if isinstance(addr, ctypes.c_void_p) else int(addr)
        got = kind.from_address(address).value
        if kind is ctypes.c_void_p:
            got, want = got or 0, int(want or 0)
        if (abs(got - want) > 1e-6 * max(1.0, abs(want))) if isinstance(want, float) else got != want:
            return f"argument {i}: packed {got!r}, expected {want!r}"
    return None


class _Runner:
    __slots__ = ("spec", "config", "kwargs", "launch", "where", "entries")

    def __init__(self, spec: ImplSpec, config: Config) -> None:
        self.spec = spec
        self.config = config
        self.kwargs = config.as_dict()
        self.launch = spec.launch
        self.where = f"kg.cutedsl({spec.display_name})[{config.label()}]"
        self.entries: dict[Any, Any] = {}

    def __call__(self, *tensors: Any) -> None:
        host_fn, args = self.launch(*tensors, **self.kwargs)  # type: ignore[misc]
        dev = tensor_device(tensors)
        key = (host_fn, dev, _arg_key(args, _params(host_fn)[1]))
        entry = self.entries.get(key)
        if entry is None:
            entry = self._resolve(tensors, dev, key)
        entry(args)

    def _resolve(self, tensors, dev, key):
        from ...driver import current_stream

        index = dev if dev >= 0 else torch.cuda.current_device()
        arch = getattr(self.spec, "arch", None) or default_arch(torch.cuda.get_device_capability(index))
        compiled, host_fn, args = compile_for(self.spec, self.config, tensors, arch)
        _, constants = _params(host_fn)
        runtime = tuple(i for i, c in enumerate(constants[:-1]) if not c)
        tensor_pos = tuple(isinstance(args[i], _Tensor) for i in runtime)

        def values_of(a: tuple) -> list:
            vals = [a[i].data_ptr() if t else a[i] for i, t in zip(runtime, tensor_pos)]
            vals.append(current_stream(index))
            return vals

        try:
            fast = _FastCall(compiled, index)
            reason = abi_mismatch(compiled, args, runtime, values_of(args))
        except Exception as exc:  # internals moved: refuse below
            fast, reason = None, f"{type(exc).__name__}: {exc}"
        if reason is None:
            def entry(a: tuple) -> None:
                fast(values_of(a))  # type: ignore[misc]
        else:
            # Calling compiled(...) with an argument list the compiled program does not expect
            # crashed the process (H200, cutlass-dsl 4.3.5: an nn.Parameter weight, then passed
            # raw, packed no pointer, 6 arguments where the host function declares 7), so a
            # mismatch refuses the candidate instead.
            raise CompileError(
                f"{self.where}: the compiled CuTe DSL program's argument layout does not match its "
                f"host function ({reason}); refusing to call it"
            )
        self.entries[key] = entry
        return entry


def abi_mismatch(compiled: Any, args: Sequence[Any], runtime: Sequence[int],
                 values: Sequence[Any]) -> str | None:
    """None when the library packs the runtime arguments ``args[i] for i in runtime`` plus the
    stream (the last of ``values``, a raw address) the way ``_FastCall`` fills ``values``, else why
    not."""
    probe = [_slow_value(args[i]) for i in runtime] + [_stream_obj(values[-1])]
    exe_args, _adapted = compiled.generate_execution_args(*probe)
    return check_abi(compiled, exe_args, values)


def _slow_value(v: Any) -> Any:
    # Every tensor, subclasses included, becomes a cute.Pointer: the library's packing finds no
    # adapter for a tensor subclass (its registry is keyed by exact type) and packs nothing for it,
    # which is how an nn.Parameter weight once made a 7-argument program pack 6.
    if isinstance(v, _Tensor):
        _, cute = _cute()
        return cute.runtime.make_ptr(_dtype_map()[v.dtype], v.data_ptr(), cute.AddressSpace.gmem,
                                     assumed_align=16 if v.data_ptr() % 16 == 0 else v.element_size())
    return v


def _stream_obj(raw: int) -> Any:
    from cuda.bindings import driver as cu

    return cu.CUstream(raw)

