"""Ops whose candidates come from several kernel libraries, tuned per shape against each other
and against PyTorch behind one verified op.

- quack-kernels (CuTe DSL, ``pip install quack-kernels``; needs nvidia-cutlass-dsl 4.7 or later):
  RMSNorm (with and without a residual), softmax, cross-entropy forward;
- Liger-Kernel (Triton, ``pip install liger-kernel``): RMSNorm (its row and its block-of-rows
  kernels), fused add + RMSNorm, SwiGLU, softmax, RoPE;
- kernelgraft's own example kernels (softmax, SwiGLU);
- PyTorch: the tuner's ``torch:eager`` and ``torch:compile`` candidates.

None of these libraries is a dependency of kernelgraft: an impl whose library is not installed is
listed by ``op.candidates`` with the reason (``pip install ...``) and never chosen, like a backend
that is not installed. Each library kernel is called exactly as its library calls it (the same
kernel, the same launch settings), with kernelgraft allocating the outputs, so a bundle carries it
and the C++ runtime serves it with neither library installed.

Import a module to register its op (``kglib::<name>``).
"""

MODULES = ("rmsnorm", "add_rmsnorm", "softmax", "swiglu", "rope", "cross_entropy")
