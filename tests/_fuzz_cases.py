"""The fuzz cases of ``test_fuzz.py``, run in a child process:
``python tests/_fuzz_cases.py SEED COUNT [--kinds K1,K2] [--only I1,I2]``.

Each case is one call of an example op (``kernelgraft.examples.MODULES``), made from the run's seed
and the case's index alone (``case_rngs``: its own ``random.Random``, ``torch.Generator`` and torch
seed), so a case is the same in every run and can be rerun alone with ``--only``. Kinds:

- inputs (``_fuzz_inputs.py``): good calls (any dtype the op takes, odd shapes, strided and
  expanded views, NaN/Inf, zero-size, aliasing inputs, inputs that require grad, meta tensors,
  views with the negative or conjugate bit) and bad ones (wrong dtype, rank, shape, device, type,
  overlapping a mutated argument, indices out of range, sizes that cannot be allocated, sparse,
  nested, quantized and mkldnn tensors);
- autograd routes (``_fuzz_autograd.py``): eager backward, a first call through torch.ops with
  grad, ``torch.func`` jvp/jacfwd/vjp/jacrev/grad, vmap, vmap(grad), forward-AD dual tensors;
- re-declaration under threads (``_fuzz_threads.py``): calls through every route while another
  thread replaces the op (same or another schema) or unregisters and declares it again.

The plan runs every kind on every op it applies to (``applies``) first, then random pairs. The
child prints one JSON line before a case (``{"case": ...}``) and one after (``{"done": ...}``), so a
crash leaves the case that caused it as the last line; a pair that found no case in its draws
prints ``{"na": ...}``. The verdicts:

- ``match``: the op returned, and ``kernelgraft.verify.oracle`` (the one oracle: float64 reference, the
  op's tolerances) accepts what it produced; for a route, its derivatives are the float64
  reference's; under threads, every call was legal.
- ``refused``: the op raised a kernelgraft error whose message names the op (and, for a bad
  argument the case knows, that argument), where refusing is honest.
- ``meta``: meta tensors in, meta tensors out with the shapes and dtypes the reference gives.
- ``FAIL``: anything else: a raw torch/triton exception, a result where the reference raises or
  where the op's contract says refuse, a result the oracle rejects, a good input refused, a
  gradient silently dropped, a call under threads that no version could give.
"""

from __future__ import annotations

import json
import os
import random
import sys
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import kernelgraft as kg  # noqa: E402
from kernelgraft.errors import describe  # noqa: E402
from kernelgraft.verify import oracle as _verify  # noqa: E402

import _fuzz_autograd  # noqa: E402
import _fuzz_threads  # noqa: E402
from _fuzz_autograd import AUTOGRAD_APPLIES, AUTOGRAD_KINDS, WITH_BACKWARD  # noqa: E402
from _fuzz_inputs import INPUT_APPLIES, INPUT_KINDS, LAYOUT_KINDS, OPS, Case, mutate  # noqa: E402
from _fuzz_threads import THREAD_KINDS  # noqa: E402

KINDS = {**INPUT_KINDS, **AUTOGRAD_KINDS, **THREAD_KINDS}
ATTEMPTS = 24  # draws for a kind that fits an op before the pair is reported as finding no case


def applies(kind: str, name: str, device: str = "cpu", native: bool | None = None) -> bool:
    """Whether kind ``kind`` fits op ``name`` at all (the default test checks each such pair ran).
    ``native``: whether the native replay is built (default: what the parent said)."""
    if kind in THREAD_KINDS:
        native = _fuzz_threads.native_available() if native is None else native
        return _fuzz_threads.applies(kind, name, device, native)
    ops = INPUT_APPLIES.get(kind) or AUTOGRAD_APPLIES.get(kind)
    return ops is None or name in ops


def build(kind: str, name: str, rng: random.Random, g: torch.Generator) -> Case | None:
    if kind in AUTOGRAD_KINDS:
        return _fuzz_autograd.build(kind, name, OPS[name], rng, g)
    if kind in THREAD_KINDS:
        return _fuzz_threads.build(kind, name, OPS[name], rng, g)
    return mutate(kind, name, OPS[name], rng, g)


# ----------------------------------------------------------------------------- judging
def _fail(why: str) -> dict:
    return {"outcome": "FAIL", "why": why}


def _produced(op, result, args):
    return [t for _, t in _verify._produced(op, result, args)]


def _documented_skip(args: list) -> list:
    """The fp8 scatter's documented CUDA behaviour for a slot past the cache: the token is skipped
    like a padding token (finding it would cost a host sync per call), so the expected result is
    the reference's on the same slots with those marked as padding."""
    k, cache, slots, *rest = args
    slots = torch.where(slots >= cache.shape[0] * cache.shape[1], -1, slots)
    return [k, cache, slots, *rest]


def judge(kind: str, op, case: Case) -> dict:
    """The verdict on one case of an input kind."""
    args, arg = case.args, case.arg
    expect = case.expect or KINDS[kind]
    if kind == "meta":
        return _judge_meta(op, args)
    ref_args = args
    if kind == "slot_out_of_range" and args[0].is_cuda and op is OPS["fp8_kcache_scatter"]:
        expect, ref_args = "either", _documented_skip(args)
    try:
        ref = None if kind == "huge" else _verify.reference(op, ref_args)
        ref_error = None
    except Exception as exc:  # the reference refuses these inputs
        ref, ref_error = None, exc
    grad = kind == "requires_grad"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ctx = torch.enable_grad() if grad else torch.no_grad() if kind == "requires_grad_no_grad" else _null()
            with ctx:
                result = op(*args)
    except kg.KernelgraftError as exc:
        return _judge_refusal(kind, expect, op, arg, exc)
    except Exception as exc:
        return _fail(f"raw {type(exc).__name__}: {str(exc)[:300]}")
    if kind == "huge":
        return _fail("an input whose output cannot be allocated was accepted")
    if ref is None:
        return _fail(f"the op returned a result where the reference raises "
                     f"{type(ref_error).__name__}: {str(ref_error)[:200]}")
    if expect == "refuse":
        return _fail("a bad input was accepted")
    produced = [t.detach() for t in _produced(op, result, args)]
    verdict = _verify.verify(ref, produced, op.tolerances)
    if not verdict.ok and not any(_verify.verify(_verify.reference(op, alt), produced, op.tolerances).ok
                                  for alt in _one_writer(case)):
        return _fail(f"silent wrong result: {verdict}")
    if grad:
        why = _judge_backward(op, args, result)
        if why:
            return _fail(why)
    return {"outcome": "match"}


def _one_writer(case: Case) -> list[list]:
    """A slot_mapping whose tokens all hold one slot: the documented result (kv_append: "two
    tokens with the same slot leave either one's row") is the reference's with any one of them
    writing it, the others padding. One argument list per token."""
    i = case.extra.get("one_writer")
    if i is None:
        return []
    slots = case.args[i]
    out = []
    for t in range(slots.shape[0]):
        alone = torch.full_like(slots, -1)
        alone[t] = slots[t]
        out.append([alone if j == i else a for j, a in enumerate(case.args)])
    return out


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _judge_refusal(kind, expect, op, arg, exc) -> dict:
    text = str(exc)
    if op.name not in text:
        return _fail(f"{type(exc).__name__} does not name the op: {text[:300]}")
    if arg is not None and f"'{arg}'" not in text and f" {arg} " not in text:
        return _fail(f"{type(exc).__name__} does not name argument {arg!r}: {text[:300]}")
    if expect == "match" and not (kind in LAYOUT_KINDS and "contiguous" in text):
        return _fail(f"a good input was refused: {type(exc).__name__}: {text[:300]}")
    return {"outcome": "refused", "error": type(exc).__name__}


def _judge_backward(op, args, result) -> str | None:
    """An op with a backward gives gradients; one without raises a kernelgraft error naming it
    when backward runs (never a silently missing gradient)."""
    outs = [t for t in _produced(op, result, args) if t.requires_grad]
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if not outs:
        return None if op.signature.returns == "none" else "the output does not require grad"
    try:
        torch.autograd.backward([o.float().sum() for o in outs])
    except kg.KernelgraftError as exc:
        if op.name.split("::")[1] in WITH_BACKWARD:
            return f"backward of an op with a backward raised: {exc}"
        return None if op.name in str(exc) else f"the backward error does not name the op: {exc}"
    except Exception as exc:
        return f"backward raised raw {type(exc).__name__}: {str(exc)[:200]}"
    if op._autograd is None:
        return "backward of an op without a backward ran and gave no error"
    if any(a.grad is None for a in leaves):
        return "a gradient is missing"
    return None


def _judge_meta(op, args) -> dict:
    try:
        with torch.no_grad():
            want = op.reference(*_verify.clone(tuple(args)))
        want_error = None
    except Exception as exc:
        want, want_error = None, exc
        try:  # an op's registered meta function answers where its reference cannot run on meta tensors
            with torch.no_grad():
                want, want_error = op.overload(*_verify.clone(tuple(args))), None
        except Exception:
            pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = op(*args)
    except kg.KernelgraftError as exc:
        if op.name not in str(exc):
            return _fail(f"the error does not name the op: {exc}")
        return {"outcome": "refused", "error": type(exc).__name__}
    except Exception as exc:
        return _fail(f"raw {type(exc).__name__}: {str(exc)[:300]}")
    if want_error is not None:
        return _fail(f"meta: the op returned where the reference raises {want_error!r}")
    got_l = [got] if isinstance(got, torch.Tensor) else list(got or ())
    want_l = [want] if isinstance(want, torch.Tensor) else list(want or ())
    spec = [(tuple(t.shape), t.dtype, t.device.type) for t in got_l]
    want_spec = [(tuple(t.shape), t.dtype, t.device.type) for t in want_l]
    if spec != want_spec:
        return _fail(f"meta outputs {spec}, the reference gives {want_spec}")
    return {"outcome": "meta"}


# ----------------------------------------------------------------------------- the run
def plan(seed: int, count: int, kinds, device: str) -> list[tuple[str, str]]:
    """(op, kind) per index: every applicable pair in a fixed order, then random applicable pairs."""
    pairs = [(name, kind) for kind in kinds for name in OPS if applies(kind, name, device)]
    rng = random.Random(f"fuzz-plan:{seed}")
    out = list(pairs)
    while len(out) < count:
        out.append(pairs[rng.randrange(len(pairs))])
    return out[:count]


def case_rngs(seed: int, index: int, attempt: int) -> tuple[random.Random, torch.Generator]:
    """The generators of case ``index`` (draw ``attempt``): from the seed and the index alone.
    torch's global generator is seeded too (``randn_like`` and the like draw from it)."""
    mixed = (seed * 1_000_003 + index) * 101 + attempt
    torch.manual_seed(mixed)
    return random.Random(f"fuzz-case:{seed}:{index}:{attempt}"), torch.Generator().manual_seed(mixed)


def _describe(args) -> str:
    return ", ".join(describe(a) if isinstance(a, torch.Tensor) else repr(a)[:40] for a in args)


def to_device(args: list, device: str) -> list:
    """``args`` on ``device`` with their layouts and sharing kept: each storage is copied once and
    every tensor viewed on its copy the way it viewed the original (aliasing views stay aliased,
    expanded ones expanded)."""
    if device == "cpu":
        return args
    copies: dict[int, torch.Tensor] = {}

    def move(t):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return t
        if t.layout != torch.strided or t.is_nested or t.is_quantized:
            try:
                return t.to(device)
            except Exception:  # no such tensor there (mkldnn): the refusal names it on CPU too
                return t
        if t.is_neg():  # the memory moved as it is, the bit kept
            return torch._neg_view(move(torch._neg_view(t)))
        storage = t.untyped_storage()
        raw = copies.get(storage.data_ptr())
        if raw is None:
            raw = copies[storage.data_ptr()] = torch.empty(0, dtype=torch.uint8).set_(
                storage, 0, (storage.nbytes(),), (1,)).to(device)
        out = torch.empty(0, dtype=t.dtype, device=device).set_(
            raw.untyped_storage(), t.storage_offset(), t.shape, t.stride())
        return out.requires_grad_(t.requires_grad)

    return [move(a) for a in args]


def run_case(seed: int, index: int, name: str, kind: str, device: str) -> None:
    for attempt in range(ATTEMPTS):
        rng, g = case_rngs(seed, index, attempt)
        try:
            case = build(kind, name, rng, g)
        except Exception:  # the fuzz's own bug: a failed case, not a dead run
            print(json.dumps({"case": index, "op": name, "kind": kind, "detail": "", "args": ""}), flush=True)
            print(json.dumps({"done": index, **_fail("building the case raised: " + traceback.format_exc()[-800:])}),
                  flush=True)
            return
        if case is not None:
            break
    else:
        print(json.dumps({"na": index, "op": name, "kind": kind}), flush=True)
        return
    case.args = to_device(case.args, device)
    print(json.dumps({"case": index, "op": name, "kind": kind, "detail": case.detail,
                      "args": _describe(case.args)}), flush=True)
    try:
        if kind in AUTOGRAD_KINDS:
            verdict = _fuzz_autograd.judge(kind, name, OPS[name], case, index)
        elif kind in THREAD_KINDS:
            verdict = _fuzz_threads.judge(kind, name, OPS[name], case, index)
        else:
            verdict = judge(kind, OPS[name], case)
    except Exception:  # the judge itself failed: report it as the case's failure
        verdict = _fail("the fuzz judge raised: " + traceback.format_exc()[-800:])
    print(json.dumps({"done": index, **verdict}), flush=True)


def main(argv: list[str]) -> None:
    seed, count = int(argv[0]), int(argv[1])
    kinds, only = list(KINDS), None  # only: the indices to run (a case alone is the same case)
    rest = argv[2:]
    while rest:
        flag, value, *rest = rest
        if flag == "--kinds":
            kinds = [k for k in value.split(",") if k]
            unknown = [k for k in kinds if k not in KINDS]
            if unknown:
                raise SystemExit(f"unknown kinds {unknown}; the kinds are {list(KINDS)}")
        elif flag == "--only":
            only = {int(i) for i in value.split(",") if i}
        else:
            raise SystemExit(f"unknown option {flag}")
    device = os.environ.get("FUZZ_DEVICE", "cpu")
    for index, (name, kind) in enumerate(plan(seed, count, kinds, device)):
        if only is None or index in only:
            run_case(seed, index, name, kind, device)


if __name__ == "__main__":
    os.environ.setdefault("KERNELGRAFT_TUNE", "off")
    main(sys.argv[1:])
