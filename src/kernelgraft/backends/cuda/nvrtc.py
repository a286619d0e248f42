"""CUDA C++ to cubin/PTX with NVRTC (through cuda-bindings), cached by a deliberate key.

The key is a sha256 over ``KEY_SCHEMA_VERSION``, the source, the name expression, the normalised
options, the target arch, the output kind and the NVRTC version, so a toolchain upgrade or a
different arch never reuses old code. Works without a GPU (compiling for a named arch).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
from collections.abc import Sequence

from ...cache.code import CodeCache
from ...errors import CompileError

__all__ = ["Compiled", "compile_cuda", "nvrtc_version", "include_dirs", "cache_key", "CACHE"]

log = logging.getLogger(__name__)
KEY_SCHEMA_VERSION = 1
CACHE = CodeCache("nvrtc")


@dataclasses.dataclass(frozen=True)
class Compiled:
    image: bytes          # cubin (ELF) or PTX text
    kind: str             # "cubin" | "ptx"
    symbol: str           # the lowered (mangled) kernel name to look up in the image
    arch: str             # "sm_90"
    log: str = ""


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise CompileError(
            "CUDA C++ kernels need NVRTC through cuda-bindings: pip install 'kernelgraft[cuda]' "
            f"(cuda-bindings and nvidia-cuda-nvrtc): {exc}"
        ) from exc
    return nvrtc


@functools.cache
def nvrtc_version() -> str:
    nvrtc = _nvrtc()
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # libnvrtc not found
        raise CompileError(
            "NVRTC is not available: install the nvidia-cuda-nvrtc wheel (pip install "
            f"'kernelgraft[cuda]') or a CUDA toolkit: {exc}"
        ) from exc
    return f"{major}.{minor}"


@functools.cache
def include_dirs() -> tuple[str, ...]:
    """Where the CUDA headers (cuda_fp16.h, ...) are: the wheels, then CUDA_HOME, /usr/local/cuda."""
    found = []
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        d = find_nvidia_header_directory("cudart")
        if d:
            found.append(str(d))
    except Exception:  # older pathfinder, or no header wheel
        pass
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            found.append(os.path.join(os.environ[env], "include"))
    found.append("/usr/local/cuda/include")
    return tuple(dict.fromkeys(d for d in found if os.path.isfile(os.path.join(d, "cuda_fp16.h"))))


def normalize_options(options: Sequence[str]) -> tuple[str, ...]:
    """Options as NVRTC takes them; ``-D`` macros sorted (their order does not matter)."""
    macros = sorted(o for o in options if o.startswith("-D"))
    rest = [o for o in options if not o.startswith("-D")]
    return tuple(rest + macros)


def cache_key(source: str, name: str, options: Sequence[str], arch: str, kind: str) -> str:
    payload = {
        "v": KEY_SCHEMA_VERSION,
        "source": hashlib.sha256(source.encode()).hexdigest(),
        "name": name,
        "options": list(normalize_options(options)),
        "arch": arch,
        "kind": kind,
        "nvrtc": nvrtc_version(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def compile_cuda(
    source: str,
    name: str,
    *,
    options: Sequence[str] = (),
    arch: str = "sm_90",
    kind: str = "cubin",
    filename: str = "kernel.cu",
    where: str = "kg.cuda",
) -> Compiled:
    """Compile ``source`` and return the image holding the kernel named by the expression ``name``
    (``"my_kernel"`` or ``"my_kernel<float, 128>"``); cached in memory and on disk.

    >>> c = compile_cuda('extern "C" __global__ void k(float* x) { x[0] = 1; }', "k")
    >>> c.image[:4], c.symbol
    (b'\\x7fELF', 'k')
    """
    options = normalize_options(options)
    key = cache_key(source, name, options, arch, kind)
    hit = CACHE.get(key)
    if hit is not None and isinstance(hit[0].get("symbol"), str):  # else an entry another version wrote: compile
        meta, image = hit
        return Compiled(image, kind, meta["symbol"], arch, str(meta.get("log", "")))
    compiled = _compile(source, name, options, arch, kind, filename, where)
    CACHE.put(key, {"symbol": compiled.symbol, "log": compiled.log, "arch": arch}, compiled.image)
    return compiled


def _check(result, what: str, where: str):
    err = result[0]
    if int(err) != 0:
        raise CompileError(f"{where}: NVRTC {what} failed: {getattr(err, 'name', err)}")
    return result[1:]


def _compile(source, name, options, arch, kind, filename, where) -> Compiled:
    nvrtc = _nvrtc()
    version = nvrtc_version()
    (prog,) = _check(nvrtc.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], []),
                     "nvrtcCreateProgram", where)
    try:
        _check(nvrtc.nvrtcAddNameExpression(prog, name.encode()), "nvrtcAddNameExpression", where)
        code = f"compute_{arch[3:]}" if kind == "ptx" else arch
        argv = [f"-arch={code}", *options, *(f"-I{d}" for d in include_dirs())]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(argv), [a.encode() for a in argv])
        (size,) = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize", where)
        # NVRTC writes into the buffer it is given: always a fresh bytearray. b" " * 1 is
        # CPython's shared one-byte object b" " (what " ".encode() returns too), and an empty
        # log's one NUL written there turned every encoded space of the process into a NUL.
        buf = bytearray(size)
        _check(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog", where)
        text = bytes(buf).rstrip(b"\0").decode(errors="replace").strip()
        if int(err) != 0:
            raise CompileError(
                f"{where}: CUDA C++ failed to compile for {arch} with NVRTC {version} "
                f"(options {list(options)}):\n{text or getattr(err, 'name', err)}"
            )
        (symbol,) = _check(nvrtc.nvrtcGetLoweredName(prog, name.encode()), "nvrtcGetLoweredName", where)
        if kind == "cubin":
            (size,) = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize", where)
            out = bytearray(size)
            _check(nvrtc.nvrtcGetCUBIN(prog, out), "nvrtcGetCUBIN", where)
            image = bytes(out)
        else:
            (size,) = _check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize", where)
            out = bytearray(size)
            _check(nvrtc.nvrtcGetPTX(prog, out), "nvrtcGetPTX", where)
            image = bytes(out).rstrip(b"\0")
        symbol = symbol.decode() if isinstance(symbol, bytes) else str(symbol)
        log.debug("%s: compiled %s for %s (%d bytes)", where, name, arch, len(image))
        return Compiled(image, kind, symbol, arch, text)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
