"""The overlap guard: no tensor argument may share an element with one the op mutates.

A kernel that writes an argument while reading another that overlaps it reads its own writes in
an order no one chose (the fuzz run saw 130-923 wrong bytes in the fp8 scatter), so such calls
are refused. Outputs are freshly allocated and cannot overlap anything.

Why per call: which tensors overlap depends on their data pointers, and the plan's key holds only
``data_ptr() & 15`` (a key on full pointers would make a plan per buffer). What the signature
fixes is decided here, once per plan: which pairs to compare, each tensor's extent in bytes, and
for each pair a rule that tells disjoint elements inside overlapping extents apart. The call then
reads one ``data_ptr()`` per tensor and does a few integer operations per pair: O(1) in the
tensors' sizes, and zero cost for every op that mutates nothing.

The rule for strided views of one buffer (interleaved K and V caches, ``kv[..., 0, :]`` and
``kv[..., 1, :]``). Take a modulus ``M`` (in bytes) that divides the byte stride of every
dimension of both tensors except some inner ones, and let ``W`` be the bytes those inner
dimensions span (``1 + sum((size - 1) * stride)`` elements). Every byte of a tensor then lies at
an offset from its pointer whose residue mod ``M`` is in ``[0, W)``; if ``W <= M``, two tensors
at pointer difference ``d`` can share a byte only if ``d mod M`` falls in ``(-W_b, W_a)`` mod
``M``. So ``W_a <= d mod M <= M - W_b`` proves them disjoint, exactly and for any sizes. For
interleaved K/V, ``M`` is the stride between heads (``2 * head_size`` elements) and each view
covers ``head_size`` of them. Of the moduli the strides offer, each pair keeps the one that
proves the most pointer differences disjoint.

The native replay runs the same comparisons in C++ (``guard.native``: per pair the arguments, the
extents and the rule) and hands an overlapping call back to this path, which raises; a guard over
list elements has no native form (``guard.native`` is None) and keeps its plan on Python.
"""

from __future__ import annotations

from typing import Any

from collections.abc import Callable, Sequence


from ..errors import InputError


__all__ = ["overlap_guard", "modular_rule"]

Layout = tuple[Sequence[int], Sequence[int], int]  # shape, strides (elements), element size


def _span(layout: Layout) -> int:
    shape, strides, size = layout
    return (sum((n - 1) * s for n, s in zip(shape, strides)) + 1) * size


def _inner_width(layout: Layout, modulus: int) -> int | None:
    """Bytes spanned by the dimensions whose byte stride ``modulus`` does not divide, or None
    when that exceeds ``modulus`` (the residues would wrap around)."""
    shape, strides, size = layout
    width = size
    for n, s in zip(shape, strides):
        if n > 1 and (s * size) % modulus:
            width += (n - 1) * s * size
    return width if width <= modulus else None


def modular_rule(a: Layout, b: Layout) -> tuple[int, int, int] | None:
    """``(M, W_a, W_b)`` of the module docstring for two layouts, or None when no modulus their
    strides offer can ever prove them disjoint."""
    moduli = {s * layout[2] for layout in (a, b) for n, s in zip(layout[0], layout[1]) if n > 1 and s > 0}
    best, best_key = None, None
    for m in sorted(moduli):
        wa, wb = _inner_width(a, m), _inner_width(b, m)
        if wa is None or wb is None or wa + wb > m:
            continue
        key = ((m - wa - wb + 1) / m, m)  # the share of pointer differences it proves disjoint
        if best_key is None or key > best_key:
            best, best_key = (m, wa, wb), key
    return best


def overlap_guard(op: Any, args: tuple) -> Callable[[tuple], None] | None:
    """The per-call check of the module docstring for ``args``' signature, or None when the op
    has nothing to check (no mutated argument, ``allow_overlap=True``, or no other non-empty
    tensor)."""
    mutated = set(op.signature.mutated)
    if op.allow_overlap or not mutated:
        return None
    items = []  # (name, arg index, list index or None, mutated, layout)
    for index, (param, value) in enumerate(zip(op.signature.params, args)):
        if value is None or param.kind not in ("tensor", "tensor_list"):
            continue
        listed = [(param.name, None, value)] if param.kind == "tensor" else [
            (f"{param.name}[{j}]", j, t) for j, t in enumerate(value)]
        for name, j, t in listed:
            if t.numel() == 0:
                continue
            items.append((name, index, j, index in mutated, (tuple(t.shape), tuple(t.stride()), t.element_size())))
    pairs = tuple((a, b) for a in range(len(items)) for b in range(len(items))
                  if a < b and (items[a][3] or items[b][3]))
    if not pairs:
        return None
    where = tuple((index, j) for _, index, j, _, _ in items)
    spans = tuple(_span(item[4]) for item in items)
    names = tuple(item[0] for item in items)
    writes = tuple(item[3] for item in items)
    # per pair: (a, b, span a, span b, M, W_a, W_b); M = 0: extents alone decide
    checks = tuple((a, b, spans[a], spans[b], *(modular_rule(items[a][4], items[b][4]) or (0, 0, 0)))
                   for a, b in pairs)
    name = op.name

    def guard(args: tuple) -> None:
        ptrs = [(args[i] if j is None else args[i][j]).data_ptr() for i, j in where]
        for a, b, span_a, span_b, m, wa, wb in checks:
            pa, pb = ptrs[a], ptrs[b]
            if pa < pb + span_b and pb < pa + span_a and not (m and wa <= (pb - pa) % m <= m - wb):
                first, second = (a, b) if writes[a] else (b, a)
                raise InputError(
                    f"{name}: argument {names[second]!r} overlaps the memory of argument "
                    f"{names[first]!r}, which the op mutates (elements of bytes {ptrs[second]:#x}+"
                    f"{spans[second]} and {ptrs[first]:#x}+{spans[first]} coincide); pass a separate "
                    "tensor (.clone()), or declare the op with kg.op(..., allow_overlap=True) if its "
                    "kernels handle overlapping arguments"
                )

    guard.native = (None if any(j is not None for _, j in where) else  # type: ignore[attr-defined]
                    tuple((where[a][0], where[b][0], sa, sb, m, wa, wb) for a, b, sa, sb, m, wa, wb in checks))
    return guard
