"""Ahead-of-time bundles: every candidate compiled to cubins on a machine without a GPU, loaded
and launched through ``kernelgraft.driver`` where the kernel DSL is not even installed.

Build (``kernelgraft aot TARGET --arch sm_90 -o DIR`` or ``build_bundle``) and load
(``kg.load_bundle(DIR)``). See ``_build`` for what a signature is, ``_triton_aot`` for what a
Triton binary assumes, ``_expr`` for the expression grammar.
"""

from ._build import build_bundle
from ._load import Bundle, load_bundle

__all__ = ["build_bundle", "load_bundle", "Bundle"]
