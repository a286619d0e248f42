"""``kg.load_bundle(DIR)``: check a bundle and attach its binaries to the ops.

For each op in the manifest: when the op exists in this process (or its module imports), each
bundled (impl, config) whose impl fingerprint still matches gets a driver runner that the op uses
instead of compiling (shapes no bundled kernel covers still go to the JIT); otherwise the op is
rebuilt from the manifest (schema, output shapes, bundled candidates only). Every binary of the
chosen arch is read and its sha256 checked here, before anything is attached.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import warnings
from pathlib import Path
from typing import Any

import torch

from .._op import _registry
from .._op import _select
from .._op._candidates import BUNDLED
from .._errors import BundleError, KernelgraftError, KernelgraftWarning
from .._spec import Config
from ._manifest import read
from ._runner import BundledRunner, Kernel

__all__ = ["Bundle", "load_bundle", "reset_bundles"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Bundle:
    """What ``load_bundle`` attached: ``ops`` by name, and for each how its candidates were bound."""

    path: Path
    arch: str
    manifest: dict
    ops: dict[str, Any]
    attached: dict[str, list[str]]   # op name -> candidate labels now served by the bundle
    rebuilt: list[str]               # ops created from the manifest (their module did not import)

    def detach(self) -> None:
        """Stop serving the bundle's candidates from existing ops (rebuilt ops stay registered)."""
        for name in self.attached:
            op = self.ops[name]
            for key in list(op._bundled):
                op._bundled.pop(key, None)
                op._runners.pop(key, None)
            for impl in op.impls:
                BUNDLED.discard(impl.fingerprint)
        _select.bump_epoch()

    def runner(self, op_name: str, index: int, config: dict) -> BundledRunner:
        """The bundled runner of one candidate (for tests and tools)."""
        op = self.ops[op_name]
        key = (index, Config.of(config, where="Bundle.runner"))
        runner = op._bundled.get(key)
        if runner is None:
            from ._bundled_op import RUNNERS

            impl = next(i for i in op.impls if getattr(i, "index", None) == index)
            runner = RUNNERS[(impl.bundle_key, key[1])]
        return runner


# Every bundle attached in this process, so reset_bundles can undo them all.
_LOADED: list[Bundle] = []


def reset_bundles() -> None:
    """Detach every loaded bundle and forget the runners of ops rebuilt from manifests (tests
    call this between tests; ops stay registered)."""
    from ._bundled_op import RUNNERS

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


def load_bundle(path: str | Path, *, arch: str | None = None, import_modules: bool = True) -> Bundle:
    """Load the bundle in ``path`` for this GPU's arch (or ``arch``) and attach it to its ops.

    Raises ``BundleError`` for a bundle built for other archs, a manifest or binary whose checksum
    does not match, or a malformed manifest.
    """
    root = Path(path)
    manifest = read(root)
    arch = arch or _current_arch()
    arch = arch if arch.startswith("sm_") else f"sm_{arch}"
    if arch not in manifest["archs"]:
        raise BundleError(
            f"bundle {root} was built for {', '.join(manifest['archs'])}, not for {arch} (this GPU); "
            f"rebuild it with `kernelgraft aot TARGET --arch {arch} -o DIR`"
        )
    bundle_id = manifest["checksum"][:16]
    try:
        prepared = [(entry, _runners(root, entry, arch)) for entry in manifest["ops"]]
        ops, attached, rebuilt = {}, {}, []
        for entry, runners in prepared:
            name = entry["name"]
            op = _existing(entry, import_modules)
            if op is None or op.impls and all(i.backend == "bundle" for i in op.impls):
                if op is None:
                    from ._bundled_op import make_op

                    op = make_op(entry, runners, bundle_id)
                    rebuilt.append(name)
                else:
                    _refresh(op, runners)
                attached[name] = [c["label"] for _, c in runners.values()]
            else:
                attached[name] = _attach(op, runners)
            ops[name] = op
    except KernelgraftError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise BundleError(f"bundle {root}: manifest.json is malformed ({type(exc).__name__}: {exc}); "
                          "rebuild the bundle") from None
    _select.bump_epoch()
    log.info("loaded bundle %s for %s: %s", root, arch, {k: len(v) for k, v in attached.items()})
    bundle = Bundle(root, arch, manifest, ops, attached, rebuilt)
    _LOADED.append(bundle)
    return bundle


def _runners(root: Path, entry: dict, arch: str) -> dict:
    names = [p["name"] for p in entry["params"]]
    n_inputs = len(names)
    names += [f"out{i}" for i in range(int(entry.get("n_returns", 0)))]
    out = {}
    for cand in entry["candidates"]:
        kernels = [Kernel(root, names, n_inputs, k) for k in cand["kernels"] if k["arch"] == arch]
        if kernels:
            label = f"{entry['name']} {cand['label']} (bundle)"
            key = (int(cand["index"]), Config.of(cand["config"], where=f"bundle {root}"))
            out[key] = (BundledRunner(label, kernels, n_inputs), cand)
    return out


def _existing(entry: dict, import_modules: bool):
    op = _registry.lookup(entry["name"])
    module = entry.get("module")
    if op is None and import_modules and module and module != "kernelgraft.aot.bundled":
        try:
            importlib.import_module(module)
        except Exception as exc:  # no triton, no source: the op is rebuilt from the manifest
            log.info("bundle op %s: module %s does not import (%s)", entry["name"], module, exc)
        op = _registry.lookup(entry["name"])
    return op


def _attach(op, runners: dict) -> list[str]:
    from .. import backends

    labels = []
    for (index, config), (runner, cand) in runners.items():
        if index >= len(op.impls) or op.impls[index].fingerprint != cand["impl_fingerprint"]:
            warnings.warn(
                f"{op.name}: bundled candidate {cand['label']} was built from different code than this "
                "process has (impl fingerprint differs); it is not used. Rebuild the bundle.",
                KernelgraftWarning, stacklevel=3)
            continue
        impl = op.impls[index]
        backend = backends.get(impl.backend)
        if backend.available() is None:
            runner._fallback_factory = lambda b=backend, i=impl, c=config: b.bind(i, c)
        op._bundled[(index, config)] = runner
        op._runners.pop((index, config), None)
        BUNDLED.add(impl.fingerprint)
        labels.append(cand["label"])
    return labels


def _refresh(op, runners: dict) -> None:
    from ._bundled_op import RUNNERS

    for position, impl in enumerate(op.impls):
        for config in impl.configs:
            found = runners.get((impl.index, config))
            if found is not None:
                RUNNERS[(impl.bundle_key, config)] = found[0]
                op._runners.pop((position, config), None)
