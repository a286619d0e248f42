"""Guarded memory: the rule that a kernel writes its outputs and mutated arguments, and nothing else.

``kernelgraft check``, the tuner's gate and graft verification run a kernel on a ``Call``: every
tensor it sees is a copy placed inside a larger buffer whose other bytes hold a known pattern
(canaries: NaN payloads for floats, so a kernel that reads them computes NaN), with the original's
strides, values and data pointer alignment (modulo 256 bytes). After the call ``Call.damage()``
names every changed canary byte (past, before, or between the elements of a strided view) and every
element changed in an input the op does not declare mutated, compared bit for bit with the
original (NaN payloads included).

Guards hold at least one block of the largest integer in the op's configs (a BLOCK, a TILE: an
unmasked tail store stays inside), at least ``FLOOR`` and at most ``CAP`` bytes. On the CPU each
buffer is its own mapping with an inaccessible page at either end, so a store that overruns even
the guard faults at once instead of corrupting the heap and killing the process later.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
from collections.abc import Sequence
from typing import Any

import torch

from .oracle import poison, tensors

__all__ = ["FLOOR", "CAP", "block_of", "Region", "Call"]

log = logging.getLogger(__name__)

FLOOR = 64 << 10  # bytes on each side: a broadcast input read as a full one lands here too
CAP = 1 << 20
_ALIGN = 256  # a copy keeps the original's data pointer modulo this (a misaligned view stays so)
# one canary per element width: NaN in every float format of that width (fp16 and bf16 alike)
_CANARY = {1: (torch.uint8, 0xA5), 2: (torch.int16, 0x7FA5), 4: (torch.int32, 0x7FA5A5A5),
           8: (torch.int64, 0x7FF5A5A5A5A5A5A5)}


def block_of(op: Any) -> int:
    """The largest integer in any config of the op's impls (its largest block), or 0."""
    values = [v for impl in getattr(op, "impls", ()) for config in impl.configs
              for v in config.as_dict().values() if isinstance(v, int) and not isinstance(v, bool)]
    return max(values, default=0)


def _host_buffer(nbytes: int) -> torch.Tensor:
    """``nbytes`` (rounded up to pages) of host memory between two inaccessible pages."""
    page = mmap.PAGESIZE
    inner = -(-nbytes // page) * page
    buf = torch.frombuffer(mmap.mmap(-1, inner + 2 * page), dtype=torch.uint8, count=inner, offset=page)
    try:  # the tensor keeps the mapping alive; unmapping it frees the protected pages too
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        for address in (buf.data_ptr() - page, buf.data_ptr() + inner):
            if libc.mprotect(address, page, 0) != 0:
                raise OSError(ctypes.get_errno(), "mprotect failed")
    except (OSError, AttributeError) as exc:  # no mprotect here: the guards alone still catch writes
        log.debug("guard pages unavailable: %s", exc)
    return buf


def _buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        try:
            return _host_buffer(nbytes)
        except (OSError, ValueError) as exc:
            log.debug("no mapped guard buffer: %s", exc)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def _bytes(storage: Any, offset: int, shape, strides, itemsize: int, device) -> torch.Tensor:
    """The elements' bytes, uint8 of shape (*shape, itemsize), over ``storage`` from byte ``offset``;
    a stride-0 (expanded) dim counts once."""
    shape = [1 if st == 0 else s for s, st in zip(shape, strides)]
    view = torch.empty(0, dtype=torch.uint8, device=device)
    return view.set_(storage, offset, (*shape, itemsize), (*[st * itemsize for st in strides], 1))


class Region:
    """One tensor placed in guarded memory: ``tensor`` is what the kernel gets, with ``source``'s
    values, strides and alignment, or poisoned (an output) when ``source`` is None. ``writable``:
    its elements may change (an output, a mutated argument)."""

    def __init__(self, name: str, shape: Sequence[int], strides: Sequence[int], dtype: torch.dtype,
                 device: torch.device, *, writable: bool, source: torch.Tensor | None = None,
                 block: int = 0) -> None:
        self.name, self.writable, self.itemsize = name, writable, dtype.itemsize
        self.shape, self.strides = tuple(int(s) for s in shape), tuple(int(s) for s in strides)
        self.numel = 1
        for size in self.shape:
            self.numel *= size
        span = 0 if self.numel == 0 else 1 + sum((s - 1) * st for s, st in zip(self.shape, self.strides))
        self.nbytes = span * self.itemsize
        guard = -(-min(CAP, max(FLOOR, block * self.itemsize)) // _ALIGN) * _ALIGN
        self.buf = _buffer(-(-(2 * guard + _ALIGN + self.nbytes) // _ALIGN) * _ALIGN, device)
        want = source.data_ptr() if source is not None and self.numel else 0  # the address modulo _ALIGN
        shift = (want - self.buf.data_ptr()) % _ALIGN
        self.start = guard + (shift if shift % self.itemsize == 0 else 0)
        self.canary = _CANARY[dtype.itemsize // 2 if dtype.is_complex else dtype.itemsize]
        self.buf.view(self.canary[0]).fill_(self.canary[1])  # lengths are multiples of 256 bytes
        self.tensor = torch.empty(0, dtype=dtype, device=device).set_(
            self.buf.untyped_storage(), self.start // self.itemsize, self.shape, self.strides)
        self.source = None
        if source is not None and span:
            source = source.detach().resolve_neg().resolve_conj()
            self.source = _bytes(source.untyped_storage(), source.storage_offset() * self.itemsize, self.shape,
                                 self.strides, self.itemsize, device)
            self._elements(self.buf).copy_(self.source)  # bytes: NaN payloads and signed zeros survive
        elif span:
            poison(self.tensor)
        distinct = self._elements(self.buf).numel() // max(self.itemsize, 1)
        # a strided view has bytes between its elements: kept to find writes there
        self.gaps = self.buf[self.start:self.start + self.nbytes].clone() if span and distinct * self.itemsize \
            != self.nbytes else None

    def _elements(self, buf: torch.Tensor, start: int | None = None) -> torch.Tensor:
        return _bytes(buf.untyped_storage(), buf.storage_offset() + (self.start if start is None else start),
                      self.shape, self.strides, self.itemsize, buf.device)

    def _off_canary(self, lo: int, hi: int) -> int:
        kind, value = self.canary
        return int((self.buf[lo:hi].view(kind) != value).sum()) if hi > lo else 0

    def damage(self) -> list[str]:
        """What the call did to memory it may not write, one phrase each (empty: nothing)."""
        end = self.start + self.nbytes
        problems = []
        if self.source is not None and not self.writable:
            hit = int((self._elements(self.buf) != self.source).reshape(-1, self.itemsize).any(-1).sum())
            if hit:
                problems.append(f"changed {hit} of {self.numel} elements of {self.name}, which the op does not "
                                "declare mutated (mutates_args)")
        past, before = self._off_canary(end, self.buf.numel()), self._off_canary(0, self.start)
        inside = 0
        if self.gaps is not None:
            changed = self.buf[self.start:end] != self.gaps
            try:
                self._elements(changed, 0).fill_(False)
            except RuntimeError:  # elements that overlap: the whole span counts as elements
                changed.fill_(False)
            inside = int(changed.sum())
        width = self.canary[0].itemsize  # canary elements were compared: report bytes
        if past:
            problems.append(f"wrote {past * width} bytes past {self.name}")
        if before:
            problems.append(f"wrote {before * width} bytes before {self.name}")
        if inside:
            problems.append(f"wrote {inside} bytes between the elements of {self.name} (its strided view)")
        return problems


class Call:
    """One call of a kernel (or an op) on guarded copies of ``args`` and, for ``out_specs``
    ((shape, dtype, device) each), poisoned guarded outputs. ``args`` and ``outs`` are what to
    pass; ``produced()`` what to judge (outputs, then mutated arguments); ``damage()`` the rule."""

    def __init__(self, op: Any, args: Sequence[Any], out_specs: Sequence[tuple] = (), *,
                 block: int | None = None) -> None:
        mutated = set(op.signature.mutated)
        block = block_of(op) if block is None else block
        self.regions: list[Region] = []
        self.mutated: list[torch.Tensor] = []
        placed: list[Any] = []
        for index, (param, value) in enumerate(zip(op.signature.params, args)):
            writable = index in mutated
            if isinstance(value, torch.Tensor):
                value = self._place(f"input {param.name!r}", value, writable, block)
            elif isinstance(value, (list, tuple)) and value and all(isinstance(t, torch.Tensor) for t in value):
                value = type(value)(self._place(f"input {param.name!r}[{j}]", t, writable, block)
                                    for j, t in enumerate(value))
            if writable:
                self.mutated.extend(tensors(value))
            placed.append(value)
        self.args = tuple(placed)
        self.outs = []
        for k, (shape, dtype, device) in enumerate(out_specs):
            strides, step = [], 1
            for size in reversed(tuple(shape)):
                strides.insert(0, step)
                step *= max(int(size), 1)
            region = Region(f"output {k}", shape, strides, dtype, torch.device(device), writable=True, block=block)
            self.regions.append(region)
            self.outs.append(region.tensor)

    def _place(self, name: str, t: torch.Tensor, writable: bool, block: int) -> torch.Tensor:
        if t.layout != torch.strided:  # sparse and the like have no bytes to guard (the op refuses them)
            return t
        region = Region(name, t.shape, t.stride(), t.dtype, t.device, writable=writable, source=t, block=block)
        self.regions.append(region)
        return region.tensor

    def produced(self) -> list[torch.Tensor]:
        """The outputs, then the mutated arguments' tensors: what the oracle judges."""
        return [*self.outs, *self.mutated]

    def damage(self) -> str | None:
        """None when the call wrote only its outputs' and mutated arguments' elements; else every
        write outside them, named ("wrote 64 bytes past output 0; changed 8 of 64 elements of
        input 'k', which the op does not declare mutated (mutates_args)")."""
        problems = [p for region in self.regions for p in region.damage()]
        return "; ".join(problems) if problems else None
