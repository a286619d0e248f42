"""The harness behind ``kernelgraft bench``: ceilings, timing, per-op runs and the report.

Each op is timed on its module's ``BENCH_SHAPES`` (the "short" suite, or "llm": every regime an LLM
meets, ``suite``), each built by the module's ``bench_case(*dims, device=...)``: every candidate, the best per backend, torch eager
and ``torch.compile`` of the reference, peers (``_peers``), and the tuned op; achieved GB/s and
TFLOP/s come from the op's ``cost`` hook (or tensor sizes) and are shown as fractions of the copy
bandwidth and bf16 GEMM throughput measured at the start of the run.
"""

from .ceilings import Ceilings, measure_ceilings
from .cost import call_cost, default_bytes
from .main import bench_inputs_of, run_benchmarks
from .peers import Peer, as_peers, parse_peer
from .report import load_json, plot, render_table, write_json
from .run import Row, bench_op
from .suite import REGIMES, SUITES, Case, cases, module_inputs, regime_of, shape_plan
from .timing import Timing, measure, measure_interleaved

__all__ = [
    "Case",
    "Ceilings",
    "Peer",
    "REGIMES",
    "SUITES",
    "Row",
    "Timing",
    "as_peers",
    "bench_inputs_of",
    "bench_op",
    "cases",
    "call_cost",
    "default_bytes",
    "load_json",
    "measure",
    "measure_ceilings",
    "measure_interleaved",
    "module_inputs",
    "parse_peer",
    "plot",
    "regime_of",
    "render_table",
    "run_benchmarks",
    "shape_plan",
    "write_json",
]
