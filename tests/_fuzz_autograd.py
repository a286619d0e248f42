"""The autograd routes of the fuzz cases (``_fuzz_cases.py``): each route through an example op
either gives the reference's derivative or raises a kernelgraft error naming the op.

Routes (one kind each): eager ``.backward()`` through the op object or ``torch.ops``
(``ad_backward``); the first call of a new op through ``torch.ops`` with grad (``ad_ops_first``: a
fuzz-local copy of the example, with a backward or without); ``torch.func.jvp``, ``jacfwd``,
``vjp``, ``jacrev``, ``grad``; ``torch.vmap`` of the op (``ad_vmap``) and of ``grad``
(``ad_vmap_grad``); and dual tensors of ``torch.autograd.forward_ad`` (``ad_forward_ad``).

The expected derivative is the same route run by torch.autograd on the op's reference with every
floating input in float64 (the tangents and cotangents are the same numbers). A derivative is
judged by the oracle's rule (``kernelgraft.verify.oracle.compare``) with the op's ``rtol`` for its
dtype widened by ``NATIVE_WIDEN``: it is computed at the inputs' precision (forward mode runs the
reference there; a backward runs in the op's dtype), as a reference that cannot run in float64
is compared. ``vmap`` is judged per batch element by the oracle itself.

A refusal is honest only where the route cannot give a derivative: reverse mode through an op
without a backward, grad through an op that writes a floating tensor, ``vmap`` (and ``jacfwd``,
which uses it) of an op that mutates. A refusal elsewhere (forward mode, a reverse route of an op
with a backward, ``vmap`` of a functional op) fails the case.
"""

from __future__ import annotations

import random

import torch
from torch.autograd import forward_ad as fwad

import kernelgraft as kg
from kernelgraft.verify import oracle as _verify

import _fuzz_local
from _fuzz_inputs import OPS, Case, good_args, pname, tensor_params

ROUTES = ("ad_backward", "ad_ops_first", "ad_jvp", "ad_jacfwd", "ad_forward_ad", "ad_vjp", "ad_jacrev",
          "ad_grad", "ad_vmap", "ad_vmap_grad")
AUTOGRAD_KINDS = {kind: "either" for kind in ROUTES}
FORWARD = {"ad_jvp", "ad_jacfwd", "ad_forward_ad"}
REVERSE = {"ad_backward", "ad_ops_first", "ad_vjp", "ad_jacrev", "ad_grad", "ad_vmap_grad"}
WITH_BACKWARD = {"swiglu"}  # the example ops that declare a backward
# An op that produces no floating tensor (the fp8 scatter writes bytes) has no derivative for a
# transform to return: it runs through eager grad mode, dual tensors and vmap only.
_TRANSFORMS = ("ad_jvp", "ad_jacfwd", "ad_vjp", "ad_jacrev", "ad_grad", "ad_vmap_grad")
AUTOGRAD_APPLIES = {kind: tuple(n for n in OPS if n != "fp8_kcache_scatter") for kind in _TRANSFORMS}
_WIDE = {torch.float16, torch.bfloat16, torch.float32, torch.float64}


def _fail(why: str) -> dict:
    return {"outcome": "FAIL", "why": why}


# ----------------------------------------------------------------------------- building
def build(kind: str, name: str, op, rng: random.Random, g: torch.Generator) -> Case | None:
    """Small, smooth arguments (a Jacobian of each output; no ties where the op selects), the
    positions differentiated (a random non-empty subset), and for forward mode sometimes a NaN
    and an Inf in one input."""
    args = list(good_args(name, rng, g, small=True, smooth=True))
    forward = kind in FORWARD
    pos = [i for i in tensor_params(op, args, floating=True, mutated=None if forward else False) if args[i].numel()]
    if kind in ("ad_jacfwd", "ad_vmap", "ad_vmap_grad"):
        pos = [i for i in pos if i not in op.signature.mutated]
    if not pos:
        return None
    pos = sorted(rng.sample(pos, rng.randint(1, len(pos))))
    if forward and name != "topk_router" and rng.random() < 0.25:
        t = args[pos[0]]
        t[(0,) * t.dim()], t[(-1,) * t.dim()] = float("nan"), float("inf")
    extra = {"pos": pos, "via": rng.choice(("op", "torch.ops")), "seed": rng.randrange(2**31),
             "backward": rng.random() < 0.5}
    detail = f"d/d({', '.join(pname(op, i) for i in pos)}) via {extra['via']}"
    if kind == "ad_ops_first":
        detail += ", with a backward" if extra["backward"] and not op.mutates_args else ", no backward"
    return Case(args, None, detail, extra=extra)


# ----------------------------------------------------------------------------- the routes
def _floating(ts) -> list:
    return [t for t in ts if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _call(fn, op, args, pos, ts) -> list:
    """``fn`` on a copy of ``args`` with ``ts`` at ``pos``: what it produced (returned tensors,
    then mutated arguments)."""
    full = list(_verify.clone(tuple(args)))
    for i, t in zip(pos, ts):
        full[i] = t
    return [t for _, t in _verify._produced(op, fn(*full), full)]


def _draw(shapes, seed: int, dtypes, device) -> list:
    """Tangents or cotangents: the same numbers for the op (``dtypes``: the op's) and, upcast
    exactly, for the float64 reference."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(tuple(s), generator=g).to(dt).to(device) for s, dt in zip(shapes, dtypes)]


def _loss(outs, weights):
    return sum((o * w.to(o.dtype)).sum() for o, w in zip(outs, weights))


def _labels(prefix, op, pos):
    return [f"{prefix} {pname(op, i)}" for i in pos]


def route(kind: str, fn, op, args: list, pos: list, tangents: list, weights: list) -> list:
    """Run route ``kind`` with ``fn`` (the op, ``torch.ops``, or the reference): its derivatives
    (and transformed outputs) as ``[(label, tensor or None)]``, the same labels for every ``fn``."""
    primals = [args[i] for i in pos]

    def f(*ts):
        return tuple(_floating(_call(fn, op, args, pos, ts)))

    def loss(*ts):
        return _loss(f(*ts), weights)

    argnums = tuple(range(len(pos)))
    if kind in ("ad_backward", "ad_ops_first"):
        leaves = [p.detach().clone().requires_grad_() for p in primals]
        with torch.enable_grad():
            outs = [o for o in f(*leaves) if o.requires_grad]
            if outs:
                torch.autograd.backward([(o * w.to(o.dtype)).sum() for o, w in zip(outs, weights)])
        return list(zip(_labels("grad", op, pos), [leaf.grad for leaf in leaves]))
    if kind == "ad_grad":
        return list(zip(_labels("grad", op, pos), torch.func.grad(loss, argnums=argnums)(*primals)))
    if kind == "ad_vjp":
        outs, vjp = torch.func.vjp(f, *primals)
        grads = vjp(tuple(w.to(o.dtype) for o, w in zip(outs, weights)))
        return [(f"output {k}", o) for k, o in enumerate(outs)] + list(zip(_labels("grad", op, pos), grads))
    if kind in ("ad_jacrev", "ad_jacfwd"):
        jac = (torch.func.jacrev if kind == "ad_jacrev" else torch.func.jacfwd)(f, argnums=argnums)(*primals)
        return [(f"d output {k} / d {pname(op, i)}", jac[k][j]) for k in range(len(jac)) for j, i in enumerate(pos)]
    if kind == "ad_jvp":
        outs, touts = torch.func.jvp(f, tuple(primals), tuple(tangents))
        return ([(f"output {k}", o) for k, o in enumerate(outs)]
                + [(f"tangent of output {k}", t) for k, t in enumerate(touts)])
    if kind == "ad_forward_ad":
        with fwad.dual_level():
            duals = [fwad.make_dual(p.clone(), t) for p, t in zip(primals, tangents)]
            produced = _floating(_call(fn, op, args, pos, duals))
            return [(f"tangent of output {k}", fwad.unpack_dual(o).tangent) for k, o in enumerate(produced)]
    raise AssertionError(kind)


# ----------------------------------------------------------------------------- judging
def _widened(op) -> dict:
    return {dt: _verify.rtol_for(dt, op.tolerances) * _verify.NATIVE_WIDEN for dt in _WIDE}


def _close(what: str, got, want, op, native=None) -> str | None:
    """None when ``got`` is ``want`` (the float64 route) under the rule; ``native()`` gives the
    same derivative of the reference at the inputs' precision, asked for only when the rule fails:
    twice its own error is allowed on top (where a derivative cancels to about zero, as that of
    renormalised weights over one expert, rounding decides its value, the reference's too)."""
    if want is None or (isinstance(want, torch.Tensor) and not want.is_floating_point()):
        if got is None or not bool(torch.as_tensor(got).detach().abs().sum() > 0):
            return None  # nothing to carry (an output that does not depend on the inputs)
        return f"{what}: {got!r} where the reference gives none"
    if got is None:
        return f"{what}: missing (None) where the reference gives one: a derivative was dropped"
    rtol = _verify.rtol_for(got.dtype, op.tolerances) * _verify.NATIVE_WIDEN
    outcome = _verify.compare(got.detach(), want.detach(), what=what, rtol=rtol)
    if outcome.ok or native is None:
        return outcome.problem
    n = native()
    if n is None or tuple(n.shape) != tuple(got.shape):
        return outcome.problem
    g, w, n = (t.detach().to(got.device, torch.float64) for t in (got, want, n))
    finite = torch.isfinite(w)
    scale = float(w[finite].abs().pow(2).mean().sqrt()) if bool(finite.any()) else 0.0
    slack = torch.where(torch.isfinite(n) & finite, (n - w).abs() * 2, torch.zeros_like(w))
    err = torch.where(finite, (g - w).abs(), torch.zeros_like(w))
    ok_finite = ~finite | (err <= rtol * (w.abs() + scale) + slack)
    # where the float64 derivative is NaN or Inf: the native one's value (the op runs at that precision)
    same_special = finite | (torch.isnan(g) & torch.isnan(w)) | (g == w) | (torch.isnan(g) & torch.isnan(n)) | (g == n)
    if bool((ok_finite & same_special).all()):
        return None
    return outcome.problem + " (also past twice the reference's own error at the inputs' precision)"


def _may_refuse(kind: str, op, has_backward: bool) -> bool:
    mutating = bool(op.signature.mutated)
    if kind in ("ad_vmap", "ad_jacfwd", "ad_vmap_grad") and mutating:
        return True  # vmap refuses an op that mutates
    if kind in REVERSE:
        return not has_backward
    return False


def _refusal(kind, target, exc, has_backward) -> dict:
    text = str(exc)
    if target.name not in text:
        return _fail(f"{type(exc).__name__} does not name the op: {text[:300]}")
    if not _may_refuse(kind, target, has_backward):
        return _fail(f"a route that must give the derivative refused: {type(exc).__name__}: {text[:300]}")
    return {"outcome": "refused", "error": type(exc).__name__}


def judge(kind: str, name: str, op, case: Case, index: int) -> dict:
    args, extra = case.args, case.extra
    pos = extra["pos"]
    if kind in ("ad_vmap", "ad_vmap_grad"):
        return _judge_vmap(kind, op, case, name in WITH_BACKWARD)
    target, has_backward = op, name in WITH_BACKWARD
    if kind == "ad_ops_first":  # a new op: nothing has called it yet
        has_backward = extra["backward"] and not op.mutates_args
        target = _fuzz_local.declare(op, f"{name}_first{index}", backward=has_backward)
    try:
        return _judge_route(kind, op, target, args, pos, extra, has_backward)
    finally:
        if target is not op:
            kg.unregister(target)


def _judge_route(kind, op, target, args, pos, extra, has_backward) -> dict:
    device = args[pos[0]].device
    native = _verify.reference(op, args)
    outs = [e.native for e in native.expected if e.native.is_floating_point()]
    weights = _draw([o.shape for o in outs], extra["seed"], [o.dtype for o in outs], device)
    tangents = _draw([args[i].shape for i in pos], extra["seed"] + 1, [args[i].dtype for i in pos], device)
    wide_args = list(_verify.upcast(_verify.clone(tuple(args))))
    try:
        want = route(kind, op.reference, op, wide_args, pos, [t.double() for t in tangents],
                     [w.double() for w in weights])
        want_error = None
    except Exception as exc:  # the route itself refuses these (in-place writes of a tracked value)
        want, want_error = None, exc
    if kind == "ad_ops_first":  # through torch.ops, looked up by name
        fn = getattr(getattr(torch.ops, _fuzz_local.NS), target.name.split("::")[1])
    else:
        fn = target if extra["via"] == "op" else target.overload
    try:
        got = route(kind, fn, op, args, pos, tangents, weights)
    except kg.KernelgraftError as exc:
        return _refusal(kind, target, exc, has_backward)
    except Exception as exc:
        return _fail(f"raw {type(exc).__name__}: {str(exc)[:300]}")
    if want_error is not None:
        return _fail(f"the op gave derivatives where the reference's route raises "
                     f"{type(want_error).__name__}: {str(want_error)[:200]}")
    if [label for label, _ in got] != [label for label, _ in want]:
        return _fail(f"the op gave {[lb for lb, _ in got]}, the reference {[lb for lb, _ in want]}")
    if kind in REVERSE and not has_backward and not op.signature.mutated:
        return _fail("reverse mode through an op without a backward ran and raised no error")
    native_route: list = []

    def native_at(k: int):
        def get():  # the same route on the reference at the inputs' precision, run once if asked
            if not native_route:
                try:
                    native_route.append(route(kind, op.reference, op, args, pos, tangents, weights))
                except Exception:
                    native_route.append(None)
            return None if native_route[0] is None else native_route[0][k][1]
        return get

    for k, ((label, g), (_, w)) in enumerate(zip(got, want)):
        problem = _close(label, g, w, op, native_at(k))
        if problem:
            return _fail(problem)
    if kind in ("ad_backward", "ad_ops_first", "ad_forward_ad"):
        return _judge_values(kind, op, fn, args, pos, native)
    return {"outcome": "match"}


def _judge_values(kind, op, fn, args, pos, native) -> dict:
    """The values of the call itself (grad mode on, or dual tensors): the oracle's verdict, with
    the rule widened where forward mode serves the reference at the inputs' precision."""
    if kind == "ad_forward_ad":
        with fwad.dual_level():
            duals = [fwad.make_dual(args[i].clone(), torch.ones_like(args[i])) for i in pos]
            produced = [fwad.unpack_dual(t).primal for t in _call(fn, op, args, pos, duals)]
        tolerances = _widened(op)
    else:
        leaves = [args[i].detach().clone().requires_grad_() for i in pos]
        with torch.enable_grad():
            produced = [t.detach() for t in _call(fn, op, args, pos, leaves)]
        tolerances = op.tolerances
    verdict = _verify.verify(native, produced, tolerances)
    return {"outcome": "match"} if verdict.ok else _fail(f"silent wrong result under {kind}: {verdict}")


def _judge_vmap(kind, op, case: Case, has_backward: bool) -> dict:
    """vmap over a batch of two: each element as the op gives it alone (the oracle) or, for
    ``vmap(grad)``, as the float64 reference's gradient gives it."""
    args, pos, extra = case.args, case.extra["pos"], case.extra
    vary = pos if kind == "ad_vmap_grad" else tensor_params(op, args, floating=True, mutated=False)
    second = list(args)
    for i in vary:  # exact in every dtype, and no new ties where the op selects
        second[i] = args[i].flip(-1) * -0.5 if args[i].dim() else args[i] * -0.5
    batched_at = vary if kind == "ad_vmap_grad" else tensor_params(op, args, floating=True)
    batched = [torch.stack([args[i], second[i]]) if i in batched_at else a for i, a in enumerate(args)]
    fn = op if extra["via"] == "op" else op.overload
    outs_spec = [e.native for e in _verify.reference(op, args).expected if e.native.is_floating_point()]
    weights = _draw([o.shape for o in outs_spec], extra["seed"], [o.dtype for o in outs_spec], args[pos[0]].device)
    try:
        if kind == "ad_vmap":
            in_dims = tuple(0 if i in batched_at else None for i in range(len(args)))
            got = torch.vmap(fn, in_dims=in_dims)(*batched)
        else:
            def loss(*ts):
                return _loss(_floating(_call(fn, op, args, pos, ts)), weights)

            got = torch.vmap(torch.func.grad(loss, argnums=tuple(range(len(pos)))))(*[batched[i] for i in pos])
    except kg.KernelgraftError as exc:
        return _refusal(kind, op, exc, has_backward)
    except Exception as exc:
        return _fail(f"raw {type(exc).__name__}: {str(exc)[:300]}")
    if kind == "ad_vmap_grad" and not has_backward:
        return _fail("vmap(grad) through an op without a backward ran and raised no error")
    for b, element in enumerate((args, second)):
        if kind == "ad_vmap":
            outs = got if isinstance(got, tuple) else () if got is None else (got,)
            verdict = _verify.verify(_verify.reference(op, element), [o[b] for o in outs], op.tolerances)
            if not verdict.ok:
                return _fail(f"vmap, element {b}: {verdict}")
            continue
        wide = list(_verify.upcast(_verify.clone(tuple(element))))
        want = route("ad_grad", op.reference, op, wide, pos, [], [w.double() for w in weights])
        for j, (label, w) in enumerate(want):
            def native(element=element, j=j):
                return route("ad_grad", op.reference, op, element, pos, [], weights)[j][1]

            problem = _close(f"element {b}, {label}", got[j][b], w, op, native)
            if problem:
                return _fail(problem)
    return {"outcome": "match"}
