"""The RMSNorm+residual, softmax and paged FP8 K-cache scatter examples: semantics on the CPU
(Triton interpreter), CUDA C++ sources compile for sm_90 without a GPU, every candidate on the GPU."""

from __future__ import annotations

import importlib

import pytest
import torch
import triton
import triton.language as tl

import kernelgraft as kg
from kernelgraft.examples import _softmax_cuda as softmax_cuda
from kernelgraft.examples import fp8_kcache_scatter as fp8
from kernelgraft.examples.rmsnorm_residual import rmsnorm_residual
from kernelgraft.examples.softmax import softmax
from kernelgraft.bench import module_inputs

MODULES = ["rmsnorm_residual", "softmax", "fp8_kcache_scatter", "swiglu", "gemm"]
# dtypes each module's CUDA C++ kernel is instantiated for (the GEMM is a 16-bit WMMA kernel)
CUDA_DTYPES = {"gemm": (torch.float16, torch.bfloat16), "swiglu": (torch.float32, torch.float16, torch.bfloat16, torch.float64)}


def _nvrtc_missing():
    try:
        from kernelgraft.backends.cuda.nvrtc import nvrtc_version

        nvrtc_version()
        return None
    except Exception as exc:  # noqa: BLE001
        return str(exc)


def test_rmsnorm_residual_semantics_and_fresh_outputs():
    x, r, w = torch.randn(6, 200, dtype=torch.bfloat16), torch.randn(6, 200, dtype=torch.bfloat16), torch.randn(200, dtype=torch.bfloat16)
    x0, r0 = x.clone(), r.clone()
    out, res = rmsnorm_residual(x, r, w, 1e-6)
    assert torch.equal(x, x0) and torch.equal(r, r0)  # functional: inputs untouched
    # (Triton's CPU interpreter rounds float32 -> bf16 its own way; GPUs round to nearest even,
    # which test_every_candidate_matches_reference_on_gpu checks)
    torch.testing.assert_close(res, x + r, rtol=1e-2, atol=1e-2)
    xf, rf = x.float(), r.float()
    assert torch.equal(rmsnorm_residual(xf, rf, w.float(), 1e-6)[1], xf + rf)
    s = (x + r).double()
    want = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("impl", ["softmax_rows", "softmax_online"])
def test_softmax_triton_kernels_on_masked_rows(impl):
    x = torch.randn(5, 5000)
    x[:, 3000:] = float("-inf")
    x[0, :2500] = float("-inf")  # the online kernel's first chunks see only -inf
    got = softmax.run(x, impl=impl)
    torch.testing.assert_close(got, torch.softmax(x.double(), -1).float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["softmax_rows", "softmax_online", "softmax_split"])
def test_softmax_triton_kernels_propagate_nan_and_inf_like_the_reference(impl):
    from kernelgraft.examples.softmax import wide_nan_inf

    x = wide_nan_inf()
    want = torch.softmax(x.double(), -1).float()
    assert want[:4].isnan().all() and not want[4].isnan().any()  # the sample means what it says
    configs = [c.config for c in softmax.candidates(x) if c.supported and c.impl.display_name == impl]
    assert configs
    for config in configs:
        got = softmax.run(x, impl=impl, config=config.as_dict())
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, msg=lambda m: f"{config}: {m}")


def test_fp8_scatter_triton_is_byte_exact_and_touches_only_its_bytes():
    for k, cache, slots, qbs, fmt in fp8.sample_inputs():
        want, got = cache.clone(), cache.clone()
        fp8.fp8_kcache_scatter.run(k, want, slots, qbs, fmt, impl="reference")
        fp8.fp8_kcache_scatter.run(k, got, slots, qbs, fmt, impl="triton")
        assert torch.equal(got, want), (tuple(k.shape), tuple(cache.stride()), fmt)
        changed = (want != cache).sum().item()
        n_valid = int((slots >= 0).sum())
        head_dim = k.shape[1]
        assert changed <= n_valid * (head_dim + 4 * head_dim // qbs) and changed > n_valid * head_dim // 2


def test_fp8_scatter_layout_matches_vllm():
    """Page = block_size*head_dim fp8 bytes (token-major), then the float32 scales."""
    k = torch.randn(2, 128) * 5
    cache = torch.zeros(3, 16, 132, dtype=torch.uint8)
    fp8.fp8_kcache_scatter(k, cache, torch.tensor([16 + 5, -1]), 128, "")
    page = cache[1].flatten()
    scale = page[16 * 128 + 5 * 4:16 * 128 + 6 * 4].view(torch.float32)
    assert scale.item() == pytest.approx(k[0].abs().max().item() / 448, rel=1e-6)
    values = page[5 * 128:6 * 128].view(torch.float8_e4m3fn).float() * scale
    torch.testing.assert_close(values, k[0], rtol=0.07, atol=1e-3)
    assert page[:5 * 128].eq(0).all() and cache[0].eq(0).all() and cache[2].eq(0).all()


def test_fp8_scatter_ue8m0_is_power_of_two_ceiling():
    s = torch.tensor([1.0, 1.5, 0.75, 2 ** -20 * 1.1, 3.0e5], dtype=torch.float32)
    got = fp8._ue8m0(s.clone())
    want = torch.tensor([2.0 ** torch.ceil(torch.log2(v.double())).item() for v in s], dtype=torch.float32)
    assert torch.equal(got, want)


def test_fp8_scatter_rejects_bad_layout():
    k = torch.randn(2, 100)
    with pytest.raises(kg.InputError, match="not a multiple of quant_block_size"):
        fp8.fp8_kcache_scatter(k, torch.zeros(1, 4, 132, dtype=torch.uint8), torch.tensor([0, 1]), 64, "")
    with pytest.raises(kg.InputError, match="too short"):
        fp8.fp8_kcache_scatter(torch.randn(2, 128), torch.zeros(1, 4, 130, dtype=torch.uint8),
                               torch.tensor([0, 1]), 128, "")


@triton.jit
def _convert(x_ptr, o_ptr, n, B: tl.constexpr):
    offs = tl.arange(0, B)
    mask = offs < n
    tl.store(o_ptr + offs, fp8._e4m3_bits(tl.load(x_ptr + offs, mask=mask)), mask=mask)


def test_software_e4m3_matches_torch_rounding():
    """Every e4m3 value, the midpoints between neighbours (ties to even) and random values."""
    codes = torch.arange(0, 127, dtype=torch.uint8)  # all finite non-negative codes
    grid = codes.view(torch.float8_e4m3fn).float()
    mids = (grid[1:] + grid[:-1]) / 2
    vals = torch.cat([grid, mids, -grid, -mids, torch.randn(4000) * 50, torch.randn(2000) * 1e-2,
                      torch.tensor([448.0, 449.0, 460.0, -470.0, 1e-9, -0.0])])
    out = torch.empty(vals.numel(), dtype=torch.uint8)
    _convert[(1,)](vals, out, vals.numel(), B=triton.next_power_of_2(vals.numel()))
    want = vals.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    bad = (out != want).nonzero().flatten()
    assert bad.numel() == 0, [(vals[i].item(), out[i].item(), want[i].item()) for i in bad[:5]]


@pytest.mark.skipif(_nvrtc_missing() is not None, reason="NVRTC not installed")
@pytest.mark.parametrize("module", MODULES)
def test_cuda_sources_compile_for_sm90(module):
    from kernelgraft.backends.cuda.jit import CudaRunner

    impls = importlib.import_module(f"kernelgraft.examples.{module}").IMPLS
    specs = [i for i in impls if i.backend == "cuda"]  # softmax has three
    assert specs
    for spec in specs:
        for config in spec.configs:
            for dtype in CUDA_DTYPES.get(module, (torch.float32, torch.float16, torch.bfloat16)):
                compiled = CudaRunner(spec, config).compile("sm_90", {"T": kg.ctype(dtype)})
                assert compiled.image[:4] == b"\x7fELF", (spec.display_name, config, dtype)


def test_softmax_cluster_kernel_claims_the_right_rows():  # compiling them: test_cuda_sources_compile_for_sm90
    spec = softmax_cuda.CUDA_CLUSTER
    fits = lambda x, i: softmax_cuda._fits_cluster(x, **spec.configs[i].as_dict())  # noqa: E731
    wide = torch.empty(2, 32768, dtype=torch.bfloat16)
    assert fits(wide, 0) is True and fits(wide, 1) is True and fits(wide, 2) is True
    assert "exceed" in fits(torch.empty(2, 65536, dtype=torch.bfloat16), 0)
    assert "idle" in fits(torch.empty(2, 4096, dtype=torch.bfloat16), 0)
    assert "16-byte" in fits(torch.empty(2, 32760, dtype=torch.bfloat16), 0)
    assert "aligned" in fits(torch.empty(2, 32769, dtype=torch.bfloat16)[:, 1:], 0)
    assert spec.min_capability == (9, 0)


def test_softmax_row_regs_kernel_claims_rows_that_fit_its_registers():
    spec = softmax_cuda.CUDA_ROW_REGS
    fits = lambda x, i: softmax_cuda._fits_row_regs(x, **spec.configs[i].as_dict())  # noqa: E731
    for i in range(len(spec.configs)):  # every config holds 64 KiB rows
        assert fits(torch.empty(2, 32768, dtype=torch.bfloat16), i) is True
        assert fits(torch.empty(2, 16384, dtype=torch.float32), i) is True
    assert "do not fit" in fits(torch.empty(2, 32768, dtype=torch.float32), 0)
    assert "do not fit" in fits(torch.empty(2, 32776, dtype=torch.float16), 0)
    assert "16-byte" in fits(torch.empty(2, 32764, dtype=torch.bfloat16), 0)
    assert "under 8192" in fits(torch.empty(2, 4096, dtype=torch.bfloat16), 0)
    assert "aligned" in fits(torch.empty(2, 16392, dtype=torch.bfloat16)[:, 4:-4], 0)


def test_softmax_row_tma_kernel_claims_rows_that_fit_shared_memory():
    spec = softmax_cuda.CUDA_ROW_TMA
    fits = lambda x, i: softmax_cuda._fits_row_tma(x, **spec.configs[i].as_dict())  # noqa: E731
    for i in range(len(spec.configs)):
        assert fits(torch.empty(2, 32768, dtype=torch.bfloat16), i) is True
        assert fits(torch.empty(2, 32768, dtype=torch.float32), i) is True  # 128 KiB: one block per SM
    assert "exceeds the shared memory" in fits(torch.empty(2, 65536, dtype=torch.float32), 0)
    assert "16-byte" in fits(torch.empty(2, 32764, dtype=torch.bfloat16), 0)
    assert "under 8192" in fits(torch.empty(2, 4096, dtype=torch.bfloat16), 0)
    assert "aligned" in fits(torch.empty(2, 16392, dtype=torch.bfloat16)[:, 4:-4], 0)
    assert spec.min_capability == (9, 0)


def test_softmax_stream_kernel_claims_long_rows():  # compiling them: test_cuda_sources_compile_for_sm90
    spec = softmax_cuda.CUDA_STREAM
    fits = lambda x, i: softmax_cuda._fits_stream(x, **spec.configs[i].as_dict())  # noqa: E731
    assert fits(torch.empty(2, 32768, dtype=torch.bfloat16), 0) is True  # 3 x 64 KiB ring
    assert "227 KiB" in fits(torch.empty(2, 32768, dtype=torch.float32), 0)
    assert fits(torch.empty(2, 16384, dtype=torch.float32), 0) is True
    assert "8192" in fits(torch.empty(2, 4096, dtype=torch.bfloat16), 0)
    assert "16-byte" in fits(torch.empty(2, 9001, dtype=torch.bfloat16), 0)
    assert spec.min_capability == (8, 0)


def _check_alone(name, spec, reference, samples, dtypes):
    """check_op on an op holding ``spec`` alone (the example's other kernels are checked elsewhere)."""
    from kernelgraft.check import check_op

    op = kg.op(name, impls=[spec], sample_inputs=samples, dtypes=dtypes)(reference)
    report = check_op(op, device="cpu", opcheck=False)
    passed = [r for r in report.results if r.status == "pass" and r.candidate.startswith("triton:")
              and r.variant == "contiguous"]  # the samples as given (derived inputs have their own rows)
    assert report.ok, [r for r in report.results if r.status == "fail"]
    return {r.candidate for r in passed}, {r.sample for r in passed}


def test_rmsnorm_block_of_rows_candidates_pass_check_op():
    from kernelgraft.examples import rmsnorm as module

    def samples(device="cpu", dtype=torch.float32):
        for rows, cols, dt in [(70, 64, torch.float32), (33, 128, torch.bfloat16), (5, 256, torch.float16),
                               (9, 1000, torch.float32)]:
            yield (torch.randn(rows, cols, device=device, dtype=dt), torch.randn(cols, device=device, dtype=dt), 1e-6)

    def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return module.rmsnorm.reference(x, weight, eps)

    labels, shapes = _check_alone("kgtest_suite::rmsnorm_rows", module.TRITON_ROWS, reference, samples,
                                  (torch.float32, torch.float16, torch.bfloat16))
    assert len(labels) == 4 and len(shapes) == 4  # every config and every sample passed
    # wider than 1024 elements is the one-row kernels' job
    x = torch.empty(4, 2048)
    for cand in module.rmsnorm.candidates(x, torch.empty(2048), 1e-6):
        if cand.impl is module.TRITON_ROWS:
            assert not cand.supported and "at most 1024 elements" in cand.reason


def test_softmax_split_row_candidates_pass_check_op():
    from kernelgraft.examples import softmax as module

    def samples(device="cpu", dtype=torch.float32):
        yield (torch.randn(1, 40000, device=device, dtype=dtype) * 5,)  # more splits than the row fills
        masked = torch.randn(3, 32768, device=device, dtype=torch.bfloat16)
        masked[1, 5000:] = float("-inf")  # whole chunks of -inf
        masked[2, :20000] = float("-inf")
        yield (masked,)
        yield (torch.randn(2, 20000, device=device, dtype=torch.float16) * 10,)

    def reference(x: torch.Tensor) -> torch.Tensor:
        return module.softmax.reference(x)

    labels, shapes = _check_alone("kgtest_suite::softmax_split", module.TRITON_SPLIT, reference, samples,
                                  (torch.float32, torch.float16, torch.bfloat16))
    assert len(labels) >= 4 and len(shapes) == 3
    many_rows = torch.empty(65, 1 << 16)
    for cand in module.softmax.candidates(many_rows):
        if cand.impl is module.TRITON_SPLIT:
            assert not cand.supported and "at most 64 rows" in cand.reason


def test_bench_inputs_are_declared():
    for module in MODULES:
        assert callable(importlib.import_module(f"kernelgraft.examples.{module}").bench_case)


# ------------------------------------------------------------------ GPU
def kernels(candidates):
    from kernelgraft.op.compete import is_torch

    return [c for c in candidates if not is_torch(c)]


@pytest.mark.gpu
def test_fp8_scatter_every_candidate_byte_exact_on_gpu():
    op = fp8.fp8_kcache_scatter
    n = 0
    for k, cache, slots, qbs, fmt in fp8.sample_inputs("cuda"):
        want = cache.clone()
        op.run(k, want, slots, qbs, fmt, impl="reference")
        # the kernels: the torch candidates are the reference itself (Inductor on torch 2.11 cannot
        # compile its float32 -> uint8 view; the tuner's gate excludes torch:compile then, once)
        for cand in kernels(op.candidates(k, cache, slots, qbs, fmt)):
            assert cand.supported, cand
            got = cache.clone()
            op.run(k, got, slots, qbs, fmt, impl=cand.index, config=cand.config.as_dict())
            torch.cuda.synchronize()
            diff = (got != want).nonzero()
            assert diff.numel() == 0, f"{cand.label} {tuple(k.shape)} {tuple(cache.stride())} {fmt}: {diff[:5].tolist()}"
            n += 1
    assert n >= 16
    # a large DeepSeek-shaped case too
    k, cache, slots, qbs, fmt = next(iter(module_inputs(fp8, "cuda")))
    want = cache.clone()
    op.run(k, want, slots, qbs, fmt, impl="reference")
    for cand in kernels(op.candidates(k, cache, slots, qbs, fmt)):
        got = cache.clone()
        op.run(k, got, slots, qbs, fmt, impl=cand.index, config=cand.config.as_dict())
        assert torch.equal(got, want), cand.label


@pytest.mark.gpu
@pytest.mark.parametrize("module", ["rmsnorm", "rmsnorm_residual", "softmax", "swiglu"])
def test_every_candidate_matches_reference_on_gpu(module):
    mod = importlib.import_module(f"kernelgraft.examples.{module}")
    op = getattr(mod, module)
    n = 0
    for inputs in op.sample_inputs("cuda"):
        want = op.reference(*[i.double() if isinstance(i, torch.Tensor) else i for i in inputs])
        want = want if isinstance(want, tuple) else (want,)
        for cand in op.candidates(*inputs):
            if not cand.supported:
                continue
            got = op.run(*inputs, impl=cand.index, config=cand.config.as_dict())
            got = got if isinstance(got, tuple) else (got,)
            tol = 1e-5 if inputs[0].dtype == torch.float32 else 2e-2
            for g, w in zip(got, want):
                torch.testing.assert_close(g.double(), w, rtol=tol, atol=tol, equal_nan=True,
                                           msg=lambda m: f"{cand.label} {tuple(inputs[0].shape)}: {m}")
            n += 1
    backends = {c.impl.backend for c in op.candidates(*next(iter(op.sample_inputs("cuda"))))}
    assert {"triton", "cuda"} <= backends and n > 10


@pytest.mark.gpu
def test_gemm_cuda_and_triton_candidates_match_on_gpu():
    """Every CUDA C++ (WMMA) config and the first Triton configs, on odd and LLM-like shapes,
    strided inputs included, against a float64 reference (relative Frobenius error)."""
    from kernelgraft.examples.gemm import gemm

    n, backends = 0, set()
    for m, nn, k in [(1, 8, 8), (37, 129, 70), (16, 4096, 4096), (512, 512, 512), (2048, 11008, 4096)]:
        for dtype in (torch.bfloat16, torch.float16):
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(k, nn + 8, device="cuda", dtype=dtype)[:, :nn]  # row stride != N
            want = a.double() @ b.double()
            # the kernels (PyTorch's candidates run the reference itself)
            cands = [c for c in gemm.candidates(a, b) if c.supported and c.impl.backend != "torch"]
            triton_seen = 0
            for cand in cands:
                if cand.impl.backend == "triton":
                    triton_seen += 1
                    if triton_seen > 3:
                        continue
                out = torch.full((m, nn), float("nan"), device="cuda", dtype=dtype)
                got = gemm.run(a, b, impl=cand.index, config=cand.config.as_dict())
                out.copy_(got)
                err = ((out.double() - want).norm() / want.norm().clamp_min(1e-30)).item()
                assert err < 1e-2, f"{cand.label} {(m, nn, k)} {dtype}: relative error {err:.3g}"
                backends.add(cand.impl.backend)
                n += 1
    assert backends == {"triton", "cuda"} and n >= 50


@pytest.mark.parametrize("name", ["add_relu", "rmsnorm", "rmsnorm_residual", "softmax", "swiglu", "gemm",
                                  "fp8_kcache_scatter"])
def test_every_predicate_takes_cuda_tensors(name):
    # A predicate's CUDA branch never runs in the CPU tests: the GEMM's WMMA predicate called the
    # Triton one without its config, which reads the pipeline's stages on CUDA tensors only, and
    # every CUDA GEMM candidate was refused on the GPU (KeyError) while the CPU tests passed. Fake
    # CUDA tensors of each sample's shapes reach those branches here; only a question this
    # machine's torch cannot answer (a device property) may stop one.
    import importlib

    from torch._subclasses.fake_tensor import FakeTensorMode

    op = getattr(importlib.import_module(f"kernelgraft.examples.{name}"), name)
    answered = 0
    for inputs in list(op.sample_inputs("cpu"))[:6]:
        with FakeTensorMode():
            fake = tuple(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")
                         if isinstance(t, torch.Tensor) else t for t in inputs)
            for impl in op.impls:
                for config in (impl.configs if impl.supports is not None else ()):
                    try:
                        verdict = impl.supports(*fake, **config.as_dict())
                    except (AssertionError, RuntimeError) as exc:
                        if "CUDA" not in str(exc) and "cuda" not in str(exc):
                            raise
                        continue  # torch.cuda asked for a real device
                    assert verdict is True or verdict is False or (isinstance(verdict, str) and verdict), \
                        (impl.display_name, config, verdict)
                    answered += 1
    if name == "gemm":  # the WMMA kernel's four configs answer on every sample
        assert answered >= 4 * 3
