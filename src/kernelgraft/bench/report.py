"""The benchmark report: a terminal table, a JSON document, and a PNG plot of time against size.

The JSON is the record (``benchmarks/summarize_bench.py`` and ``--replot`` read it back); the table
and the plot are views of it. rich and matplotlib are optional: without rich the table is plain
text, without matplotlib the plot is skipped with a message (replot later from the JSON).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .ceilings import Ceilings
from .run import BACKEND, COMPILE, EAGER, PEER, TUNED, Row

__all__ = ["document", "write_json", "load_json", "render_table", "plot", "environment"]

SCHEMA = "kernelgraft.bench/1"
PLOTTED = (BACKEND, EAGER, COMPILE, PEER, TUNED)


def environment() -> dict[str, Any]:
    """Versions and the device, for the record."""
    import torch

    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    try:
        from ..version import __version__

        env["kernelgraft"] = __version__
    except Exception:  # pragma: no cover
        pass
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["device"] = props.name
        env["capability"] = f"sm_{props.major}{props.minor}"
        env["sms"] = props.multi_processor_count
    return env


def document(rows: Sequence[Row], ceilings: Ceilings | None, env: dict | None = None) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "environment": env if env is not None else environment(),
        "ceilings": ceilings.as_dict() if ceilings else None,
        "rows": [dataclasses.asdict(r) for r in rows],
    }


def write_json(doc: dict[str, Any], path: str | os.PathLike) -> None:
    """Write atomically (temp file + replace), so an interrupted run leaves the last full state."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".bench-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(_finite(doc), f, indent=1)
    os.replace(tmp, path)


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: store them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def load_json(path: str | os.PathLike) -> tuple[list[Row], Ceilings | None, dict]:
    doc = json.loads(Path(path).read_text())
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a kernelgraft bench report (schema {doc.get('schema')!r}, want {SCHEMA!r})")
    names = {f.name for f in dataclasses.fields(Row)}
    rows = [Row(**{k: v for k, v in r.items() if k in names}) for r in doc["rows"]]
    ceil = Ceilings(**doc["ceilings"]) if doc.get("ceilings") else None
    return rows, ceil, doc.get("environment", {})


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def table_lines(rows: Sequence[Row]) -> list[list[str]]:
    """Cells of the table: one line per row, with speed-up against torch eager of the same shape."""
    eager = {(r.op, r.size): r.time_us for r in rows if r.kind == EAGER and r.time_us}
    out = []
    for r in rows:
        ref = eager.get((r.op, r.size))
        speedup = f"{ref / r.time_us:.2f}x" if ref and r.time_us else "-"
        note = r.error or r.detail
        out.append([
            r.op.split("::")[-1], f"{r.regime}: {r.shape}" if r.regime else r.shape, r.variant, _fmt(r.time_us, ".1f"), _fmt(r.gbps, ".0f"),
            _pct(r.bw_frac), _fmt(r.tflops, ".1f") if r.flops else "-", _pct(r.flops_frac) if r.flops else "-",
            speedup, _fmt(r.vs_tuned, ".2f") + ("x" if r.vs_tuned is not None else ""), note,
        ])
    return out


HEADERS = ["op", "inputs", "variant", "median us", "GB/s", "% copy", "TFLOP/s", "% gemm", "vs eager", "kg/this",
           "note"]


def render_table(rows: Sequence[Row], ceilings: Ceilings | None, *, console: Any = None) -> str:
    """Print the table (rich when installed) and return it as plain text."""
    lines = table_lines(rows)
    title = "kernelgraft bench"
    if ceilings:
        title += f" (copy {ceilings.copy_gbps:.0f} GB/s, bf16 GEMM {ceilings.bf16_tflops:.0f} TFLOP/s)"
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(HEADERS)]
    text = "\n".join(
        [title, "  ".join(h.ljust(w) for h, w in zip(HEADERS, widths))]
        + ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines]
    )
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(text)
        return text
    table = Table(title=title)
    for h in HEADERS:
        table.add_column(h, justify="right" if h not in ("op", "inputs", "variant", "note") else "left")
    for line in lines:
        table.add_row(*line)
    (console or Console()).print(table)
    return text


# One colour per backend in every plot (others take the spare ones in name order).
_BACKEND_COLORS = {"cuda": "tab:blue", "triton": "tab:orange", "cutile": "tab:purple", "cutedsl": "tab:brown"}
_SPARE_COLORS = ("tab:pink", "tab:olive", "tab:cyan", "tab:gray")
_FIXED_STYLES = {
    EAGER: {"color": "tab:green", "linestyle": "--", "marker": "o"},
    COMPILE: {"color": "tab:red", "linestyle": "--", "marker": "o"},
    TUNED: {"color": "black", "linestyle": "-", "marker": "x", "linewidth": 1.0, "zorder": 5},
}


def _style(kind: str, backend: str, backends: list[str]) -> dict[str, Any]:
    """The same line style for a variant in every panel: torch eager, torch.compile and the tuned
    op fixed; each backend's best its own colour."""
    if kind in _FIXED_STYLES:
        return dict(_FIXED_STYLES[kind])
    if kind == PEER:
        return {"color": "tab:cyan", "linestyle": "-.", "marker": "s", "linewidth": 1.5}
    color = _BACKEND_COLORS.get(backend)
    if color is None:
        spare = [b for b in backends if b not in _BACKEND_COLORS]
        color = _SPARE_COLORS[spare.index(backend) % len(_SPARE_COLORS)] if backend in spare else "gray"
    return {"color": color, "linestyle": "-", "marker": "o", "linewidth": 2.2, "alpha": 0.75}


def _panel(ax: Any, op_rows: list[Row], ceilings: Ceilings | None, backends: list[str]) -> None:
    # Compute-bound ops (the rows declare FLOPs) are plotted against GFLOP per call with the GEMM
    # ceiling; the rest against MB moved with the copy ceiling.
    by_flops = any(r.flops and math.isfinite(r.flops) for r in op_rows)
    scale = 1e9 if by_flops else 1e6

    def x_of(r: Row) -> float | None:
        x = r.flops if by_flops else r.bytes
        return x / scale if x and math.isfinite(x) else None

    series: dict[str, tuple[str, str, list[tuple[float, float]]]] = {}
    failed: dict[str, str] = {}
    for r in op_rows:
        if r.kind not in PLOTTED:
            continue
        x = x_of(r)
        if r.time_us and x is not None:
            series.setdefault(r.variant, (r.kind, r.backend, []))[2].append((x, r.time_us))
        elif r.error:
            failed.setdefault(r.variant, r.error.split(":")[0])
    for variant, (kind, backend, points) in series.items():
        points.sort()
        ax.plot(*zip(*points), markersize=3, label=variant, **_style(kind, backend, backends))
    xs = sorted({x for _, _, pts in series.values() for x, _ in pts})
    if ceilings and xs:
        if by_flops and ceilings.bf16_tflops:
            ax.plot(xs, [x * 1e9 / (ceilings.bf16_tflops * 1e12) * 1e6 for x in xs], ":", color="gray",
                    label=f"bf16 GEMM ceiling {ceilings.bf16_tflops:.0f} TFLOP/s")
        elif not by_flops and ceilings.copy_gbps:
            ax.plot(xs, [x * 1e6 / (ceilings.copy_gbps * 1e9) * 1e6 for x in xs], ":", color="gray",
                    label=f"copy ceiling {ceilings.copy_gbps:.0f} GB/s")
    for variant, why in failed.items():
        if variant not in series:  # failed on every size: say so where its line would be
            ax.plot([], [], linestyle="none", label=f"{variant}: failed ({why})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("GFLOP per call" if by_flops else "MB moved per call")
    ax.set_ylabel("median time (us)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def plot(rows: Sequence[Row], path: str | os.PathLike, ceilings: Ceilings | None = None) -> str | None:
    """Per op, median time against size (bytes moved, or FLOPs for ops that declare them) for each
    backend's best candidate, torch eager, torch.compile and the tuned op, with the device ceiling.
    Returns None on success, else why no plot was written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); replot later with --replot"
    ops = list(dict.fromkeys(r.op for r in rows))
    if not ops:
        return "no rows to plot"
    backends = sorted({r.backend for r in rows if r.kind == BACKEND})
    cols = min(3, len(ops))
    nrows = math.ceil(len(ops) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 4.2 * nrows), squeeze=False)
    for ax, op in zip(axes.flat, ops):
        _panel(ax, [r for r in rows if r.op == op], ceilings, backends)
        ax.set_title(op.split("::")[-1])
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
