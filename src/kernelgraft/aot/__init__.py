"""Ahead-of-time bundles: every candidate compiled on a machine without a GPU (cubins, or shared
libraries for CuTe DSL), loaded and launched where the kernel DSL is not even installed.

Build: ``kernelgraft aot TARGET --arch sm_90 [--arch sm_100] -o DIR [--static] [--sign KEYFILE]``
(or ``build_bundle(ops, DIR, archs=..., sign=...)``). Load: ``kg.load_bundle(DIR[, key=KEYFILE])``.

What is supported (and what is not):
- Backends: Triton (``triton.compile`` for ``GPUTarget('cuda', cc, 32)``: cubin + PTX), CUDA C++
  (the NVRTC path: cubin), cuTile (its export: cubin; skipped with the reason without tileiras) and
  CuTe DSL (the ``@cute.jit`` host function exported as ``export_to_c`` does and linked with a C
  shim into a shared library, plus the CUDA dialect runtime it needs; skipped without a C
  compiler). CuTe DSL libraries are native code: ``load_bundle`` opens them only with ``key=`` (a
  verified signature) or ``allow_native=True``.
- Signatures: the op's ``sample_inputs()`` (or ``inputs=``), one per dtype/rank/size regime. Sizes
  become expressions (``(x.shape[0] + 1023) // 1024``) valid where the recorded ShapeEnv guards
  hold (same-shape checks, ``% 16 == 0`` for ints compiled as divisible, int32 range, the range that
  fixes a shape-dependent constexpr such as ``triton.next_power_of_2``, written ``next_pow2(n)``).
  A launch the grammar cannot express (a view with an offset, data-dependent values) is compiled
  for its exact shapes.
- Launch functions must make exactly one kernel launch (Triton) or return one ``kg.Launch``, of
  the op's own inputs and outputs (not of a copy the launch makes); float scalars that are op
  arguments pass through by identity (anything computed from them pins the op's float arguments to
  the sample); int/bool op arguments are pinned.
- Layouts follow each impl's ``contiguous=``: inputs it needs contiguous are traced contiguous (a
  kernel is selected only where they are); the others' strides are expressions (``x.stride(0)``),
  so strided views are served with the caller's strides. Each sample's strided copy (the one
  ``kernelgraft check`` tests) is built too.
- Triton binaries assume 16-byte aligned pointers (checked per call) and no global scratch, TMA
  descriptors, clusters or PDL; ints are never specialised to constants. CUDA C++ kernels are
  checked for 16-byte aligned pointers too: ``supports()`` was traced on fake tensors, which look
  aligned, so a misaligned call falls back. A launch that needs the device (a grid of one block
  per SM, say) cannot be traced without a GPU and is skipped with the reason.
- A call no bundled kernel covers goes to the JIT when the op's module is imported, else raises
  ``UnsupportedError``. A bundle for another arch or with a bad checksum raises ``BundleError``.
- A bundle is untrusted input: loading imports no module it names (``import_modules=`` allows
  some), reads only regular files under size caps, bounds JSON nesting and expression evaluation,
  validates grids and blocks against device limits, and never overrides an op that Python code
  defines. ``--sign KEYFILE`` / ``build_bundle(..., sign=)`` add an HMAC-SHA256 signature that
  ``load_bundle(..., key=)`` requires; without a key only unkeyed sha256 sums protect it.
- The manifest is JSON only; expressions are checked against a whitelisted grammar at load. Each
  kernel entry carries what a TensorRT plugin's ``aot_impl`` needs: kernel name, binary, grid,
  block and shared memory as expressions of input shapes, and ``scalar_order``.
"""

from .build import build_bundle
from .load import Bundle, load_bundle
from .sign import sign_bundle, verify_bundle

__all__ = ["build_bundle", "load_bundle", "Bundle", "sign_bundle", "verify_bundle"]
