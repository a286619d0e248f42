"""``build_bundle``: compile every candidate of every op for each arch and signature, without a GPU.

A signature is one sample input tuple (default: the op's ``sample_inputs()``), plus, for each, the
strided copy ``kernelgraft check`` derives from it (every tensor a non-contiguous view), so the
layouts check passes are the layouts the bundle is built for. With ``dynamic=True`` (the default)
every dimension and every stride of an input the candidate does not need contiguous becomes a
symbol, and the launch parameters become expressions of them, valid wherever the recorded guards
hold (``_trace``, ``_layout``); when a launch function does something the expression grammar
cannot hold, that signature is compiled for its static shapes and strides instead. CuTe DSL
candidates become one shared library per kernel (``kernelgraft.backends.cutedsl.aot``).

What is not built is listed in the op's entry, with why: ``skipped``, candidates with no AOT path
(or no toolchain here, or no signature at all); ``dropped``, every (candidate, signature, arch)
the candidate takes but that failed to record or compile (``kernelgraft aot`` prints them and
fails unless ``--allow-partial``); ``refused``, every (candidate, signature) the candidate itself
declines, as eager dispatch would (its layout declaration or ``supports()``); ``unserved``, the
op's own signatures that no bundled kernel serves, with each candidate's reason.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .. import backends
from ..errors import BundleError
from . import manifest as _manifest
from .bundle_check import check_manifest
from ..symbolic.expr import Unsupported
from ..spec.layout import contiguous_names, declared
from .program import decision_table, kernel_program, key_label, meta_rules, read_decisions, tuned_entries
from .sign import SIGNATURE, load_key, sign_bundle
from ..symbolic.trace import trace
from ..version import __version__

__all__ = ["build_bundle", "record_call", "compile_recorded", "call_identity"]

log = logging.getLogger(__name__)


def _toolchains() -> dict[str, str]:
    """Each registered backend's AOT toolchain version, or why it is unavailable (which matters
    only if an op needs it)."""
    out = {}
    for name in backends.names():
        try:
            path = backends.aot_path(name)
            if path is None:
                continue
            out[name] = path.toolchain_version()
        except Exception as exc:  # a missing toolchain (or a plugin's AOT module that fails to import)
            out[name] = f"unavailable: {exc}"
    return out


def _no_aot_path(backend: str) -> str | None:
    """Why ``backend``'s candidates cannot be bundled; None when they can."""
    try:
        return None if backends.aot_path(backend) is not None else "has no AOT path"
    except Exception as exc:  # a plugin's AOT module that fails to import
        return f"has an AOT path that did not load: {type(exc).__name__}: {exc}"


def _param_entry(p) -> dict:
    import inspect

    default = None if p.default is inspect.Parameter.empty else p.default
    if isinstance(default, torch.dtype):  # by name, as the schema writes it (the bundle spec's dtypes)
        default = str(default).removeprefix("torch.")
    if not isinstance(default, (int, float, bool, str, type(None))):
        default = None
    return {"name": p.name, "kind": p.kind, "optional": p.optional, "mutated": p.mutated,
            "required": p.default is inspect.Parameter.empty, "default": default}


def _scalar_guards(op, sample, untied: bool) -> list[str]:
    """Non-tensor op arguments the record may have folded in: pinned to the sample's value (string
    arguments by ``_string_pins``: expressions have no strings)."""
    guards = []
    for p, v in zip(op.signature.params, sample):
        if p.kind in ("int", "bool") or (p.kind == "float" and untied):
            if v is None:
                continue
            guards.append(f"({p.name} == {v!r})")
        elif p.kind == "dtype" and v is not None:
            raise Unsupported(f"argument {p.name} of kind {p.kind}")
    return guards


def _string_pins(op, sample) -> dict[str, str]:
    """String arguments, which a launch turns into constants (a constexpr, a flag): the kernel
    serves only the value it was recorded with (the manifest's ``pinned``, checked like dtypes)."""
    return {p.name: v for p, v in zip(op.signature.params, sample) if p.kind == "str" and v is not None}


def record_call(op, impl, config, sample, dynamic):
    """(the recorded launch, whether it is symbolic), or the reason ``supports`` refused the sample."""
    module = backends.aot_path(impl.backend)
    if module is None:
        raise Unsupported(f"backend {impl.backend} has no AOT path")

    def rec(ctx, args, kwargs):
        call = module.record(ctx, args, kwargs, impl)
        # The impl's code decides the binary too: two impls whose launches look alike (the same
        # grid, parameters and config) are still two kernels, compiled apart.
        return {**call, "impl": impl.fingerprint}

    try:
        return trace(op, impl, config, sample, rec, dynamic=dynamic), dynamic
    except Exception as exc:
        if not dynamic:
            raise
        log.info("%s %s: symbolic trace failed (%s: %s); compiling static shapes",
                 op.name, impl.display_name, type(exc).__name__, exc)
        return trace(op, impl, config, sample, rec, dynamic=False), False


def build_bundle(
    ops: Sequence[Any],
    out: str | Path,
    *,
    archs: Sequence[str] = ("sm_90",),
    inputs: Mapping[str, Callable[[], Iterable[tuple]] | Iterable[tuple]] | None = None,
    dynamic: bool = True,
    progress: Callable[[str], None] | None = None,
    sign: bytes | str | os.PathLike | None = None,
    decisions: str | os.PathLike | None = None,
) -> dict:
    """Compile ``ops`` into a bundle directory ``out`` (manifest.json + bin/); returns the manifest.

    ``inputs`` maps an op name to sample input tuples (CPU tensors are fine) that declare the
    signatures to compile; without it the op's ``sample_inputs()`` are used. ``sign``: a key (bytes)
    or key file to sign the bundle with (``signature.json``; ``load_bundle(..., key=...)`` checks it).
    ``decisions``: a tuning cache file (``tune.json``) whose decisions for these ops, made on a GPU
    of one of ``archs``, become each op's decision table (which candidate serves which shapes).
    """
    if sign is not None:
        load_key(sign)  # a missing or short key fails before minutes of compiling
    tuned = read_decisions(decisions) if decisions is not None else []
    archs = list(dict.fromkeys(_manifest.normalize_arch(a) for a in archs))
    out = Path(out)
    (out / "bin").mkdir(parents=True, exist_ok=True)
    toolchain = {"torch": torch.__version__, **_toolchains()}
    # A backend whose toolchain is an optional extra (``aot_optional``) and missing here has its
    # candidates skipped, with the reason, instead of dropped: a machine without tileiras (or CuTe
    # DSL, or a C compiler to link its libraries) still builds a bundle of the others.
    missing = {b: v.removeprefix("unavailable: ") for b, v in toolchain.items()
               if b != "torch" and v.startswith("unavailable: ") and getattr(backends.get(b), "aot_optional", False)}
    manifest_ops = []
    started = time.perf_counter()
    for op in ops:
        entry = _build_op(op, archs, out, inputs, dynamic, progress, missing)
        entry["decisions"] = decision_table(op, entry["candidates"], tuned, archs)
        entry["torch_wins"] = _torch_wins(op, tuned, archs)
        manifest_ops.append(entry)

    manifest = {
        "format": _manifest.FORMAT, "version": _manifest.VERSION,
        "archs": archs,
        "toolchain": {"kernelgraft": __version__, **toolchain},
        "build_seconds": round(time.perf_counter() - started, 2), "ops": manifest_ops,
    }
    # what the loaders will hold it to: a bundle this build cannot load fails here, naming the field
    check_manifest(json.loads(json.dumps(manifest)), f"bundle {out}: manifest.json")
    _manifest.write(out, manifest)
    signature = out / SIGNATURE
    if sign is not None:
        sign_bundle(out, sign)
    elif signature.exists():  # left by an earlier signed build: it no longer matches
        signature.unlink()
    return manifest


def _samples(op, inputs) -> list[tuple]:
    given = (inputs or {}).get(op.name)
    if given is None:
        if op.sample_inputs is None:
            raise BundleError(f"{op.name}: no sample_inputs and no inputs given; declare signatures")
        # as ``kernelgraft check`` calls it: with the device ("cpu") when the function takes one
        from ..op.samples import samples

        return samples(op, "cpu")
    if callable(given):
        given = given()
    return [tuple(s) for s in given]


def _signatures(op, inputs) -> list[tuple[tuple, str, bool]]:
    """(sample, label, derived): the op's samples, each followed by the strided copy that
    ``kernelgraft check`` derives from it (when it has a tensor that can be made strided)."""
    from ..op.samples import noncontiguous

    out = []
    for sample in _samples(op, inputs):
        out.append((sample, signature_label(sample), False))
        strided = noncontiguous(op, sample)
        if strided is not None:
            out.append((strided, signature_label(strided), True))
    return out


def signature_label(sample: tuple) -> str:
    """A sample as users read it: ``float16[300] 1.5``; a non-contiguous tensor shows its strides
    (``float32[4, 8]/(16, 2)``)."""
    parts = []
    for a in sample:
        if isinstance(a, torch.Tensor):
            layout = "" if a.is_contiguous() else f"/{tuple(a.stride())}"
            parts.append(f"{str(a.dtype).removeprefix('torch.')}{list(a.shape)}{layout}")
        elif isinstance(a, (list, tuple)):
            parts.append(f"[{len(a)} tensors]")
        else:
            parts.append(repr(a))
    return " ".join(parts)


def _build_op(op, archs, out: Path, inputs, dynamic, progress, missing: Mapping[str, str]) -> dict:
    """The op's manifest entry; what is not built is listed with why (see the module docstring)."""
    signatures = _signatures(op, inputs)
    names = [p.name for p in op.signature.params]
    candidates, skipped, dropped, refused, compiled_cache = [], [], [], [], {}
    served: set[int] = set()                                  # signatures some kernel serves
    why_not: dict[int, list[str]] = {}                        # signature -> each candidate's reason
    for index, impl in enumerate(op.impls):
        for config in impl.configs:
            label = f"{impl.backend}:{impl.display_name}[{config.label()}]"
            why = _no_aot_path(impl.backend)
            if why:
                skipped.append({"candidate": label, "reason": f"backend {impl.backend} {why}"})
                continue
            if impl.backend in missing:
                skipped.append({"candidate": label, "reason": f"no {impl.backend} toolchain here: {missing[impl.backend]}"})
                continue
            variants: dict[str, dict] = {}
            reasons: list[str] = []
            declined: list[str] = []  # the candidate's own supports() reasons, per sample

            def drop(number, arch, exc) -> None:
                reason = f"{type(exc).__name__}: {exc}" if isinstance(exc, BaseException) else str(exc)
                reasons.append(reason)
                why_not.setdefault(number, []).append(f"{label}: {reason}")
                dropped.append({"candidate": label, "signature": signatures[number][1], "arch": arch,
                                "reason": reason})

            for number, (sample, sig_label, _derived) in enumerate(signatures):
                try:
                    result, was_dynamic = record_call(op, impl, config, sample, dynamic)
                except Exception as exc:
                    drop(number, None, exc)
                    continue
                if isinstance(result, str):  # the candidate declines this sample, as eager dispatch would
                    refused.append({"candidate": label, "signature": sig_label, "reason": result})
                    why_not.setdefault(number, []).append(f"{label}: {result}")
                    declined.append(result)
                    continue
                call, guards, out_shapes, out_dtypes = result
                try:
                    guards = guards + call["guards"] + _scalar_guards(op, sample, call["untied_float"])
                except Unsupported as exc:
                    drop(number, None, exc)
                    continue
                tensors = [(p.name, a) for p, a in zip(op.signature.params, sample) if isinstance(a, torch.Tensor)]
                dense = set(contiguous_names(impl, [n for n, _ in tensors]))
                for arch in archs:
                    key = json.dumps([arch, call_identity(call)], sort_keys=True, default=str)
                    if key not in compiled_cache:
                        try:
                            compiled_cache[key] = _compile(impl.backend, call, arch, out)
                        except Exception as exc:
                            log.debug("%s %s: compile for %s failed", op.name, label, arch, exc_info=True)
                            compiled_cache[key] = exc
                    kernel = compiled_cache[key]
                    if isinstance(kernel, Exception):
                        drop(number, arch, kernel)
                        continue
                    variant = {
                        "arch": arch, "dynamic": was_dynamic,
                        "dtypes": {n: str(t.dtype).removeprefix("torch.") for n, t in tensors},
                        "ranks": {n: t.dim() for n, t in tensors},
                        # traced contiguous: selected only where these inputs are (the others' strides
                        # are symbols of the expressions)
                        "contiguous": [n for n, _ in tensors if n in dense],
                        "guards": list(dict.fromkeys(guards)),
                        "outputs": {"shapes": out_shapes, "dtypes": out_dtypes},
                        **kernel,
                    }
                    pins = _string_pins(op, sample)
                    if pins:
                        variant["pinned"] = pins
                    try:
                        variant["program"] = kernel_program(variant, names)
                    except BundleError as exc:  # an expression with no C++ form: this kernel is Python-only
                        drop(number, arch, exc)
                        continue
                    served.add(number)
                    variants.setdefault(json.dumps(variant, sort_keys=True), variant)
            if progress:
                lost = sum(d["candidate"] == label for d in dropped)
                progress(f"{op.name} {label}: {len(variants)} kernels" + (f", {lost} dropped" if lost else ""))
            if not variants:
                why = "; ".join(dict.fromkeys(reasons)) or (
                    "no sample is supported: " + "; ".join(dict.fromkeys(declined)) if declined else "no sample is supported")
                skipped.append({"candidate": label, "reason": why})
                continue
            ordered = sorted(variants.values(), key=lambda v: (not v["dynamic"], -len(v["guards"])))
            candidates.append({
                "index": index, "backend": impl.backend, "impl": impl.display_name,
                "impl_fingerprint": impl.fingerprint, "config": config.as_dict(), "label": label,
                "contiguous": declared(impl), "kernels": ordered,
            })
    unserved = [{"signature": label, "reasons": list(dict.fromkeys(why_not.get(number, ["no candidate"])))}
                for number, (_, label, derived) in enumerate(signatures) if not derived and number not in served]
    return {
        "name": op.name, "module": getattr(op.reference, "__module__", None),
        "schema": op.signature.schema, "params": [_param_entry(p) for p in op.signature.params],
        "returns": op.signature.returns, "n_returns": op.signature.n_returns,
        "mutates_args": list(op.mutates_args), "fingerprint": op.fingerprint,
        "doc": (op.reference.__doc__ or "").strip()[:500],
        "candidates": candidates, "meta": meta_rules(candidates), "skipped": skipped, "dropped": dropped,
        "refused": refused, "unserved": unserved,
    }


def _torch_wins(op, entries: Sequence[dict], archs: Sequence[str]) -> list[dict]:
    """The tuned decisions (``--decisions``: the entries ``decision_table`` reads, made on a GPU
    of one of ``archs``) whose ranking PyTorch tops (``torch:eager``/``torch:compile``, see
    ``kernelgraft.op.compete``). A bundle holds kernels only, so where PyTorch won, the bundle
    serves its best kernel, which is slower: recorded here (and printed by ``kernelgraft aot``) so
    the user knows. Empty without decisions."""
    wins = []
    for arch, entry in tuned_entries(op, entries, archs):
        ranking = [r for r in entry.get("ranking", []) if isinstance(r, dict)]
        if not ranking or ranking[0].get("backend") != "torch":
            continue
        winner, key = ranking[0], entry.get("key", {})
        kernel = next((r for r in ranking if r.get("backend") != "torch"), None)
        config = kernel.get("config") if kernel and isinstance(kernel.get("config"), dict) else {}
        wins.append({
            "signature": key_label(op, key), "arch": arch,
            "device": key.get("env", {}).get("device"),
            "winner": f"torch:{winner.get('impl_name')}", "ms": winner.get("ms"),
            "best_kernel": (f"{kernel.get('backend')}:{kernel.get('impl_name')}"
                            f"[{','.join(f'{k}={v}' for k, v in config.items()) or '-'}]"
                            if kernel else None),
            "best_kernel_ms": kernel.get("ms") if kernel else None,
        })
    return wins


def call_identity(call: dict) -> Any:
    """What of a recorded call decides the binary: equal identities compile to the same kernel."""
    out = {k: v for k, v in call.items() if k not in ("jit", "spec", "attrs")}
    out["attrs"] = sorted((list(k), v) for k, v in call.get("attrs", {}).items())
    return out


def compile_recorded(backend: str, call: dict, arch: str) -> tuple[dict, dict[str, bytes]]:
    """(manifest entry, {kind: image}) of one recorded call compiled for ``arch``."""
    return backends.aot_path(backend).compile_call(call, arch)


def _compile(backend: str, call: dict, arch: str, out: Path) -> dict:
    entry, images = compile_recorded(backend, call, arch)
    files = {}
    for kind, image in images.items():
        files[kind] = _manifest.store_binary(out, image, kind)
    entry["images"] = files
    entry["scalar_order"] = [p["expr"] for p in entry["params"] if "expr" in p]
    return entry
