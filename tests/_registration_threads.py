"""The scenarios of ``test_registration_threads.py``, run in a child process (a crash must fail the
test, not kill pytest): ``python tests/_registration_threads.py SCENARIO...``.

In each scenario 8 reader threads call one op name through every route while a writer thread
re-declares it a fixed number of times (replace with the same schema or another, unregister and
declare again). Version ``v`` of the op computes ``x * (v + 2)``, so every result says which
version served it. The writer logs, before and after each change, which outcomes a call may see
(the old version, the new one, ``unregistered``); a call may see any outcome allowed between the
moment it started and the moment it returned, and nothing else: no other exception, no other
value. After each change the writer waits until every reader has made two more calls, so every
change overlaps calls of every route. One JSON line per scenario reports the counts and the first
violations.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import kernelgraft as kg  # noqa: E402
from kernelgraft.op import registry as _registry  # noqa: E402

READERS = 8
NS = "kgthreads"
UNREGISTERED = "unregistered"
SCENARIOS = {  # writer steps: (action, schema) with action "replace" or "redeclare"
    "replace_same_schema": [("replace", "a")] * 6,
    "replace_new_schema": [("replace", "b"), ("replace", "a")] * 3,
    "unregister_redeclare": [("redeclare", "a")] * 4,
    "unregister_new_schema": [("redeclare", "b"), ("redeclare", "a")] * 2,
    "native_replace": [("replace", "a")] * 4 + [("redeclare", "a")] * 2,
}


# ----------------------------------------------------------------------------- the op's versions
def _reference(factor: float, schema: str):
    if schema == "a":
        def cell(x: torch.Tensor) -> torch.Tensor:
            return x * factor
    else:
        def cell(x: torch.Tensor, k: float = 1.0) -> torch.Tensor:
            return x * factor * k
    cell.__qualname__ = f"cell_{schema}_{int(factor)}"  # another fingerprint per version
    return cell


# The native scenario's "kernel": C code, as a GPU launch is. (A Python callback would let another
# thread in mid-replay, which no real launch does; the replay relies on the GIL being held.)
_C_SCALE = r"""
void scale(void** packed) {
    const float* x = *(const float**)packed[0];
    float* out = *(float**)packed[1];
    int n = *(const int*)packed[2];
    float factor = *(const float*)packed[3];
    for (int i = 0; i < n; ++i) out[i] = x[i] * factor;
}
"""


def _c_scale():
    directory = tempfile.mkdtemp(prefix="kgthreads-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    source, library = os.path.join(directory, "scale.c"), os.path.join(directory, "scale.so")
    with open(source, "w") as f:
        f.write(_C_SCALE)
    subprocess.run([os.environ.get("CC", "cc"), "-O1", "-shared", "-fPIC", source, "-o", library],
                   check=True, capture_output=True)
    fn = ctypes.CDLL(library).scale
    fn.argtypes, fn.restype = [ctypes.POINTER(ctypes.c_void_p)], None
    return fn


def declare(name: str, version: int, schema: str, native, replace: bool):
    factor = float(version + 2)
    options = {}
    if native:  # a replayable host kernel: the op's third call of a signature replays natively
        from _host_backend import kg_host

        kinds = [ctypes.c_void_p] * 2 + [ctypes.c_int32, ctypes.c_float]
        options = dict(impls=[kg_host(native, kinds, lambda x, out: [x, out, x.numel(), factor])],
                       dtypes=[torch.float32], fallback="error")
    return kg.op(_reference(factor, schema), name=f"{NS}::{name}", replace=replace, **options)


# ----------------------------------------------------------------------------- one scenario
class Log:
    """The outcomes a call may see, one set per writer step (appended before and after each
    change, so the set current while a change runs allows both sides)."""

    def __init__(self, first: int) -> None:
        self.allowed: list[frozenset] = [frozenset({first})]

    def mark(self, *outcomes) -> None:
        self.allowed.append(frozenset(outcomes))

    def between(self, start: int, end: int) -> frozenset:
        return frozenset().union(*self.allowed[start - 1:end])


def run(scenario: str) -> dict:
    steps = SCENARIOS[scenario]
    native = None
    if scenario.startswith("native"):
        from kernelgraft import native as _native

        if _native.load() is None:
            return {"scenario": scenario, "skipped": _native.reason()}
        try:
            native = _c_scale()
        except (OSError, subprocess.CalledProcessError) as exc:
            return {"scenario": scenario, "skipped": f"no C compiler for the host kernel: {exc}"}
    name = scenario
    first = declare(name, 0, "a", native, replace=False)
    current = [first]
    x = torch.rand(5) + 0.5  # no zero: the result's ratio to x is the version's factor
    log = Log(0)
    xg = x.clone().requires_grad_()
    packet = getattr(getattr(torch.ops, NS), name)
    overload = packet.default
    routes = {
        "first op object": lambda: first(x),
        "current op object": lambda: current[0](x),
        "op object, through the dispatcher (grad)": lambda: current[0](xg),
        "torch.ops": lambda: getattr(getattr(torch.ops, NS), name)(x),
        "torch.ops packet held": lambda: packet(x),
        "torch.ops overload held": lambda: overload(x),
    }
    names = list(routes)
    calls = [0] * READERS
    counts = {route: 0 for route in routes}
    bad: list[str] = []
    done = threading.Event()

    def outcome(call):
        try:
            out = call()
        except kg.RegistrationError:
            return UNREGISTERED
        out = out.detach()
        factor = round(float((out / x).mean()))
        if not torch.equal(out, x * float(factor)):
            return f"a wrong value {out.tolist()}"
        return factor - 2

    def reader(index: int) -> None:
        route = names[index % len(names)]
        call = routes[route]
        while not done.is_set():
            start = len(log.allowed)
            try:
                seen = outcome(call)
            except Exception:
                seen = "raised " + traceback.format_exc(limit=3)[-400:]
            allowed = log.between(start, len(log.allowed))
            if seen not in allowed and len(bad) < 20:
                bad.append(f"{route}: got {seen!r}, allowed {sorted(map(str, allowed))}")
            counts[route] += 1
            calls[index] += 1
            if seen == UNREGISTERED:
                time.sleep(0)  # a refusal is quick: let the other routes run

    def wait_for_calls(n: int = 2) -> bool:
        target = [c + n for c in calls]
        deadline = time.monotonic() + 60
        while any(c < t for c, t in zip(calls, target)):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(READERS)]
    for t in threads:
        t.start()
    stalled = not wait_for_calls(3)
    version = 0
    for action, schema in steps:
        if stalled:
            break
        old, version = version, version + 1
        if action == "replace":
            log.mark(old, version)
            current[0] = declare(name, version, schema, native, replace=True)
            log.mark(version)
        else:
            log.mark(old, UNREGISTERED)
            kg.unregister(f"{NS}::{name}")
            log.mark(UNREGISTERED)
            stalled = not wait_for_calls()
            log.mark(UNREGISTERED, version)
            current[0] = declare(name, version, schema, native, replace=False)
            log.mark(version)
        stalled = stalled or not wait_for_calls()
    done.set()
    for t in threads:
        t.join(60)
    result = {"scenario": scenario, "counts": counts, "bad": bad, "stalled": stalled,
              "changes": len(steps), "alive": sum(t.is_alive() for t in threads)}
    if native:
        result["replays"] = current[0].dispatcher.current_replay() is not None
    _registry.unregister(f"{NS}::{name}")
    return result


if __name__ == "__main__":
    os.environ.setdefault("KERNELGRAFT_TUNE", "off")
    for scenario in sys.argv[1:]:
        print(json.dumps({"start": scenario}), flush=True)
        print(json.dumps(run(scenario)), flush=True)
