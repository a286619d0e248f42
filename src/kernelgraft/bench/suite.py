"""Benchmark suites: which shapes ``kernelgraft bench`` times, grouped by the regime an LLM meets.

An op module declares its shapes once, as ``BENCH_SHAPES = {suite: {regime: [dims, ...]}}``, and
builds its arguments from one ``dims`` tuple; ``bench_inputs(device, suite)`` then yields
:class:`Case` objects (argument tuples tagged with their regime) through :func:`cases`. The same
table serves ``kernelgraft bench --suite llm``, ``benchmarks/bench_llm_suite.py`` and its
``--dry-run`` listing, which reads the dims without allocating anything.

>>> from kernelgraft.bench import Case, cases
>>> shapes = {"short": {"prefill": [(4, 8)]}, "llm": {"decode": [(1, 8)], "prefill": [(4, 8)]}}
>>> [(c.regime, c) for c in cases(shapes, "llm", lambda rows, cols: (rows, cols))]
[('decode', (1, 8)), ('prefill', (4, 8))]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

__all__ = ["module_inputs", "Case", "REGIMES", "SUITES", "cases", "check_shapes", "regime_of", "shape_plan"]

# "short" is the quick default of ``kernelgraft bench``; "llm" covers every regime below that an
# op meets in LLM inference and training.
SUITES = ("short", "llm")

REGIMES = {
    "decode": "1-64 rows: one token per sequence of a decode batch",
    "prefill": "4K-32K rows of a model's hidden or intermediate size",
    "narrow": "hidden 64-256 with tens of thousands of rows (per-head QK norm, MoE routers)",
    "wide": "hidden 8192-53248 (70B-405B-class layers)",
    "vocab": "32K-256K columns, from a single row to a prefill's logits",
    "attention": "attention-score rows: heads x queries rows of the KV length",
    "skinny": "GEMMs of Llama-class layers with M = 1-16 tokens",
    "gemm": "GEMMs of Llama-class layers at prefill sizes",
    "elementwise": "flat activations from a decode step to a long prefill",
}

Dims = tuple


class Case(tuple):
    """One benchmark shape: the op's arguments (a plain tuple to every caller) tagged with the
    ``regime`` it stands for and the ``dims`` it was built from."""

    regime: str
    dims: Dims

    def __new__(cls, args: Sequence[Any], regime: str = "", dims: Dims = ()) -> "Case":
        case = super().__new__(cls, args)
        case.regime, case.dims = regime, tuple(dims)
        return case


def regime_of(args: Any) -> str:
    """The regime of a benchmark argument tuple ('' for an untagged plain tuple)."""
    return getattr(args, "regime", "")


def check_shapes(shapes: Mapping[str, Mapping[str, Sequence[Dims]]], where: str = "BENCH_SHAPES") -> None:
    """Raise ValueError unless ``shapes`` names only known suites and regimes with dims tuples."""
    for suite, regimes in shapes.items():
        if suite not in SUITES:
            raise ValueError(f"{where}: unknown suite {suite!r}; suites are {', '.join(SUITES)}")
        for regime, dims_list in regimes.items():
            if regime not in REGIMES:
                raise ValueError(f"{where}[{suite!r}]: unknown regime {regime!r}; regimes are {', '.join(REGIMES)}")
            for dims in dims_list:
                if not isinstance(dims, tuple):
                    raise ValueError(f"{where}[{suite!r}][{regime!r}]: dims must be tuples, got {dims!r}")


def shape_plan(shapes: Mapping[str, Mapping[str, Sequence[Dims]]], suite: str) -> list[tuple[str, Dims]]:
    """``[(regime, dims), ...]`` of ``suite`` in declaration order, without building any tensor."""
    if suite not in SUITES:
        raise ValueError(f"unknown benchmark suite {suite!r}; suites are {', '.join(SUITES)}")
    if suite not in shapes:
        raise ValueError(f"no shapes declared for suite {suite!r}; declared: {', '.join(shapes) or 'none'}")
    return [(regime, tuple(dims)) for regime, dims_list in shapes[suite].items() for dims in dims_list]


def cases(
    shapes: Mapping[str, Mapping[str, Sequence[Dims]]], suite: str, make: Callable[..., tuple]
) -> Iterator[Case]:
    """Yield ``Case(make(*dims), regime, dims)`` for every shape of ``suite``, one at a time, so
    only one shape's tensors are alive while it is timed."""
    for regime, dims in shape_plan(shapes, suite):
        yield Case(make(*dims), regime, dims)


def module_inputs(module: Any, device: str = "cuda", suite: str = "short") -> Iterator[Case] | None:
    """The benchmark inputs a module declares: its ``BENCH_SHAPES`` of ``suite``, each built by its
    ``bench_case(*dims, device=...)``; None when it declares neither."""
    shapes, case = getattr(module, "BENCH_SHAPES", None), getattr(module, "bench_case", None)
    if shapes is None or not callable(case):
        return None
    return cases(shapes, suite, lambda *dims: case(*dims, device=device))
