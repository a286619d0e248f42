"""Bad input never reaches a kernel: inputs that require grad on an op without a
backward, shape mismatches, outputs too large to allocate, bf16 GEMM on the interpreter,
arguments that overlap a mutated one (or themselves), NaN/Inf, out-of-range indices.

CPU tests run the Triton kernels under the interpreter; the GPU tests rerun the kernel paths
(Triton and CUDA C++) on a GPU."""

from __future__ import annotations

import logging
import timeit

import pytest
import torch

import kernelgraft as kg
from kernelgraft.op import registry as _registry
from kernelgraft.examples.add_relu import add_relu
from kernelgraft.examples.fp8_kcache_scatter import fp8_kcache_scatter
from kernelgraft.examples.rmsnorm import rmsnorm
from kernelgraft.examples.swiglu import swiglu

NAN, INF = float("nan"), float("inf")


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """NaN where the reference has NaN (payloads differ between converters), the same bits
    elsewhere (so -0.0 stays -0.0)."""
    nan = torch.isnan(want)
    if not torch.equal(torch.isnan(got), nan):
        return False
    ints = {4: torch.int32, 2: torch.int16, 1: torch.uint8}[want.element_size()]
    return torch.equal(got[~nan].contiguous().view(ints), want[~nan].contiguous().view(ints))


# ------------------------------------------------------------------ autograd
def test_op_without_backward_runs_without_grad():
    g = torch.randn(3, 4, requires_grad=True)
    with torch.no_grad():
        out = add_relu(g, g)
    assert torch.equal(out, torch.relu(g.detach() * 2))
    assert torch.equal(add_relu(g.detach(), g.detach()), torch.relu(g.detach() * 2))
    with torch.inference_mode():
        assert torch.equal(add_relu(g, g), torch.relu(g.detach() * 2))


def test_op_with_backward_passes_gradcheck():
    gate = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    up = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(swiglu, (gate, up))
    out = swiglu(gate, up)
    out.sum().backward()
    assert gate.grad is not None and up.grad is not None
    sig = torch.sigmoid(gate.detach())
    assert torch.allclose(up.grad, gate.detach() * sig)


# ------------------------------------------------------------------ what the fuzz test found (test_fuzz.py)
def test_backward_through_an_op_without_one_raises_naming_it():
    g = torch.randn(3, 4, requires_grad=True)
    out = add_relu(g, g)
    assert out.requires_grad
    with pytest.raises(kg.UnsupportedError, match=r"kgexamples::add_relu has no backward.*register_autograd"):
        out.sum().backward()
    assert g.grad is None
    with torch.no_grad():
        assert not add_relu(g, g).requires_grad
    with torch.inference_mode():
        assert torch.equal(add_relu(g, g), torch.relu(2 * g.detach()))


def test_compiled_inference_with_parameters_works_and_backward_raises():
    w = torch.nn.Parameter(torch.randn(3, 4))
    x = torch.randn(3, 4)
    f = torch.compile(lambda w, x: add_relu(w, x) * 2, backend="aot_eager", fullgraph=True)
    out = f(w, x)
    assert torch.equal(out.detach(), torch.relu(w.detach() + x) * 2)
    with pytest.raises(kg.UnsupportedError, match="kgexamples::add_relu has no backward"):
        out.sum().backward()
    with torch.no_grad():
        assert torch.equal(f(w, x), torch.relu(w.detach() + x) * 2)


def test_a_backward_registered_later_replaces_the_refusal():
    @kg.op("fuzztest::double")
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    x = torch.randn(4, requires_grad=True)
    with pytest.raises(kg.UnsupportedError, match="fuzztest::double has no backward"):
        double(x).sum().backward()
    double.register_autograd(lambda ctx, grad: grad * 2)
    double(x).sum().backward()
    assert torch.equal(x.grad, torch.full((4,), 2.0))


def test_backward_through_a_tensor_list_argument_raises_naming_the_elements():
    # the refusal's gradient for a Tensor[] argument is a list (torch checks the structure); it
    # once passed None as the refused gradient's size and torch raised a bare RuntimeError
    @kg.op("fuzztest::cat_scaled")
    def cat_scaled(xs: list[torch.Tensor], w: torch.Tensor) -> torch.Tensor:
        return torch.cat(xs) * w

    a, b = torch.randn(4), torch.randn(4, requires_grad=True)
    w = torch.randn(8)
    refused = r"fuzztest::cat_scaled has no backward, and its argument 'xs\[1\]' requires"
    with pytest.raises(kg.UnsupportedError, match=refused):
        cat_scaled([a, b], w).sum().backward()
    w.requires_grad_()
    with pytest.raises(kg.UnsupportedError, match=r"arguments 'xs\[1\]', 'w' require grad"):
        cat_scaled([a, b], w).sum().backward()
    assert b.grad is None and w.grad is None
    # compiled: the refusal is traced into the backward graph (its fake kernel shapes a list
    # element's gradient) and raises when that runs
    f = torch.compile(lambda a, b, w: cat_scaled([a, b], w) * 2, backend="aot_eager", fullgraph=True)
    out = f(a, b, w.detach())
    assert torch.equal(out.detach(), torch.cat([a, b.detach()]) * w.detach() * 2)
    with pytest.raises(kg.UnsupportedError, match=r"argument 'xs\[1\]' requires grad"):
        out.sum().backward()


def test_shape_mismatch_is_an_input_error_without_error_logs(caplog):
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(kg.InputError, match=r"kgexamples::add_relu: .*\(5,\).*shapes do not fit together"):
            add_relu(torch.randn(3, 4), torch.randn(5))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_an_output_that_cannot_be_allocated_is_refused():
    x = torch.zeros(1, 64).expand(2**36, 64)
    with pytest.raises(kg.InputError, match=r"kgexamples::rmsnorm: output 0 would be .* TiB, more than"):
        rmsnorm(x, torch.ones(64), 1e-6)


def test_bf16_gemm_on_the_interpreter_matches_and_check_sees_bf16():
    from kernelgraft.verify import oracle as _verify
    from kernelgraft.examples.gemm import gemm, sample_inputs

    samples = list(sample_inputs("cpu"))
    assert any(a.dtype == torch.bfloat16 for a, _ in samples)
    assert any(not torch.isfinite(a).all() for a, _ in samples)
    for a, b in samples:
        ref = _verify.reference(gemm, (a, b))
        verdict = _verify.verify(ref, [gemm.run(a, b, impl=0)], gemm.tolerances)
        assert verdict.ok, (tuple(a.shape), a.dtype, str(verdict))


def test_a_mutated_argument_whose_elements_share_memory_is_refused():
    k, cache, slots = torch.randn(2, 128), torch.zeros(1, 4, 132, dtype=torch.uint8), torch.tensor([0, 1])
    with pytest.raises(kg.InputError, match=r"argument 'kv_cache' is mutated but several of its elements"):
        fp8_kcache_scatter(k, cache[:, :1].expand(1, 4, 132), slots, 128, "")


@pytest.mark.parametrize("slots, fmt, match", [
    (torch.tensor([0]), "", r"argument 'slot_mapping' has 1 entries, expected one per token of 'k' \(2\)"),
    (torch.tensor([0, 1]), "UE8M0", r"argument 'scale_fmt' is 'UE8M0', expected ''"),
])
def test_fp8_scatter_refuses_mismatched_slots_and_unknown_scale_formats(slots, fmt, match):
    cache = torch.zeros(1, 4, 132, dtype=torch.uint8)
    with pytest.warns(kg.FallbackWarning), pytest.raises(kg.InputError, match=match):
        fp8_kcache_scatter(torch.randn(2, 128), cache, slots, 128, fmt)
    assert not cache.any()


# ------------------------------------------------------------------ overlap
def _scatter_case():
    cache = torch.randint(0, 256, (4, 4, 132), dtype=torch.uint8)
    return torch.randn(3, 128), cache, torch.tensor([5, -1, 0])


def test_input_overlapping_the_mutated_cache_is_refused():
    _, cache, slots = _scatter_case()
    # k a float32 view of the cache's own bytes, as the fuzz run built it
    k = cache.view(-1)[4 * 132:4 * 132 + 3 * 128 * 4].view(torch.float32).view(3, 128)
    before = cache.clone()
    with pytest.raises(kg.InputError, match=r"argument 'k' overlaps the memory of argument 'kv_cache'"):
        fp8_kcache_scatter(k, cache, slots, 128, "")
    assert torch.equal(cache, before)
    # slots in the cache's memory are refused too; op.run and torch.ops check the same
    slot_view = cache.view(-1)[:24].view(torch.int64)
    with pytest.raises(kg.InputError, match=r"'slot_mapping' overlaps"):
        fp8_kcache_scatter(torch.randn(3, 128), cache, slot_view, 128, "")
    with pytest.raises(kg.InputError, match=r"'k' overlaps"):
        fp8_kcache_scatter.run(k, cache, slots, 128, "", impl="triton")
    with pytest.raises(kg.InputError, match=r"'k' overlaps"):
        torch.ops.kgexamples.fp8_kcache_scatter(k, cache, slots, 128, "")
    assert torch.equal(cache, before)


def test_disjoint_views_of_one_buffer_are_allowed():
    k, cache, slots = _scatter_case()
    arena = torch.zeros(cache.numel() + k.numel() * 4, dtype=torch.uint8)
    view_cache = arena[: cache.numel()].view(cache.shape)
    view_cache.copy_(cache)
    view_k = arena[cache.numel():].view(torch.float32).view(3, 128)
    view_k.copy_(k)
    fp8_kcache_scatter(view_k, view_cache, slots, 128, "")
    want = cache.clone()
    fp8_kcache_scatter.run(k, want, slots, 128, "", impl="reference")
    assert torch.equal(view_cache, want)


def test_allow_overlap_is_an_option_and_part_of_the_identity():
    def bump(x: torch.Tensor, y: torch.Tensor) -> None:
        x.add_(y)

    strict = kg.op(bump, mutates_args=("x",))
    lenient = kg.op(bump, mutates_args=("x",), allow_overlap=True)
    try:
        assert strict.fingerprint != lenient.fingerprint
        assert "allow_overlap" not in strict.identity  # the default leaves fingerprints as they were
        x = torch.ones(4)
        with pytest.raises(kg.InputError, match=r"'y' overlaps the memory of argument 'x'"):
            strict(x, x[1:])
        lenient(x, x)
        assert x.tolist() == [2.0] * 4
        with pytest.raises(kg.SpecError, match="allow_overlap"):
            kg.op(bump, mutates_args=("x",), allow_overlap="yes")
    finally:
        _registry.unregister(strict.name)
        _registry.unregister(lenient.name)


def test_native_replay_hands_an_overlapping_call_back_and_it_is_refused():
    """The replay runs the guard's comparisons in C++: a mutating op still replays, and an
    overlapping call of its signature is refused as on the Python path."""
    import shutil

    from _host_backend import accumulate_op

    from kernelgraft import native as _native

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler on this machine: the native replay cannot be built")
    assert _native.load() is not None, _native.reason()

    op = accumulate_op("kgtest_bad::accumulate")
    try:
        for _ in range(4):
            x, acc = torch.randn(8), torch.randn(8)
            want = acc + x
            op(x, acc)
            torch.testing.assert_close(acc, want)
        replay = op.dispatcher.current_replay()
        assert replay is not None and replay.stats() == {"calls": 2, "misses": 0}
        buf = torch.randn(16)
        before = buf.clone()
        with pytest.raises(kg.InputError, match=r"'x' overlaps the memory of argument 'acc'"):
            op(buf[4:12], buf[:8])  # the same signature as the replay's: shape (8,), stride (1,)
        assert torch.equal(buf, before) and replay.stats()["misses"] >= 1  # handed back, not run
        want = buf[:8] + buf[8:]
        op(buf[8:], buf[:8])  # disjoint views of one buffer: replayed
        assert replay.stats()["calls"] == 3 and torch.equal(buf[:8], want)
    finally:
        _registry.unregister(op.name)


def test_overlap_check_cost_on_the_python_path():
    """The per-call guard reads one data_ptr per tensor and compares intervals: report its cost."""
    k, cache, slots = _scatter_case()
    guard = fp8_kcache_scatter.dispatcher.overlap_guard((k, cache, slots, 128, ""))
    assert guard is not None
    args = (k, cache, slots, 128, "")
    n = 20000
    per_call = min(timeit.repeat(lambda: guard(args), number=n, repeat=5)) / n
    print(f"overlap guard: {per_call * 1e6:.3f} us per call (3 tensors, 2 pairs)")
    assert per_call < 20e-6  # a loose bound on a shared machine; the report gives the measurement
    assert add_relu.dispatcher.overlap_guard((k, k)) is None  # ops that mutate nothing pay nothing


# ------------------------------------------------------------------ NaN / Inf
def test_add_relu_propagates_nan_like_torch_relu():
    x = torch.tensor([NAN, -NAN, INF, -INF, -0.0, -1.0, 2.0, 0.0])
    y = torch.zeros_like(x)
    assert _same(add_relu(x, y), torch.relu(x + y))
    assert torch.isnan(add_relu(torch.tensor([NAN]), torch.tensor([0.0]))).all()
    for dt in (torch.float16, torch.bfloat16):
        xs = x.to(dt)
        assert _same(add_relu(xs, y.to(dt)), torch.relu(xs + y.to(dt)))


def test_swiglu_and_rmsnorm_propagate_nan_and_inf():
    gate = torch.tensor([NAN, INF, -INF, 1.0, 0.0])
    up = torch.tensor([1.0, 2.0, 3.0, NAN, INF])
    got, want = swiglu(gate, up), torch.nn.functional.silu(gate) * up
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.allclose(got[~torch.isnan(want)], want[~torch.isnan(want)])
    x = torch.tensor([[1.0, NAN, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0], [INF, 1.0, 1.0, 1.0]])
    w = torch.ones(4)
    got, want = rmsnorm(x, w, 1e-6), rmsnorm.run(x, w, 1e-6, impl="reference")
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.allclose(got[1], want[1])


@pytest.mark.parametrize("scale_fmt", ["", "ue8m0"])
@pytest.mark.parametrize("special", [NAN, INF, -INF])
def test_fp8_scatter_writes_torchs_bytes_for_nan_and_inf(special, scale_fmt):
    k = torch.randn(4, 128) * 3
    k[0, 5] = special           # one special value in token 0's only block
    k[2, :] = special           # a block made of it
    k[3, 7], k[3, 9] = NAN, INF
    cache = torch.randint(0, 256, (2, 4, 132), dtype=torch.uint8)
    want = cache.clone()
    slots = torch.tensor([0, 5, 2, 7])
    fp8_kcache_scatter(k, cache, slots, 128, scale_fmt)
    fp8_kcache_scatter.run(k, want, slots, 128, scale_fmt, impl="reference")
    assert torch.equal(cache, want), (cache != want).nonzero()[:8].tolist()
    # the raw conversion the reference relies on, as torch gives it today
    raw = torch.tensor([NAN, INF, -INF]).to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    assert raw[0] == 0x7F


# ------------------------------------------------------------------ out-of-range indices
def test_fp8_scatter_out_of_range_slot_raises_on_cpu_and_writes_nothing():
    k = torch.randn(4, 128)
    cache = torch.randint(0, 256, (2, 4, 132), dtype=torch.uint8)
    before = cache.clone()
    for slots in ([100000, 1, 2, 3], [0, 1, 8, 3], [0, 1, 2, 40]):
        with pytest.raises(kg.InputError, match=r"'slot_mapping' holds slot \d+ .*below num_blocks"):
            fp8_kcache_scatter(k, cache, torch.tensor(slots), 128, "")
        assert torch.equal(cache, before)
    with pytest.raises(kg.InputError, match="slot_mapping"):
        fp8_kcache_scatter.run(k, cache, torch.tensor([100000, 1, 2, 3]), 128, "", impl="reference")
    assert torch.equal(cache, before)
    fp8_kcache_scatter(k, cache, torch.tensor([7, -1, -5, 0]), 128, "")  # the last slot, padding
    assert not torch.equal(cache, before)


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["triton", "cuda"])
def test_gpu_kernels_mask_out_of_range_slots(impl):
    k = torch.randn(4, 128, device="cuda")
    cache = torch.randint(0, 256, (2, 4, 132), dtype=torch.uint8, device="cuda")
    guard = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8, device="cuda")
    guard_before = guard.clone()
    before = cache.clone()
    slots = torch.tensor([100000, 1, 8, 3], device="cuda")
    fp8_kcache_scatter.run(k, cache, slots, 128, "", impl=impl)
    torch.cuda.synchronize()
    want = before.clone()
    fp8_kcache_scatter.run(k, want, torch.tensor([-1, 1, -1, 3], device="cuda"), 128, "", impl="reference")
    assert torch.equal(cache, want)
    assert torch.equal(guard, guard_before)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["triton", "cuda"])
@pytest.mark.parametrize("special", [NAN, INF, -INF])
@pytest.mark.parametrize("scale_fmt", ["", "ue8m0"])
def test_gpu_nan_inf_bytes(impl, special, scale_fmt):
    """The GPU's fp8 conversion saturates Inf to 448 where torch's gives NaN: no Inf may reach it
    (a ue8m0 rounding of a NaN scale once made -0.0, and x / -0.0 an Inf)."""
    k = torch.randn(4, 128, device="cuda") * 3
    k[0, 5], k[2, :] = special, special
    k[3, 7], k[3, 9] = NAN, INF
    cache = torch.randint(0, 256, (2, 4, 132), dtype=torch.uint8, device="cuda")
    want = cache.clone()
    slots = torch.tensor([0, 5, 2, 7], device="cuda")
    fp8_kcache_scatter.run(k, cache, slots, 128, scale_fmt, impl=impl)
    fp8_kcache_scatter.run(k, want, slots, 128, scale_fmt, impl="reference")
    assert torch.equal(cache, want)
    x = torch.tensor([NAN, -1.0, 2.0, -0.0], device="cuda")
    got = add_relu.run(x, torch.zeros_like(x), impl=impl)
    assert _same(got.cpu(), torch.relu(x).cpu())


@pytest.mark.gpu
def test_gpu_overlap_refused_and_cost():
    cache = torch.randint(0, 256, (3, 4, 132), dtype=torch.uint8, device="cuda")  # 1584 bytes: room for k
    k = cache.view(-1)[: 3 * 128 * 4].view(torch.float32).view(3, 128)
    with pytest.raises(kg.InputError, match="overlaps"):
        fp8_kcache_scatter(k, cache, torch.tensor([5, -1, 0], device="cuda"), 128, "")
    k = torch.randn(3, 128, device="cuda")
    slots = torch.tensor([5, -1, 0], device="cuda")
    for _ in range(3):
        fp8_kcache_scatter(k, cache, slots, 128, "")
    torch.cuda.synchronize()
    n = 2000
    per_call = min(timeit.repeat(lambda: fp8_kcache_scatter(k, cache, slots, 128, ""), number=n, repeat=5)) / n
    torch.cuda.synchronize()
    print(f"fp8_kcache_scatter host cost with the overlap guard: {per_call * 1e6:.2f} us per call")


def test_the_autograd_kernel_is_registered_when_the_op_is_defined():
    """An op's autograd kernel (its backward, or the refusal) is in place from definition, so no
    route that never takes the eager slow path (torch.ops, a compiled graph traced in a fresh
    process) can reach the op before it and lose a gradient."""
    import torch

    @kg.op("tbadin::lazy_grad")
    def lazy_grad(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    assert torch._C._dispatch_has_kernel_for_dispatch_key("tbadin::lazy_grad", "Autograd")
    x = torch.randn(8)
    assert torch.equal(lazy_grad(x), x * 3) and torch.equal(torch.ops.tbadin.lazy_grad(x), x * 3)
    with torch.no_grad():
        assert not lazy_grad(x.requires_grad_()).requires_grad
    out = torch.ops.tbadin.lazy_grad(torch.randn(8, requires_grad=True))
    with pytest.raises(kg.UnsupportedError, match="tbadin::lazy_grad has no backward"):
        out.sum().backward()
