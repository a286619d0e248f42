"""``kg.load_bundle(DIR)``: check a bundle and attach its binaries to the ops.

A bundle is untrusted data: loading it never runs code from it or imports a module it names
(unless the caller allows that module), every binary of the chosen arch is read and its sha256
checked before anything is attached, and with a key the whole bundle must carry a valid signature.
CuTe DSL candidates are native code (shared libraries, ``_native_kernel``): they are loaded only
from a bundle whose signature a key verified, or with ``allow_native=True``; otherwise they are left
out with a warning and the op is served by its other candidates.

For each op in the manifest: when the op exists in this process (its module was imported), each
bundled (impl, config) whose impl fingerprint still matches gets a driver runner that the op uses
instead of compiling (shapes no bundled kernel covers still go to the JIT); otherwise the op is
rebuilt from the manifest (schema, output shapes, bundled candidates only) as a stand-in.

Op names: a bundle never overrides an op defined by Python code. A stand-in registers only under a
name no kernelgraft op holds; when the module that defines the name is imported later, its op takes
the name over (instead of failing to register) and serves: its reference, its JIT candidates, and
the bundle's binaries as its bundled runners wherever the impl fingerprints agree, so shapes the
bundle covers never compile. The module's op, not the stand-in, serves because it is the complete
op (reference for CPU and fallback, every candidate) and ``op is module.op`` is what its users
test; references to the stand-in forward to it. An op edited since the bundle was built (same
schema, other fingerprint) takes over with a warning and keeps only the binaries whose impls are
unchanged; a different op (another schema) under the name is a ``RegistrationError`` naming both,
in either order (bundle then import, or import then bundle), unless ``kg.op(replace=True)``.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import warnings
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch

from ..op import registry as _registry
from ..op import select as _select
from ..op.candidates import BUNDLED
from ..errors import BundleError, KernelgraftError, KernelgraftWarning, RegistrationError
from ..spec import Config
from .manifest import Reads, normalize_arch, read, read_binary
from .native_kernel import NativeKernel, check_library, is_native
from .runner import BundledRunner, Kernel, _check_cubin
from .sign import verify_bundle

__all__ = ["Bundle", "load_bundle", "reset_bundles"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(repr=False)
class Bundle:
    """What ``load_bundle`` attached: ``ops`` by name, and for each how its candidates were bound."""

    path: Path
    arch: str
    manifest: dict
    ops: dict[str, Any]
    attached: dict[str, list[str]]   # op name -> candidate labels now served by the bundle
    rebuilt: list[str]               # ops created from the manifest (their module was not imported)
    kernels: int = 0                 # binaries loaded for ``arch``
    signed: bool = False             # the signature was verified with a key
    # op name -> {the manifest's impl index: this process's}, where they differ: the op here has
    # impls the building machine lacked (a backend that did not import there), or the other way
    moved: dict[str, dict[int, int]] = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:
        return (f"Bundle({str(self.path)!r}, arch={self.arch!r}, ops={list(self.ops)}, "
                f"kernels={self.kernels}{', signed' if self.signed else ''})")

    def detach(self) -> None:
        """Stop serving the bundle's candidates from existing ops (rebuilt ops stay registered)."""
        for name in self.attached:
            op = self.ops[name]
            for index, config in op.dispatcher.bundled_keys():
                op.dispatcher.serve_bundled(index, config, None)
            for impl in op.impls:
                BUNDLED.discard(impl.fingerprint)
        _select.bump_epoch()

    def runner(self, op_name: str, index: int, config: dict) -> BundledRunner:
        """The bundled runner of one candidate (for tests and tools). A ``BundleError`` says why
        when this bundle serves no such candidate here: no such op in it, or the candidate was left
        out when it loaded (built from other code, native code not allowed, another arch)."""
        op = self.ops.get(op_name)
        if op is None:
            raise BundleError(f"bundle {self.path}: no op {op_name!r} (it has {sorted(self.ops)})")
        key = (self.moved.get(op_name, {}).get(index, index), Config.of(config, where="Bundle.runner"))
        runner = op.dispatcher.bundled_runner(*key)
        if runner is None:
            from .bundled_op import RUNNERS

            impl = next((i for i in op.impls if getattr(i, "index", None) == index), None)
            runner = RUNNERS.get((impl.bundle_key, key[1])) if impl is not None else None
        if runner is None:
            served = ", ".join(self.attached.get(op_name, [])) or "none"
            raise BundleError(
                f"bundle {self.path}: {op_name}: candidate {index} with config {dict(key[1])} is not served "
                f"from this bundle in this process (left out when it loaded: see its warnings; served: {served})")
        return runner


# Every bundle attached in this process, so reset_bundles can undo them all.
_LOADED: list[Bundle] = []


def reset_bundles() -> None:
    """Detach every loaded bundle and forget the runners of ops rebuilt from manifests (tests
    call this between tests; ops stay registered)."""
    from .bundled_op import RUNNERS

    while _LOADED:
        _LOADED.pop().detach()
    RUNNERS.clear()
    BUNDLED.clear()
    _select.bump_epoch()


def _current_arch() -> str:
    if not torch.cuda.is_available():
        raise BundleError("load_bundle: no CUDA GPU in this process to pick the arch from; pass "
                          "arch='sm_90' (or the bundle's arch) to load it anyway")
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def load_bundle(
    path: str | Path,
    *,
    arch: str | None = None,
    key: bytes | str | os.PathLike | None = None,
    import_modules: bool | Collection[str] = False,
    allow_native: bool = False,
) -> Bundle:
    """Load the bundle in ``path`` for this GPU's arch (or ``arch``) and attach it to its ops.

    ``arch``: ``"sm_90"`` (also ``"sm90"``, ``"90"``, ``"9.0"``); default: the current GPU's.

    ``key``: verify the bundle's HMAC-SHA256 signature (made by ``kernelgraft aot ... --sign
    KEYFILE``) first; ``bytes`` are the key itself, a ``str`` or path names the key file. With a key,
    an unsigned bundle or one changed after signing is refused. Without one, the manifest's sha256
    sums still catch corruption, but not someone who edits the bundle and recomputes them.

    ``import_modules``: the manifest names the Python module that defined each op. Importing a
    module runs its code, and a bundle is data, so by default no module is imported: ops already
    registered in this process (you imported their module) get the bundle's binaries, the others
    are rebuilt from the manifest. Pass a collection of module names to allow importing exactly
    those (an allow-list), or ``True`` to import whatever the manifest names (trusted bundles only).

    ``allow_native``: CuTe DSL candidates are shared libraries, and loading one runs its code in
    this process. They are loaded when the bundle's signature was verified with ``key`` (whoever
    holds the key vouches for them) or with ``allow_native=True`` (you trust the bundle's origin);
    otherwise they are left out with a ``KernelgraftWarning`` and the op's other candidates serve.

    Raises ``BundleError`` for a bundle built for other archs, a signature, manifest or binary that
    does not verify, a file that is not a regular file or is too large, or a malformed manifest.

    >>> bundle = kg.load_bundle("bundle/", arch="sm_90", key="bundle.key")  # doctest: +SKIP
    >>> bundle  # doctest: +SKIP
    Bundle('bundle/', arch='sm_90', ops=['kgexamples::add_relu'], kernels=30, signed)
    """
    root = Path(path)
    allowed = _allowed_modules(import_modules)
    reads = Reads(root)  # every file at most once, all charged to one budget (see _manifest)
    manifest = read(root, verify_bundle(root, key, reads) if key is not None else None, reads)
    arch = normalize_arch(arch or _current_arch())
    archs = manifest["archs"]
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise BundleError(f"bundle {root}: manifest.json 'archs' is not a list of arch names")
    if arch not in archs:
        raise BundleError(
            f"bundle {root} was built for {', '.join(archs)}, not for {arch}; "
            f"rebuild it with `kernelgraft aot TARGET --arch {arch} -o DIR`"
        )
    bundle_id = str(manifest["checksum"])[:16]
    bundle = Bundle(root, arch, manifest, {}, {}, [], signed=key is not None)
    try:
        if not isinstance(manifest["ops"], list):
            raise TypeError("'ops' is not a list")
        native = allow_native or key is not None
        if not native:
            _warn_native(root, manifest["ops"], arch)
        binaries = _check_binaries(root, manifest["ops"], arch, native, reads)
        prepared = [(entry, _runners(root, entry, arch, binaries, native)) for entry in manifest["ops"]]
        bundle.kernels = sum(len(r.kernels) for _, runners in prepared for r, _ in runners.values())
        found = [(entry, runners, _existing(entry, allowed)) for entry, runners in prepared]
        for entry, _, op in found:  # refuse a name clash before anything is attached
            if op is not None and not _bundle_only(op):
                _refuse_other_op(op, _bundled_schema(entry), entry, root)
        for entry, runners, op in found:
            name = entry["name"]
            if op is None or _bundle_only(op):
                if op is None:
                    op = _stand_in(entry, runners, bundle_id, bundle)
                    bundle.rebuilt.append(name)
                else:
                    _refresh(op, runners)
                bundle.attached[name] = [c["label"] for _, c in runners.values()]
            else:
                bundle.attached[name] = _attach(op, runners, bundle.moved.setdefault(name, {}))
            bundle.ops[name] = op
    except (BundleError, RegistrationError):
        raise
    except KernelgraftError as exc:  # e.g. a name torch already defines: still the bundle's fault
        raise BundleError(f"bundle {root}: {exc}") from None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RecursionError, OverflowError) as exc:
        raise BundleError(f"bundle {root}: manifest.json is malformed ({type(exc).__name__}: {exc}); "
                          "rebuild the bundle") from None
    _select.bump_epoch()
    log.info("loaded bundle %s for %s: %s", root, arch, {k: len(v) for k, v in bundle.attached.items()})
    _LOADED.append(bundle)
    return bundle


def _bundle_only(op) -> bool:
    return bool(op.impls) and all(i.backend == "bundle" for i in op.impls)


def _allowed_modules(import_modules: bool | Collection[str]) -> bool | frozenset[str]:
    if isinstance(import_modules, bool):
        return import_modules
    if isinstance(import_modules, str) or not all(isinstance(m, str) for m in import_modules):
        raise TypeError(f"load_bundle: import_modules is a bool or a collection of module names, got "
                        f"{import_modules!r}")
    return frozenset(import_modules)


def _warn_native(root: Path, ops: list, arch: str) -> None:
    left = sorted({f"{e['name']} {c['label']}" for e in ops for c in e["candidates"]
                   for k in c["kernels"] if k["arch"] == arch and is_native(k)})
    if left:
        warnings.warn(
            f"bundle {root}: {len(left)} CuTe DSL candidates are native code (shared libraries) and are not "
            f"loaded from an unsigned bundle: {', '.join(left)}. Load it with key=... (a signed bundle) or "
            "allow_native=True (a bundle you trust) to serve them", KernelgraftWarning, stacklevel=3)


def _check_binaries(root: Path, ops: list, arch: str, native: bool, reads: Reads) -> dict[str, bytes]:
    """Every binary of ``arch`` against its size and sha256 (and every cubin for a CUDA ELF that
    defines its kernel), before any expression is compiled: a replaced or corrupted file is refused
    in milliseconds, whatever the size of the manifest. Each file is read once; a cubin is searched
    once per kernel name (each search charged to the read budget, as the C++ runtime does), a
    library once. Returns the bytes read, by file name: the kernels are built from these very bytes
    (read once, and nothing on disk changes them since)."""
    read: dict[str, bytes] = {}
    checked: set[tuple[str, ...]] = set()
    for entry in ops:
        for cand in entry["candidates"]:
            for k in cand["kernels"]:
                if k["arch"] == arch and (native or not is_native(k)):
                    for kind, image in k["images"].items():
                        data = read[image["file"]] = read_binary(root, image, reads)
                        where = f"bundle {root}: {entry['name']} kernel {k['kernel']}"
                        if kind == "cubin" and ("cubin", image["file"], k["kernel"]) not in checked:
                            checked.add(("cubin", image["file"], k["kernel"]))
                            reads.charge(image["file"], len(data))  # other bytes under a recomputed sha256
                            _check_cubin(where, data, str(k["kernel"]))
                        elif kind in ("so", "runtime") and (kind, image["file"]) not in checked:
                            checked.add((kind, image["file"]))
                            check_library(where, data, entry=kind == "so")
    return read


def _runners(root: Path, entry: dict, arch: str, binaries: dict[str, bytes], native: bool) -> dict:
    names = [p["name"] for p in entry["params"]]
    n_inputs = len(names)
    names += [f"out{i}" for i in range(int(entry.get("n_returns", 0)))]
    out = {}
    for cand in entry["candidates"]:
        label = f"{entry['name']} {cand['label']} (bundle)"
        kernels = [(NativeKernel if is_native(k) else Kernel)(root, names, n_inputs, k, label, binaries)
                   for k in cand["kernels"] if k["arch"] == arch and (native or not is_native(k))]
        if kernels:
            key = (int(cand["index"]), Config.of(cand["config"], where=f"bundle {root}"))
            out[key] = (BundledRunner(label, kernels, n_inputs), cand)
    return out


def _existing(entry: dict, allowed: bool | frozenset[str]):
    op = _registry.lookup(entry["name"])
    module = entry.get("module")
    permitted = allowed is True or (not isinstance(allowed, bool) and module in allowed)
    if op is None and permitted and isinstance(module, str) and module != "kernelgraft.aot.bundled":
        try:
            importlib.import_module(module)
        except Exception as exc:  # no triton, no source: the op is rebuilt from the manifest
            log.info("bundle op %s: module %s does not import (%s)", entry["name"], module, exc)
        op = _registry.lookup(entry["name"])
    return op


def _stand_in(entry: dict, runners: dict, bundle_id: str, bundle: Bundle):
    """An op rebuilt from the manifest that yields its name to the op of the module defining it."""
    from .bundled_op import make_op

    try:
        op = make_op(entry, runners, bundle_id)
    except RegistrationError as exc:
        raise BundleError(f"bundle op {entry['name']!r} cannot be registered: {exc}") from None

    def take_over(real, replace: bool = False):
        """Called by the registry when Python code registers ``real`` under this stand-in's name."""
        same = entry.get("fingerprint") == real.fingerprint
        if not same and not replace:
            _refuse_other_op(real, op.signature.schema, entry, bundle.path)
        _registry.unregister(op.name)
        registered = _registry.register(real)
        _registry.retire(op, "replaced")  # references to the stand-in now reach the module's op
        if not same:
            warnings.warn(
                f"{real.name}: defined by {real.reference.__module__}, which replaces the op of this name "
                f"that bundle {bundle.path} rebuilt; the bundle's op was built from different code "
                "(fingerprints differ), so only candidates whose impl fingerprints agree keep its binaries",
                KernelgraftWarning, stacklevel=4)
        bundle.attached[real.name] = _attach(registered, runners, bundle.moved.setdefault(real.name, {}))
        bundle.ops[real.name] = registered
        if real.name in bundle.rebuilt:
            bundle.rebuilt.remove(real.name)
        _select.bump_epoch()
        log.info("op %s: %s took over from bundle %s", real.name, real.reference.__module__, bundle.path)
        return registered

    op._bundle_stand_in = take_over  # read by _registry.register
    return op


def _refuse_other_op(real, bundled_schema: str, entry: dict, path: Path) -> None:
    """A different op (another schema) under a bundle op's name is a name clash, not an edit."""
    if real.signature.schema == bundled_schema:
        return  # the same op, edited since the bundle was built: it takes over, with a warning
    raise RegistrationError(
        f"op name {real.name!r} names two different ops: {entry.get('module')}.{entry['name'].split('::')[1]} "
        f"in bundle {path}, schema {bundled_schema}, and {real.reference.__module__}."
        f"{real.reference.__qualname__}, schema {real.signature.schema}. Give one of them another "
        "name, or pass replace=True to kg.op to let the module's op take the name (the bundle's "
        "kernels are then not used)")


def _bundled_schema(entry: dict) -> str:
    from ..op.schema import parse_signature
    from .bundled_op import _reference

    mutates = tuple(entry.get("mutates_args", ()))
    return parse_signature(_reference(entry), mutates, f"bundle op {entry['name']!r}").schema


def _attach(op, runners: dict, moved: dict[int, int]) -> list[str]:
    """Serve each bundled candidate from ``op``'s impl with the same fingerprint: the manifest's
    index when that impl has it, else the one impl here that has it (the building machine had other
    backends, so other indexes: ``moved`` records where each went); none is code that changed."""
    from .. import backends

    labels = []
    for (index, config), (runner, cand) in runners.items():
        here = _impl_index(op, index, cand["impl_fingerprint"])
        if here is None:
            warnings.warn(
                f"{op.name}: bundled candidate {cand['label']} was built from different code than this "
                "process has (impl fingerprint differs from every impl of the op here); it is not used. Rebuild the bundle.",
                KernelgraftWarning, stacklevel=3)
            continue
        if here != index:
            moved[index] = here
        impl = op.impls[here]
        backend = backends.get(impl.backend)
        if backend.available() is None:
            runner._fallback_factory = lambda b=backend, i=impl, c=config: b.bind(i, c)
        op.dispatcher.serve_bundled(here, config, runner)
        BUNDLED.add(impl.fingerprint)
        labels.append(cand["label"])
    return labels


def _impl_index(op, index: int, fingerprint: str) -> int | None:
    """The index of ``op``'s impl whose fingerprint is ``fingerprint``: ``index`` itself when it
    matches, else the one impl that does (equal fingerprints are equal code and configs)."""
    impls = op.impls
    if 0 <= index < len(impls) and impls[index].fingerprint == fingerprint:
        return index
    return next((n for n, impl in enumerate(impls) if impl.fingerprint == fingerprint), None)


def _refresh(op, runners: dict) -> None:
    from .bundled_op import RUNNERS

    for position, impl in enumerate(op.impls):
        for config in impl.configs:
            found = runners.get((impl.index, config))
            if found is not None:
                RUNNERS[(impl.bundle_key, config)] = found[0]
                op.dispatcher.forget_runner(position, config)
