"""Declaring, replacing and unregistering an op while other threads call it never crashes, and
every call reaches the old op or the new one (``kernelgraft._op._slot``).

The scenarios (``_registration_threads.py``) run in a child process, so a crash fails the test
instead of killing pytest: 8 threads call one name through the op object (the first one, retired
by the first change, and the current one), through the dispatcher (an input that requires grad),
through ``torch.ops`` (looked up per call, and a packet and an overload held from the start), and
through the native replay, while another thread re-declares it with the same schema or another,
or unregisters and declares it again. A call may return only the result of a version that held
the name while it ran, or raise ``RegistrationError`` only while the name was unregistered.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kernelgraft as kg

_HERE = Path(__file__).parent
_SCENARIOS = ["replace_same_schema", "replace_new_schema", "unregister_redeclare",
              "unregister_new_schema"]


def _run(scenarios: list[str], timeout: float = 300) -> dict:
    env = dict(os.environ, KERNELGRAFT_TUNE="off",
               PYTHONPATH=os.pathsep.join([str(Path(kg.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(_HERE / "_registration_threads.py"), *scenarios],
                          capture_output=True, text=True, timeout=timeout, env=env)
    results, started = {}, []
    for line in proc.stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "start" in record:
            started.append(record["start"])
        else:
            results[record["scenario"]] = record
    if proc.returncode != 0 or len(results) != len(scenarios):
        pytest.fail(f"the child died (exit {proc.returncode}) during scenario {started[-1:]}\n"
                    f"stderr tail:\n{proc.stderr[-3000:]}")
    return results


@pytest.fixture(scope="module")
def results():
    return _run(_SCENARIOS)


def _check(result: dict) -> None:
    print(f"\n{result['scenario']}: {result['changes']} changes, calls per route {result['counts']}")
    assert not result["bad"], "calls saw what no version gave:\n" + "\n".join(result["bad"])
    assert not result["stalled"] and not result["alive"], result
    assert all(n >= 2 * result["changes"] for n in result["counts"].values()), result["counts"]


@pytest.mark.parametrize("scenario", _SCENARIOS)
def test_calls_reach_the_old_op_or_the_new_one_while_the_name_changes(results, scenario):
    _check(results[scenario])


def test_calls_through_the_native_replay_while_the_name_changes():
    from kernelgraft import _native

    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler on this machine: the native replay cannot be built")
    assert _native.load() is not None, _native.reason()  # built once, shared with the child
    result = _run(["native_replace"])["native_replace"]
    _check(result)
    assert result["replays"], "the op's calls never reached the native replay"
