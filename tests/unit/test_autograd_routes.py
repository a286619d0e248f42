"""No gradient vanishes: every autograd route through a kernelgraft op computes the reference's
gradient, or raises an error that names the op (and, for reverse mode, says how to add a backward).

Routes: eager ``.backward()``; the first call through ``torch.ops``; torch.compile (aot_eager,
inductor) in a fresh process; forward mode (``torch.func.jvp``, ``jacfwd``,
``torch.autograd.forward_ad``); ``torch.vmap`` of the op and of ``grad``; ``jacrev``. Over every
example op (only ``swiglu`` declares a backward) and user ops with and without one, with a
``Tensor[]`` argument, with several outputs, and ops that mutate.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch.autograd import forward_ad as fwAD

import kernelgraft as kg
from kernelgraft.examples.add_relu import add_relu
from kernelgraft.examples.gemm import gemm
from kernelgraft.examples.rmsnorm import rmsnorm
from kernelgraft.examples.rmsnorm_residual import rmsnorm_residual
from kernelgraft.examples.softmax import softmax
from kernelgraft.examples.swiglu import swiglu

NO_BACKWARD = r"has no backward.*register_autograd"


def _randn(gen, *shape, dtype=torch.float32, special=False):
    t = torch.randn(*shape, generator=gen, dtype=dtype) * 2
    if special:  # a NaN and an Inf where one fits: tangents must carry them as the reference does
        flat = t.view(-1)
        flat[0] = float("nan")
        flat[-1] = float("inf")
    return t


def _example_args(name: str, seed: int = 0, special: bool = False) -> tuple:
    g = torch.Generator().manual_seed(seed)
    if name == "add_relu":
        return _randn(g, 3, 5, special=special), _randn(g, 3, 5)
    if name == "rmsnorm":
        return _randn(g, 3, 8, special=special), _randn(g, 8), 1e-6
    if name == "rmsnorm_residual":
        return _randn(g, 3, 8, special=special), _randn(g, 3, 8), _randn(g, 8), 1e-6
    if name == "swiglu":
        return _randn(g, 3, 7, dtype=torch.float64, special=special), _randn(g, 3, 7, dtype=torch.float64)
    if name == "softmax":
        return (_randn(g, 3, 9, special=special),)
    if name == "gemm":
        return _randn(g, 4, 6, special=special), _randn(g, 6, 5)
    raise AssertionError(name)


EXAMPLES = {"add_relu": add_relu, "rmsnorm": rmsnorm, "rmsnorm_residual": rmsnorm_residual,
            "swiglu": swiglu, "softmax": softmax, "gemm": gemm}
WITH_BACKWARD = {"swiglu"}


def _tensor_positions(args) -> tuple[int, ...]:
    return tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))


def _outputs(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def _same(got, want, **tol):
    for g, w in zip(_outputs(got), _outputs(want), strict=True):
        torch.testing.assert_close(g, w, equal_nan=True, **tol)


def _flat_sum(out):
    return sum(o.sum() for o in _outputs(out))


# ------------------------------------------------------------------ forward mode
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_forward_mode_gives_the_references_tangent(name):
    """jvp, jacfwd and forward_ad dual tensors, through the op object and torch.ops: the tangent
    (and value) of the reference, never a zero or missing tangent."""
    op = EXAMPLES[name]
    ref = op.reference
    args = _example_args(name, seed=1, special=True)
    pos = _tensor_positions(args)
    g = torch.Generator().manual_seed(2)
    tangents = {i: torch.randn(args[i].shape, generator=g, dtype=args[i].dtype) for i in pos}

    def on(fn, which=pos):
        def f(*ts):
            full = list(args)
            for i, t in zip(which, ts):
                full[i] = t
            return fn(*full)
        return f

    primals = tuple(args[i] for i in pos)
    tans = tuple(tangents[i] for i in pos)
    want_out, want_t = torch.func.jvp(on(ref), primals, tans)
    got_out, got_t = torch.func.jvp(on(op), primals, tans)
    _same(got_t, want_t, rtol=0, atol=0)
    _same(got_out, want_out, rtol=0, atol=0)

    overload = op.overload
    for fn in (op, overload):
        with fwAD.dual_level():
            duals = list(args)
            for i in pos:
                duals[i] = fwAD.make_dual(args[i], tangents[i])
            out = fn(*duals)
            got = tuple(fwAD.unpack_dual(o).tangent for o in _outputs(out))
        assert all(t is not None for t in got), f"{op.name}: forward_ad lost the tangent"
        _same(got, want_t, rtol=0, atol=0)

    clean = _example_args(name, seed=3)
    x0 = clean[pos[0]]
    jac_want = torch.func.jacfwd(on(ref, pos[:1]))(x0)
    jac_got = torch.func.jacfwd(on(op, pos[:1]))(x0)
    _same(jac_got, jac_want, rtol=0, atol=0)
    if name == "add_relu":  # the op's argument checks still apply (it declares no float64)
        x = torch.randn(3, 5, dtype=torch.float64)
        with pytest.raises(kg.InputError, match=r"kgexamples::add_relu: argument 'x' expected dtype"):
            torch.func.jvp(add_relu, (x, x), (x, x))


# ------------------------------------------------------------------ reverse mode
def _requiring_grad(args):
    return tuple(a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_reverse_routes_compute_the_gradient_or_raise_naming_the_op(name):
    """Eager .backward() through the op object and through torch.ops, torch.func.grad, jacrev
    and vmap(grad): the reference's gradient where the op has a backward, else an
    UnsupportedError naming the op and register_autograd (never a raw torch error, never None)."""
    op = EXAMPLES[name]
    args = _example_args(name, seed=4)
    pos = _tensor_positions(args)
    has_backward = name in WITH_BACKWARD

    def grads_of(fn, call_args):
        leaves = _requiring_grad(call_args)
        torch.autograd.backward([o.sum() for o in _outputs(fn(*leaves))])
        return [leaves[i].grad for i in pos]

    def loss(fn):
        def f(*ts):
            full = list(args)
            for i, t in zip(pos, ts):
                full[i] = t
            return _flat_sum(fn(*full))
        return f

    primals = tuple(args[i] for i in pos)
    batched = tuple(torch.stack([p, p.flip(0)]) for p in primals)
    routes = {
        "eager": lambda fn: grads_of(fn, args),
        "grad": lambda fn: torch.func.grad(loss(fn), argnums=tuple(range(len(pos))))(*primals),
        "jacrev": lambda fn: torch.func.jacrev(lambda *ts: _outputs(
            fn(*[ts[pos.index(i)] if i in pos else a for i, a in enumerate(args)]))[0],
            argnums=tuple(range(len(pos))))(*primals),
        "vmap(grad)": lambda fn: torch.vmap(torch.func.grad(loss(fn), argnums=tuple(range(len(pos)))))(*batched),
    }
    for route, run in routes.items():
        for fn in (op, op.overload):
            if has_backward:
                got, want = run(fn), run(op.reference)
                for g, w in zip(got, want, strict=True):
                    assert g is not None, f"{op.name}: {route} lost the gradient"
                    torch.testing.assert_close(g, w)
            else:
                with pytest.raises(kg.UnsupportedError, match=op.name.replace(":", r"\:") + " " + NO_BACKWARD):
                    run(fn)


def test_swiglu_passes_gradcheck_in_both_modes_and_batched():
    gate, up = _requiring_grad(_example_args("swiglu", seed=5))
    assert torch.autograd.gradcheck(swiglu, (gate, up), check_forward_ad=True, check_batched_grad=True,
                                     check_batched_forward_grad=True)
    assert torch.autograd.gradcheck(swiglu.overload, (gate, up), check_forward_ad=True)


def test_a_first_torch_ops_call_with_grad_never_loses_the_gradient():
    """The op's autograd kernel is there from definition: the first call of a new op, through
    torch.ops, in grad mode, refuses at backward (it has no backward) or computes the gradient."""

    @kg.op("tagroutes::first_no_backward")
    def first_no_backward(x: torch.Tensor) -> torch.Tensor:
        return x * 3 + 1

    @kg.op("tagroutes::first_backward")
    def first_backward(x: torch.Tensor) -> torch.Tensor:
        return x * 3 + 1

    first_backward.register_autograd(lambda ctx, g: g * 3)
    x = torch.randn(6, requires_grad=True)
    out = torch.ops.tagroutes.first_no_backward(x)
    assert out.requires_grad
    with pytest.raises(kg.UnsupportedError, match="tagroutes::first_no_backward " + NO_BACKWARD):
        out.sum().backward()
    assert x.grad is None
    torch.ops.tagroutes.first_backward(x).sum().backward()
    assert torch.equal(x.grad, torch.full((6,), 3.0))


# ------------------------------------------------------------------ user ops
def _declare_user_ops():
    @kg.op("tagroutes::scale_shift")
    def scale_shift(x: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * w + alpha * torch.sin(x)

    def setup(ctx, inputs, output):
        x, w, alpha = inputs
        ctx.save_for_backward(x, w)
        ctx.alpha = alpha

    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = g * (w + ctx.alpha * torch.cos(x)) if ctx.needs_input_grad[0] else None
        gw = g * x if ctx.needs_input_grad[1] else None
        return gx, gw, None

    scale_shift.register_autograd(backward, setup_context=setup)

    @kg.op("tagroutes::cat_scaled")
    def cat_scaled(xs: list[torch.Tensor], w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat(xs) * w, torch.cat(xs).exp()

    def cat_setup(ctx, inputs, output):
        xs, w = inputs
        ctx.sizes = [len(x) for x in xs]
        ctx.save_for_backward(torch.cat(xs), w)

    def cat_backward(ctx, g0, g1):
        cat, w = ctx.saved_tensors
        assert isinstance(ctx.needs_input_grad[0], list)  # the op's structure: one flag per element
        gcat = g0 * w + g1 * cat.exp()
        return list(gcat.split(ctx.sizes)), g0 * cat

    cat_scaled.register_autograd(cat_backward, setup_context=cat_setup)

    @kg.op("tagroutes::no_backward")
    def no_backward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * y

    return scale_shift, cat_scaled, no_backward


def test_user_op_with_a_backward_matches_the_reference_on_every_route():
    scale_shift, cat_scaled, _ = _declare_user_ops()
    g = torch.Generator().manual_seed(6)
    x, w = (torch.randn(5, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(lambda a, b: scale_shift(a, b, 0.7), (x, w), check_forward_ad=True,
                                     check_batched_grad=True, check_batched_forward_grad=True)
    assert torch.autograd.gradgradcheck(lambda a, b: scale_shift(a, b, 0.7), (x, w))
    ref = scale_shift.reference
    xd, wd = x.detach(), w.detach()
    for route in (torch.func.jacrev, torch.func.jacfwd, torch.func.hessian):
        torch.testing.assert_close(route(lambda a: scale_shift(a, wd, 0.7).sum() if route is torch.func.hessian
                                         else scale_shift(a, wd, 0.7))(xd),
                                   route(lambda a: ref(a, wd, 0.7).sum() if route is torch.func.hessian
                                         else ref(a, wd, 0.7))(xd))
    # a Tensor[] argument and two outputs: gradients per list element
    a, b = (torch.randn(n, generator=g, dtype=torch.float64, requires_grad=True) for n in (3, 2))
    wc = torch.randn(5, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, w: cat_scaled([a, b], w), (a, b, wc))
    out0, out1 = torch.ops.tagroutes.cat_scaled([a, b.detach()], wc)
    (out0.sum() + out1.sum()).backward()
    assert a.grad is not None and b.grad is None and wc.grad is not None
    jac = torch.func.jacrev(lambda a, b: cat_scaled([a, b], wc.detach())[0], argnums=(0, 1))(a.detach(), b.detach())
    want = torch.func.jacrev(lambda a, b: cat_scaled.reference([a, b], wc.detach())[0], argnums=(0, 1))(
        a.detach(), b.detach())
    _same(jac, want)


def test_user_op_without_a_backward_refuses_reverse_mode_and_differentiates_forward_mode():
    _, _, no_backward = _declare_user_ops()
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(4, generator=g), torch.randn(4, generator=g)
    refused = "tagroutes::no_backward " + NO_BACKWARD
    for route in (lambda f: torch.func.jacrev(f)(x, y), lambda f: torch.func.grad(lambda a: f(a, y).sum())(x),
                  lambda f: torch.func.vjp(f, x, y)[1](torch.ones(4))):
        with pytest.raises(kg.UnsupportedError, match=refused):
            route(no_backward)
    tx = torch.randn(4, generator=g)
    _same(torch.func.jvp(lambda a: no_backward(a, y), (x,), (tx,)),
          torch.func.jvp(lambda a: no_backward.reference(a, y), (x,), (tx,)), rtol=0, atol=0)


def test_a_backward_returning_the_wrong_count_is_a_spec_error_naming_the_op():
    @kg.op("tagroutes::bad_backward")
    def bad_backward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y

    bad_backward.register_autograd(lambda ctx, g: g)
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(kg.SpecError, match=r"tagroutes::bad_backward: its backward must return one gradient"):
        bad_backward(x, torch.randn(3)).sum().backward()


# ------------------------------------------------------------------ vmap
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_vmap_runs_the_op_per_batch_element(name, capfd):
    """vmap(op) equals the op called on each element, through the op's own rule: no torch warning
    (printed by C++) asking the user to file a PyTorch issue for a missing batching rule."""
    op = EXAMPLES[name]
    args = [_example_args(name, seed=s) for s in (8, 9, 10)]
    pos = _tensor_positions(args[0])
    batched = [torch.stack([a[i] for a in args]) if i in pos else args[0][i] for i in range(len(args[0]))]
    in_dims = tuple(0 if i in pos else None for i in range(len(args[0])))
    capfd.readouterr()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*batching rule.*")
        got = torch.vmap(op, in_dims=in_dims)(*batched)
    assert "batching rule" not in capfd.readouterr().err
    want = [op(*a) for a in args]
    for k, g in enumerate(_outputs(got)):
        torch.testing.assert_close(g, torch.stack([_outputs(w)[k] for w in want]), rtol=0, atol=0, equal_nan=True)


# ------------------------------------------------------------------ ops that mutate
def _declare_mutating_ops():
    @kg.op("tagroutes::scale_into", mutates_args=("out",))
    def scale_into(x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(x * 2)

    @kg.op("tagroutes::quantize_into", mutates_args=("out",))
    def quantize_into(x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(torch.clamp(torch.round(x * 10), -128, 127).to(torch.int8))

    return scale_into, quantize_into


def test_an_op_that_mutates_never_drops_a_gradient():
    """Grad through an op that writes a float tensor is refused, naming the op, on every route;
    writing an integer tensor carries no gradient and runs; forward mode writes the reference's
    tangent; vmap and register_autograd refuse with errors naming the op."""
    scale_into, quantize_into = _declare_mutating_ops()
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4, generator=g, requires_grad=True)
    refused = r"tagroutes::scale_into mutates 'out', and its argument 'x' requires grad.*no_grad"
    for fn in (scale_into, torch.ops.tagroutes.scale_into):
        out = torch.zeros(4)
        with pytest.raises(kg.UnsupportedError, match=refused):
            fn(x, out)
        assert not out.requires_grad
    with torch.no_grad():
        out = torch.empty(4)
        scale_into(x, out)
    assert torch.equal(out, x.detach() * 2)
    q = torch.empty(4, dtype=torch.int8)
    quantize_into(x, q)  # an integer tensor: no gradient to lose
    assert torch.equal(q, torch.clamp(torch.round(x.detach() * 10), -128, 127).to(torch.int8))

    t = torch.randn(4, generator=g)
    with fwAD.dual_level():
        out = torch.zeros(4)
        scale_into(fwAD.make_dual(x.detach(), t), out)
        assert torch.equal(fwAD.unpack_dual(out).tangent, t * 2)

    with pytest.raises(kg.UnsupportedError, match=r"tagroutes::scale_into cannot run under torch.vmap"):
        torch.vmap(scale_into)(torch.randn(3, 4), torch.zeros(3, 4))
    with pytest.raises(kg.SpecError, match=r"tagroutes::scale_into: register_autograd is for ops that do not mutate"):
        scale_into.register_autograd(lambda ctx, g: g)


# ------------------------------------------------------------------ torch.compile, fresh process
# A fresh interpreter: nothing called before, no torch cache, no autograd kernel registered by an
# earlier eager call. Several cases in one process keep it fast.
_FRESH = textwrap.dedent('''
    import sys, torch
    import kernelgraft as kg
    from kernelgraft.examples.add_relu import add_relu
    from kernelgraft.examples.rmsnorm_residual import rmsnorm_residual
    from kernelgraft.examples.swiglu import swiglu
    backend = sys.argv[1]

    def refused(run, name):
        try:
            run()
        except kg.UnsupportedError as exc:
            assert name + " has no backward" in str(exc) and "register_autograd" in str(exc), exc
            return
        raise AssertionError(f"{name}: a backward with no backward declared ran without an error")

    # the first call of the op at all, through torch.ops, with grad
    g = torch.randn(3, 5, requires_grad=True)
    refused(lambda: torch.ops.kgexamples.add_relu(g, g).sum().backward(), "kgexamples::add_relu")
    assert g.grad is None

    x = torch.randn(4, 8, requires_grad=True)
    y = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    f = torch.compile(lambda a, b: add_relu(a, b) * 2, backend=backend, fullgraph=True)
    out = f(x, y)
    assert torch.equal(out.detach(), torch.relu(x.detach() + y.detach()) * 2)
    refused(lambda: out.sum().backward(), "kgexamples::add_relu")
    h = torch.compile(lambda a, b, c: rmsnorm_residual(a, b, c, 1e-6)[0].sum(), backend=backend, fullgraph=True)
    refused(lambda: h(x, y, w).backward(), "kgexamples::rmsnorm_residual")
    assert x.grad is None and w.grad is None

    xs, ys = (t.detach().double().requires_grad_() for t in (x, y))
    s = torch.compile(lambda a, b: swiglu(a, b) * 3, backend=backend, fullgraph=True)
    s(xs, ys).sum().backward()
    xr, yr = (t.detach().clone().requires_grad_() for t in (xs, ys))
    (swiglu.reference(xr, yr) * 3).sum().backward()
    torch.testing.assert_close(xs.grad, xr.grad)
    torch.testing.assert_close(ys.grad, yr.grad)
    print("FRESH-OK")
''')


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_backward_in_a_fresh_process_raises_or_matches_the_reference(backend):
    src = os.path.dirname(os.path.dirname(kg.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _FRESH, backend], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0 and "FRESH-OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-6000:]


# ------------------------------------------------------------------ on the GPU (kernels, native replay)
@pytest.mark.gpu
def test_autograd_routes_on_gpu():
    """On CUDA, where the kernels and the native replay serve: a forward-AD tangent is not lost
    to a replayed plan, reverse mode through swiglu matches the reference, add_relu refuses, the
    compiled backward refuses, and vmap runs the kernels per element."""
    g = torch.Generator(device="cuda").manual_seed(12)
    x, y = (torch.randn(64, 256, device="cuda", generator=g) for _ in range(2))
    for _ in range(3):  # warm: plans, and the native replay of the signature where it builds
        add_relu(x, y)
        swiglu(x, y)
    t = torch.randn(64, 256, device="cuda", generator=g)
    with fwAD.dual_level():
        out = add_relu(fwAD.make_dual(x, t), y)
        tangent = fwAD.unpack_dual(out).tangent
    assert tangent is not None
    torch.testing.assert_close(tangent, torch.func.jvp(lambda a: add_relu.reference(a, y), (x,), (t,))[1])
    xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
    swiglu(xs, ys).sum().backward()
    xr, yr = x.clone().requires_grad_(), y.clone().requires_grad_()
    swiglu.reference(xr, yr).sum().backward()
    torch.testing.assert_close(xs.grad, xr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ys.grad, yr.grad, rtol=1e-4, atol=1e-5)
    with pytest.raises(kg.UnsupportedError, match="kgexamples::add_relu " + NO_BACKWARD):
        torch.ops.kgexamples.add_relu(xs, y).sum().backward()
    f = torch.compile(lambda a, b: add_relu(a, b) * 2, backend="inductor", fullgraph=True)
    with pytest.raises(kg.UnsupportedError, match="kgexamples::add_relu " + NO_BACKWARD):
        f(xs, y).sum().backward()
    got = torch.vmap(add_relu)(x.view(4, 16, 256), y.view(4, 16, 256))
    torch.testing.assert_close(got, torch.stack([add_relu(a, b) for a, b in zip(x.view(4, 16, 256), y.view(4, 16, 256))]),
                               rtol=0, atol=0)


def test_an_op_that_takes_a_name_with_the_same_schema_gets_its_own_gradients():
    """A re-declared op (same schema: the name's definition and its autograd kernel stay) is the
    one every autograd route reaches: its backward, its reference's tangent; before it declares a
    backward, reverse mode refuses even though the op it replaced had one."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)

    @kg.op("tagroutes::redeclared")
    def first(x: torch.Tensor) -> torch.Tensor:
        return x * 2.0

    first.register_autograd(lambda ctx, grad: grad * 2.0)
    torch.ops.tagroutes.redeclared(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))

    @kg.op("tagroutes::redeclared", replace=True)
    def second(x: torch.Tensor) -> torch.Tensor:
        return x * 3.0

    x.grad = None
    with pytest.raises(kg.UnsupportedError, match="tagroutes::redeclared"):
        torch.ops.tagroutes.redeclared(x).sum().backward()
    second.register_autograd(lambda ctx, grad: grad * 3.0)
    x.grad = None
    torch.ops.tagroutes.redeclared(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))
    tangent = torch.randn(6, generator=g, dtype=torch.float64)
    _, out_tangent = torch.func.jvp(torch.ops.tagroutes.redeclared, (x.detach(),), (tangent,))
    torch.testing.assert_close(out_tangent, tangent * 3.0)
    kg.unregister("tagroutes::redeclared")
