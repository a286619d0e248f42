"""A whole benchmark run: ceilings first, then every op's shapes; JSON rewritten after each op."""

from __future__ import annotations

import inspect
import logging
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Any

from ..op.samples import samples
from .ceilings import Ceilings, measure_ceilings
from .peers import peers_for
from .report import document, plot, render_table, write_json
from .run import Row, bench_op, summary_rows
from .suite import SUITES, module_inputs

__all__ = ["bench_inputs_of", "run_benchmarks"]

log = logging.getLogger(__name__)


def _takes_suite(make: Callable) -> bool:
    try:
        return "suite" in inspect.signature(make).parameters
    except (TypeError, ValueError):
        return False


def bench_inputs_of(op: Any, device: str, suite: str = "short") -> Iterable[tuple] | None:
    """The inputs ``kernelgraft bench`` times ``op`` on: its module's ``BENCH_SHAPES`` of ``suite``,
    each built by the module's ``bench_case(*dims, device=...)`` (one shape at a time); else the
    module's ``bench_inputs(device, suite)`` (``bench_inputs(device)`` when it takes no suite: its
    shapes serve every suite); else its ``sample_inputs`` (small shapes); else None."""
    if suite not in SUITES:
        raise ValueError(f"unknown benchmark suite {suite!r}; suites are {', '.join(SUITES)}")
    module = sys.modules.get(getattr(op, "__module__", ""), None)
    declared = module_inputs(module, device, suite)
    if declared is not None:
        return declared
    make = getattr(module, "bench_inputs", None)
    if callable(make):
        if _takes_suite(make):
            return make(device, suite=suite)
        if suite != "short":
            log.warning("%s: bench_inputs(device) takes no suite; timing its own shapes for suite %r", op.name, suite)
        return make(device)
    if op.sample_inputs is not None:
        log.warning("%s: no BENCH_SHAPES and bench_case (or bench_inputs) in its module; using "
                    "sample_inputs (small shapes)", op.name)
        return samples(op, device)  # as check and aot call it (with the device when it takes one)
    return None


def run_benchmarks(
    ops: Sequence[Any],
    *,
    device: str = "cuda",
    json_path: str | None = None,
    png_path: str | None = None,
    compile: bool = True,
    tune: bool = True,
    max_shapes: int | None = None,
    all_candidates: bool = False,
    ceilings: Ceilings | None = None,
    timer: Callable | None = None,
    inputs_for: Callable[..., Iterable[tuple] | None] = bench_inputs_of,
    say: Callable[[str], None] = print,
    suite: str = "short",
    peers: Any = None,
    timing: str = "cold",
    dynamic: bool = False,
    rounds: int = 1,
) -> tuple[list[Row], Ceilings | None]:
    """Benchmark ``ops`` on the shapes of ``suite`` and write the report. Returns all rows and
    the ceilings used. ``peers`` are timed beside each op they apply to (a list, or a mapping
    from op names to lists; ``kernelgraft.bench.peers``); ``timing``, ``dynamic`` and ``rounds``
    as in :func:`~kernelgraft.bench.bench_op`."""
    if ceilings is None:
        say("measuring ceilings (device copy bandwidth, bf16 GEMM) ...")
        ceilings = measure_ceilings(device)
        say(f"  copy {ceilings.copy_gbps:.0f} GB/s, bf16 GEMM {ceilings.bf16_tflops:.0f} TFLOP/s")
    rows: list[Row] = []
    for op in ops:
        inputs = inputs_for(op, device, suite) if suite != "short" else inputs_for(op, device)
        if inputs is None:
            say(f"{op.name}: skipped (no bench_inputs or sample_inputs)")
            continue
        if max_shapes is not None:
            inputs = islice(inputs, max_shapes)
        started = time.perf_counter()
        try:
            rows.extend(bench_op(op, inputs, ceilings=ceilings, timer=timer, compile=compile, tune=tune,
                                 peers=peers_for(op.name, peers), timing=timing, dynamic=dynamic,
                                 rounds=rounds))
        except Exception as exc:  # a broken op (or its inputs) must not lose the others
            say(f"{op.name}: benchmark failed: {type(exc).__name__}: {exc}")
            log.debug("bench of %s failed", op.name, exc_info=True)
        say(f"{op.name}: done in {time.perf_counter() - started:.1f} s")
        if json_path:
            write_json(document(rows, ceilings), json_path)
    render_table(summary_rows(rows, all_candidates=all_candidates), ceilings)
    if json_path:
        write_json(document(rows, ceilings), json_path)
        say(f"wrote {json_path}")
    if png_path:
        why = plot(rows, png_path, ceilings)
        say(f"wrote {png_path}" if why is None else f"no plot: {why}")
    return rows, ceilings
