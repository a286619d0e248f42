"""Inside a graph Inductor compiles, each kernelgraft op call either stays an opaque call or gives
way to its reference, traced into the graph where Inductor fuses it with its neighbours.

Why: the tuner's ``torch:compile`` candidate is the reference compiled *alone*; in the user's graph
Inductor does at least as well (it fuses the reference with the ops around it: a residual add into
the norm that follows it), and pays no call of its own, while an opaque op call costs its host time
on every forward (on the H200, a grafted Llama under ``torch.compile`` was 1.04x the plain compiled
model in prefill and 1.26x in one-token decode, with kernels that spent no more GPU time than
Inductor's). So an op that does not beat Inductor should not stand in Inductor's way.

The choice, per op call site at the shapes Inductor compiles (static shapes only), reads the
tuner's decision for those inputs, from memory or disk, without measuring (tuning cannot run inside
a compile: Dynamo and Inductor are not re-entrant). The reference is inlined when ``torch:compile``
passed the gate and its GPU time is at most max(the GPU time of what serves the op's calls, that
candidate's host time per call), where what serves them is the decision's first-ranked candidate:
a kernel, or the eager reference where it won (a cuBLAS GEMM), or torch:compile itself (always
inlined). That is the time an opaque call takes in a stream of calls, against the GPU time of code
Inductor launches with the rest of its graph. A kernel
keeps its place where it is faster on the GPU than Inductor's code and its launch hides behind its
own GPU time (a large GEMM); a short kernel whose call costs the host more than Inductor's whole
kernel gives way. The host time is the tuner's launch of the kernel (its Python runner); a served
call replays natively and costs less, so on the host-bound side near ties go to Inductor.

No decision (shapes not tuned yet: call the op once, or ``kg.graft`` with ``example_inputs``,
before compiling), symbolic shapes,
mutated arguments, tensor-list arguments, PyTorch not competing (``compete=`` without "compile",
``kg.tune(compete=False)``), ``kg.tune(mode="off")`` or ``KERNELGRAFT_INLINE=0``: the op stays.
AOTInductor compiles keep every op: a package's kernels are its bundle's, served by the runtime.

The pass runs as ``torch._inductor.config.post_grad_custom_post_pass``, after the pattern grafts
(``_pattern``), installed the first time a compile traces a kernelgraft op (``_operator``'s trace
hook). Its ``uuid`` covers every choice made so far, so Inductor's FX graph cache does not serve a
graph compiled under other choices, with one gap: a choice first made for an op that a pattern
graft inserted (after the cache key is computed) reaches the key from the next compile on.
``choices()`` lists what was chosen and why.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import operator
import threading
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..op import compete as _compete, registry as _registry, select as _select
from ..tune import api as _tune_api
from ..verify.oracle import tensors
from ..op.modes import env_tristate, settings
from .passes import Slot

__all__ = ["choose", "choices", "install", "inline_pass"]

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
# _signature(op, args) -> (inline?, why); only decided choices are kept
_CHOICES: dict[tuple, tuple[bool, str]] = {}
_VERSION = 1


def _enabled() -> bool:
    return env_tristate("KERNELGRAFT_INLINE") is not False


def _signature(op: Any, args: tuple) -> tuple | None:
    """What the choice depends on in the arguments; None when a shape or stride is symbolic."""
    parts: list[Any] = [op.name, op.fingerprint, _select.epoch()]  # kg.tune.clear() moves the epoch
    for a in args:
        if isinstance(a, torch.Tensor):
            shape, stride = tuple(a.shape), tuple(a.stride())
            if not all(type(s) is int for s in shape + stride):
                return None
            parts.append((shape, stride, a.dtype, str(a.device)))
        elif isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in a):
            return None
        else:
            parts.append(repr(a))
    return tuple(parts)


def choose(op: Any, args: tuple) -> tuple[bool, str]:
    """(inline the reference?, why) for a call of ``op`` on ``args`` (fake or real tensors)."""
    if not _enabled():
        return False, "KERNELGRAFT_INLINE=0"
    sig = _signature(op, args)
    if sig is None:
        return False, "a shape, a stride or a tensor list the choice cannot be made for (symbolic or listed)"
    off = _switched_off(op, args)
    if off is not None:
        return False, off
    with _LOCK:
        found = _CHOICES.get(sig)
    if found is not None:
        return found
    decided, result = _decide(op, args)
    if decided:
        with _LOCK:
            _CHOICES[sig] = result
    return result


def _decide(op: Any, args: tuple) -> tuple[bool, tuple[bool, str]]:
    """(whether this is final for these inputs, (inline?, why)): final once the decision is read."""
    if op.mutates_args:
        return True, (False, "it mutates an argument")
    if op.signature.returns == "none":
        return True, (False, "it returns nothing")
    # The tuning key reads layouts and alignment, so it is built from real (uninitialised, never
    # launched on) tensors of the call's shapes and strides, freed at once.
    with unset_fake_temporarily():
        try:
            real = tuple(torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                         if isinstance(a, torch.Tensor) else a for a in args)
            decision = _tune_api.decision(op, *real)
        except Exception as exc:  # inputs the op refuses (its own call will say so), no memory
            return False, (False, f"no decision: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        finally:
            real = None
    if decision is None or not decision.ranking:
        return False, (False, "not tuned for these inputs yet (call the op once, or kg.graft with "
                              "example_inputs, before compiling)")
    compiled = next((e for e in decision.ranking if e.get("backend") == _compete.TORCH
                     and e.get("impl_name") == "compile"), None)
    if compiled is None:
        return True, (False, "torch:compile did not pass the tuning gate")
    # What serves the op's calls: the first ranked, a kernel or the eager reference (which wins
    # ties and the GEMMs cuBLAS runs fastest); torch:compile first means Inductor's code won.
    served = decision.ranking[0]
    if served is compiled:
        return True, (True, "torch:compile won the tuning")
    c_gpu, k_gpu, k_host = compiled.get("gpu_ms"), served.get("gpu_ms"), served.get("host_ms")
    if c_gpu is None or k_gpu is None or k_host is None:
        return True, (False, "the decision has no GPU and host time for these candidates (made before "
                             "they were recorded, or by a timer that does not measure the host); "
                             "kg.tune.clear() and tuning again records them")
    name = served.get("impl_name") if served.get("backend") != _compete.TORCH else f"torch:{served.get('impl_name')}"
    us = f"torch:compile {c_gpu * 1e3:.2f} us of GPU time; {name} " \
         f"{k_gpu * 1e3:.2f} us of GPU time, {k_host * 1e3:.2f} us of host time per call"
    if c_gpu <= max(k_gpu, k_host):
        return True, (True, f"Inductor's code for the reference serves it ({us})")
    return True, (False, f"{name} serves it ({us})")


def _switched_off(op: Any, args: tuple) -> str | None:
    """Why this thread's settings keep the op whatever its decision says (checked on every
    choice: ``kg.tune`` blocks come and go), else None."""
    s = settings()
    if s.mode == "off":
        return "tuning is off (kg.tune(mode='off'))"
    first = next(tensors(args), None)
    device = first.device if first is not None else torch.device("cpu")
    off = _compete._off_reason(op, "compile", device, s, listing=True)
    return None if off is None else f"torch:compile does not compete ({off})"


def choices() -> dict[tuple, tuple[bool, str]]:
    """Every choice made in this process: (op name, fingerprint, arguments) -> (inlined?, why)."""
    with _LOCK:
        return dict(_CHOICES)


def _digest() -> str:
    with _LOCK:
        items = sorted((repr(k), v[0]) for k, v in _CHOICES.items())
    s = settings()
    return hashlib.sha256(repr((_VERSION, _enabled(), s.mode, getattr(s, "compete", None), items)).encode()).hexdigest()


# ---------------------------------------------------------------------------- the graph rewrite
def _op_of(node: fx.Node) -> Any:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    op = _registry.lookup(target._schema.name)
    return op if op is not None and getattr(op, "overload", None) is target else None


def _val(a: Any) -> Any:
    return a.meta.get("val") if isinstance(a, fx.Node) else a


def inline_pass(graph: fx.Graph) -> int:
    """Replace each op call whose choice is Inductor's by its reference; returns how many."""
    from torch._inductor.virtualized import V

    if V.aot_compilation:
        # An AOTInductor package keeps every op call: its deployment is the kernels' bundle,
        # served by kernelgraft's runtime with the decisions the bundle holds.
        return 0
    done = 0
    own = _compete.compiling_references()
    pending = list(graph.nodes)
    while pending:  # in order; ops a reference calls join at the end, inlined in turn
        node = pending.pop(0)
        op = _op_of(node)
        if op is None or op.name in own or node.kwargs or node.graph is not graph:
            continue
        try:
            added = _consider(graph, node, op)
        except Exception as exc:  # never break the user's compile: the op call stays
            log.warning("kernelgraft: %s at %%%s kept: the in-graph choice failed: %s: %s",
                        op.name, node.name, type(exc).__name__, exc)
            continue
        if added is not None:
            done += 1
            pending.extend(added)
    if done:
        graph.eliminate_dead_code()
        graph.lint()
    return done


def _consider(graph: fx.Graph, node: fx.Node, op: Any) -> list[fx.Node] | None:
    """Choose for one call; the nodes put in its place when the reference was inlined, else None."""
    if any(isinstance(a, fx.Node) and not isinstance(_val(a), torch.Tensor) for a in node.args):
        return None  # a value the choice cannot read (a tensor list, a symbolic scalar)
    inline, why = choose(op, tuple(_val(a) for a in node.args))
    log.info("kernelgraft: %s at %%%s %s: %s", op.name, node.name, "inlined" if inline else "kept", why)
    if not inline:
        return None
    result = _inline(graph, node, op)
    if isinstance(result, str):
        log.info("kernelgraft: %s at %%%s kept: %s", op.name, node.name, result)
        return None
    return result


def _inline(graph: fx.Graph, node: fx.Node, op: Any) -> list[fx.Node] | str:
    """Put ``op.reference`` traced into Inductor's IR in place of ``node``: the nodes put in, or
    why not (the graph is then left as it was)."""
    from torch._dynamo.utils import detect_fake_mode
    from torch._inductor.pattern_matcher import fwd_only

    inputs = [a for a in node.args if isinstance(a, fx.Node)]
    vals = [a.meta["val"] for a in inputs]
    layout = [isinstance(a, fx.Node) for a in node.args]
    scalars = list(node.args)

    def reference(*ts: torch.Tensor) -> Any:
        it = iter(ts)
        return op.reference(*[next(it) if is_node else s for is_node, s in zip(layout, scalars)])

    mode = detect_fake_mode(vals)
    try:
        with mode if mode is not None else contextlib.nullcontext():
            gm = fwd_only(reference, vals)
    except Exception as exc:
        return f"the reference does not trace: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    sub = gm.graph
    if any(n.op == "get_attr" for n in sub.nodes):
        return "the traced reference holds constant tensors"
    output = next(n for n in sub.nodes if n.op == "output")
    result = output.args[0]
    outs = [result] if op.signature.returns == "tensor" else list(result)
    if not all(isinstance(o, fx.Node) and o.op == "call_function" for o in outs):
        return "the reference returns an input, or not a tensor per output"
    want = [_val(node)] if op.signature.returns == "tensor" else list(_val(node) or ())
    if len(want) != len(outs):
        return f"the reference returns {len(outs)} outputs, the op {len(want)}"
    for o, w in zip(outs, want):
        v = o.meta.get("val")
        if not isinstance(v, torch.Tensor) or not isinstance(w, torch.Tensor) or v.shape != w.shape \
                or v.dtype != w.dtype or v.stride() != w.stride():
            return "the reference's outputs differ from the op's in shape, dtype or layout"
    # The op promises fresh outputs and leaves its inputs alone (mutating ops never get here); a
    # reference may alias (return a view, the same tensor twice) or write in place, which the
    # eager path copies around but a graph would not.
    if len(set(outs)) != len(outs) or any(_views_an_input(o) for o in outs):
        return "the reference returns a view of an input, or the same tensor twice"
    if any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
           for n in sub.nodes if n.op == "call_function"):
        return "the reference writes a tensor in place"
    users = list(node.users)
    if op.signature.returns != "tensor" and not all(
            u.op == "call_function" and u.target is operator.getitem for u in users):
        return "an output of the op is used other than by index"
    env: dict[fx.Node, fx.Node] = dict(zip((n for n in sub.nodes if n.op == "placeholder"), inputs))
    trace = node.meta.get("stack_trace")
    added: list[fx.Node] = []
    try:
        with graph.inserting_before(node):
            for n in sub.nodes:
                if n.op == "call_function":
                    env[n] = graph.node_copy(n, lambda x: env[x])
                    added.append(env[n])
                    if trace is not None:
                        env[n].meta.setdefault("stack_trace", trace)
    except Exception:
        for n in reversed(added):  # nothing uses them yet: the graph is as it was
            graph.erase_node(n)
        raise
    if op.signature.returns == "tensor":
        node.replace_all_uses_with(env[outs[0]])
    else:
        for u in users:
            u.replace_all_uses_with(env[outs[u.args[1]]])
            graph.erase_node(u)
    graph.erase_node(node)
    return added


def _views_an_input(node: fx.Node) -> bool:
    """Whether ``node`` (of a traced reference) is an input or a chain of views of one."""
    while node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
            and node.target.is_view and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node.op == "placeholder"


# ---------------------------------------------------------------------------- installing
def _run(graph: fx.Graph) -> None:
    inline_pass(graph)


_SLOT = Slot("post_grad_custom_post_pass", "kernelgraft-inline", _run, _digest)


def install() -> None:
    """Make the in-graph choice part of every Inductor compilation from now on (idempotent)."""
    with _LOCK:
        _SLOT.install()


def on_trace(op: Any, args: tuple) -> None:
    """``_operator``'s trace hook: fake tensors reached ``op`` inside a compile."""
    if torch._guards.TracingContext.try_get() is None:
        return  # the op's own shape inference (Dispatcher.output_specs), not a compile
    try:
        install()
        choose(op, args)  # made now, so the FX graph cache key (computed before the pass) has it
    except Exception as exc:  # the pass decides again, or keeps the op
        log.debug("kernelgraft: in-graph choice for %s not made at trace time: %s", op.name, exc)


