"""Example ops that double as documentation, demo subjects and benchmark subjects.

Each module defines one op with a PyTorch reference, kernels in one or more backends and
``sample_inputs`` for ``kernelgraft check``. Import a module to register its op.
"""

MODULES = ("add_relu", "rmsnorm", "rmsnorm_residual", "softmax", "swiglu", "gemm", "fp8_kcache_scatter",
           "kv_append", "topk_router")
