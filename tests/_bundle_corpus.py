"""One corpus of tampered bundles, derived from one real bundle, and the two loaders' verdicts on it.

Each case edits a copy of the real bundle (built once per test session for sm_90 on the CPU,
signed) and says what both loaders must answer: ``LOADED``, or refused with a message that names
``field`` (a path of the bundle spec such as ``ops[0].schema``, or a file). ``verdicts`` runs every
case through the Python loader and through the C++ runtime, each in a child process (crash
isolation: a case that kills its child is reported as ``crash`` and the others still run), and
returns per case ``(verdict, message, seconds)``. ``tests/integration/test_bundle_verdicts.py`` asserts on the
verdicts; ``benchmarks/bench_bundle_verdicts.py`` prints the times.

Edits change an expression's text and program together (``set_expr``) and re-derive the op's output
rules from the kernels' programs (``resum``, with ``_program.meta_rules``, which both loaders hold the
manifest's rules equal to): what someone who recomputes every unkeyed sum does."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from kernelgraft.aot import manifest as _manifest
from kernelgraft.aot.sign import SIGNATURE, sign_bundle

from _aot_helpers import EXAMPLES, env
from _bundle_edits import (add_stride_guard, drop_a_rule_guard, edited as _edit, first, guard_program_edited, kernels,
                           or_guard, raw as _raw, resum, set_expr, stale as _stale, stride_guard_in_meta)

__all__ = ["CASES", "KEY", "LOADED", "derive", "first", "real_bundle", "resum", "set_expr", "verdicts"]

KEY = b"kernelgraft-test-key-0123456789abcdef"
LOADED = "loaded"
_HANG_GUARD_S = 60  # per case: a generous bound on a child that hangs, not a measure of speed


def real_bundle(base: Path, unsigned: Path | None = None) -> Path:
    """The real bundle of the examples, signed with ``KEY`` (made once under ``base``; a later
    call, from this or another process sharing ``base``, finds it there): a signed copy of
    ``unsigned`` (that bundle, built by ``kernelgraft aot`` of the same examples), else built."""
    from filelock import FileLock

    out = base / "kg-real-bundle"
    with FileLock(str(base / "kg-real-bundle.lock")):
        if not (out / SIGNATURE).exists():
            shutil.rmtree(out, ignore_errors=True)
            keyfile = base / "kg-real-bundle.key"
            keyfile.write_bytes(KEY + b"\n")
            if unsigned is not None:  # what ``--sign`` does after the build
                tmp = base / "kg-real-bundle.tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(unsigned, tmp)
                sign_bundle(tmp, keyfile)
                tmp.rename(out)
            else:
                cmd = [sys.executable, "-m", "kernelgraft", "aot", *EXAMPLES, "--arch", "sm_90", "-o", str(out),
                       "--sign", str(keyfile)]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=900)
                assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out


def _param(name: str, kind: str = "tensor", default=None, required: bool = True, optional: bool = False,
           mutated: bool = False) -> dict:
    return {"name": name, "kind": kind, "default": default, "required": required, "optional": optional,
            "mutated": mutated}


def _add_param(p: dict, schema_text: str | None):
    """Append parameter ``p`` to add_relu (and ``schema_text`` to its schema, when given)."""
    def fn(m: dict) -> None:
        op = m["ops"][0]
        op["params"].append(p)
        if schema_text is not None:
            op["schema"] = op["schema"].replace(") -> ", f", {schema_text}) -> ")

    return _edit(fn)


def _all_kernels(fn: Callable[[dict, dict], None]):
    def edit(m: dict) -> None:
        for op, k in [(op, k) for op in m["ops"] for c in op["candidates"] for k in c["kernels"]]:
            fn(op, k)

    return _edit(edit)


def _own(path: Path) -> Path:
    """The corpus's copies share the real bundle's binaries (hard links): a case that edits one
    in place first makes it its own."""
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data)
    return path


def _cubin(root: Path, m: dict) -> Path:
    return root / first(m)[1]["images"]["cubin"]["file"]

def _truncate(size_of: Callable[[int], int], pick=_cubin):
    def edit(root: Path, m: dict) -> None:
        path = _own(pick(root, m))
        with open(path, "r+b") as f:
            f.truncate(size_of(path.stat().st_size))  # sparse past the end: costs no disk

    return edit


def _ptx_files(root: Path, m: dict) -> list[Path]:
    return sorted({root / k["images"]["ptx"]["file"] for _, k in kernels(m)})


def _sparse_ptx(count: int, size: int, resummed: bool):
    """``count`` ptx files grown (sparse) to ``size`` bytes; with ``resummed`` their sizes and
    sha256 are written into the manifest, so only the caps refuse them."""
    def edit(root: Path, m: dict) -> None:
        changed = {}
        for path in _ptx_files(root, m)[:count]:
            _own(path)
            with open(path, "r+b") as f:
                f.truncate(size)
            if resummed:
                digest = hashlib.sha256()
                with open(path, "rb") as f:
                    for block in iter(lambda: f.read(1 << 24), b""):
                        digest.update(block)
                changed[str(path.relative_to(root))] = digest.hexdigest()
        for _, k in kernels(m):
            image = k["images"]["ptx"]
            if image["file"] in changed:
                image.update(sha256=changed[image["file"]], bytes=size)
        if resummed:
            resum(root, m)

    return edit


def _flip_byte(root: Path, m: dict) -> None:
    path = _own(_cubin(root, m))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _replace_cubin_resummed(root: Path, m: dict) -> None:
    """Other bytes (not an ELF) with the right size and sha256."""
    path = _own(_cubin(root, m))
    data = bytes(range(256)) * (path.stat().st_size // 256 + 1)
    data = data[:path.stat().st_size]
    path.write_bytes(data)
    name = str(path.relative_to(root))
    for _, k in [(op, k) for op in m["ops"] for c in op["candidates"] for k in c["kernels"]]:
        for image in k["images"].values():
            if image["file"] == name:
                image["sha256"] = hashlib.sha256(data).hexdigest()
    resum(root, m)


def _relabel_dtypes(m: dict) -> None:
    for op in m["ops"]:
        for c in op["candidates"]:
            for k in c["kernels"]:
                k["dtypes"] = {n: "float64" if d == "float32" else d for n, d in k["dtypes"].items()}
                k["outputs"]["dtypes"] = ["float64" if d == "float32" else d for d in k["outputs"]["dtypes"]]


def _deep(depth: int):
    """An extra field of lists nested ``depth`` deep (under the top level), checksum recomputed."""
    def edit(root: Path, m: dict) -> None:
        value: list = []
        for _ in range(depth - 1):
            value = [value]
        m["extra"] = value
        resum(root, m)

    return edit


def _raw_bytes(old: bytes, new: bytes):
    def edit(root: Path, m: dict) -> None:
        path = root / "manifest.json"
        path.write_bytes(path.read_bytes().replace(old, new, 1))

    return edit


def _fifo(root: Path, m: dict) -> None:
    path = _cubin(root, m)
    path.unlink()
    os.mkfifo(path)


def _symlink(root: Path, m: dict) -> None:
    path = _cubin(root, m)
    path.unlink()
    path.symlink_to("/dev/zero")


def _many_files(root: Path, m: dict) -> None:
    from kernelgraft.aot.bundle_spec import limit

    for i in range(limit("FILES") + 1):
        (root / "bin" / f"pad{i}.ptx").write_bytes(b"")


def _sign_with(edit):
    """Apply ``edit`` and sign the result with ``KEY`` (a case about what a signer can still not do)."""
    def signed(root: Path, m: dict) -> None:
        from kernelgraft.aot.sign import sign_bundle

        edit(root, m)
        sign_bundle(root, KEY)

    return signed


def _huge_signature(root: Path, m: dict) -> None:
    from kernelgraft.aot.bundle_spec import limit

    with open(root / SIGNATURE, "r+b") as f:
        f.truncate(limit("SIGNATURE_BYTES") + 1)


def _signature_escape(root: Path, m: dict) -> None:
    body = json.loads((root / SIGNATURE).read_text())
    body["files"]["../outside"] = "0" * 64
    (root / SIGNATURE).write_text(json.dumps(body))


def _distinct_guards(m: dict) -> None:
    """One kernel with 140 distinct guard texts of about 2000 characters: within the caps of one
    text and of guards, over the budget of distinct expression text (only the texts change: both
    loaders walk a kernel's texts before its programs)."""
    first(m)[1]["guards"] = [f"(x.shape[0] >= {-i})" + " and (x.shape[0] >= 0)" * 90 for i in range(140)]


def _meta_stale(root: Path, m: dict) -> None:
    """A manifest whose output rules were not re-derived after a kernel changed."""
    op, k = first(m)
    set_expr(op, k, "guards", k["guards"] + ["(x.shape[0] >= 0)"])
    _manifest.write(root, m)  # the rules still hold the old guards


# name -> (edit(root, manifest), expected: LOADED or the field the refusal names, key or None)
CASES: dict[str, tuple] = {
    "untouched": (lambda root, m: None, LOADED),
    "untouched-signed": (lambda root, m: None, LOADED, KEY),
    # params against the schema
    "param-extra": (_add_param(_param("z"), None), "ops[0].schema"),
    "param-extra-in-schema-too": (_add_param(_param("z", optional=True, required=False), "Tensor? z=None"), LOADED),
    "param-missing": (_edit(lambda m: m["ops"][1]["params"].pop()), "ops[1].schema"),
    "param-kind-mismatch": (_edit(lambda m: m["ops"][0]["params"][1].update(kind="int")), "ops[0].schema"),
    "param-renamed": (_edit(lambda m: m["ops"][0]["params"][1].update(name="w")), "ops[0].schema"),
    "param-reserved-name": (_add_param(_param("lambda"), "Tensor lambda"), "ops[0].params[2].name"),
    "param-output-name": (_add_param(_param("out0"), "Tensor out0"), "ops[0].params[2].name"),
    "param-float-default": (_edit(lambda m: (m["ops"][1]["params"][2].update(required=False, default=1e-06),
                                             m["ops"][1].update(schema=m["ops"][1]["schema"].replace(
                                                 "float eps", "float eps=1e-06")))), LOADED),
    "param-str-default": (_add_param(_param("mode", "str", "mean", required=False), 'str mode="mean"'), LOADED),
    "param-dtype-default": (_add_param(_param("dt", "dtype", "float16", required=False), "ScalarType dt=float16"),
                            LOADED),
    "param-default-not-in-schema": (_add_param(_param("n", "int", 3, required=False), "SymInt n=4"),
                                    "ops[0].schema parameter 2"),
    "schema-default-injects-param": (_add_param(_param("s", "str", 'a", Tensor w="b', required=False),
                                                'str s="a", Tensor w="b"'), "ops[0].params[2].default"),
    "schema-injected-text-only": (_edit(lambda m: m["ops"][0].update(
        schema=m["ops"][0]["schema"].replace("Tensor y", 'Tensor y, str s="a", Tensor w="b"'))), "ops[0].schema"),
    "schema-alias-on-unmutated": (_edit(lambda m: m["ops"][0].update(
        schema=m["ops"][0]["schema"].replace("Tensor x", "Tensor(a0!) x"))), "ops[0].schema parameter 0"),
    "mutates-args-mismatch": (_edit(lambda m: m["ops"][0].update(mutates_args=["x"])), "ops[0].mutates_args"),
    # names
    "name-aten": (_edit(lambda m: m["ops"][0].update(name="aten::add_relu")), "ops[0].name"),
    "name-prim": (_edit(lambda m: m["ops"][0].update(name="prim::add_relu")), "ops[0].name"),
    "name-not-identifier": (_edit(lambda m: m["ops"][0].update(name="kg v::add-relu")), "ops[0].name"),
    "name-twice": (_edit(lambda m: m["ops"][1].update(name=m["ops"][0]["name"])), "ops[1].name"),
    # counts
    "n-returns-huge": (_edit(lambda m: m["ops"][0].update(n_returns=10**8)), "ops[0].n_returns"),
    "n-returns-not-the-returns": (_edit(lambda m: m["ops"][0].update(returns="tuple", n_returns=2)),
                                  "ops[0].schema"),
    "guards-too-many": (_all_kernels(lambda op, k: k.update(guards=["(x.shape[0] >= 0)"] * 300)),
                        "kernels[0].guards"),
    "guard-huge": (_edit(lambda m: first(m)[1].update(guards=["(x.shape[0] >= 0)" + " and (x.shape[0] >= 0)" * 10000])),
                   "guards[0]"),
    "guards-20-of-196kb": (_edit(lambda m: first(m)[1].update(guards=["(x.shape[0] >= 0)" * 11000] * 20)),
                           "guards[0]"),
    "guards-distinct-over-budget": (_edit(_distinct_guards), "EXPR_DISTINCT_CHARS"),
    "program-too-long": (_edit(lambda m: first(m)[1]["program"]["grid"].__setitem__(
        1, [["int", "1"]] + [["int", "0"], ["op", "+"]] * 600)), "program.grid[1]"),
    "program-unknown-token": (_edit(lambda m: first(m)[1]["program"]["grid"][0].append(["exec", 1])),
                              "program.grid[0]"),
    "program-stack-left-over": (_edit(lambda m: first(m)[1]["program"]["grid"][0].append(["int", "1"])),
                                "program.grid[0]"),
    "program-input-out-of-range": (_edit(lambda m: first(m)[1]["program"]["grid"].__setitem__(0, [["size", 7, 0]])),
                                   "program.grid[0]"),
    "program-extra-operand": (_edit(lambda m: first(m)[1]["program"]["grid"].__setitem__(1, [["int", "1", 2]])),
                              "program.grid[1]"),
    "grid-negative": (_edit(lambda m: set_expr(*first(m), "grid", "-5", 0)), "program.grid[0]"),
    "grid-zero": (_edit(lambda m: set_expr(*first(m), "grid", "(3 - 3)", 0)), "program.grid[0]"),
    "grid-x-too-large": (_edit(lambda m: set_expr(*first(m), "grid", "2147483648", 0)), "program.grid[0]"),
    "grid-divides-by-zero": (_edit(lambda m: set_expr(*first(m), "grid", "(x.shape[0] // 0)", 0)),
                             "program.grid[0]"),
    "grid-tower-of-powers": (_edit(lambda m: set_expr(*first(m), "grid", "((((9 ** 64) ** 64) ** 64) ** 64)", 0)),
                             "program.grid[0]"),
    "grid-constant-error-in-operand": (_edit(lambda m: set_expr(*first(m), "grid", "(x.shape[0] + (1 // 0))", 0)),
                                       "program.grid[0]"),
    "block-over-1024-threads": (_edit(lambda m: first(m)[1].update(block=[64, 32, 1])), "block"),
    "dtypes-relabelled": (_edit(_relabel_dtypes), "dtypes"),
    "dtype-unknown": (_edit(lambda m: first(m)[1]["dtypes"].update(x="complex128")), "dtypes.x"),
    "decision-ranking-out-of-range": (_edit(lambda m: m["ops"][0]["decisions"].append(
        {"arch": "sm_90", "tensors": {}, "ints": {}, "values": {}, "ranking": [99], "source": "x"})),
        "decisions[0].ranking[0]"),
    "decision-keyed-by-output": (_edit(lambda m: m["ops"][0]["decisions"].append(
        {"arch": "sm_90", "tensors": {}, "ints": {"out0": [1, 2]}, "values": {}, "ranking": [0]})),
        "decisions[0].ints"),
    "candidate-repeated": (_edit(lambda m: m["ops"][0]["candidates"].append(m["ops"][0]["candidates"][0])),
                           "candidates[9]"),
    "config-nested": (_edit(lambda m: m["ops"][0]["candidates"][0].update(config={"BLOCK": {"a": 1}})),
                      "config.BLOCK"),
    "pointer-source-and-null": (_edit(lambda m: first(m)[1]["params"][0].update(null=True)), "params[0]"),
    "pinned-not-a-str-param": (_edit(lambda m: first(m)[1].update(pinned={"x": "a"})), "pinned"),
    "library-without-runtime": (_edit(lambda m: first(m, "cutedsl")[1]["images"].pop("runtime")), "images"),
    "image-bytes-negative": (_edit(lambda m: first(m)[1]["images"]["cubin"].update(bytes=-1)), "cubin.bytes"),
    "label-too-long": (_edit(lambda m: m["ops"][0]["candidates"][0].update(label="x" * 5000)), "label"),
    "arch-malformed": (_edit(lambda m: m.update(archs=["sm_90", "gfx90a"])), "archs[1]"),
    # files
    "cubin-over-size-cap": (_truncate(lambda n: _manifest.MAX_BINARY_BYTES + 1), "-byte cap"),
    "ptx-four-sparse-255mb": (_sparse_ptx(4, 255 << 20, resummed=False), "-byte cap"),
    "ptx-over-total-budget": (_sparse_ptx(9, 30 << 20, resummed=True), "TOTAL_BYTES"),
    "cubin-truncated": (_truncate(lambda n: n // 2), "the manifest says"),
    "cubin-byte-flipped": (_flip_byte, "checksum mismatch for bin/"),
    "cubin-not-elf-resummed": (_replace_cubin_resummed, "not a 64-bit CUDA ELF"),
    "cubin-fifo": (_fifo, "not a regular file"),
    "cubin-symlink-to-dev-zero": (_symlink, "symlink"),
    "binary-path-escape": (_edit(lambda m: first(m)[1]["images"]["cubin"].update(file="bin/../manifest.json")),
                           "cubin.file"),
    "manifest-over-size-cap": (_truncate(lambda n: _manifest.MAX_MANIFEST_BYTES + 1,
                                         lambda root, m: root / "manifest.json"), "-byte cap"),
    # JSON
    "json-not-utf8": (_raw_bytes(b'"doc":"', b'"doc":"\xff'), "not valid JSON"),
    "json-lone-surrogate": (_edit(lambda m: m["ops"][0].update(doc="\ud800")), "not valid JSON"),
    "json-nested-32": (_deep(31), LOADED),
    "json-nested-33": (_deep(32), "nests deeper"),
    "json-nested-objects-50k": (_raw(lambda t: t[:-2] + ',"x":' + '{"a":' * 50000 + "1" + "}" * 50000 + "}\n"),
                                "nests deeper"),
    "json-nested-lists-50k": (_raw(lambda t: t[:-2] + ',"x":' + "[" * 50000 + "]" * 50000 + "}\n"), "nests deeper"),
    "json-int-over-int64": (_edit(lambda m: m.update(extra=2**63)), "int64"),
    "json-number-infinite": (_raw(lambda t: t[:-2] + ',"x":1e400}\n'), "not finite"),
    "json-nan": (_raw(lambda t: t[:-2] + ',"x":NaN}\n'), "not valid JSON"),
    "json-leading-zero": (_raw(lambda t: t[:-2] + ',"x":01}\n'), "not valid JSON"),
    "json-key-twice": (_raw(lambda t: t[:-2] + ',"format":"kernelgraft-bundle"}\n'), "twice"),
    "json-trailing-data": (_raw(lambda t: t + "{}"), "not valid JSON"),
    "json-control-character": (_raw(lambda t: t.replace('"doc":"', '"doc":"\x01', 1)), "not valid JSON"),
    # signed
    "signed-too-many-files": (_many_files, "FILES", KEY),
    "signed-signature-over-cap": (_huge_signature, "-byte cap", KEY),
    "signed-signature-names-outside": (_signature_escape, "not a hmac-sha256 bundle signature", KEY),
    "signed-schema-injection-still-refused": (_sign_with(_add_param(_param("z"), None)), "ops[0].schema", KEY),
    "meta-stale": (_meta_stale, "ops[0].meta"),
    # guards: one program per text, the rules' guards those of them that read no stride
    "guard-or-and-another": (_edit(or_guard), LOADED),
    "guard-reads-a-stride": (_edit(add_stride_guard), LOADED),
    "guard-program-edited-rules-stale": (guard_program_edited, "ops[0].meta"),
    "guard-program-malformed": (_edit(lambda m: first(m)[1]["program"]["guards"][0].append(["int", "1"])),
                                "program.guards[0]"),
    "guard-program-stride-out-of-range": (_edit(lambda m: first(m)[1]["program"]["guards"].__setitem__(
        0, [["stride", 9, 0], ["int", "1"], ["op", "=="]])), "program.guards[0]"),
    "guard-programs-fewer-than-texts": (_edit(lambda m: first(m)[1]["program"]["guards"].pop()),
                                        "program.guards"),
    "guard-programs-more-than-texts": (_edit(lambda m: first(m)[1]["program"]["guards"].append([["int", "1"]])),
                                       "program.guards"),
    "guard-program-joined-as-before": (_stale(lambda m: first(m)[1]["program"].update(
        guard=first(m)[1]["program"].pop("guards")[0])), "lacks 'guards'"),
    "meta-holds-a-stride-guard": (stride_guard_in_meta, "ops[0].meta"),
    "meta-rule-guard-dropped": (_stale(drop_a_rule_guard), "ops[0].meta"),
    "version-unknown": (_edit(lambda m: m.update(version=5)), "manifest version 5"),
}
def derive(bundle: Path, out: Path, only: list[str] | None = None) -> list[tuple[str, Path, bytes | None]]:
    """The corpus under ``out``: per case (name, bundle directory, key), each op in a namespace of
    its own (``kgv<i>``) so that the cases that load do not clash."""
    from kernelgraft.aot.sign import sign_bundle

    base = _manifest.read(bundle)
    items = []
    for i, (name, case) in enumerate(CASES.items()):
        if only is not None and name not in only:
            continue
        edit, _expected, *key = case
        root = out / name
        shutil.copytree(bundle, root, symlinks=True, copy_function=os.link)
        (root / SIGNATURE).unlink(missing_ok=True)
        m = json.loads(json.dumps(base))
        for op in m["ops"]:
            op["name"] = f"kgv{i}::" + op["name"].split("::")[1]
        resum(root, m)
        if key:
            sign_bundle(root, KEY)
        edit(root, m)
        items.append((name, root, key[0] if key else None))
    return items


_PY_CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import kernelgraft as kg
from kernelgraft.aot.load import reset_bundles
for name, path, key in json.loads(sys.argv[1]):
    started = time.perf_counter()
    try:
        kg.load_bundle(path, arch="sm_90", key=None if key is None else key.encode())
        verdict, message = "loaded", ""
    except (kg.BundleError, kg.RegistrationError) as exc:
        verdict, message = "refused", str(exc)
    except BaseException as exc:
        verdict, message = "error", f"{type(exc).__name__}: {exc}"
    reset_bundles()
    print(json.dumps([name, verdict, message[:2000], time.perf_counter() - started]), flush=True)
"""

_CPP_CHILD = r"""
import json, sys, time
import torch
torch.ops.load_library(sys.argv[2])
keyfile = sys.argv[3]
for name, path, key in json.loads(sys.argv[1]):
    started = time.perf_counter()
    try:
        torch.ops.kernelgraft.load_bundle(path, None if key is None else keyfile, "sm_90", False)
        verdict, message = "loaded", ""
    except RuntimeError as exc:
        verdict, message = "refused", str(exc).split("\nException raised from")[0]
    except BaseException as exc:
        verdict, message = "error", f"{type(exc).__name__}: {exc}"
    print(json.dumps([name, verdict, message[:2000], time.perf_counter() - started]), flush=True)
"""


def _run(script: str, items: list, extra: list[str], cwd: Path) -> dict[str, tuple[str, str, float]]:
    """Every item through ``script`` in child processes: a fresh child after one that dies."""
    out: dict[str, tuple[str, str, float]] = {}
    todo = [[n, str(p), None if k is None else k.decode()] for n, p, k in items]
    while todo:
        cmd = [sys.executable, "-P", "-c", script, json.dumps(todo), *extra]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=cwd,
                                  timeout=_HANG_GUARD_S * len(todo))
            lines, rc = proc.stdout.splitlines(), proc.returncode
        except subprocess.TimeoutExpired as exc:
            lines, rc = (exc.stdout or b"").decode(errors="replace").splitlines(), "hang"
        for line in lines:
            try:
                name, verdict, message, seconds = json.loads(line)
            except (ValueError, TypeError):
                continue
            out[name] = (verdict, message, seconds)
        todo = [t for t in todo if t[0] not in out]
        if todo:  # the first one left took its child down
            out[todo[0][0]] = ("crash", f"the child ended with {rc}", float("nan"))
            todo = todo[1:]
    return out


def verdicts(items: list, runtime_library: Path, work: Path) -> dict[str, dict]:
    """{case: {"python": (verdict, message, s), "cpp": (...)}} for the derived ``items``."""
    keyfile = work / "corpus.key"
    keyfile.write_bytes(KEY + b"\n")
    py = _run(_PY_CHILD, items, [], work)
    cpp = _run(_CPP_CHILD, items, [str(runtime_library), str(keyfile)], work)
    return {name: {"python": py[name], "cpp": cpp[name]} for name, _, _ in items}
