"""Grafts keep layouts: where the replaced code gave an output another layout than the op's fresh,
contiguous one, the rewritten graph copies it into that layout, so the rest of the model sees the
strides it was written for; a layout no fresh tensor can take (a broadcast) keeps the site as it is,
with the reason."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import kernelgraft as kg
from kernelgraft.examples.add_relu import add_relu

from _hf_models import logits, tiny_llama


# ---------------------------------------------------------------------------- a RoPE op
@triton.jit
def _rope_kernel(q_ptr, cos_ptr, sin_ptr, out_ptr, heads, seq, cos_batch_stride,
                 D: tl.constexpr, HALF: tl.constexpr):
    # One program per (batch, head, position) row of a contiguous q and out; cos and sin are
    # [B or 1, 1, S, D], contiguous.
    r = tl.program_id(0)
    c = (r // (heads * seq)) * cos_batch_stride + (r % seq) * D
    offs = tl.arange(0, HALF)
    x1 = tl.load(q_ptr + r * D + offs).to(tl.float32)
    x2 = tl.load(q_ptr + r * D + HALF + offs).to(tl.float32)
    c1 = tl.load(cos_ptr + c + offs).to(tl.float32)
    c2 = tl.load(cos_ptr + c + HALF + offs).to(tl.float32)
    s1 = tl.load(sin_ptr + c + offs).to(tl.float32)
    s2 = tl.load(sin_ptr + c + HALF + offs).to(tl.float32)
    tl.store(out_ptr + r * D + offs, (x1 * c1 - x2 * s1).to(out_ptr.dtype.element_ty))
    tl.store(out_ptr + r * D + HALF + offs, (x2 * c2 + x1 * s2).to(out_ptr.dtype.element_ty))


def _launch_rope(q, cos, sin, out):
    b, h, s, d = q.shape
    batch_stride = cos.stride(0) if cos.shape[0] > 1 else 0
    _rope_kernel[(b * h * s,)](q, cos, sin, out, h, s, batch_stride, D=d, HALF=d // 2)


def _rope_fits(q, cos, sin, **config):
    if q.dim() != 4 or q.shape[-1] % 2 or q.shape[-1] & (q.shape[-1] - 1):
        return "q must be [B, H, S, D] with D a power of two"
    want = (q.shape[2], q.shape[3])
    for t in (cos, sin):
        if t.dim() != 4 or t.shape[1] != 1 or tuple(t.shape[2:]) != want or t.shape[0] not in (1, q.shape[0]):
            return f"cos/sin must be [B or 1, 1, {want[0]}, {want[1]}], got {tuple(t.shape)}"
        if t.dtype != q.dtype:
            return "one dtype"
    return True


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_pattern(q, cos, sin):
    """Hugging Face Llama's ``apply_rotary_pos_emb`` for one tensor (cos and sin unsqueezed)."""
    return (q * cos) + (rotate_half(q) * sin)


@kg.op("kgtest_layout::rope", impls=[kg.triton(_launch_rope, configs=[{}], supports=_rope_fits)],
       dtypes=(torch.float32, torch.float16, torch.bfloat16))
def rope(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """q * cos + rotate_half(q) * sin; the kernel writes a contiguous output."""
    return (q * cos) + (rotate_half(q) * sin)


def _rope_example(device="cpu", dtype=torch.float32):
    return (torch.randn(2, 4, 12, 16, device=device, dtype=dtype),
            torch.randn(2, 1, 12, 16, device=device, dtype=dtype),
            torch.randn(2, 1, 12, 16, device=device, dtype=dtype))


def test_hf_llama_rope_on_a_transposed_q_grafts_verifies_and_compiles():
    """Llama computes RoPE on q = q_proj(x).view(b, s, h, d).transpose(1, 2): the replaced code
    returns q's layout, and the attention's later views are written for it. The graft verifies
    (the traced model runs eagerly with the op in it) and Inductor's code runs the kernel."""
    pytest.importorskip("transformers")
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    model = tiny_llama(num_hidden_layers=1)
    ids = torch.randint(0, 256, (2, 12))
    expected = logits(model, ids)
    report = kg.graft(model, pattern=rope_pattern, replacement=rope, pattern_inputs=_rope_example(),
                      example_inputs=((ids,), {"use_cache": False}))
    try:
        assert report.count == 2 and report.verified and not report.kept  # q and k of one layer
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)
        # A cached graph skips the pattern pass; the count below is the pass's.
        with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
            got = logits(compiled, ids)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        assert report.compiled == 2
    finally:
        kg.ungraft(model)
        torch._dynamo.reset()


def _exported_transposed_add_relu():
    class M(torch.nn.Module):
        def forward(self, x, y):
            b, s, h, d = x.shape
            q = x.transpose(1, 2)  # [b, h, s, d], laid out as [b, s, h, d]
            out = torch.relu(q + y.transpose(1, 2))
            return out.transpose(1, 2).view(b, s, h * d)  # a view only q's layout allows

    x, y = torch.randn(2, 5, 3, 8), torch.randn(2, 5, 3, 8)
    return M(), x, y, torch.export.export(M(), (x, y))


def test_exported_program_keeps_a_transposed_output_layout():
    model, x, y, ep = _exported_transposed_add_relu()
    report = kg.graft(ep, pattern=lambda a, b: torch.relu(a + b), replacement=add_relu,
                      example_inputs=(x, y))
    assert report.count == 1 and report.verified
    ops = [n for n in ep.graph.nodes if "add_relu" in str(n.target)]
    assert len(ops) == 1
    # the op call's value is contiguous; what stands for the replaced relu has the relu's strides
    users = list(ops[0].users)
    assert ops[0].meta["val"].is_contiguous() and users
    x2, y2 = torch.randn(2, 5, 3, 8), torch.randn(2, 5, 3, 8)
    torch.testing.assert_close(ep.module()(x2, y2), model(x2, y2))


def test_a_graft_without_example_inputs_keeps_the_layout_too():
    """No example to verify on: a layout-keeping copy is what makes the rewritten program run."""
    model, x, y, ep = _exported_transposed_add_relu()
    assert kg.graft(ep, pattern=lambda a, b: torch.relu(a + b), replacement=add_relu).count == 1
    torch.testing.assert_close(ep.module()(x, y), model(x, y))


@kg.op("kgtest_layout::relu_head")
def relu_head(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """relu(x + y)[:, :4], returned as a fresh contiguous tensor."""
    return torch.relu(x + y)[:, :4]


def test_an_output_with_gaps_keeps_its_strides():
    """The replaced code returns a slice of a larger tensor (strides (8, 1) for shape (n, 4)):
    the program's output keeps them."""
    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x + y)[:, :4]

    x, y = torch.randn(6, 8), torch.randn(6, 8)
    ep = torch.export.export(M(), (x, y))
    report = kg.graft(ep, pattern=lambda a, b: torch.relu(a + b)[:, :4], replacement=relu_head,
                      pattern_inputs=(torch.randn(3, 8), torch.randn(3, 8)), example_inputs=(x, y))
    assert report.count == 1 and report.verified
    x2, y2 = torch.randn(6, 8), torch.randn(6, 8)
    got, want = ep.module()(x2, y2), M()(x2, y2)
    assert got.stride() == want.stride() == (8, 1)
    torch.testing.assert_close(got, want)


@kg.op("kgtest_layout::row_sum_expand")
def row_sum_expand(x: torch.Tensor) -> torch.Tensor:
    """Each row's sum over every element of the row (a fresh tensor, not a broadcast)."""
    return x.sum(-1, keepdim=True).expand_as(x)


def test_a_broadcast_output_is_left_as_is_with_the_reason():
    class M(torch.nn.Module):
        def forward(self, x):
            return x.sum(-1, keepdim=True).expand_as(x) * 2

    x = torch.randn(5, 7)
    ep = torch.export.export(M(), (x,))
    with pytest.warns(kg.GraftWarning, match="output 0 .*overlaps itself"):
        report = kg.graft(ep, pattern=lambda t: t.sum(-1, keepdim=True).expand_as(t),
                          replacement=row_sum_expand, pattern_inputs=(torch.randn(3, 7),),
                          example_inputs=(x,))
    assert report.count == 0
    assert any("overlaps itself" in why for why in report.kept.values()), report.kept
    assert "kgtest_layout.row_sum_expand.default" not in [str(n.target) for n in ep.graph.nodes]
    torch.testing.assert_close(ep.module()(x), M()(x))


def test_inductor_is_told_the_dense_input_layout_the_op_takes():
    """The rewrite makes a transposed q dense for the op; Inductor holds an inserted op's inputs
    to a layout only where the node says what its eager inputs were (else the kernel may be
    handed q's strides after all), so the op's node says so."""
    from torch._inductor.pattern_matcher import fwd_only
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    from kernelgraft.graft import pattern as _pattern

    class M(torch.nn.Module):
        def forward(self, q, cos, sin):
            return rope_pattern(q.transpose(1, 2), cos, sin).transpose(1, 2).reshape(2, 12, -1)

    q, cos, sin = torch.randn(2, 12, 4, 16), torch.randn(2, 1, 12, 16), torch.randn(2, 1, 12, 16)
    gm = fwd_only(M(), [q, cos, sin])
    FakeTensorProp(gm, FakeTensorMode()).propagate(q, cos, sin)
    pat = _pattern.Pattern(rope_pattern, rope, _rope_example())
    assert _pattern.rewrite_graph(gm.graph, [pat], "inductor")[0] == 1
    node = next(x for x in gm.graph.nodes if "rope" in str(x.target))
    eager_args, _ = node.meta["eager_input_vals"]
    assert eager_args[0].shape == (2, 4, 12, 16) and eager_args[0].is_contiguous()
    gm.recompile()
    torch.testing.assert_close(gm(q, cos, sin), M()(q, cos, sin))


class _Rotary(torch.nn.Module):
    def forward(self, q, cos, sin):
        return rope_pattern(q, cos, sin)


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rotary = _Rotary()

    def forward(self, x, cos, sin):
        b, s = x.shape[:2]
        out = self.rotary(x.transpose(1, 2), cos, sin)
        return out.transpose(1, 2).view(b, s, -1)  # a view only the transposed layout allows


def test_a_module_graft_whose_model_no_longer_runs_is_undone_with_a_verification_error():
    """A graft by module type runs the op's contiguous output where the module returned its
    input's layout (the eager path is not rewritten): a model that then fails is refused with
    the reason, and every graft of the call is undone."""
    model = _Attention()
    x, cos, sin = torch.randn(2, 12, 4, 16), torch.randn(2, 1, 12, 16), torch.randn(2, 1, 12, 16)
    with pytest.raises(kg.VerificationError, match="view size is not compatible"):
        kg.graft(model, {_Rotary: rope}, example_inputs=(x, cos, sin))
    assert kg.ungraft(model) == 0
    torch.testing.assert_close(model(x, cos, sin), rope_pattern(x.transpose(1, 2), cos, sin)
                               .transpose(1, 2).reshape(2, 12, -1))


# ---------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_hf_llama_rope_grafts_and_compiles(dtype):
    pytest.importorskip("transformers")
    model = tiny_llama("cuda", dtype)
    ids = torch.randint(0, 256, (2, 32), device="cuda")
    expected = logits(model, ids)
    report = kg.graft(model, pattern=rope_pattern, replacement=rope,
                      pattern_inputs=_rope_example("cuda", torch.float32),
                      example_inputs=((ids,), {"use_cache": False}))
    try:
        assert report.count == 4 and report.verified
        torch._dynamo.reset()
        got = logits(torch.compile(model, fullgraph=True), ids)
        tol = 5e-2 if dtype == torch.bfloat16 else 1e-4
        torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)
    finally:
        kg.ungraft(model)
        torch._dynamo.reset()
