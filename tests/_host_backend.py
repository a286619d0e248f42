"""A replayable backend whose "kernels" are C functions run on CPU tensors, called through the
packed C ABI the CuTe DSL backend uses (one ``void*`` per argument, pointing at its value). It lets
the CPU tests drive the native replay through real ops: plans, recording, the C++ replay, misses.

``kg_host(fn, kinds)``: ``fn`` is a ctypes ``CFUNCTYPE(None, POINTER(c_void_p))`` and ``launch``
returns the argument values (tensors become their data pointers) for the ctypes ``kinds``.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any

import torch

from kernelgraft.driver import observe
from kernelgraft.driver.params import packed_slots
from kernelgraft.native import record as _record
from kernelgraft.spec import Config, ImplSpec
from kernelgraft.backends import register

HOST_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p))


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class HostImpl(ImplSpec):
    backend = "kgtest_host"

    fn: Any = None
    kinds: tuple = ()


class _Runner:
    def __init__(self, spec: HostImpl, config: Config) -> None:
        self.spec, self.kwargs = spec, config.as_dict()
        self.calls = 0

    def __call__(self, *tensors: Any) -> None:
        values = [v.data_ptr() if isinstance(v, torch.Tensor) else v
                  for v in self.spec.launch(*tensors, **self.kwargs)]
        kinds = list(self.spec.kinds) + [ctypes.c_void_p]  # the stream slot, as CuTe DSL's
        buffer, offsets, pointers = packed_slots(kinds, values + [0])
        storage = ctypes.create_string_buffer(buffer, len(buffer))
        base = ctypes.addressof(storage)
        packed = (ctypes.c_void_p * len(offsets))(*(base + o for o in offsets))
        fn = observe.address_of(self.spec.fn)
        if observe.active() is not None:
            observe.note(observe.Record(
                kind=1, fn=fn, function=0, grid=(1, 1, 1), block=(1, 1, 1), smem=0, buffer=buffer,
                offsets=offsets, pointers=pointers, stream=0, device=-1, stream_offset=offsets[-1],
                owner=self.spec.fn))
        self.calls += 1
        self.spec.fn(packed)


class HostBackend:
    name = "kgtest_host"
    replayable = True

    def available(self) -> str | None:
        return None

    def device_reason(self, device: torch.device) -> str | None:
        return None if device.type == "cpu" else "host kernels run on CPU tensors"

    def bind(self, spec: HostImpl, config: Config) -> _Runner:
        return _Runner(spec, config)


register(HostBackend())


def kg_host(fn, kinds, launch, configs=({},)) -> HostImpl:
    return HostImpl(launch=launch, configs=configs, fn=fn, kinds=tuple(kinds))


def _accumulate_fn(packed):
    a, o = (ctypes.c_uint64.from_address(packed[i]).value for i in range(2))
    n = ctypes.c_int32.from_address(packed[2]).value
    A, O = ((ctypes.c_float * n).from_address(p) for p in (a, o))
    for i in range(n):
        O[i] += A[i]


_ACCUMULATE = HOST_FN(_accumulate_fn)


def accumulate_op(name: str):
    """A mutating op (``acc += x`` on float32 CPU tensors) run by a host "kernel": replayable."""
    import kernelgraft as kg

    def accumulate(x: torch.Tensor, acc: torch.Tensor) -> None:
        acc += x

    return kg.op(name, mutates_args=("acc",), fallback="error",
                 impls=[kg_host(_ACCUMULATE, [ctypes.c_void_p] * 2 + [ctypes.c_int32],
                                lambda x, acc: [x, acc, x.numel()])])(accumulate)
