"""What ``kg.op`` checks and normalises when an op is declared (impls, ``dtypes=``, ``ndim=``), and
the op's identity: every option that changes what it does, in one canonical form that is the same in
every process (its sha256 is the op's fingerprint)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ..errors import SpecError, describe
from ..spec import ImplSpec
from ..verify.compare import compare_identity
from . import compete as _compete
from .identity import callable_identity as source, dtype_name, tolerances_identity

__all__ = ["check_impls", "dtype_list", "normalize_dtypes", "normalize_ndim", "identity"]


def check_impls(impls, where) -> tuple:
    if isinstance(impls, ImplSpec):
        raise SpecError(f"{where}: impls must be a list of kernel specs, got the single spec "
                        f"{impls!r}; write impls=[spec]")
    if isinstance(impls, (str, bytes, Mapping)) or not isinstance(impls, Iterable):
        raise SpecError(f"{where}: impls must be a list of kernel specs made by kg.triton/kg.cuda/"
                        f"kg.cutedsl/kg.cutile, got {describe(impls)}; write impls=[kg.triton(...), ...]")
    return tuple(impls)

def dtype_list(value, where, what) -> tuple:
    """A list of torch dtypes, or a SpecError saying what came and how to write it."""
    if isinstance(value, torch.dtype):
        raise SpecError(f"{where}: {what} must be a list of torch dtypes, got the single dtype "
                        f"{value}; write [{value}]")
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise SpecError(f"{where}: {what} must be a list of torch dtypes such as "
                        f"[torch.float16, torch.float32], got {describe(value)}")
    allowed = tuple(value)
    if not allowed or not all(isinstance(d, torch.dtype) for d in allowed):
        raise SpecError(f"{where}: {what} must be a non-empty list of torch dtypes such as "
                        f"[torch.float16, torch.float32], got {allowed!r}")
    return allowed

def normalize_dtypes(signature, dtypes, where) -> dict:
    """``dtypes=`` as one tuple of dtypes per Tensor parameter (a list applies to every one)."""
    names = {p.name for p in signature.params if p.kind in ("tensor", "tensor_list")}
    if dtypes is None:
        return {}
    if isinstance(dtypes, Mapping):
        out = {}
        for key, allowed in dtypes.items():
            if key not in names:
                raise SpecError(f"{where}: dtypes names {key!r}, which is not a Tensor parameter; "
                                f"the Tensor parameters are {sorted(names)}")
            out[key] = dtype_list(allowed, where, f"dtypes[{key!r}]")
        return out
    allowed = dtype_list(dtypes, where, "dtypes")
    return {n: allowed for n in names}

def normalize_ndim(signature, ndim, where) -> dict:
    """``ndim=`` as one tuple of ranks per Tensor parameter named."""
    if ndim is None:
        return {}
    names = sorted(p.name for p in signature.params if p.kind == "tensor")
    example = names[0] if names else "x"
    if not isinstance(ndim, Mapping):
        raise SpecError(f"{where}: ndim must map Tensor parameter names to a rank or ranks, got "
                        f"{describe(ndim)}; write ndim={{{example!r}: 2}} or "
                        f"ndim={{{example!r}: (2, 3)}} (Tensor parameters: {names})")
    out = {}
    for key, value in ndim.items():
        if key not in names:
            raise SpecError(f"{where}: ndim names {key!r}, which is not a Tensor parameter; "
                            f"the Tensor parameters are {names}")
        ranks = (value,) if isinstance(value, int) else tuple(value) if isinstance(value, Iterable) else None
        if not ranks or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
            raise SpecError(f"{where}: ndim[{key!r}] must be a rank (int >= 0) or a list of ranks, "
                            f"got {describe(value)}")
        out[key] = ranks
    return out

def identity(op) -> dict[str, Any]:
    """Every option that changes what the op does, in one canonical JSON form that is the same
    in every process: callables by their source (as the reference), dtypes by name, mappings
    sorted, equivalent spellings (``dtypes=[...]`` vs one list per parameter) normalised."""

    identity = {
        "reference": source(op.reference),
        "schema": op.signature.schema,
        "mutates": sorted(op.mutates_args),
        "impls": [impl.fingerprint for impl in op.impls],
        "fallback": op.fallback,
        "dtypes": {p: sorted({dtype_name(d) for d in allowed}) for p, allowed in sorted(op._dtypes.items())},
        "ndim": {p: sorted(set(dims)) for p, dims in sorted(op._ndim.items())},
        "tolerances": {name: value for name, value in tolerances_identity(op.tolerances)},
        "sample_inputs": source(op.sample_inputs),
        "cost": source(op.cost),
        "prune": source(op.prune),
        "buckets": op.buckets.identity(),
    }
    # Only when set: the fingerprints (default names, tune caches, bundles) of every op that
    # keeps the default stay what they were.
    if op.allow_overlap:
        identity["allow_overlap"] = True
    if op.compete != _compete.NAMES:
        identity["compete"] = list(op.compete)
    if op._outputs_declared:
        identity["outputs"] = list(op.output_names)
    if op.compare:
        identity["compare"] = compare_identity(op.compare, source)
    return identity
