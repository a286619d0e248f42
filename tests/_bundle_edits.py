"""Edits of a parsed bundle manifest for the corpus of tampered bundles (``_bundle_corpus``): the
helpers that change an expression's text and program together (``set_expr``) and derive the output
rules again from the kernels' programs (``resum``, with ``_program.meta_rules``, which both loaders
hold the manifest's rules equal to), the case wrappers, and the edits of guards and their rules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kernelgraft.aot import manifest as _manifest
from kernelgraft.aot.program import meta_rules
from kernelgraft.aot.rpn import compile_rpn


def resum(root: Path, m: dict) -> None:
    """Re-derive every op's output rules (from its kernels' programs) and write the manifest with a
    fresh checksum."""
    for op in m["ops"]:
        if "meta" in op:
            op["meta"] = meta_rules(op["candidates"])
    _manifest.write(root, m)


def names(op: dict) -> list[str]:
    return [p["name"] for p in op["params"]]


def kernels(m: dict, backend: str = "triton"):
    return [(op, k) for op in m["ops"] for c in op["candidates"] if c["backend"] == backend for k in c["kernels"]]


def first(m: dict, backend: str = "triton") -> tuple[dict, dict]:
    return kernels(m, backend)[0]


def set_expr(op: dict, k: dict, field: str, text, index: int | None = None) -> None:
    """Set an expression's text and its program together (guards: the list of texts, each with its
    own program)."""
    if field == "guards":
        k["guards"] = list(text)
        k["program"]["guards"] = [compile_rpn(g, names(op)) for g in text]
    elif field == "grid":
        k["grid"][index] = text
        k["program"]["grid"][index] = compile_rpn(text, names(op))
    else:
        k[field] = text
        k["program"][field] = compile_rpn(text, names(op))


def edited(fn: Callable[[dict], None]):
    """A case that edits the parsed manifest, then resums it."""
    def edit(root: Path, m: dict) -> None:
        fn(m)
        resum(root, m)

    return edit


def stale(fn: Callable[[dict], None]):
    """A case that edits the parsed manifest and writes it with a fresh checksum, its output rules
    as they were (not derived again)."""
    def edit(root: Path, m: dict) -> None:
        fn(m)
        _manifest.write(root, m)

    return edit


def raw(fn: Callable[[str], str]):
    """A case that edits manifest.json as text (no resum)."""
    def edit(root: Path, m: dict) -> None:
        path = root / "manifest.json"
        path.write_text(fn(path.read_text()))

    return edit


# --- guards: one program per text, a rule's guards those of them that read no stride -------

def add_stride_guard(m: dict) -> None:
    op, k = first(m)
    set_expr(op, k, "guards", k["guards"] + ["(x.stride(0) == 1)"])


def stride_guard_in_meta(root: Path, m: dict) -> None:
    """A kernel guards a stride (its rule leaves it out); the rule is written with it anyway: a Meta
    kernel would then give no shapes for the layouts the rule covers."""
    add_stride_guard(m)
    resum(root, m)
    op, k = first(m)
    sizes_only = [g for g in k["program"]["guards"] if not any(t[0] == "stride" for t in g)]
    rule = next(r for r in op["meta"] if r["guards"] == sizes_only and r["dtypes"] == k["dtypes"]
                and r["ranks"] == k["ranks"] and r["shapes"] == k["program"]["outputs"])
    rule["guards"].append(k["program"]["guards"][-1])
    _manifest.write(root, m)


def guard_program_edited(root: Path, m: dict) -> None:
    """A size guard edited (its text and program) after the rules were derived: the rules no longer
    follow from the kernels' programs."""
    op, k = first(m)
    at = next(i for i, g in enumerate(k["guards"]) if "stride" not in g)
    set_expr(op, k, "guards", k["guards"][:at] + ["(x.shape[0] >= 12345)"] + k["guards"][at + 1:])
    _manifest.write(root, m)


def drop_a_rule_guard(m: dict) -> None:
    max(m["ops"][0]["meta"], key=lambda r: len(r["guards"]))["guards"].pop()


def or_guard(m: dict) -> None:
    """Every add_relu kernel gains a guard whose top level is an ``or``, and a second guard: each
    compiles alone, so the kernel's guard is (a or b) and c, never a or (b and c)."""
    op = m["ops"][0]
    for c in op["candidates"]:
        for k in c["kernels"]:
            set_expr(op, k, "guards", k["guards"] + ["x.shape[0] < 4 or x.shape[0] > 8", "x.shape[0] % 2 == 0"])
