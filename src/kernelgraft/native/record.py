"""Recording the launches of one plan call, and turning a one-launch recording into a Replay.

A plan call runs under ``recording()``: the driver launcher, the CuTe DSL packed call and JIT
Triton's launch (_triton.py) each ``note`` what they launch (the function, grid, block, parameter
bytes and which bytes are device pointers), and a dispatch mode notes every torch op the call runs.
``replay_for`` then builds a native Replay when the call was exactly one recorded launch whose
every device pointer lies in one of the call's input or output tensors; otherwise it says why not
and the plan stays in Python.

Only metadata fixed by the plan's key may shape the launch: the launch function must describe the
launch from dtypes, shapes, strides and the config, as for AOT bundles. A torch op that computes
(``out.zero_()`` before the kernel), a Triton launch it cannot describe, a second launch, a
pointer into a workspace, or a launch on a stream other than torch's current one all leave the
plan in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import admit as _admit
from ..driver.observe import Record, active, launch_record, note, observing
from ..backends.triton import replay as _triton

__all__ = ["Record", "recording", "note", "active", "launch_record", "replay_for"]

_DEVICE_TYPES = {"cpu": 0, "cuda": 1}
_METADATA_OPS = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias",
    "lift_fresh", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_contiguous",
    "dim", "size", "stride", "numel", "get_device", "is_same_size", "_local_scalar_dense_meta",
}


@dataclass
class _Recorder(_triton.Counts):
    """The observer of one recorded call (driver/_observe.py): it only ever sees the launches of
    the thread that records."""

    launches: list[Record] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def note(self, record: Record | None, why: str = "") -> None:
        if record is None:
            self.refused.append(why)
        else:
            self.launches.append(record)


class _OpWatch(TorchDispatchMode):
    """Notes every torch op that is more than metadata (views and allocations are fine)."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in _METADATA_OPS and not getattr(func, "is_view", False):
            self.recorder.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class recording:
    """``with recording() as rec:`` notes the launches, torch ops and Triton launches the calling
    thread makes in the enclosed call (torch dispatch modes are per thread too)."""

    def __enter__(self) -> _Recorder:
        self.recorder = _Recorder()
        self.watch = _OpWatch(self.recorder)
        self.watch.__enter__()
        self.unwatch_triton = _triton.watch()
        self.observe = observing(self.recorder)
        self.observe.__enter__()
        return self.recorder

    def __exit__(self, *exc: Any) -> None:
        self.observe.__exit__(*exc)
        self.unwatch_triton()
        self.watch.__exit__(*exc)


# ---------------------------------------------------------------- building the replay
def _device(d: torch.device) -> tuple[int, int] | None:
    kind = _DEVICE_TYPES.get(d.type)
    return None if kind is None else (kind, d.index if d.index is not None else -1)


def _tensor_spec(t: torch.Tensor) -> tuple | None:
    # Alignment is always part of the signature: backends compile per 16-byte alignment (CuTe DSL,
    # cuTile), even where the op's own plan key leaves it out.
    dev = _device(t.device)
    return None if dev is None else ("t", t.dtype, *dev, tuple(t.shape), tuple(t.stride()), t.data_ptr() & 15)


def _extent(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def map_pointers(pointers: Sequence[tuple[int, int]], tensors: Sequence[torch.Tensor | None]):
    """(offset, source, delta) for each pointer, where source indexes ``tensors`` and the address
    is ``tensors[source].data_ptr() + delta``; or a str saying which pointer maps to none or to
    several. Null pointers stay null (no patch)."""
    patches = []
    for offset, address in pointers:
        if address == 0:
            continue
        exact = [i for i, t in enumerate(tensors) if t is not None and t.numel() and t.data_ptr() == address]
        inside = exact or [
            i for i, t in enumerate(tensors)
            if t is not None and t.data_ptr() <= address < t.data_ptr() + _extent(t)
        ]
        if len(inside) != 1:
            what = "no input or output tensor (a workspace?)" if not inside else "several tensors"
            return f"the pointer parameter at byte {offset} ({address:#x}) points into {what}"
        source = inside[0]
        patches.append((offset, source, address - tensors[source].data_ptr()))
    return patches


def replay_for(native: Any, args: tuple, outs: Sequence[torch.Tensor], out_kind: int,
               recorder: _Recorder, plain: tuple, disjoint: tuple = ()) -> Any:
    """A native Replay of the recorded call with arguments ``args`` and outputs ``outs``, or a str
    saying why the call cannot be replayed. ``disjoint``: (arg a, arg b, span a, span b, modulus,
    width a, width b) pairs the replay checks share no element (the plan's overlap guard, see
    ``kernelgraft.op.overlap``)."""
    if recorder.refused:
        return recorder.refused[0]
    if recorder.triton_launches > recorder.triton_described:
        return ("the call launches a Triton kernel other than through JITFunction.run, which a "
                "replay would skip")
    if recorder.ops:
        return f"the call runs torch ops besides its kernel ({', '.join(sorted(set(recorder.ops)))})"
    if len(recorder.launches) != 1:
        return f"the call made {len(recorder.launches)} recorded launches, not one"
    (rec,) = recorder.launches
    specs = []
    for a in args:
        if type(a) in plain:
            # Plans run admitted tensors only (kernelgraft.admit); a replay recorded from anything
            # else would serve it by its memory.
            why = _admit.refusal(a) or _admit.deferred(a)
            if why is not None:
                return f"an argument is {why}"
            spec = _tensor_spec(a)
            if spec is None:
                return f"a tensor on {a.device}"
            specs.append(spec)
        elif isinstance(a, torch.Tensor) or isinstance(a, (list, tuple)):
            return "an argument is a tensor subclass or a sequence"
        else:
            specs.append(("v", a))
    tensors = [a if type(a) in plain else None for a in args] + list(outs)
    patches = map_pointers(rec.pointers, tensors)
    if isinstance(patches, str):
        return patches
    device = next((t.device for t in tensors if t is not None), None)
    where = None if device is None else _device(device)
    if where is None:
        return "no tensor on a CPU or CUDA device"
    if device.type == "cuda":
        from ..driver import current_stream

        if rec.device != where[1]:
            return "the launch is not on the tensors' device"
        if rec.stream != current_stream(rec.device):
            return "the launch used a stream other than torch's current one"
    elif rec.stream != 0:  # host "kernels" (tests) have no stream
        return "a CPU launch with a stream"
    out_specs = []
    for o in outs:
        dev = _device(o.device)
        if dev is None:
            return f"an output on {o.device}"
        out_specs.append((tuple(o.shape), o.dtype, *dev))
    return native.Replay(
        tensor_types=tuple(plain), args=tuple(specs), outs=tuple(out_specs), out_kind=out_kind,
        launch_kind=rec.kind, fn=rec.fn, function=rec.function, grid=rec.grid, block=rec.block,
        smem=rec.smem, buffer=rec.buffer, offsets=rec.offsets, tail=rec.tail, patches=tuple(patches),
        stream_offset=rec.stream_offset, result=rec.result, stream_device=where, keepalive=rec.owner,
        disjoint=disjoint,
    )
