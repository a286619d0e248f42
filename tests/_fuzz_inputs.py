"""The inputs of the fuzz cases (``_fuzz_cases.py``): good arguments for every example op, and the
kinds of odd or bad arguments made from them.

Every case is built from its own generators (``random.Random`` and ``torch.Generator`` seeded from
the run's seed and the case's index, see ``_fuzz_cases.case_rngs``), so a case is the same whatever
ran before it. ``mutate`` returns a ``Case``, or None where the kind does not fit the arguments it
drew (the run then draws again); ``APPLIES`` says which ops a kind fits at all, and the default
fuzz test checks that every such pair ran.
"""

from __future__ import annotations

import dataclasses
import random

import torch

from kernelgraft.examples.add_relu import add_relu
from kernelgraft.examples.fp8_kcache_scatter import _case as fp8_case
from kernelgraft.examples.fp8_kcache_scatter import fp8_kcache_scatter
from kernelgraft.examples.gemm import gemm
from kernelgraft.examples.kv_append import kv_append
from kernelgraft.examples.rmsnorm import rmsnorm
from kernelgraft.examples.rmsnorm_residual import rmsnorm_residual
from kernelgraft.examples.softmax import softmax
from kernelgraft.examples.swiglu import swiglu
from kernelgraft.examples.topk_router import topk_router

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
OPS = {
    "add_relu": add_relu, "swiglu": swiglu, "softmax": softmax, "rmsnorm": rmsnorm,
    "rmsnorm_residual": rmsnorm_residual, "gemm": gemm, "fp8_kcache_scatter": fp8_kcache_scatter,
    "kv_append": kv_append, "topk_router": topk_router,
}
# Every kind of input case, and what it must give: "match", "refuse", or "either" (refuse when the
# reference itself refuses, else match; the op may also refuse what its declaration excludes).
# A case may say otherwise for its op (``Case.expect``: kv_append skips an out-of-range slot).
INPUT_KINDS = {
    "plain": "match", "nan_inf": "match", "zero_size": "match", "strided": "match",
    "transposed": "match", "expanded": "match", "alias_inputs": "match",
    "requires_grad": "match", "requires_grad_no_grad": "match", "meta": "meta",
    "negative_slot": "match",
    "bad_dtype": "refuse", "wrong_rank": "either", "shape_mismatch": "either",
    "broadcast": "either", "mixed_dtype": "either", "device_mix": "refuse",
    "scalar_for_tensor": "refuse", "tensor_for_scalar": "refuse", "wrong_type": "refuse",
    "overlap_mutated": "refuse", "expanded_mutated": "refuse", "huge": "refuse",
    "slot_out_of_range": "refuse", "slots_length": "either", "bad_scale_fmt": "refuse",
    "bad_quant_block": "refuse", "bad_top_k": "refuse",
}
# Tensors a kernel may not read as stored (kernelgraft.admit): views with the negative bit that
# the op only reads are resolved (their values match), one it mutates is refused, and so are sparse,
# nested, quantized and mkldnn tensors, naming the argument.
ADMISSION_KINDS = {
    "neg_view": "match", "conj_imag": "match", "neg_mutated": "refuse", "sparse": "refuse",
    "sparse_csr": "refuse", "nested": "refuse", "quantized": "refuse",
}
if torch.backends.mkldnn.is_available():
    ADMISSION_KINDS["mkldnn"] = "refuse"
INPUT_KINDS.update(ADMISSION_KINDS)
# Not a kind: negative strides (torch cannot make such a view; as_strided refuses them).
# Good kinds whose layout may be refused by every kernel (an InputError that says so).
LAYOUT_KINDS = {"strided", "transposed", "expanded"}

_ALL = tuple(OPS)
_MUTATING = ("fp8_kcache_scatter", "kv_append")
_SCALARS = ("rmsnorm", "rmsnorm_residual", "fp8_kcache_scatter", "topk_router")
_TWO_TENSORS = tuple(n for n in _ALL if n not in ("softmax", "topk_router"))
# The ops each input kind fits (the rest: every op). A kind that fits an op always finds a case for
# it within a few draws; the default test checks that each of these pairs ran.
INPUT_APPLIES = {
    "alias_inputs": ("add_relu", "swiglu", "rmsnorm_residual"),
    "negative_slot": _MUTATING, "slot_out_of_range": _MUTATING, "slots_length": _MUTATING,
    "overlap_mutated": _MUTATING, "expanded_mutated": _MUTATING, "neg_mutated": _MUTATING,
    "bad_scale_fmt": ("fp8_kcache_scatter",), "bad_quant_block": ("fp8_kcache_scatter",),
    "bad_top_k": ("topk_router",),
    "broadcast": _TWO_TENSORS, "device_mix": _TWO_TENSORS,
    "mixed_dtype": ("add_relu", "swiglu", "rmsnorm", "rmsnorm_residual", "gemm", "kv_append"),
    "tensor_for_scalar": _SCALARS,
    "huge": tuple(n for n in _ALL if n not in _MUTATING),
}


@dataclasses.dataclass
class Case:
    args: list
    arg: str | None = None  # the argument a refusal must name
    detail: str = ""
    expect: str | None = None  # overrides the kind's expectation for this op
    extra: dict = dataclasses.field(default_factory=dict)  # what a route or thread case needs


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


def _kv_args(rng: random.Random, g: torch.Generator, dt, zero: bool, small: bool) -> tuple:
    """A paged KV append as vLLM makes it: key and value strided slices of a fused QKV output, the
    caches in one of vLLM's layouts, distinct slots with padding (-1) among them."""
    tokens = 0 if zero else rng.randint(1, 6 if small else 20)
    heads, hd = rng.choice((1, 2, 3)), rng.choice((4, 8) if small else (16, 64, 80, 128))
    blocks, bs = rng.choice(((2, 4), (3, 8), (1, 16), (4, 4)))
    layout = rng.choice(("contiguous", "dense", "interleaved", "split", "layer"))
    if layout == "interleaved":  # K and V alternate per head
        kv = _randn((blocks, bs, heads, 2, hd), dt, g)
        k_cache, v_cache = kv[..., 0, :], kv[..., 1, :]
    elif layout == "split":  # [blocks, 2, bs, heads, hd]
        kv = _randn((blocks, 2, bs, heads, hd), dt, g)
        k_cache, v_cache = kv[:, 0], kv[:, 1]
    elif layout == "layer":  # layer 1 of a two-layer allocation
        k_cache, v_cache = (_randn((2, blocks, bs, heads, hd), dt, g)[1] for _ in range(2))
    else:
        k_cache, v_cache = (_randn((blocks, bs, heads, hd), dt, g) for _ in range(2))
    qkv = _randn((tokens, 3, heads, hd), dt, g)
    key, value = qkv[:, 1], qkv[:, 2]
    if layout == "contiguous":
        key, value = key.contiguous(), value.contiguous()
    n = min(rng.randint(0, tokens), blocks * bs) if tokens else 0
    slots = torch.randperm(blocks * bs, generator=g)[:n]
    if n > 1 and rng.random() < 0.5:
        slots[rng.randrange(n)] = -1  # padding
    return key, value, k_cache, v_cache, slots


def _topk_args(rng: random.Random, g: torch.Generator, dt, zero: bool, small: bool, smooth: bool) -> tuple:
    """Router logits (ties, masked experts, a NaN row) and a top_k up to past the kernels' 16."""
    tokens = 0 if zero else rng.choice((1, 2, 3, 7) if small else (1, 2, 3, 7, 16, 33))
    experts = rng.choice((2, 4, 8, 16) if small else (2, 8, 16, 60, 64, 128, 256))
    top_k = rng.randint(1, min(experts, 20))
    if smooth:  # distinct logits, exact in every dtype: a gradient is defined where no tie is
        logits = torch.stack([(torch.randperm(experts, generator=g) - experts / 2) * 0.125
                              for _ in range(tokens)]) if tokens else torch.empty(0, experts)
    else:
        style = rng.choice(("randn", "tied", "masked"))
        if style == "tied":  # a coarse grid: many exact ties, some at the cut
            logits = torch.randint(-8, 9, (tokens, experts), generator=g) / 4
        else:
            logits = torch.randn(tokens, experts, generator=g) * 2
        if style == "masked" and tokens:
            logits[:, torch.randperm(experts, generator=g)[: experts // 2]] = float("-inf")
    return logits.to(dt), top_k, rng.random() < 0.5


def good_args(name: str, rng: random.Random, g: torch.Generator, zero: bool = False, *,
              small: bool = False, smooth: bool = False) -> tuple:
    """Arguments the op must accept, in a random dtype it declares. ``small``: a few elements
    (Jacobians); ``smooth``: no ties where the op selects (a gradient is defined)."""
    dt = rng.choice(FLOATS)
    most = 48 if small else 4096
    if name in ("add_relu", "swiglu"):
        shape = _dims(rng, rng.randint(1, 3), zero, most)
        return _randn(shape, dt, g, 3), _randn(shape, dt, g)
    if name == "softmax":
        return (_randn(_dims(rng, rng.randint(1, 3), zero, most), dt, g, 4),)
    if name in ("rmsnorm", "rmsnorm_residual"):
        rows, cols = _dims(rng, 2, zero, most)
        x, w, eps = _randn((rows, cols), dt, g), _randn((cols,), dt, g), rng.choice((1e-6, 1e-5))
        return (x, w, eps) if name == "rmsnorm" else (x, _randn((rows, cols), dt, g), w, eps)
    if name == "gemm":
        m, n, k = _dims(rng, 3, zero, most)
        return _randn((m, k), dt, g), _randn((k, n), dt, g)
    if name == "fp8_kcache_scatter":
        head_dim, qbs = rng.choice(((32, 32), (64, 32)) if small else ((128, 128), (64, 32), (96, 32), (64, 64)))
        block_size, num_blocks = rng.choice(((16, 2), (8, 3), (64, 1)))
        n_tokens = 0 if zero else rng.randint(1, 4 if small else min(24, block_size * num_blocks))
        k, cache, slots = fp8_case("cpu", dt, n_tokens, head_dim, qbs, block_size, num_blocks,
                                   pad=rng.choice((0, 0, 4)), generator=g)
        return k, cache, slots, qbs, rng.choice(("", "ue8m0"))
    if name == "kv_append":
        return _kv_args(rng, g, dt, zero, small)
    if name == "topk_router":
        return _topk_args(rng, g, dt, zero, small, smooth)
    raise AssertionError(name)


HUGE = {  # expanded (stride-0) inputs whose outputs would need terabytes
    "add_relu": lambda: (torch.zeros(1).expand(2**41), torch.zeros(1).expand(2**41)),
    "swiglu": lambda: (torch.zeros(1).expand(2**41), torch.zeros(1).expand(2**41)),
    "softmax": lambda: (torch.zeros(1, 1).expand(2**30, 2**11),),
    "rmsnorm": lambda: (torch.zeros(1, 64).expand(2**36, 64), torch.ones(64), 1e-6),
    "rmsnorm_residual": lambda: (torch.zeros(1, 64).expand(2**36, 64), torch.zeros(1, 64).expand(2**36, 64),
                                 torch.ones(64), 1e-6),
    "gemm": lambda: (torch.zeros(1, 8).expand(2**21, 8), torch.zeros(8, 1).expand(8, 2**21)),
    "topk_router": lambda: (torch.zeros(1, 8).expand(2**40, 8), 2, True),
}


# ----------------------------------------------------------------------------- mutations
def tensor_params(op, args, *, floating=False, mutated=None):
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


def pname(op, i):
    return op.signature.params[i].name


def _declared_dtypes(op, param: str) -> list[str]:
    return op.identity["dtypes"].get(param, [])


def writes_float(op, args) -> bool:
    """Whether the op writes a floating tensor argument: grad through it is refused by design."""
    return any(args[i].dtype.is_floating_point for i in tensor_params(op, args, mutated=True))


def mutate(kind: str, name: str, op, rng: random.Random, g: torch.Generator) -> Case | None:
    """One case of ``kind`` for op ``name``, or None when the arguments drawn do not fit it."""
    args = list(good_args(name, rng, g, zero=(kind == "zero_size")))
    if kind in ("plain", "zero_size"):
        return Case(args)
    if kind == "huge":
        return Case(list(HUGE[name]())) if name in HUGE else None
    if kind == "nan_inf":
        idx = [i for i in tensor_params(op, args, floating=True) if args[i].numel()]
        if not idx:
            return None
        i = rng.choice(idx)
        t = args[i]
        for v in (float("nan"), float("inf"), float("-inf")):  # by index: t may be a strided view
            t[tuple(int(d) for d in torch.unravel_index(torch.tensor(rng.randrange(t.numel())), t.shape))] = v
        return Case(args, None, pname(op, i))
    if kind in ("strided", "transposed", "expanded", "expanded_mutated"):
        idx = [i for i in tensor_params(op, args, mutated=True if kind == "expanded_mutated" else None)
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
        case = Case(args, pname(op, i) if kind == "expanded_mutated" else None, pname(op, i))
        if pname(op, i) == "slot_mapping":  # every token one slot: any one of them may be the writer
            case.extra["one_writer"] = i
        return case
    if kind == "alias_inputs":
        idx = tensor_params(op, args, mutated=False)
        pairs = [(a, b) for a in idx for b in idx if a < b and args[a].shape == args[b].shape]
        if not pairs or op.signature.mutated:
            return None
        a, b = rng.choice(pairs)
        args[b] = args[a].to(args[b].dtype) if args[a].dtype != args[b].dtype else args[a]
        return Case(args, None, f"{pname(op, a)} is {pname(op, b)}")
    if kind in ("requires_grad", "requires_grad_no_grad"):
        idx = tensor_params(op, args, floating=True, mutated=False)
        if not idx:
            return None
        for i in idx:
            args[i] = args[i].float() if args[i].dtype not in FLOATS else args[i]
            args[i].requires_grad_(True)
        # an op that writes a floating tensor refuses grad mode before it writes (no formula can
        # carry the gradient into what it writes); under no_grad it runs
        refuse = kind == "requires_grad" and writes_float(op, args)
        return Case(args, None, "", "refuse" if refuse else None)
    if kind == "meta":
        return Case([a.to("meta") if isinstance(a, torch.Tensor) else a for a in args])
    if kind == "device_mix":
        idx = tensor_params(op, args)
        i = rng.choice(idx[1:]) if len(idx) > 1 else None
        if i is None:
            return None
        args[i] = args[i].to("meta")
        return Case(args, pname(op, i), pname(op, i))
    if kind == "bad_dtype":
        i = rng.choice(tensor_params(op, args))
        allowed = _declared_dtypes(op, pname(op, i))
        bad = [d for d in (torch.int32, torch.int64, torch.float64, torch.bool, torch.complex64,
                           torch.uint8, torch.float8_e4m3fn) if str(d).removeprefix("torch.") not in allowed]
        dt = rng.choice(bad)
        args[i] = args[i].float().to(dt)
        return Case(args, pname(op, i), f"{pname(op, i)}={dt}")
    if kind == "mixed_dtype":
        idx = [i for i in tensor_params(op, args, floating=True) if args[i].dtype in FLOATS]
        if len(idx) < 2:
            return None
        i = rng.choice(idx)
        dt = rng.choice([d for d in FLOATS if d != args[i].dtype])
        args[i] = args[i].to(dt)
        return Case(args, None, f"{pname(op, i)}={dt}")
    if kind == "wrong_rank":
        i = rng.choice(tensor_params(op, args))
        t = args[i]
        if rng.random() < 0.5 or t.dim() == 0 or not t.numel():  # one more dimension
            args[i] = t.unsqueeze(0).expand(2, *t.shape).contiguous()
        else:  # a 0-d tensor
            args[i] = t.reshape(-1)[:1].reshape(())
        return Case(args, None, f"{pname(op, i)} rank {args[i].dim()}")
    if kind in ("shape_mismatch", "broadcast"):
        idx = [i for i in tensor_params(op, args, mutated=False) if args[i].dim() >= 1]
        if not idx:
            return None
        i = rng.choice(idx)
        t = args[i]
        d = rng.randrange(t.dim())
        shape = list(t.shape)
        if kind == "broadcast":
            if shape[d] <= 1 or len(tensor_params(op, args)) < 2:
                return None
            shape[d] = 1
        else:
            shape[d] += rng.choice((1, 2, 5))
        args[i] = torch.randn(shape, generator=g).to(t.dtype)
        return Case(args, None, f"{pname(op, i)} {tuple(shape)}")
    if kind == "scalar_for_tensor":
        i = rng.choice(tensor_params(op, args))
        args[i] = rng.choice((1.5, 2, True))
        return Case(args, pname(op, i), pname(op, i))
    if kind == "tensor_for_scalar":
        idx = _scalar_params(op)
        if not idx:
            return None
        i = rng.choice(idx)
        args[i] = torch.tensor(1e-6 if isinstance(args[i], float) else 64)
        return Case(args, pname(op, i), pname(op, i))
    if kind == "wrong_type":
        i = rng.randrange(len(args))
        if isinstance(args[i], torch.Tensor):
            args[i] = rng.choice((None, [1.0, 2.0], "x"))
        else:
            args[i] = rng.choice((None, [1.0], object()))
        return Case(args, pname(op, i), pname(op, i))
    if kind in ADMISSION_KINDS:
        return _admission_case(kind, op, args, rng)
    if name == "topk_router" and kind == "bad_top_k":
        experts = args[0].shape[-1]
        args[1] = rng.choice((0, -1, experts + 1, experts + 7, 2**40))
        return Case(args, "top_k", str(args[1]))
    if name == "fp8_kcache_scatter":
        return _fp8_case(kind, args, rng)
    if name == "kv_append":
        return _kv_case(kind, args, rng)
    return None


def _overlap(args: list, cache_index: int, which: list[int], rng: random.Random, names) -> Case | None:
    """A read argument moved into the memory of the mutated cache at ``cache_index``."""
    cache = args[cache_index]
    i = rng.choice(which)
    src = args[i]
    if not src.numel() or not cache.is_contiguous():
        return None
    nbytes = src.numel() * src.element_size()
    flat = cache.view(-1).view(torch.uint8)
    if flat.numel() < nbytes:
        return None
    view = flat[:nbytes].view(src.dtype).view(src.shape)
    view.copy_(src)  # the same values, now in the cache's memory
    args[i] = view
    return Case(args, names[i], names[i])


def _fp8_case(kind: str, args: list, rng: random.Random) -> Case | None:
    k, cache, slots, qbs, fmt = args
    if kind == "overlap_mutated":
        return _overlap(args, 1, [0, 2], rng, ("k", "kv_cache", "slot_mapping"))
    if kind in ("slot_out_of_range", "negative_slot"):
        if not slots.numel():
            return None
        n_slots = cache.shape[0] * cache.shape[1]
        slots[rng.randrange(slots.numel())] = (rng.choice((n_slots, n_slots + 1, 2**40, 2**62))
                                               if kind == "slot_out_of_range" else -rng.choice((2, 7, 2**40)))
        return Case(args, "slot_mapping" if kind == "slot_out_of_range" else None)
    if kind == "slots_length":  # one slot per token, exactly
        args[2] = torch.cat([slots, torch.tensor([-1])]) if rng.random() < 0.5 or not slots.numel() else slots[1:]
        return Case(args, "slot_mapping", expect="refuse")
    if kind == "bad_scale_fmt":
        args[4] = rng.choice(("UE8M0", "e8m0", " ", "fp32"))
        return Case(args, "scale_fmt", args[4])
    if kind == "bad_quant_block":
        args[3] = rng.choice((0, -qbs, qbs + 1, 3, 2**40))
        return Case(args, "quant_block_size", str(args[3]))
    return None


def _kv_case(kind: str, args: list, rng: random.Random) -> Case | None:
    key, value, k_cache, v_cache, slots = args
    names = ("key", "value", "key_cache", "value_cache", "slot_mapping")
    if kind == "overlap_mutated":
        return _overlap(args, rng.choice((2, 3)), [0, 1, 4], rng, names)
    if kind in ("slot_out_of_range", "negative_slot"):
        if not slots.numel():
            return None
        n_slots = k_cache.shape[0] * k_cache.shape[1]
        bad = rng.choice((n_slots, n_slots + 1, 2**40, 2**62)) if kind == "slot_out_of_range" else -rng.choice((2, 7, 2**40))
        slots[rng.randrange(slots.numel())] = bad
        # documented: a slot past the cache writes nothing, as a padding slot, on every device
        return Case(args, None, str(bad), expect="match")
    if kind == "slots_length":  # at most one slot per token: fewer is fine, more is refused
        if rng.random() < 0.5:
            args[4] = torch.cat([slots, torch.full((key.shape[0] - slots.numel() + 1,), -1)])
            return Case(args, "slot_mapping", f"{args[4].numel()} slots", expect="refuse")
        if not slots.numel():
            return None
        args[4] = slots[1:]
        return Case(args, None, f"{args[4].numel()} slots", expect="match")
    return None


def _admission_case(kind: str, op, args: list, rng: random.Random) -> Case | None:
    """A tensor argument replaced by one the admission rule resolves or refuses (see
    ``ADMISSION_KINDS``); None when no argument fits."""
    if kind == "neg_mutated":
        idx = tensor_params(op, args, mutated=True)
    elif kind in ("neg_view", "conj_imag"):
        idx = [i for i in tensor_params(op, args, floating=True, mutated=False) if args[i].numel()]
    else:
        idx = [i for i in tensor_params(op, args) if args[i].dim() >= (2 if kind == "sparse_csr" else 1)
               and (args[i].is_floating_point() or kind not in ("quantized", "mkldnn"))]
    if not idx:
        return None
    i = rng.choice(idx)
    t = args[i]
    if kind in ("neg_view", "neg_mutated"):
        args[i] = torch._neg_view(t.neg())  # the same values, the negation in memory
    elif kind == "conj_imag":  # z.conj().imag: float32 values whose memory holds their negation
        for j in tensor_params(op, args, floating=True):
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
    return Case(args, None if ADMISSION_KINDS[kind] == "match" else pname(op, i), pname(op, i))
