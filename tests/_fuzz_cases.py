"""The fuzz cases of ``test_fuzz.py``, run in a child process: ``python tests/_fuzz_cases.py SEED COUNT``.

Each case is one call of an example op on inputs made from a seed: a good call (any dtype the op
takes, odd shapes, strided and expanded views, NaN/Inf, zero-size, aliasing inputs, inputs that
require grad, meta tensors) or a bad one (wrong dtype, rank, shape, device, type, overlapping a
mutated argument, indices out of range, sizes that cannot be allocated). The child judges each call
and prints one JSON line before it (``{"case": ...}``) and one after (``{"done": ...}``), so a crash
leaves the case that caused it as the last line. The verdicts:

- ``match``: the op returned, and ``kernelgraft.verify.oracle`` (the one oracle: float64 reference, the
  op's tolerances) accepts what it produced.
- ``refused``: the op raised a kernelgraft error whose message names the op (and, for a bad
  argument the case knows, that argument).
- ``meta``: meta tensors in, meta tensors out with the shapes and dtypes the reference gives.
- ``FAIL``: anything else: a raw torch/triton exception, a result where the reference raises or
  where the op's contract says refuse, a result the oracle rejects, a good input refused, a
  gradient silently dropped.
"""

from __future__ import annotations

import json
import os
import random
import sys
import traceback
import warnings

import torch

import kernelgraft as kg
from kernelgraft.errors import describe
from kernelgraft.verify import oracle as _verify
from kernelgraft.examples.add_relu import add_relu
from kernelgraft.examples.fp8_kcache_scatter import _case as fp8_case
from kernelgraft.examples.fp8_kcache_scatter import fp8_kcache_scatter
from kernelgraft.examples.gemm import gemm
from kernelgraft.examples.rmsnorm import rmsnorm
from kernelgraft.examples.rmsnorm_residual import rmsnorm_residual
from kernelgraft.examples.softmax import softmax
from kernelgraft.examples.swiglu import swiglu

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# Every kind of case, and what it must give: "match", "refuse", or "either" (refuse when the
# reference itself refuses, else match; the op may also refuse what its declaration excludes).
KINDS = {
    "plain": "match", "nan_inf": "match", "zero_size": "match", "strided": "match",
    "transposed": "match", "expanded": "match", "alias_inputs": "match",
    "requires_grad": "match", "requires_grad_no_grad": "match", "meta": "meta",
    "negative_slot": "match",
    "bad_dtype": "refuse", "wrong_rank": "either", "shape_mismatch": "either",
    "broadcast": "either", "mixed_dtype": "either", "device_mix": "refuse",
    "scalar_for_tensor": "refuse", "tensor_for_scalar": "refuse", "wrong_type": "refuse",
    "overlap_mutated": "refuse", "expanded_mutated": "refuse", "huge": "refuse",
    "slot_out_of_range": "refuse", "slots_length": "refuse", "bad_scale_fmt": "refuse",
    "bad_quant_block": "refuse",
}
# Tensors a kernel may not read as stored (kernelgraft/admit.py): views with the negative bit that
# the op only reads are resolved (their values match), one it mutates is refused, and so are sparse,
# nested, quantized and mkldnn tensors, naming the argument.
ADMISSION_KINDS = {
    "neg_view": "match", "conj_imag": "match", "neg_mutated": "refuse", "sparse": "refuse",
    "sparse_csr": "refuse", "nested": "refuse", "quantized": "refuse",
}
if torch.backends.mkldnn.is_available():
    ADMISSION_KINDS["mkldnn"] = "refuse"
KINDS.update(ADMISSION_KINDS)
# Not a kind: negative strides (torch cannot make such a view; as_strided refuses them).
# Good kinds whose layout may be refused by every kernel (an InputError that says so).
LAYOUT_KINDS = {"strided", "transposed", "expanded"}


# ----------------------------------------------------------------------------- good inputs
def _dims(rng: random.Random, n: int, zero: bool, most: int = 4096) -> list[int]:
    """``n`` sizes (edge sizes, primes, powers of two) whose product is at most ``most``: the
    interpreter runs kernels one program at a time."""
    while True:
        dims = [rng.choice((1, 2, 3, 7, 16, 33, 64, 100)) for _ in range(n)]
        if torch.Size(dims).numel() <= most:
            break
    if zero:
        dims[rng.randrange(n)] = 0
    return dims


def _randn(shape, dtype, g, scale=1.0):
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def good_args(name: str, rng: random.Random, g: torch.Generator, zero: bool = False) -> tuple:
    """Arguments the op must accept, in a random dtype it declares."""
    dt = rng.choice(FLOATS)
    if name in ("add_relu", "swiglu"):
        shape = _dims(rng, rng.randint(1, 3), zero)
        return _randn(shape, dt, g, 3), _randn(shape, dt, g)
    if name == "softmax":
        return (_randn(_dims(rng, rng.randint(1, 3), zero), dt, g, 4),)
    if name in ("rmsnorm", "rmsnorm_residual"):
        rows, cols = _dims(rng, 2, zero)
        x, w, eps = _randn((rows, cols), dt, g), _randn((cols,), dt, g), rng.choice((1e-6, 1e-5))
        return (x, w, eps) if name == "rmsnorm" else (x, _randn((rows, cols), dt, g), w, eps)
    if name == "gemm":
        m, n, k = _dims(rng, 3, zero)
        return _randn((m, k), dt, g), _randn((k, n), dt, g)
    if name == "fp8_kcache_scatter":
        head_dim, qbs = rng.choice(((128, 128), (64, 32), (96, 32), (64, 64)))
        block_size, num_blocks = rng.choice(((16, 2), (8, 3), (64, 1)))
        n_tokens = 0 if zero else rng.randint(1, min(24, block_size * num_blocks))
        k, cache, slots = fp8_case("cpu", dt, n_tokens, head_dim, qbs, block_size, num_blocks,
                                   pad=rng.choice((0, 0, 4)), generator=g)
        return k, cache, slots, qbs, rng.choice(("", "ue8m0"))
    raise AssertionError(name)


OPS = {
    "add_relu": add_relu, "swiglu": swiglu, "softmax": softmax, "rmsnorm": rmsnorm,
    "rmsnorm_residual": rmsnorm_residual, "gemm": gemm, "fp8_kcache_scatter": fp8_kcache_scatter,
}
HUGE = {  # expanded (stride-0) inputs whose outputs would need terabytes
    "add_relu": lambda: (torch.zeros(1).expand(2**41), torch.zeros(1).expand(2**41)),
    "swiglu": lambda: (torch.zeros(1).expand(2**41), torch.zeros(1).expand(2**41)),
    "softmax": lambda: (torch.zeros(1, 1).expand(2**30, 2**11),),
    "rmsnorm": lambda: (torch.zeros(1, 64).expand(2**36, 64), torch.ones(64), 1e-6),
    "rmsnorm_residual": lambda: (torch.zeros(1, 64).expand(2**36, 64), torch.zeros(1, 64).expand(2**36, 64),
                                 torch.ones(64), 1e-6),
    "gemm": lambda: (torch.zeros(1, 8).expand(2**21, 8), torch.zeros(8, 1).expand(8, 2**21)),
}


# ----------------------------------------------------------------------------- mutations
def _tensor_params(op, args, *, floating=False, mutated=None):
    out = []
    for i, (p, a) in enumerate(zip(op.signature.params, args)):
        if p.kind != "tensor" or not isinstance(a, torch.Tensor):
            continue
        if floating and not a.dtype.is_floating_point:
            continue
        if mutated is not None and (i in op.signature.mutated) != mutated:
            continue
        out.append(i)
    return out


def _scalar_params(op):
    return [i for i, p in enumerate(op.signature.params) if p.kind in ("int", "float", "str", "bool")]


def _pname(op, i):
    return op.signature.params[i].name


def mutate(kind: str, name: str, op, rng: random.Random, g: torch.Generator):
    """(args, the argument the refusal must name or None, detail) for one case of ``kind``, or
    None when the kind does not apply to this op."""
    args = list(good_args(name, rng, g, zero=(kind == "zero_size")))
    if kind in ("plain", "zero_size"):
        return args, None, ""
    if kind == "huge":
        return (list(HUGE[name]()), None, "") if name in HUGE else None
    if kind == "nan_inf":
        idx = [i for i in _tensor_params(op, args, floating=True) if args[i].numel()]
        if not idx:
            return None
        i = rng.choice(idx)
        flat = args[i].view(-1)
        for v in (float("nan"), float("inf"), float("-inf")):
            flat[rng.randrange(flat.numel())] = v
        return args, None, _pname(op, i)
    if kind in ("strided", "transposed", "expanded", "expanded_mutated"):
        idx = [i for i in _tensor_params(op, args, mutated=True if kind == "expanded_mutated" else None)
               if args[i].numel() > 1 and args[i].dim() >= (2 if kind == "transposed" else 1)]
        if kind == "expanded":
            idx = [i for i in idx if i not in op.signature.mutated]
        if not idx:
            return None
        i = rng.choice(idx)
        t = args[i]
        if kind == "strided":
            base = torch.empty(*t.shape[:-1], t.shape[-1] * 2, dtype=t.dtype)
            view = base[..., ::2]
            view.copy_(t)
        elif kind == "transposed":
            view = t.transpose(-1, -2).contiguous().transpose(-1, -2)
        else:  # stride 0 along the first dimension of size > 1
            d = next(d for d, s in enumerate(t.shape) if s > 1)
            view = t.narrow(d, 0, 1).expand(t.shape)
        args[i] = view
        return args, _pname(op, i) if kind == "expanded_mutated" else None, _pname(op, i)
    if kind == "alias_inputs":
        idx = _tensor_params(op, args, mutated=False)
        pairs = [(a, b) for a in idx for b in idx if a < b and args[a].shape == args[b].shape]
        if not pairs or op.signature.mutated:
            return None
        a, b = rng.choice(pairs)
        args[b] = args[a].to(args[b].dtype) if args[a].dtype != args[b].dtype else args[a]
        return args, None, f"{_pname(op, a)} is {_pname(op, b)}"
    if kind in ("requires_grad", "requires_grad_no_grad"):
        idx = _tensor_params(op, args, floating=True, mutated=False)
        if not idx:
            return None
        for i in idx:
            args[i] = args[i].float() if args[i].dtype not in FLOATS else args[i]
            args[i].requires_grad_(True)
        return args, None, ""
    if kind == "meta":
        return [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args], None, ""
    if kind == "device_mix":
        idx = _tensor_params(op, args)
        i = rng.choice(idx[1:]) if len(idx) > 1 else None
        if i is None:
            return None
        args[i] = args[i].to("meta")
        return args, _pname(op, i), _pname(op, i)
    if kind == "bad_dtype":
        i = rng.choice(_tensor_params(op, args))
        allowed = op._dtypes.get(_pname(op, i), ())
        bad = [d for d in (torch.int32, torch.int64, torch.float64, torch.bool, torch.complex64,
                           torch.uint8, torch.float8_e4m3fn) if d not in allowed]
        dt = rng.choice(bad)
        t = args[i]
        args[i] = t.float().to(dt)
        return args, _pname(op, i), f"{_pname(op, i)}={dt}"
    if kind == "mixed_dtype":
        idx = _tensor_params(op, args, floating=True)
        idx = [i for i in idx if args[i].dtype in FLOATS]
        if len(idx) < 2:
            return None
        i = rng.choice(idx)
        dt = rng.choice([d for d in FLOATS if d != args[i].dtype])
        args[i] = args[i].to(dt)
        return args, None, f"{_pname(op, i)}={dt}"
    if kind == "wrong_rank":
        i = rng.choice(_tensor_params(op, args))
        t = args[i]
        if rng.random() < 0.5 or t.dim() == 0 or not t.numel():  # one more dimension
            args[i] = t.unsqueeze(0).expand(2, *t.shape).contiguous()
        else:  # a 0-d tensor
            args[i] = t.reshape(-1)[:1].reshape(())
        return args, None, f"{_pname(op, i)} rank {args[i].dim()}"
    if kind in ("shape_mismatch", "broadcast"):
        idx = [i for i in _tensor_params(op, args, mutated=False) if args[i].dim() >= 1]
        if not idx:
            return None
        i = rng.choice(idx)
        t = args[i]
        d = rng.randrange(t.dim())
        shape = list(t.shape)
        if kind == "broadcast":
            if shape[d] <= 1 or len(_tensor_params(op, args)) < 2:
                return None
            shape[d] = 1
        else:
            shape[d] += rng.choice((1, 2, 5))
        args[i] = torch.randn(shape, generator=g).to(t.dtype)
        return args, None, f"{_pname(op, i)} {tuple(shape)}"
    if kind == "scalar_for_tensor":
        i = rng.choice(_tensor_params(op, args))
        args[i] = rng.choice((1.5, 2, True))
        return args, _pname(op, i), _pname(op, i)
    if kind == "tensor_for_scalar":
        idx = _scalar_params(op)
        if not idx:
            return None
        i = rng.choice(idx)
        args[i] = torch.tensor(1e-6 if isinstance(args[i], float) else 64)
        return args, _pname(op, i), _pname(op, i)
    if kind == "wrong_type":
        i = rng.randrange(len(args))
        if isinstance(args[i], torch.Tensor):
            args[i] = rng.choice((None, [1.0, 2.0], "x"))
        else:
            args[i] = rng.choice((None, [1.0], object()))
        return args, _pname(op, i), _pname(op, i)
    if kind in ADMISSION_KINDS:
        return _admission_case(kind, op, args, rng)
    # ------------------------------------------------------------------ the fp8 scatter's own
    if name != "fp8_kcache_scatter":
        return None
    k, cache, slots, qbs, fmt = args
    if kind == "overlap_mutated":
        if not k.numel():
            return None
        which = rng.choice(("k", "slot_mapping"))
        src = k if which == "k" else slots
        nbytes = src.numel() * src.element_size()
        flat = cache.view(-1) if cache.is_contiguous() else None
        if flat is None or flat.numel() < nbytes:
            return None
        view = flat[:nbytes].view(src.dtype).view(src.shape)
        view.copy_(src)  # the same values, now in the cache's memory
        args[0 if which == "k" else 2] = view
        return args, which, which
    if kind in ("slot_out_of_range", "negative_slot"):
        if not slots.numel():
            return None
        n_slots = cache.shape[0] * cache.shape[1]
        slots[rng.randrange(slots.numel())] = (rng.choice((n_slots, n_slots + 1, 2**40, 2**62))
                                               if kind == "slot_out_of_range" else -rng.choice((2, 7, 2**40)))
        return args, "slot_mapping" if kind == "slot_out_of_range" else None, ""
    if kind == "slots_length":
        args[2] = torch.cat([slots, torch.tensor([-1])]) if rng.random() < 0.5 or not slots.numel() else slots[1:]
        return args, "slot_mapping", ""
    if kind == "bad_scale_fmt":
        args[4] = rng.choice(("UE8M0", "e8m0", " ", "fp32"))
        return args, "scale_fmt", args[4]
    if kind == "bad_quant_block":
        args[3] = rng.choice((0, -qbs, qbs + 1, 3, 2**40))
        return args, "quant_block_size", str(args[3])
    return None


def _admission_case(kind: str, op, args: list, rng: random.Random):
    """A tensor argument replaced by one the admission rule resolves or refuses (see
    ``ADMISSION_KINDS``); None when no argument fits."""
    if kind == "neg_mutated":
        idx = _tensor_params(op, args, mutated=True)
    elif kind in ("neg_view", "conj_imag"):
        idx = [i for i in _tensor_params(op, args, floating=True, mutated=False) if args[i].numel()]
    else:
        idx = [i for i in _tensor_params(op, args) if args[i].dim() >= (2 if kind == "sparse_csr" else 1)
               and (args[i].is_floating_point() or kind not in ("quantized", "mkldnn"))]
    if not idx:
        return None
    i = rng.choice(idx)
    t = args[i]
    if kind in ("neg_view", "neg_mutated"):
        args[i] = torch._neg_view(t.neg())  # the same values, the negation in memory
    elif kind == "conj_imag":  # z.conj().imag: float32 values whose memory holds their negation
        for j in _tensor_params(op, args, floating=True):
            args[j] = args[j].float()
        t = args[i]
        args[i] = torch.complex(torch.randn_like(t), -t).conj().imag
    elif kind == "sparse":
        args[i] = t.to_sparse()
    elif kind == "sparse_csr":
        args[i] = t.reshape(-1, t.shape[-1]).to_sparse_csr() if t.dim() > 2 else t.to_sparse_csr()
    elif kind == "nested":
        args[i] = torch.nested.nested_tensor([t, t])
    elif kind == "quantized":
        args[i] = torch.quantize_per_tensor(t.float(), 0.05, 10, torch.quint8)
    else:
        args[i] = t.float().to_mkldnn()
    return args, None if KINDS[kind] == "match" else _pname(op, i), _pname(op, i)


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


def judge(kind: str, op, args: list, arg: str | None) -> dict:
    expect = KINDS[kind]
    if kind == "meta":
        return _judge_meta(op, args)
    ref_args = args
    if kind == "slot_out_of_range" and args[0].is_cuda:
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
    if not verdict.ok:
        return _fail(f"silent wrong result: {verdict}")
    if grad:
        why = _judge_backward(op, args, result)
        if why:
            return _fail(why)
    return {"outcome": "match"}


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
        if op._autograd is not None:
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
def cases(seed: int, count: int):
    """(index, op name, kind, args, argument to name, detail): every kind on every op where it
    applies, in turn, then random ones."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    plan = [(name, kind) for kind in KINDS for name in OPS]
    while len(plan) < count * 3:
        plan.append((rng.choice(list(OPS)), rng.choice(list(KINDS))))
    made = 0
    for name, kind in plan:
        if made >= count:
            return
        built = mutate(kind, name, OPS[name], rng, g)
        if built is None:
            continue
        args, arg, detail = built
        yield made, name, kind, args, arg, detail
        made += 1


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


def main(seed: int, count: int) -> None:
    torch.manual_seed(seed)
    device = os.environ.get("FUZZ_DEVICE", "cpu")
    for index, name, kind, args, arg, detail in cases(seed, count):
        args = to_device(args, device)
        print(json.dumps({"case": index, "op": name, "kind": kind, "detail": detail,
                          "args": _describe(args)}), flush=True)
        try:
            verdict = judge(kind, OPS[name], args, arg)
        except Exception:  # the judge itself failed: report it as the case's failure
            verdict = _fail("the fuzz judge raised: " + traceback.format_exc()[-600:])
        print(json.dumps({"done": index, **verdict}), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("KERNELGRAFT_TUNE", "off")
    main(int(sys.argv[1]), int(sys.argv[2]))
