"""What manifest version 2 added for the C++ runtime, in the form of version 4: every expression
also as RPN (``_rpn``), output-shape rules for Meta kernels, and a decision table.

- ``kernel["program"]``: ``guards`` (one program per guard text, each compiled alone: a kernel
  serves where every one holds, as the Python runner evaluates the texts one by one), ``grid``
  (3), ``shared_mem``, ``params`` (one program per kernel parameter that has an ``expr``, else
  null) and ``outputs`` (one program per output dimension), all over the op's inputs in schema
  order. (Versions 2 and 3 held one ``guard`` program of the texts joined with " and " and no
  parentheses: a guard with a top-level ``or`` became another condition.)
- ``op["meta"]``: the distinct (dtypes, ranks, guards, output shapes, output dtypes) rules of the
  op's kernels, most general first: a Meta kernel uses the first rule whose guards all hold. A
  rule holds programs only, derived from the kernels' programs alone (so a loader without the
  texts derives them too, and both loaders require the manifest's rules to be exactly these): its
  ``guards`` are the kernel's guard programs that read no stride (output shapes depend on sizes
  only, they were traced on contiguous inputs, and a Meta kernel must give them for any layout).
- ``op["decisions"]``: rows ``{"arch", "tensors": {name: {"dtype", "dims": [[lo, hi], ...]}},
  "ints": {name: [lo, hi]}, "values": {name: v}, "ranking": [candidate positions], "source"}``
  from a tuning cache file: a call whose inputs fall in a row's ranges tries its ranking first (a
  candidate whose kernels' guards fail is passed over); without a row the candidates are tried in
  manifest order, the Python op's own default order.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import BundleError
from ..symbolic.expr import reads_strides
from .rpn import compile_rpn

__all__ = ["kernel_program", "meta_rules", "shape_guards", "reads_stride_token", "decision_table", "read_decisions",
           "tuned_entries", "key_label"]

log = logging.getLogger(__name__)


def kernel_program(kernel: dict, names: Sequence[str]) -> dict:
    """The RPN programs of one kernel entry (its texts stay the Python loader's source)."""
    return {
        "guards": [compile_rpn(g, names) for g in kernel["guards"]],
        "grid": [compile_rpn(str(g), names) for g in kernel["grid"]],
        "shared_mem": compile_rpn(str(kernel["shared_mem"]), names),
        "params": [compile_rpn(p["expr"], names) if "expr" in p else None for p in kernel["params"]],
        "outputs": [[compile_rpn(str(s), names) for s in shape] for shape in kernel["outputs"]["shapes"]],
    }


def shape_guards(guards: Sequence[str]) -> list[str]:
    """The guard texts that read sizes and scalars only (what an output-shape rule needs)."""
    return [g for g in guards if not reads_strides(g)]


def reads_stride_token(program: Sequence[Sequence[Any]]) -> bool:
    """Whether an RPN program reads a stride (the program form of ``_expr.reads_strides``)."""
    return any(token[0] == "stride" for token in program)


def meta_rules(candidates: Sequence[dict]) -> list[dict]:
    """The op's output-shape rules from its kernels' programs alone, deduplicated, symbolic ones and
    those with fewer guards first (``runtime/csrc/spec.cpp`` derives the same in C++)."""
    rules: dict[str, dict] = {}
    for cand in candidates:
        for k in cand["kernels"]:
            guards = [p for p in k["program"]["guards"] if not reads_stride_token(p)]
            rule = {"dtypes": k["dtypes"], "ranks": k["ranks"], "guards": guards, "dynamic": k["dynamic"],
                    "shapes": k["program"]["outputs"], "out_dtypes": k["outputs"]["dtypes"]}
            if k.get("pinned"):
                rule["pinned"] = k["pinned"]
            rules.setdefault(json.dumps(rule, sort_keys=True), rule)
    return sorted(rules.values(), key=lambda r: (not r["dynamic"], len(r["guards"])))


def read_decisions(path: str | Path) -> list[dict]:
    """The entries of a tuning cache file (``tune.json``, as ``kernelgraft cache export`` writes it
    too; ``"cache"``: this machine's tuning cache); BundleError when it is not one."""
    from ..tune.cache import BadFile, Foreign, cache_path, entry_problem, read_json

    own = str(path) == "cache"  # the cache trusts only its owner; a file named by the user is the user's call
    if own:
        found = cache_path()
        if found is None:
            raise BundleError("--decisions cache: the kernelgraft cache is off (KERNELGRAFT_CACHE_DIR=off)")
        path = found

    try:
        data = read_json(Path(path), owner_only=own)
    except (BadFile, Foreign, OSError) as exc:
        raise BundleError(f"--decisions {path}: not a readable tuning cache ({exc})") from None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        raise BundleError(f"--decisions {path}: not a kernelgraft tuning cache (no 'entries' object)")
    good = [e for e in entries.values() if entry_problem(e) is None]
    if len(good) < len(entries):
        log.warning("--decisions %s: %d malformed entries skipped", path, len(entries) - len(good))
    return good


def _range(rule: Callable[[int], int], bucket: int) -> list[int]:
    """[lo, hi]: the sizes a monotone bucket rule maps to ``bucket`` (hi is the bucket itself)."""
    if bucket <= 0:
        return [0, 0]
    lo, hi = 1, bucket
    while lo < hi:  # the smallest size the rule rounds up to this bucket
        mid = (lo + hi) // 2
        if rule(mid) >= bucket:
            hi = mid
        else:
            lo = mid + 1
    return [lo, bucket]


def _arch_of(capability: Any) -> str | None:
    try:
        major, minor = str(capability).split(".")
        return f"sm_{int(major)}{int(minor)}"
    except ValueError:
        return None


def tuned_entries(op: Any, entries: Sequence[dict], archs: Sequence[str]) -> list[tuple[str, dict]]:
    """(arch, entry) of the tuning-cache ``entries`` made for ``op`` (its name and fingerprint)
    on a device of one of ``archs``."""
    found = []
    for entry in entries:
        key = entry.get("key", {})
        if key.get("op") != op.name or key.get("fingerprint") != op.fingerprint:
            continue
        arch = _arch_of(key.get("env", {}).get("capability"))
        if arch in archs:
            found.append((arch, entry))
    return found


def key_label(op: Any, key: dict) -> str:
    """A tuning key's arguments as users read them, each tensor dim as the sizes its bucket
    covers: ``float32[513..1024] 2``."""
    from ..tune.key import Buckets

    buckets = getattr(op, "buckets", None) or Buckets()
    parts = []
    for p, desc in zip(op.signature.params, key.get("args", [])):
        tag = desc[0] if isinstance(desc, list) and desc else None
        if tag == "T":
            dims = []
            for d, size in enumerate(desc[2]):
                lo, hi = _range(buckets.rule(p.name, d), int(size))
                dims.append(str(hi) if lo == hi else f"{lo}..{hi}")
            parts.append(f"{str(desc[1]).removeprefix('torch.')}[{','.join(dims)}]")
        elif tag == "L":
            parts.append(f"[{len(desc[1])} tensors]")
        else:
            parts.append(str(desc[-1]) if isinstance(desc, list) and desc else str(desc))
    return " ".join(parts)


def decision_table(op: Any, candidates: Sequence[dict], entries: Sequence[dict], archs: Sequence[str]) -> list[dict]:
    """The decision rows of ``op`` from tuning-cache ``entries`` (tuned for this op's fingerprint
    on a device of one of ``archs``); rows naming no bundled candidate are left out."""
    from ..tune.key import Buckets, bucket

    position = {(c["index"], json.dumps(c["config"], sort_keys=True)): i for i, c in enumerate(candidates)}
    buckets = getattr(op, "buckets", None) or Buckets()
    params = op.signature.params
    rows: dict[str, dict] = {}
    for arch, entry in tuned_entries(op, entries, archs):
        key = entry.get("key", {})
        ranking = [position.get((r.get("impl"), json.dumps(r.get("config"), sort_keys=True)))
                   for r in entry.get("ranking", [])]
        ranking = [r for r in dict.fromkeys(ranking) if r is not None]
        if not ranking:
            continue
        row: dict[str, Any] = {"arch": arch, "tensors": {}, "ints": {}, "values": {}, "ranking": ranking,
                               "source": f"tuned on {key.get('env', {}).get('device', '?')}"}
        args = key.get("args", [])
        if len(args) != len(params):
            continue
        usable = True
        for p, desc in zip(params, args):
            tag = desc[0] if isinstance(desc, list) and desc else None
            if tag == "T":
                _, dtype, shape, _layout = desc
                row["tensors"][p.name] = {
                    "dtype": str(dtype).removeprefix("torch."),
                    "dims": [_range(buckets.rule(p.name, d), int(s)) for d, s in enumerate(shape)]}
            elif tag == "I":
                b = int(desc[1])
                lo, hi = _range(bucket, abs(b))
                row["ints"][p.name] = [lo, hi] if b >= 0 else [-hi, -lo]
            elif tag == "V" and isinstance(desc[1], (bool, str, type(None))) and p.kind in ("bool", "str"):
                row["values"][p.name] = desc[1]
            elif tag == "F":
                continue
            else:  # tensor lists and other arguments: the row could not be matched in C++
                usable = False
        if usable:
            rows.setdefault(json.dumps(row, sort_keys=True), row)
    return list(rows.values())
