"""Kernel parameters: explicit C types for scalars, and the packed parameter buffer.

A kernel's parameters are described by *kinds*: ``"ptr"`` (a device pointer, from a tensor or an
int address) and the scalar kinds ``i8 i16 i32 i64 u8 u16 u32 u64 f16 f32 f64``. Python ints and
floats carry no C type, so scalars are passed wrapped (``i32(n)``, ``f32(eps)``) or as ctypes
instances (``ctypes.c_int32(n)``); a bare ``int`` or ``float`` is refused rather than guessed,
because a wrong guess shifts every later parameter.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import LaunchError, describe

__all__ = ["packed_slots", 
    "Scalar", "KINDS", "SIZES", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "f32", "f64",
    "ptr", "kind_of", "value_of", "ParamBuffer",
]

# kind -> struct format character (native size, explicit alignment handled below)
KINDS: dict[str, str] = {
    "ptr": "Q", "i8": "b", "i16": "h", "i32": "i", "i64": "q",
    "u8": "B", "u16": "H", "u32": "I", "u64": "Q", "f16": "e", "f32": "f", "f64": "d",
}
# kind -> its size in bytes
SIZES: dict[str, int] = {kind: struct.calcsize("=" + fmt) for kind, fmt in KINDS.items()}
_CTYPES = {
    ctypes.c_int8: "i8", ctypes.c_int16: "i16", ctypes.c_int32: "i32", ctypes.c_int64: "i64",
    ctypes.c_uint8: "u8", ctypes.c_uint16: "u16", ctypes.c_uint32: "u32", ctypes.c_uint64: "u64",
    ctypes.c_float: "f32", ctypes.c_double: "f64", ctypes.c_void_p: "ptr",
}


class Scalar:
    """A kernel argument with an explicit C type: ``Scalar("i32", n)``; see ``i32`` etc."""

    __slots__ = ("kind", "value")

    def __init__(self, kind: str, value: Any) -> None:
        if kind not in KINDS:
            raise LaunchError(f"unknown parameter kind {kind!r}; allowed: {sorted(KINDS)}")
        self.kind = kind
        self.value = value

    def __repr__(self) -> str:
        return f"{self.kind}({self.value!r})"


def _maker(kind: str):
    def make(value: Any) -> Scalar:
        return Scalar(kind, value)

    make.__name__ = make.__qualname__ = kind
    make.__doc__ = f"A kernel argument of C type {kind} (see kernelgraft.driver)."
    return make


i8, i16, i32, i64 = _maker("i8"), _maker("i16"), _maker("i32"), _maker("i64")
u8, u16, u32, u64 = _maker("u8"), _maker("u16"), _maker("u32"), _maker("u64")
f16, f32, f64, ptr = _maker("f16"), _maker("f32"), _maker("f64"), _maker("ptr")


def kind_of(arg: Any, index: int) -> str:
    """The parameter kind of one launch argument; refuses untyped Python scalars."""
    if isinstance(arg, torch.Tensor) or arg is None:
        return "ptr"
    if isinstance(arg, Scalar):
        return arg.kind
    kind = _CTYPES.get(type(arg))
    if kind is not None:
        return kind
    if isinstance(arg, (bool, int, float)):
        raise LaunchError(
            f"kernel argument {index} is a bare Python {type(arg).__name__} {arg!r}, which has no C "
            "type; wrap it as kernelgraft.driver.i32(...), i64(...), f32(...) (or a ctypes value) to "
            "match the kernel's parameter"
        )
    raise LaunchError(
        f"kernel argument {index}: expected a tensor, a typed scalar (driver.i32(...), ...) or a "
        f"ctypes value, got {describe(arg)}"
    )


def value_of(arg: Any) -> Any:
    """The raw value to pack: a device address for tensors, the number for scalars."""
    if isinstance(arg, torch.Tensor):
        return arg.data_ptr()
    if arg is None:
        return 0
    if isinstance(arg, Scalar):
        v = arg.value
        return v.data_ptr() if isinstance(v, torch.Tensor) else v
    return arg.value


class ParamBuffer:
    """A packed parameter buffer for one parameter list, plus the ``void*[]`` pointing into it.

    ``address(values)`` packs the values and returns the address of the pointer array, ready to
    pass as ``kernelParams`` to ``cuLaunchKernel`` (which copies the values at launch, so reuse is
    safe once the call returns). Buffers are per thread because the launch runs without the GIL.
    """

    def __init__(self, kinds: Sequence[str]) -> None:
        fmt, offsets, size = "=", [], 0
        for kind in kinds:
            if kind not in KINDS:
                raise LaunchError(f"unknown parameter kind {kind!r}; allowed: {sorted(KINDS)}")
            width = SIZES[kind]
            pad = (-size) % width
            if pad:
                fmt += f"{pad}x"
            size += pad
            offsets.append(size)
            fmt += KINDS[kind]
            size += width
        self.kinds = tuple(kinds)
        self.offsets = tuple(offsets)
        self.size = size
        self._struct = struct.Struct(fmt)
        self._local = threading.local()

    def _storage(self):
        local = self._local
        try:
            return local.buf, local.addr
        except AttributeError:
            buf = ctypes.create_string_buffer(max(self.size, 8))
            base = ctypes.addressof(buf)
            array = (ctypes.c_void_p * max(len(self.offsets), 1))(*(base + o for o in self.offsets))
            local.buf, local.array, local.addr = buf, array, ctypes.addressof(array)
            return buf, local.addr

    def pack(self, values: Sequence[Any]) -> bytes:
        """The packed bytes (for tests and for the ``extra`` launch form)."""
        return self._struct.pack(*values)

    def address(self, values: Sequence[Any]) -> int:
        buf, addr = self._storage()
        try:
            self._struct.pack_into(buf, 0, *values)
        except struct.error as exc:
            raise LaunchError(
                f"cannot pack kernel arguments {list(values)!r} as {list(self.kinds)}: {exc}"
            ) from exc
        return addr


def packed_slots(kinds: Sequence[type], values: Sequence[Any]) -> tuple[bytes, tuple[int, ...], list]:
    """8-byte slots, one per value in its ctypes type; (bytes, offsets, pointer slots) where the
    pointers are the ``c_void_p`` slots except the last one (the stream)."""
    parts, pointers = [], []
    for i, (kind, value) in enumerate(zip(kinds, values)):
        raw = bytes(kind(value))
        parts.append(raw + bytes(8 - len(raw)))
        if kind is ctypes.c_void_p and i < len(values) - 1:
            pointers.append((8 * i, int(value or 0)))
    return b"".join(parts), tuple(8 * i for i in range(len(values))), pointers
