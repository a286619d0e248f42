"""``check_manifest``: the Python side of the bundle spec (``_bundle_spec`` states the rules; the C++
runtime's ``spec.cpp`` checks the same ones). It runs on a parsed manifest whose checksum holds,
before anything else reads it, and raises ``BundleError`` naming the field by its path
(``ops[0].params[2].default``) and what is wrong with it.

The walk is linear in the manifest and every count is capped before a loop runs over it; the only
work beyond a walk is evaluating constant program parts (bounded by the program caps) and, in
the Python loader only, compiling each distinct expression text once to compare it with its
program (bounded by ``EXPR_DISTINCT_CHARS``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from .bundle_spec import (
    IDENTIFIER,
    check_param_name,
    default_text,
    limit,
    parse_schema,
    returns_text,
    split_op_name,
    table,
)
from .bundle_walk import Walk
from .program import meta_rules

__all__ = ["check_manifest"]

_ARCH = re.compile(r"sm_[0-9]{2,3}a?\Z")
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_FILE = re.compile(r"bin/[A-Za-z0-9_-][A-Za-z0-9_.-]*\Z")
_OUT = re.compile(r"out(0|[1-9][0-9]?)\Z")
_MAX_BLOCK = (1024, 1024, 64)
_MAX_THREADS = 1024
_MAX_GRID = (2**31 - 1, 65535, 65535)
_MAX_SHARED = 228 * 1024


def check_manifest(manifest: dict, where: str, *, texts: bool = True) -> None:
    """BundleError unless ``manifest`` (format, version and checksum already checked) is a valid
    bundle. ``texts``: also check that every expression text compiles to its program (what the
    Python loader, which evaluates the texts, needs)."""
    w = Walk(where, manifest, texts)
    archs = w.lst(w.field(manifest, "archs", "archs"), "archs", "ARCHS")
    if not archs:
        w.fail("archs", "is empty")
    for i, a in enumerate(archs):
        if not isinstance(a, str) or not _ARCH.match(a):
            w.fail(f"archs[{i}]", f"{str(a)[:40]!r} is not an arch name sm_NN")
    if len(set(archs)) != len(archs):
        w.fail("archs", "names an arch twice")
    w.obj(w.field(manifest, "toolchain", "toolchain"), "toolchain")
    names = set()
    for i, op in enumerate(w.lst(w.field(manifest, "ops", "ops"), "ops", "OPS")):
        name = _op(w, w.obj(op, f"ops[{i}]"), f"ops[{i}]", set(archs))
        if name in names:
            w.fail(f"ops[{i}].name", f"{name!r} names two ops")
        names.add(name)


def _op(w: Walk, op: dict, path: str, archs: set[str]) -> str:
    name = w.field(op, "name", path)
    split = split_op_name(name)
    if isinstance(split, str):
        w.fail(f"{path}.name", split)
    w.string(w.field(op, "fingerprint", path), f"{path}.fingerprint")
    for key in ("module", "doc"):
        if op.get(key) is not None:
            w.string(op[key], f"{path}.{key}")
    params = w.lst(w.field(op, "params", path), f"{path}.params", "PARAMS")
    for i, p in enumerate(params):
        _param(w, w.obj(p, f"{path}.params[{i}]"), f"{path}.params[{i}]")
    names = [p["name"] for p in params]
    if len(set(names)) != len(names):
        w.fail(f"{path}.params", "name a parameter twice")
    returns = w.one_of(w.field(op, "returns", path), f"{path}.returns", ("none", "tensor", "tuple"))
    lo, hi = {"none": (0, 0), "tensor": (1, 1), "tuple": (1, limit("RETURNS"))}[returns]
    n_returns = w.integer(w.field(op, "n_returns", path), f"{path}.n_returns", lo, hi)
    mutates = w.lst(w.field(op, "mutates_args", path), f"{path}.mutates_args", "PARAMS")
    if not all(isinstance(m, str) for m in mutates) or len(set(mutates)) != len(mutates) or (
            sorted(mutates) != sorted(p["name"] for p in params if p["mutated"])):
        w.fail(f"{path}.mutates_args", "are not the mutated parameters")
    _schema(w, w.field(op, "schema", path), params, returns, n_returns, f"{path}.schema")
    kinds = {p["name"]: p["kind"] for p in params}
    candidates = w.lst(w.field(op, "candidates", path), f"{path}.candidates", "CANDIDATES")
    seen = set()
    for i, c in enumerate(candidates):
        key = _candidate(w, w.obj(c, f"{path}.candidates[{i}]"), f"{path}.candidates[{i}]", kinds, n_returns, archs)
        if key in seen:
            w.fail(f"{path}.candidates[{i}]", "repeats the index and config of an earlier candidate")
        seen.add(key)
    if w.programs:
        _meta(w, w.lst(w.field(op, "meta", path), f"{path}.meta"), candidates, f"{path}.meta")
        rows = w.lst(w.field(op, "decisions", path), f"{path}.decisions", "DECISIONS")
        for i, row in enumerate(rows):
            _decision(w, w.obj(row, f"{path}.decisions[{i}]"), f"{path}.decisions[{i}]", kinds, len(candidates))
    return name


def _param(w: Walk, p: dict, path: str) -> None:
    why = check_param_name(w.field(p, "name", path))
    if why:
        w.fail(f"{path}.name", why)
    kind = w.one_of(w.field(p, "kind", path), f"{path}.kind", table().param_kinds)
    tensor = table().param_kinds[kind][1]
    optional, mutated, required = (w.boolean(w.field(p, k, path), f"{path}.{k}") for k in ("optional", "mutated", "required"))
    if mutated and not tensor:
        w.fail(f"{path}.mutated", f"a {kind} parameter cannot be mutated")
    default = w.field(p, "default", path)
    if required:
        if default is not None:
            w.fail(f"{path}.default", "a required parameter has no default")
        return
    if default is None:
        if not optional:
            w.fail(f"{path}.default", "is None for a parameter that is not optional")
    elif tensor or default_text(kind, default) is None:
        w.fail(f"{path}.default", f"{str(default)[:80]!r} is not a default of a {kind} parameter")


def _schema(w: Walk, schema: Any, params: list[dict], returns: str, n_returns: int, path: str) -> None:
    parsed = parse_schema(schema)
    if isinstance(parsed, str):
        w.fail(path, parsed)
    written, ret = parsed
    if len(written) != len(params):
        w.fail(path, f"has {len(written)} parameters, the op {len(params)}")
    for i, (s, p) in enumerate(zip(written, params)):
        at = f"{path} parameter {i}"
        schema_type, _ = table().param_kinds[p["kind"]]
        if s.name != p["name"]:
            w.fail(at, f"is named {s.name!r}, the op's parameter {p['name']!r}")
        if s.type + ("[]" if s.is_list else "") != schema_type:
            w.fail(at, f"{p['name']} is {s.type}{'[]' if s.is_list else ''}, a {p['kind']} parameter is {schema_type}")
        if (s.alias is not None) != p["mutated"] or (s.alias is not None and s.alias != i):
            w.fail(at, f"{p['name']}: the alias (a{i}!) must mark exactly a mutated parameter")
        if (s.optional and not p["optional"]) or (s.optional and s.is_list) or (
                p["optional"] and not s.optional and s.default != "None"):
            w.fail(at, f"{p['name']}: '?' must mark exactly an optional parameter")
        want = None if p["required"] else default_text(p["kind"], p["default"])
        if s.default != want:
            w.fail(at, f"{p['name']} has default {s.default!r}, the op's is {want!r}")
    if ret != returns_text(returns, n_returns):
        w.fail(path, f"returns {ret[:80]!r}, the op returns {returns_text(returns, n_returns)!r}")


def _names(w: Walk, value: Any, path: str, allowed: Callable[[str], bool], what: str) -> dict:
    obj = w.obj(value, path)
    if len(obj) > limit("PARAMS") + limit("RETURNS"):
        w.fail(path, f"has {len(obj)} keys, over the cap of {limit('PARAMS') + limit('RETURNS')}")
    for k in obj:
        if not allowed(k):
            w.fail(path, f"{k[:80]!r} is not {what}")
    return obj


def _candidate(w: Walk, c: dict, path: str, kinds: dict, n_returns: int, archs: set[str]) -> tuple:
    index = w.integer(w.field(c, "index", path), f"{path}.index", 0, limit("CANDIDATES"))
    for key in ("backend", "impl", "impl_fingerprint", "label"):
        w.string(w.field(c, key, path), f"{path}.{key}")
    config = w.obj(w.field(c, "config", path), f"{path}.config")
    if len(config) > limit("CONFIG_KEYS"):
        w.fail(f"{path}.config", f"has {len(config)} keys, over the cap of {limit('CONFIG_KEYS')} (CONFIG_KEYS)")
    for k, v in config.items():
        if len(k) > limit("NAME_CHARS") or not IDENTIFIER.match(k):
            w.fail(f"{path}.config", f"key {k[:80]!r} is not an identifier")
        for item in (w.lst(v, f"{path}.config.{k}", "CONFIG_KEYS") if isinstance(v, list) else [v]):
            w.scalar(item, f"{path}.config.{k}")
    for i, k in enumerate(w.lst(w.field(c, "kernels", path), f"{path}.kernels", "KERNELS")):
        _kernel(w, w.obj(k, f"{path}.kernels[{i}]"), f"{path}.kernels[{i}]", kinds, n_returns, archs)
    return index, json.dumps(config, sort_keys=True)


def _kernel(w: Walk, k: dict, path: str, kinds: dict, n_returns: int, archs: set[str]) -> None:
    params = list(kinds)
    tensor = lambda n: kinds.get(n) == "tensor"  # noqa: E731
    output = lambda n: bool(_OUT.match(n)) and int(n[3:]) < n_returns  # noqa: E731
    w.one_of(w.field(k, "arch", path), f"{path}.arch", archs)
    name = w.string(w.field(k, "kernel", path), f"{path}.kernel", "NAME_CHARS")
    if not name:
        w.fail(f"{path}.kernel", "is empty")
    w.boolean(w.field(k, "dynamic", path), f"{path}.dynamic")
    dtypes = _names(w, w.field(k, "dtypes", path), f"{path}.dtypes", tensor, "a tensor parameter")
    for n, d in dtypes.items():
        w.one_of(d, f"{path}.dtypes.{n}", table().dtypes)
    for n, r in _names(w, w.field(k, "ranks", path), f"{path}.ranks", tensor, "a tensor parameter").items():
        w.integer(r, f"{path}.ranks.{n}", 0, limit("DIMS"))
    if "pinned" in k:
        if type(w.version) is int and w.version < 3:
            w.fail(f"{path}.pinned", "needs manifest version 3")
        for n, v in _names(w, k["pinned"], f"{path}.pinned", lambda n: kinds.get(n) == "str", "a str parameter").items():
            w.string(v, f"{path}.pinned.{n}")
    for i, n in enumerate(w.lst(w.field(k, "aligned", path), f"{path}.aligned", "PARAMS")):
        if not isinstance(n, str) or not (tensor(n) or kinds.get(n) == "tensor_list" or output(n)):
            w.fail(f"{path}.aligned[{i}]", f"{str(n)[:80]!r} is not a tensor parameter or output")
    guards = [w.expr(g, f"{path}.guards[{i}]")
              for i, g in enumerate(w.lst(w.field(k, "guards", path), f"{path}.guards", "GUARDS"))]
    grid = [w.expr(g, f"{path}.grid[{i}]") for i, g in enumerate(w.lst(w.field(k, "grid", path), f"{path}.grid", exact=3))]
    smem = w.expr(w.field(k, "shared_mem", path), f"{path}.shared_mem")
    block = w.lst(w.field(k, "block", path), f"{path}.block", exact=3)
    threads = 1
    for d, (b, m) in enumerate(zip(block, _MAX_BLOCK)):
        threads *= w.integer(b, f"{path}.block[{d}]", 1, m)
    if threads > _MAX_THREADS:
        w.fail(f"{path}.block", f"has {threads} threads, over {_MAX_THREADS}")
    kparams = w.lst(w.field(k, "params", path), f"{path}.params", "KERNEL_PARAMS")
    exprs: list[str | None] = []
    for i, p in enumerate(kparams):
        at = f"{path}.params[{i}]"
        p = w.obj(p, at)
        kind = w.one_of(w.field(p, "kind", at), f"{at}.kind", table().kernel_param_kinds)
        if kind == "ptr":
            if "expr" in p or (("source" in p) == (p.get("null") is True)):
                w.fail(at, "a pointer has either a source or \"null\": true")
            if "source" in p and not (isinstance(p["source"], str) and (tensor(p["source"]) or output(p["source"]))):
                w.fail(f"{at}.source", f"{str(p['source'])[:80]!r} is not a tensor parameter or output")
            exprs.append(None)
        else:
            if "source" in p or "null" in p:
                w.fail(at, f"a {kind} parameter has an expr, not a source")
            exprs.append(w.expr(w.field(p, "expr", at), f"{at}.expr"))
    outputs = w.obj(w.field(k, "outputs", path), f"{path}.outputs")
    shapes = w.lst(w.field(outputs, "shapes", f"{path}.outputs"), f"{path}.outputs.shapes", exact=n_returns)
    shapes = [[w.expr(d, f"{path}.outputs.shapes[{i}][{j}]")
               for j, d in enumerate(w.lst(s, f"{path}.outputs.shapes[{i}]", "DIMS"))] for i, s in enumerate(shapes)]
    out_dtypes = w.lst(w.field(outputs, "dtypes", f"{path}.outputs"), f"{path}.outputs.dtypes", exact=n_returns)
    for i, d in enumerate(out_dtypes):
        w.one_of(d, f"{path}.outputs.dtypes[{i}]", table().dtypes)
    _images(w, w.obj(w.field(k, "images", path), f"{path}.images"), f"{path}.images")
    _types(w, k, kparams, dtypes, out_dtypes, path)
    if w.programs:
        _programs(w, w.obj(w.field(k, "program", path), f"{path}.program"), f"{path}.program", params,
                  guards, grid, smem, exprs, shapes)


def _images(w: Walk, images: dict, path: str) -> None:
    for kind, image in images.items():
        at = f"{path}.{kind}"
        w.one_of(kind, at, table().image_kinds)
        image = w.obj(image, at)
        file = w.string(w.field(image, "file", at), f"{at}.file", "NAME_CHARS")
        if not _FILE.match(file):
            w.fail(f"{at}.file", f"{file[:80]!r} is outside the bundle's bin/ (or not a file name)")
        digest = w.field(image, "sha256", at)
        if not isinstance(digest, str) or not _SHA256.match(digest):
            w.fail(f"{at}.sha256", "is not a sha256 in hex")
        w.integer(w.field(image, "bytes", at), f"{at}.bytes", 0, limit("FILE_BYTES"))
    if "so" in images:
        if "runtime" not in images or "cubin" in images:
            w.fail(path, "a library (so) comes with its runtime and no cubin")
    elif "cubin" not in images or "runtime" in images:
        w.fail(path, "a kernel has a cubin (or a library so with its runtime)")


def _types(w: Walk, k: dict, kparams: list, dtypes: dict, out_dtypes: list, path: str) -> None:
    """The manifest's dtypes agree with the types the kernel's compiler recorded."""
    sources = dict(dtypes) | {f"out{i}": d for i, d in enumerate(out_dtypes)}
    pointers = [sources.get(p["source"]) for p in kparams if "source" in p]
    triton = k.get("triton")
    signature = triton.get("signature") if isinstance(triton, dict) else None
    names = table().triton_types
    if isinstance(signature, dict) and all(d in names for d in pointers):
        compiled = sorted(t for t in signature.values() if isinstance(t, str) and t.startswith("*"))
        claimed = sorted("*" + names[d] for d in pointers)
        if compiled != claimed:
            w.fail(f"{path}.dtypes", f"give pointer types {claimed}, but the kernel was compiled for {compiled}")
    cuda = k.get("cuda")
    template = cuda.get("template") if isinstance(cuda, dict) else None
    if isinstance(template, dict):
        for arg, ctype in template.items():
            want = table().c_types.get(ctype) if isinstance(ctype, str) else None
            if want is not None and want not in sources.values():
                w.fail(f"{path}.dtypes", f"template argument {arg}={ctype} is compiled for {want}, which no "
                                          "tensor of the kernel has")


def _programs(w: Walk, prog: dict, path: str, params: list[str], guards: list[str], grid: list[str],
              smem: str, exprs: list[str | None], shapes: list[list[str]]) -> None:
    n = len(params)
    check = w.text_program if w.check_texts else None
    # one program per guard text (the kernel serves where all hold): no text is joined to another
    programs = w.lst(w.field(prog, "guards", path), f"{path}.guards", "GUARDS", exact=len(guards))
    for i, (text, p) in enumerate(zip(guards, programs)):
        w.program(p, f"{path}.guards[{i}]", n)
        if check:
            check(text, p, params, f"{path}.guards[{i}]")
    programs = w.lst(w.field(prog, "grid", path), f"{path}.grid", exact=3)
    for d, (text, p) in enumerate(zip(grid, programs)):
        constant, value = w.program(p, f"{path}.grid[{d}]", n)
        if constant and (type(value) is not int or not 1 <= value <= _MAX_GRID[d]):
            w.fail(f"{path}.grid[{d}]", f"is {value!r}, outside the device limits (1..{_MAX_GRID[d]})")
        if check:
            check(text, p, params, f"{path}.grid[{d}]")
    p = w.field(prog, "shared_mem", path)
    constant, value = w.program(p, f"{path}.shared_mem", n)
    if constant and (type(value) is not int or not 0 <= value <= _MAX_SHARED):
        w.fail(f"{path}.shared_mem", f"is {value!r} bytes, outside 0..{_MAX_SHARED}")
    if check:
        check(smem, p, params, f"{path}.shared_mem")
    programs = w.lst(w.field(prog, "params", path), f"{path}.params", exact=len(exprs))
    for i, (text, p) in enumerate(zip(exprs, programs)):
        if (text is None) != (p is None):
            w.fail(f"{path}.params[{i}]", "a pointer has no program, a scalar has one")
        if text is not None:
            w.program(p, f"{path}.params[{i}]", n)
            if check:
                check(text, p, params, f"{path}.params[{i}]")
    programs = w.lst(w.field(prog, "outputs", path), f"{path}.outputs", exact=len(shapes))
    for i, (texts, dims) in enumerate(zip(shapes, programs)):
        dims = w.lst(dims, f"{path}.outputs[{i}]", exact=len(texts))
        for j, (text, p) in enumerate(zip(texts, dims)):
            w.program(p, f"{path}.outputs[{i}][{j}]", n)
            if check:
                check(text, p, params, f"{path}.outputs[{i}][{j}]")


def _meta(w: Walk, meta: list, candidates: list, path: str) -> None:
    want = meta_rules(candidates)  # from the (checked) programs alone, as the C++ runtime derives them
    dump = lambda v: json.dumps(v, sort_keys=True)  # noqa: E731  (1 == True == 1.0 in Python, not in JSON)
    if len(meta) != len(want) or any(dump(a) != dump(b) for a, b in zip(meta, want)):
        w.fail(path, "is not the output rules its kernels give (rebuild the bundle)")


def _decision(w: Walk, row: dict, path: str, kinds: dict, n_candidates: int) -> None:
    w.string(w.field(row, "arch", path), f"{path}.arch")
    tensors = _names(w, w.field(row, "tensors", path), f"{path}.tensors", lambda n: kinds.get(n) == "tensor",
                     "a tensor parameter")
    for n, t in tensors.items():
        at = f"{path}.tensors.{n}"
        t = w.obj(t, at)
        w.one_of(w.field(t, "dtype", at), f"{at}.dtype", table().dtypes)
        for d, r in enumerate(w.lst(w.field(t, "dims", at), f"{at}.dims", "DIMS")):
            for v in w.lst(r, f"{at}.dims[{d}]", exact=2):
                w.integer(v, f"{at}.dims[{d}]", -(2**63), 2**63 - 1)
    for n, r in _names(w, w.field(row, "ints", path), f"{path}.ints", lambda n: n in kinds, "a parameter").items():
        for v in w.lst(r, f"{path}.ints.{n}", exact=2):
            w.integer(v, f"{path}.ints.{n}", -(2**63), 2**63 - 1)
    for n, v in _names(w, w.field(row, "values", path), f"{path}.values", lambda n: n in kinds, "a parameter").items():
        w.scalar(v, f"{path}.values.{n}")
    for i, r in enumerate(w.lst(w.field(row, "ranking", path), f"{path}.ranking", "CANDIDATES")):
        w.integer(r, f"{path}.ranking[{i}]", 0, n_candidates - 1)
    if "source" in row:
        w.string(row["source"], f"{path}.source")
