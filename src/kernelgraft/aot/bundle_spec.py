"""What a valid bundle is: one definition, which the Python loader and the C++ runtime both enforce
before any work that grows with the input.

The caps, reserved names and kinds are data, in one table: ``runtime/csrc/bundle_spec.h``. The C++
runtime compiles it in (its rows are X-macros); this module parses the same rows (``table()``).
A header was chosen over a Python table that generates one because the runtime is built from its
source directory alone (in a child process, by torch's extension tools, wherever kernelgraft is
installed): the file it includes is the file this module reads, so there is nothing to regenerate
and nothing that can be stale. The rules below use those rows; ``_bundle_check`` implements them in
Python and ``runtime/csrc/spec.cpp`` in C++, and one corpus of tampered bundles
(``tests/integration/test_bundle_verdicts.py``) checks that both give every case the same verdict.

Files (each file is stat'ed first, refused over its cap or when its size is not the manifest's
``bytes``, and read with at most cap + 1 bytes; one load reads each file once and charges it to
``TOTAL_BYTES``; only regular files, no symlink):

- ``manifest.json`` (``MANIFEST_BYTES``), ``signature.json`` (``SIGNATURE_BYTES``), ``bin/NAME``
  (``FILE_BYTES``; at most ``FILES`` of them; NAME of ``[A-Za-z0-9_.-]``, not starting with ``.``).

JSON (both files): UTF-8 without a byte order mark; RFC 8259 grammar (no ``NaN``, ``Infinity``,
leading zeros or trailing text); integers within int64, other numbers finite; no lone surrogate;
no key twice in an object; containers nested at most ``JSON_DEPTH`` deep.

Versions (``KG_VERSION``): 1 holds expression texts only; 2 and 3 (3: kernels may pin string
arguments) added RPN programs, with one program for all of a kernel's guards, their texts joined
with " and " and no parentheses, so a guard with a top-level ``or`` became another condition: their
programs are not read (the Python loader reads them by their texts, guard by guard, as version 1;
the C++ runtime, which has only the programs, refuses them: rebuild the bundle).
4 holds one program per guard. Only the versions with programs are held to the program rules
below, and only those does the C++ runtime read.

Manifest: ``format`` ``"kernelgraft-bundle"``, ``version`` a ``KG_VERSION``, ``checksum`` the sha256 of
the rest (checked first), ``toolchain`` an object, ``archs`` 1 to ``ARCHS`` distinct ``sm_NN[N][a]``,
``ops`` at most ``OPS`` ops of distinct names. Other keys are free (and covered by the checksum).

An op: ``name`` ``NS::NAME``, both identifiers (``[A-Za-z_][A-Za-z0-9_]*``, ``NAME_CHARS`` in all),
NS not a ``KG_RESERVED_NAMESPACE``; ``fingerprint`` a string; ``module`` (optional) and ``doc``
(optional) strings or null; ``params`` at most ``PARAMS``; ``returns`` ``none`` / ``tensor`` /
``tuple`` with ``n_returns`` 0 / 1 / 1 to ``RETURNS``; ``mutates_args`` the mutated params' names;
``schema`` exactly what the params and returns give (below); ``candidates`` at most ``CANDIDATES``, no
two of the same (index, config); in a version with programs, ``meta`` equal to what its kernels'
programs give (``_program.meta_rules``: both loaders derive it from the programs alone) and
``decisions`` at most ``DECISIONS`` rows.

A param: ``name`` an identifier, not a ``KG_RESERVED_PARAM`` nor ``out<digits>``, unique; ``kind`` a
``KG_PARAM_KIND``; ``optional``, ``mutated``, ``required`` booleans (only tensor kinds are mutated);
``default`` null when required, else by kind: null (then optional), an int for int, an int or
finite float for float, a bool for bool, a string of ``KG_STR_DEFAULT_CHARS`` for str, a
``KG_DTYPE`` name for dtype (tensor kinds: null only).

The schema grammar (what ``torch.library.infer_schema`` writes for these kinds)::

    schema  = "(" [param *(", " param)] ") -> " returns
    param   = type " " name ["=" default]
    type    = "Tensor" ["(a" POSITION "!)"] ["[]"] ["?"]  |  ("SymInt" | "float" | "bool" | "str"
              | "ScalarType") ["?"]
    default = "None" | "True" | "False" | INT | FLOAT (Python's repr) | '"' STR '"' | DTYPE
    returns = "()" | "Tensor" | "((Tensor))" | "(Tensor" 1*(", Tensor") ")"

It equals the params when, param by param: the names are equal; the type is the kind's
(``Tensor[]`` only for ``tensor_list``); the alias ``(aN!)`` is there exactly for a mutated param, N
its position; ``?`` only on an optional param, and an optional param has ``?`` or the default None;
the default is there exactly when not required and is the default's text; and the returns are the
op's. So the schema the runtime registers is the params it pops: one param more or less, another
kind, or a default that smuggles text (a quote, a comma) is refused.

A candidate: ``index`` an int in 0..``CANDIDATES``; ``backend``, ``impl``, ``impl_fingerprint``,
``label`` strings; ``config`` at most ``CONFIG_KEYS`` identifier keys with null, bool, int, float or
string values (or lists of those); ``kernels`` at most ``KERNELS``.

A kernel: ``arch`` one of ``archs``; ``kernel`` a name; ``dynamic`` a bool; ``dtypes`` and ``ranks``
(0..``DIMS``) keyed by tensor params; ``pinned`` (version 3 on) string values keyed by str params;
``aligned`` names of tensor params or outputs (``out<i>``, i < n_returns); ``guards`` at most
``GUARDS`` expressions; ``grid`` 3 expressions; ``shared_mem`` an expression; ``block`` 3 ints within
1024, 1024, 64 and 1024 threads; ``params`` at most ``KERNEL_PARAMS``, each a ``KG_KERNEL_PARAM_KIND``:
a ``ptr`` has a ``source`` (a tensor param or output) or ``"null": true``, another kind an
``expr``; ``outputs`` n_returns ``shapes`` (at most ``DIMS`` expressions each) and n_returns
``dtypes``; ``images`` of ``KG_IMAGE_KIND`` (a cubin, or a library ``so`` with its ``runtime``), each
``{"file", "sha256", "bytes"}``; the pointer dtypes agree with the compiler's record (``triton``
signature, ``cuda`` template) where it has one. An expression is a string of at most ``EXPR_CHARS``;
all distinct ones together at most ``EXPR_DISTINCT_CHARS``.

Programs (version 4): ``program`` holds ``guards`` (one per guard text, in order: each text compiled
alone, so the kernel's guard is the AND of these programs, as the Python runner takes the AND of
the texts), ``grid`` (3), ``shared_mem``, ``params`` (one per kernel param: null for a pointer) and
``outputs`` (one per output dimension). A meta rule is ``{"dtypes", "ranks", "pinned" (when the
kernel pins), "guards", "dynamic", "shapes", "out_dtypes"}``: its ``guards`` the kernel's guard
programs that hold no ``stride`` token, its ``shapes`` the kernel's output programs; the rules are
deduplicated (first kept) and stably sorted, those with ``dynamic`` true first, then by the
number of guards. A program is a list of at most ``PROGRAM_TOKENS`` tokens (``PROGRAM_TOKENS_TOTAL``
in the manifest), each exactly one of ``["int", DECIMAL]`` (128-bit), ``["float", NUMBER]``,
``["size", I, D]``, ``["stride", I, D]``, ``["arg", I]`` (I a param's position, D < ``DIMS``),
``["op", BINARY]``, ``["unary", neg|pos|not]``,
``["bool", and|or, N]``, ``["call", min|max, N]``, ``["call", "next_pow2", 1]``; it never pops more
than it pushed and leaves one value. Its constant parts are evaluated when the bundle loads (as
``_rpn.evaluate`` does): a constant operand that is an error (overflow, division by zero), a
constant divisor of zero, or a constant grid or shared memory outside the device limits is refused.
The Python loader, which evaluates the texts, also checks that each text compiles to its program
(``_rpn.compile_rpn``).

Decision rows: ``arch`` a string, ``tensors`` keyed by tensor params (a dtype and at most ``DIMS``
``[lo, hi]``), ``ints`` keyed by params (``[lo, hi]``), ``values`` keyed by params (scalars),
``ranking`` at most ``CANDIDATES`` candidate positions, ``source`` (optional) a string.

Every string not named above is at most ``TEXT_CHARS``; names ``NAME_CHARS``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from pathlib import Path
from typing import Any

from ..errors import BundleError

__all__ = ["Spec", "table", "limit", "loads", "split_op_name", "check_param_name", "SchemaParam",
           "parse_schema", "schema_of", "default_text", "returns_text", "kind_of", "IDENTIFIER", "SPEC_FILE"]

SPEC_FILE = Path(__file__).resolve().parents[1] / "runtime" / "csrc" / "bundle_spec.h"
_ROW = re.compile(r"^(KG_[A-Z_]+)\((.*)\)\s*$")
_ARG = re.compile(r'\s*("(?:[^"\\]|\\.)*"|[A-Za-z0-9_]+)\s*(?:,|$)')
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INT64 = (-(2**63), 2**63 - 1)


@dataclasses.dataclass(frozen=True)
class Spec:
    limits: dict[str, int]
    versions: dict[int, bool]              # version -> whether its RPN programs are read
    reserved_namespaces: frozenset[str]
    reserved_params: frozenset[str]
    param_kinds: dict[str, tuple[str, bool]]  # kind -> (schema type, is a tensor kind)
    kernel_param_kinds: frozenset[str]
    image_kinds: frozenset[str]
    dtypes: tuple[str, ...]
    triton_types: dict[str, str]           # dtype -> Triton's pointee type name
    c_types: dict[str, str]                # CUDA C++ type -> dtype
    str_default_chars: frozenset[str]


def _args(text: str, where: str) -> list[Any]:
    out, at = [], 0
    while at < len(text):
        m = _ARG.match(text, at)
        if not m or m.end() == at:
            raise ValueError(f"{where}: cannot read the arguments {text!r}")
        token = m.group(1)
        out.append(json.loads(token) if token.startswith('"') else int(token) if token.isdigit() else token)
        at = m.end()
    return out


@functools.cache
def table() -> Spec:
    """The rows of ``bundle_spec.h``."""
    rows: dict[str, list[list[Any]]] = {}
    for number, line in enumerate(SPEC_FILE.read_text().splitlines(), 1):
        m = _ROW.match(line)
        if m and not line.startswith("#"):
            rows.setdefault(m.group(1), []).append(_args(m.group(2), f"{SPEC_FILE.name}:{number}"))
    return Spec(
        limits={name: value for name, value in rows["KG_LIMIT"]},
        versions={number: bool(programs) for number, programs in rows["KG_VERSION"]},
        reserved_namespaces=frozenset(r[0] for r in rows["KG_RESERVED_NAMESPACE"]),
        reserved_params=frozenset(r[0] for r in rows["KG_RESERVED_PARAM"]),
        param_kinds={kind: (schema, bool(tensor)) for kind, schema, tensor in rows["KG_PARAM_KIND"]},
        kernel_param_kinds=frozenset(r[0] for r in rows["KG_KERNEL_PARAM_KIND"]),
        image_kinds=frozenset(r[0] for r in rows["KG_IMAGE_KIND"]),
        dtypes=tuple(r[0] for r in rows["KG_DTYPE"]),
        triton_types={dtype: name for dtype, name in rows["KG_TRITON_TYPE"]},
        c_types={c_type: dtype for c_type, dtype in rows["KG_C_TYPE"]},
        str_default_chars=frozenset(rows["KG_STR_DEFAULT_CHARS"][0][0]),
    )


def limit(name: str) -> int:
    return table().limits[name]


# --- JSON -----------------------------------------------------------------------------------

def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _int(text: str) -> int:
    value = int(text)
    if not _INT64[0] <= value <= _INT64[1]:
        raise ValueError(f"the integer {text[:40]} is outside int64")
    return value


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is not finite")
    return value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"the key {twice[:40]!r} appears twice in one object")
    return out


def loads(data: bytes, where: str) -> Any:
    """The JSON value of ``data`` under the bundle's JSON rules; BundleError naming ``where``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BundleError(f"{where} is not valid JSON (not UTF-8: {exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_refuse_constant,
                           object_pairs_hook=_object)
    except RecursionError:
        raise BundleError(f"{where} nests deeper than {limit('JSON_DEPTH')} levels") from None
    except (ValueError, MemoryError) as exc:
        raise BundleError(f"{where} is not valid JSON ({str(exc)[:200]})") from None
    _check_tree(value, where)
    return value


def _check_tree(value: Any, where: str) -> None:
    """Nesting depth and strings without lone surrogates, iteratively (a deep document would break
    a recursive walk)."""
    depth_cap = limit("JSON_DEPTH")
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > depth_cap:
            raise BundleError(f"{where} nests deeper than {depth_cap} levels")
        if isinstance(item, dict):
            for k, v in item.items():
                _text(k, where)
                if isinstance(v, (dict, list)):
                    stack.append((v, depth + 1))
                elif isinstance(v, str):
                    _text(v, where)
        elif isinstance(item, list):
            for v in item:
                if isinstance(v, (dict, list)):
                    stack.append((v, depth + 1))
                elif isinstance(v, str):
                    _text(v, where)


def _text(s: str, where: str) -> None:
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise BundleError(f"{where} is not valid JSON (a string holds a lone surrogate)") from None


# --- names and the schema grammar ---------------------------------------------------------

def split_op_name(name: Any) -> tuple[str, str] | str:
    """(namespace, name), or why ``name`` is not a bundle op name."""
    if not isinstance(name, str):
        return f"is {kind_of(name)}, not a string"
    ns, sep, short = name.partition("::")
    if len(name) > limit("NAME_CHARS"):
        return f"is {len(name)} characters, over the cap of {limit('NAME_CHARS')} (NAME_CHARS)"
    if not sep or not IDENTIFIER.match(ns) or not IDENTIFIER.match(short):
        return f"{name[:80]!r} is not NAMESPACE::NAME with identifier parts"
    if ns in table().reserved_namespaces:
        return f"{name!r}: namespace {ns!r} belongs to PyTorch"
    return ns, short


def check_param_name(name: Any) -> str | None:
    """Why ``name`` cannot name an op parameter, or None."""
    if not isinstance(name, str):
        return f"is {kind_of(name)}, not a string"
    if len(name) > limit("NAME_CHARS") or not IDENTIFIER.match(name):
        return f"{name[:80]!r} is not an identifier of at most {limit('NAME_CHARS')} characters"
    if name in table().reserved_params or re.fullmatch(r"out[0-9]+", name):
        return f"{name!r} is reserved (a keyword, an expression function or an output's name)"
    return None


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a bool", int: "an int", float: "a float", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


@dataclasses.dataclass(frozen=True)
class SchemaParam:
    """One parameter as the schema writes it."""

    type: str              # "Tensor", "SymInt", ...
    alias: int | None      # N of "(aN!)"
    is_list: bool          # "[]"
    optional: bool         # "?"
    name: str
    default: str | None    # the text after "=", None when there is none


_PARAM = re.compile(r"(Tensor|SymInt|float|bool|str|ScalarType)(?:\(a([0-9]+)!\))?(\[\])?(\?)? "
                    r"([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?\Z")


def parse_schema(schema: Any) -> tuple[list[SchemaParam], str] | str:
    """(params, returns) of a schema string in the grammar above, or why it is not one."""
    if not isinstance(schema, str):
        return f"is {kind_of(schema)}, not a string"
    head, sep, returns = schema.rpartition(") -> ")
    if not sep or not head.startswith("("):
        return "is not '(PARAMS) -> RETURNS'"
    params = []
    for part in (head[1:].split(", ") if head != "(" else []):
        m = _PARAM.match(part)
        if m is None:
            return f"parameter {part[:80]!r} is not 'TYPE NAME[=DEFAULT]'"
        params.append(SchemaParam(m.group(1), None if m.group(2) is None else int(m.group(2)), bool(m.group(3)),
                                  bool(m.group(4)), m.group(5), m.group(6)))
    return params, returns


def returns_text(returns: str, n_returns: int) -> str:
    if returns == "none":
        return "()"
    if returns == "tensor":
        return "Tensor"
    return "((Tensor))" if n_returns == 1 else "(" + ", ".join(["Tensor"] * n_returns) + ")"


def default_text(kind: str, value: Any) -> str | None:
    """The schema text of a (valid) default of ``kind``, or None when it is not one."""
    if value is None:
        return "None"
    if kind == "int" and type(value) is int:
        return str(value)
    if kind == "float" and type(value) in (int, float):
        return repr(value)
    if kind == "bool" and type(value) is bool:
        return repr(value)
    if kind == "str" and type(value) is str and len(value) <= limit("TEXT_CHARS") and (
            set(value) <= table().str_default_chars):
        return f'"{value}"'
    if kind == "dtype" and type(value) is str and value in table().dtypes:
        return value
    return None


def schema_of(params: list[dict], returns: str, n_returns: int) -> str:
    """The canonical schema of valid ``params`` (``?`` on every optional one): what the Python
    loader registers for an op it rebuilds."""
    parts = []
    for i, p in enumerate(params):
        schema_type, _ = table().param_kinds[p["kind"]]
        base, is_list = ("Tensor", True) if schema_type == "Tensor[]" else (schema_type, False)
        alias = f"(a{i}!)" if p["mutated"] else ""
        optional = "?" if p["optional"] and not is_list else ""
        default = "" if p["required"] else "=" + str(default_text(p["kind"], p["default"]))
        parts.append(f"{base}{alias}{'[]' if is_list else ''}{optional} {p['name']}{default}")
    return f"({', '.join(parts)}) -> {returns_text(returns, n_returns)}"
