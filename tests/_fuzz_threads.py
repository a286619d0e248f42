"""Re-declaration under threads, a kind of fuzz case (``_fuzz_cases.py``) over every example op.

A case declares a fuzz-local copy of the example (``_fuzz_local``: its reference and kernels under
``kgfuzz::``, never the shared example op) and starts ``READERS`` threads that call it a fixed
number of times each, every thread through one route: the first op object (retired by the first
change), the current op object, ``torch.ops`` looked up per call, a ``torch.ops`` overload held
from the start, the op object with an input that requires grad, and the native replay (which
serves the op object's calls of a replayable plan). Meanwhile the case's thread changes the name a
fixed number of times: replace (``replace=True``) with the same schema, replace with another
schema (``_fuzz_local`` schema "b": its floating results negated, so they say which served), or
unregister and declare again.

The verdict accepts any legal interleaving and nothing else: the changing thread logs, before and
after each change, which versions a call may reach; a call must return the correct result (the
oracle, the op's tolerances) of a version allowed between its start and its end, or raise
``RegistrationError`` where the name was unregistered in that span. Each change waits until every
reader has made ``CALLS_PER_CHANGE`` more calls, so each overlaps calls of every route, but
nothing in the verdict depends on timing: the counts are fixed and every interleaving is judged by
the same rule. A change refused because a call stayed inside the op past the drain bound (a
documented outcome of a schema change) leaves the old version, and is logged so.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import random
import shutil
import subprocess
import tempfile
import threading
import traceback

import torch

import kernelgraft as kg
from kernelgraft.verify import oracle as _verify

import _fuzz_local
from _fuzz_inputs import Case, good_args, tensor_params

THREAD_KINDS = {"threads_replace": "match", "threads_schema": "match", "threads_unregister": "match",
                "threads_native": "match"}
READERS = 3
CALLS_PER_CHANGE = 1
UNREGISTERED = "unregistered"
STALL_SECONDS = 300.0  # only a hang reaches it: the verdict is a failure then
ROUTES = ("first op object", "current op object", "torch.ops", "torch.ops overload held", "op object, grad")
STEPS = {  # (action, schema): action "replace" (replace=True) or "redeclare" (unregister, declare)
    "threads_replace": [("replace", "a")] * 2,
    "threads_schema": [("replace", "b"), ("replace", "a")],
    "threads_unregister": [("redeclare", "a"), ("redeclare", "b")],
    "threads_native": [("replace", "a"), ("redeclare", "a")],
}


def native_available() -> bool:
    """The parent says whether the native replay is built (building it here would take the
    case's time); on CPU the threads_native kind runs only then."""
    return os.environ.get("FUZZ_NATIVE") == "1"


def applies(kind: str, name: str, device: str, native: bool) -> bool:
    if kind != "threads_native":
        return True
    if not native:
        return False
    return device != "cpu" or name == "add_relu"  # on CPU: a host kernel stands in for add_relu's


# ----------------------------------------------------------------------------- a host kernel
_C_ADD_RELU = r"""
void add_relu(void** packed) {
    const float* x = *(const float**)packed[0];
    const float* y = *(const float**)packed[1];
    float* out = *(float**)packed[2];
    int n = *(const int*)packed[3];
    for (int i = 0; i < n; ++i) { float s = x[i] + y[i]; out[i] = s > 0.0f ? s : (s != s ? s : 0.0f); }
}
"""
_HOST: dict = {}


def _host_impls():
    """add_relu as a replayable host kernel (C, as a GPU launch is: no Python runs mid-replay)."""
    if "impls" not in _HOST:
        from _host_backend import kg_host

        directory = tempfile.mkdtemp(prefix="kgfuzz-")
        source, library = os.path.join(directory, "add_relu.c"), os.path.join(directory, "add_relu.so")
        with open(source, "w") as f:
            f.write(_C_ADD_RELU)
        subprocess.run([os.environ.get("CC", "cc"), "-O1", "-shared", "-fPIC", source, "-o", library],
                       check=True, capture_output=True)
        fn = ctypes.CDLL(library).add_relu
        fn.argtypes, fn.restype = [ctypes.POINTER(ctypes.c_void_p)], None
        shutil.rmtree(directory, ignore_errors=True)  # the library stays mapped
        kinds = [ctypes.c_void_p] * 3 + [ctypes.c_int32]
        _HOST["impls"] = [kg_host(fn, kinds, lambda x, y, out: [x, y, out, x.numel()])]
    return _HOST["impls"]


# ----------------------------------------------------------------------------- building
def build(kind: str, name: str, op, rng: random.Random, g: torch.Generator) -> Case | None:
    args = list(good_args(name, rng, g, small=True))
    host = kind == "threads_native" and os.environ.get("FUZZ_DEVICE", "cpu") == "cpu"
    if host:  # the host kernel takes dense float32
        args = [a.float().contiguous() for a in args]
    offset = rng.randrange(len(ROUTES))
    routes = [ROUTES[(offset + i) % len(ROUTES)] for i in range(READERS)]
    if op.signature.mutated or not tensor_params(op, args, floating=True, mutated=False):
        routes = ["current op object" if r == "op object, grad" else r for r in routes]
    steps = list(STEPS[kind])
    return Case(args, None, f"{steps} / {routes}", extra={"routes": routes, "steps": steps, "host": host})


# ----------------------------------------------------------------------------- one case
class _Log:
    """What a call may reach, one set per change of the name (appended before and after each)."""

    def __init__(self) -> None:
        self.allowed: list[frozenset] = [frozenset({0})]

    def mark(self, *outcomes) -> None:
        self.allowed.append(frozenset(outcomes))

    def between(self, start: int, end: int) -> frozenset:
        return frozenset().union(*self.allowed[start - 1:end])


class _Progress:
    def __init__(self, n: int) -> None:
        self.calls = [0] * n
        self.cond = threading.Condition()

    def tick(self, i: int) -> None:
        with self.cond:
            self.calls[i] += 1
            self.cond.notify_all()

    def wait(self, target: int) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: min(self.calls) >= target, timeout=STALL_SECONDS)


@dataclasses.dataclass
class _Versions:
    schemas: dict  # version -> schema
    expected: dict  # schema -> the oracle's Reference


def _expected(op, args) -> dict:
    ref = _verify.reference(op, args)
    flipped = tuple(dataclasses.replace(e, native=-e.native, wide=None if e.wide is None else -e.wide)
                    if e.what.startswith("output") and e.native.is_floating_point() else e
                    for e in ref.expected)
    return {"a": ref, "b": dataclasses.replace(ref, expected=flipped)}


def judge(kind: str, name: str, op, case: Case, index: int) -> dict:
    extra = case.extra
    args = case.args
    local = f"{name}_{kind.removeprefix('threads_')}{index}"
    impls = _host_impls() if extra["host"] else None
    host_opts = {"dtypes": [torch.float32], "fallback": "error", "ndim": None} if extra["host"] else {}

    def declare(version: int, schema: str, replace: bool):
        return _fuzz_local.declare(op, local, version=version, schema=schema, impls=impls,
                                   replace=replace, **host_opts)

    first = declare(0, "a", replace=False)
    try:
        return _run(kind, op, first, declare, args, extra)
    finally:
        kg.unregister(f"{_fuzz_local.NS}::{local}")


def _run(kind, op, first, declare, args, extra) -> dict:
    versions = _Versions({0: "a"}, _expected(op, args))
    current = [first]
    packet = getattr(getattr(torch.ops, _fuzz_local.NS), first.name.split("::")[1])
    overload = packet.default
    graded = [a.detach().clone().requires_grad_() if i in tensor_params(op, args, floating=True, mutated=False)
              else a for i, a in enumerate(args)]
    routes = {
        "first op object": lambda a: first(*a),
        "current op object": lambda a: current[0](*a),
        "torch.ops": lambda a: getattr(getattr(torch.ops, _fuzz_local.NS), first.name.split("::")[1])(*a),
        "torch.ops overload held": lambda a: overload(*a),
        "op object, grad": lambda a: current[0](*[gi if isinstance(gi, torch.Tensor) and gi.requires_grad else ai
                                                  for gi, ai in zip(graded, a)]),
    }
    for _ in range(3 if kind == "threads_native" else 1):  # a replay comes with a signature's third call
        current[0](*_verify.clone(tuple(args)))
    log, progress = _Log(), _Progress(READERS)
    steps = extra["steps"]
    calls = (len(steps) + 2) * CALLS_PER_CHANGE
    bad: list[str] = []

    def outcome(call):
        full = list(_verify.clone(tuple(args)))  # what a call mutates is its own
        try:
            result = call(full)
        except kg.RegistrationError as exc:  # no op holds the name (an op object retired by a replace
            # says so in its own words: "replaced and no op holds the name now")
            text = str(exc)
            free = "unregistered" in text or "no op holds the name" in text
            return UNREGISTERED if free else f"RegistrationError: {text[:200]}"
        produced = [t.detach() for _, t in _verify._produced(op, result, full)]
        return frozenset(s for s, ref in versions.expected.items()
                         if _verify.verify(ref, produced, op.tolerances).ok) or "a wrong result"

    def reader(i: int) -> None:
        route = extra["routes"][i]
        for _ in range(calls):
            start = len(log.allowed)
            try:
                seen = outcome(routes[route])
            except Exception:
                seen = "raised " + traceback.format_exc(limit=4)[-500:]
            allowed = log.between(start, len(log.allowed))
            legal = ({UNREGISTERED} & allowed if seen == UNREGISTERED else
                     seen & {versions.schemas[v] for v in allowed if v != UNREGISTERED}
                     if isinstance(seen, frozenset) else set())
            if not legal and len(bad) < 5:
                bad.append(f"{route}: got {seen if isinstance(seen, str) else sorted(seen)}, "
                           f"allowed {sorted(map(str, allowed))}")
            progress.tick(i)

    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(READERS)]
    for t in threads:
        t.start()
    version, stalled = 0, False
    for step, (action, schema) in enumerate(steps):
        if not progress.wait((step + 1) * CALLS_PER_CHANGE):
            stalled = True
            break
        old, new = version, version + 1
        versions.schemas[new] = schema
        if action == "redeclare":
            log.mark(old, UNREGISTERED)
            kg.unregister(first.name)
            log.mark(UNREGISTERED)
            log.mark(UNREGISTERED, new)
            current[0] = declare(new, schema, replace=False)
        else:
            log.mark(old, new)
            try:
                current[0] = declare(new, schema, replace=True)
            except kg.RegistrationError as exc:
                if "inside a call of it" not in str(exc):
                    raise
                log.mark(old)  # a schema change refused after the drain bound: the old op stays
                continue
        log.mark(new)
        version = new
    for t in threads:
        t.join(STALL_SECONDS)
    if stalled or any(t.is_alive() for t in threads):
        return {"outcome": "FAIL", "why": f"a reader stalled: calls {progress.calls}"}
    if bad:
        return {"outcome": "FAIL", "why": "calls saw what no version gave: " + " | ".join(bad)}
    if extra["host"]:  # the last version replays too, once its signature has been called thrice
        for _ in range(3):
            current[0](*_verify.clone(tuple(args)))
        if current[0].dispatcher.current_replay() is None:
            return {"outcome": "FAIL", "why": "the host kernel's plan never reached the native replay"}
    return {"outcome": "match"}
