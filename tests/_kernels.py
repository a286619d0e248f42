"""Small real Triton kernels shared by the tests (run through the interpreter on the CPU)."""

import triton
import triton.language as tl

LAUNCHES: list[str] = []


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (x * alpha).to(out_ptr.dtype.element_ty), mask=mask)


def launch_scale(x, alpha, out, *, BLOCK):
    LAUNCHES.append(f"scale[{BLOCK}]")
    n = x.numel()
    scale_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, alpha, BLOCK=BLOCK)


def launch_scale_half(x, alpha, out, *, BLOCK):
    """A planted bug: covers only the first half of the elements."""
    LAUNCHES.append(f"half[{BLOCK}]")
    n = x.numel() // 2
    scale_kernel[(triton.cdiv(max(n, 1), BLOCK),)](x, out, n, alpha, BLOCK=BLOCK)


def launch_scale_wrong(x, alpha, out, *, BLOCK):
    """A planted bug: wrong factor."""
    LAUNCHES.append(f"wrong[{BLOCK}]")
    n = x.numel()
    scale_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, alpha * 1.01, BLOCK=BLOCK)


@triton.jit
def add_inplace_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(x_ptr + offs, x + y, mask=mask)


def launch_add_inplace(x, y, *, BLOCK):
    LAUNCHES.append(f"add_[{BLOCK}]")
    n = x.numel()
    add_inplace_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK)


@triton.jit
def sum_diff_kernel(x_ptr, y_ptr, s_ptr, d_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(s_ptr + offs, x + y, mask=mask)
    tl.store(d_ptr + offs, x - y, mask=mask)


def launch_sum_diff(x, y, s, d, *, BLOCK):
    LAUNCHES.append(f"sum_diff[{BLOCK}]")
    n = x.numel()
    sum_diff_kernel[(triton.cdiv(n, BLOCK),)](x, y, s, d, n, BLOCK=BLOCK)
