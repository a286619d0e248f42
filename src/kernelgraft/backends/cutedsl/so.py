"""One compiled CuTe DSL host function as a shared library with a uniform C entry point.

The DSL's AOT export gives a C header and an object file: the host function (grid, block, argument
structs compiled in) with its cubin embedded, calling into the DSL's runtime library. Two layouts:

- nvidia-cutlass-dsl 4.4 and later: the public ``compiled.export_to_c(dir, name, function_prefix)``
  (position-independent object; header ``cute_dsl_<prefix>_wrapper(<prefix>_Kernel_Module_t *, ...)``),
  linked against the runtime library the DSL names (``cute.runtime.find_runtime_libraries``, what
  ``python -m cutlass.cute.export.aot_config --libs`` prints: ``libcute_dsl_runtime.so`` in 4.8).
  On a machine without a GPU ``cute.compile`` builds no JIT engine, so nothing has loaded that
  runtime when the export's JIT link resolves the host code's calls (``_cudaLaunchKernelEx`` ...):
  the runtime is opened with ``RTLD_GLOBAL`` first (it loads without a driver).
- 4.3: ``cute.export.export_to_c`` checks for a driver (``cuInit``) first, so this module does what
  it does without that check: the header from ``CuteCHeaderGenerator``, the object from the MLIR
  execution engine's object dump (dumped when compiled, before the link that needs the runtime).
  The object is of LLVM's large code model with absolute relocations: the library has text
  relocations that the dynamic loader patches when it loads it.

Then a small generated C shim is linked with the object (``gcc``, no CUDA headers, no libcuda at
link time) into one ``.so`` that exports only::

    int32_t kg_cutedsl_abi(void);                    /* 1 */
    int32_t kg_cutedsl_num_args(void);               /* runtime arguments, the stream not counted */
    const char *kg_cutedsl_kinds(void);              /* "ptr,ptr,ptr,i32" */
    int32_t kg_cutedsl_launch(int32_t device, void *stream, void **args, int32_t num_args,
                              char *error, size_t error_size);

``args[i]`` points at argument ``i``'s value (a device pointer, or an integer/float of its kind),
as ``cuLaunchKernel``'s parameter array does. The call runs in ``device``'s context (its primary
context is made current for the call when the current one is another device's). The first launch on
a device loads the embedded cubin (once per process) and the kernels on that device, as the
library's own JIT executor does (``cuda_init``, then ``cuda_load_to_device`` per device, whose first
argument is the library handle in 4.3 and a pointer to it from 4.4 on: read off the header that
came with the object). The library needs the DSL's runtime library (a ``DT_NEEDED`` by soname,
shipped in the wheel and in the bundle; the loaders open the bundle's verified copy first) and
``libcuda.so.1``, named by the library itself (linked against a stub of that name), which resolves
the shim's and the host code's driver calls.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ...symbolic.expr import Unsupported

__all__ = ["ABI", "ENTRY", "RUNTIME_SONAMES", "runtime_library", "export_object", "build_library", "toolchain"]

ABI = 1
ENTRY = "kg_cutedsl_launch"
# the DSL runtime library by version: 4.4 on (libs wheel), 4.3
RUNTIME_SONAMES = ("libcute_dsl_runtime.so", "libcuda_dialect_runtime.so")
# The C type of each argument kind the shim passes through (the manifest's kinds, as the other backends').
C_TYPES = {"ptr": "void *", "i8": "int8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t",
           "u8": "uint8_t", "u16": "uint16_t", "u32": "uint32_t", "u64": "uint64_t", "f32": "float",
           "f64": "double"}
_HEADER_TYPES = {"void *": "ptr", "int8_t": "i8", "int16_t": "i16", "int32_t": "i32", "int64_t": "i64",
                 "uint8_t": "u8", "uint16_t": "u16", "uint32_t": "u32", "uint64_t": "u64", "float": "f32",
                 "double": "f64", "bool": "u8"}


def runtime_library() -> Path:
    """The DSL's runtime library that exported host code calls (``libcute_dsl_runtime.so`` in 4.8,
    ``libcuda_dialect_runtime.so`` in 4.3), as the DSL itself finds it."""
    import cutlass

    try:
        from cutlass.cute.runtime import find_runtime_libraries
    except ImportError:  # pragma: no cover - every supported version has it
        find_runtime_libraries = None
    if find_runtime_libraries is not None:
        for path in find_runtime_libraries(enable_tvm_ffi=False):
            if Path(path).is_file():
                return Path(path)
    raise RuntimeError(f"the CuTe DSL runtime library ({' or '.join(RUNTIME_SONAMES)}) is not in the "
                       f"nvidia-cutlass-dsl installation beside {cutlass.__file__}")


@functools.cache
def _runtime_visible() -> None:
    """Opens the runtime library with ``RTLD_GLOBAL``, where the export's JIT link looks for the
    host code's calls (the DSL opens it itself only when it builds a JIT engine: on a GPU)."""
    import ctypes

    ctypes.CDLL(str(runtime_library()), mode=os.RTLD_NOW | os.RTLD_GLOBAL)


def _compiler() -> str:
    for name in (os.environ.get("CC"), "gcc", "cc"):
        if name and shutil.which(name):
            return name
    raise RuntimeError("no C compiler (gcc or cc, or $CC) to link CuTe DSL libraries with")


def toolchain() -> str:
    """``gcc 12.2.0``: the linker that builds the libraries (RuntimeError without one)."""
    cc = _compiler()
    out = subprocess.run([cc, "-dumpfullversion"], capture_output=True, text=True, timeout=60)
    return f"{Path(cc).name} {out.stdout.strip() or 'unknown'}"


@contextlib.contextmanager
def _quiet_stderr():
    """LLVM prints "JIT session error: Symbols not found" on fd 2 when the runtime library cannot
    load (no libcuda here); that is expected, so it is kept out of ``kernelgraft aot``'s output."""
    import logging

    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode(errors="replace").strip()
            if text:
                logging.getLogger(__name__).debug("CuTe DSL export: %s", text)


def _shared_libs(dsl) -> list[str]:
    """The runtime library when it loads here (a GPU machine), else none: the object is dumped
    before the engine links it, so unresolved calls do not stop the export."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return []
    return list(dsl.get_shared_libs())


def _public_export(compiled: Any) -> Any:
    """``compiled.export_to_c`` where it is the DSL's public AOT export (4.4 on: it takes a
    ``function_prefix``), else None."""
    method = getattr(compiled, "export_to_c", None)
    if not callable(method):
        return None
    try:
        return method if "function_prefix" in inspect.signature(method).parameters else None
    except (TypeError, ValueError):
        return None


def export_object(compiled: Any, prefix: str) -> tuple[str, bytes]:
    """(header text, object bytes) of a ``cute.compile`` result, symbols prefixed with ``prefix``."""
    export = _public_export(compiled)
    if export is not None:
        _runtime_visible()
        with tempfile.TemporaryDirectory(prefix="kg-cute-") as tmp, _quiet_stderr():
            export(tmp, "kernel", function_prefix=prefix)
            header = Path(tmp, "kernel.h").read_text()
            obj = Path(tmp, "kernel.o").read_bytes()
    else:
        header, obj = _export_object_4_3(compiled, prefix)
    if not obj.startswith(b"\x7fELF"):
        raise RuntimeError(f"the CuTe DSL export wrote no object file for {prefix}")
    return header, obj


def _shared_libs(dsl) -> list[str]:
    """The runtime library when it loads here (a GPU machine), else none: the object is dumped
    before the engine links it, so unresolved calls do not stop the export."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return []
    return list(dsl.get_shared_libs())


def _export_object_4_3(compiled: Any, prefix: str) -> tuple[str, bytes]:
    """What 4.3's ``export_to_c`` does, without its driver check (the module docstring says why)."""
    from cutlass.cute.export import CuteCHeaderGenerator, get_export_module
    from cutlass.cutlass_dsl import CuTeDSL

    dsl = CuTeDSL._get_dsl()
    module = get_export_module(compiled.ir_module, prefix)
    header = CuteCHeaderGenerator()(prefix, module, compiled.args_spec, compiled.function_name,
                                    compiled.kernel_info, compiled.dynamic_args, compiled.dynamic_kwargs,
                                    dsl.name)
    if "gpu.container_module" in module.operation.attributes:
        del module.operation.attributes["gpu.container_module"]
    with tempfile.TemporaryDirectory(prefix="kg-cute-") as tmp, _quiet_stderr():
        engine = dsl.compiler_provider.execution_engine.ExecutionEngine(
            module, opt_level=2, shared_libs=_shared_libs(dsl))
        engine.raw_lookup(f"{prefix}_{compiled.function_name}")  # compiles (the link may fail: see above)
        path = os.path.join(tmp, "host.o")
        engine.dump_to_object_file(path)
        obj = Path(path).read_bytes() if os.path.exists(path) else b""
    return header, obj


_CIFACE = re.compile(r"void (_mlir_\w+__mlir_ciface_\w+)\(void \*\*args, int32_t num_args\);")
# 4.4 on: cuda_load_to_device's first argument points at the library handle (the header says so)
_LOAD_INDIRECT = re.compile(r"struct \{\s*\w+ \*\*library;\s*int32_t \*device_id;\s*\w+ \*ret;\s*\} "
                            r"loadArgs = \{&libraryPtr, &device_id, &ret\};")


def header_signature(header: str, prefix: str) -> tuple[str, list[str], bool]:
    """(the packed entry symbol, the runtime arguments' kinds without the stream, whether
    ``cuda_load_to_device`` takes a pointer to the library handle) from the header the export
    wrote; Unsupported if its layout is not one this shim was written for."""
    p = re.escape(prefix)
    wrapper = re.search(rf"static inline int32_t (?:cute_dsl_)?{p}_wrapper\({p}_Kernel_(?:Metadata|Module)_t "
                        rf"\*\w+((?:, [^,)]+)*)\)", header)
    ciface = _CIFACE.search(header)
    init, load = f"_mlir_{prefix}_cuda_init", f"_mlir_{prefix}_cuda_load"
    if wrapper is None or ciface is None or init not in header or load not in header:
        raise Unsupported("the header export_to_c wrote is not laid out as kernelgraft's shim expects "
                          "(a <prefix>_wrapper(module, ..., stream) over _mlir_<prefix>_cuda_init/"
                          "_cuda_load and one packed entry); this nvidia-cutlass-dsl version is not supported")
    indirect = False
    if f"{load}_to_device(" in header:  # the header documents cuda_load_to_device's arguments
        indirect = _LOAD_INDIRECT.search(header) is not None
        if not indirect:
            raise Unsupported("the header export_to_c wrote calls cuda_load_to_device with arguments kernelgraft's "
                              "shim does not know; this nvidia-cutlass-dsl version is not supported")
    params = [q.strip() for q in wrapper.group(1).split(",") if q.strip()]
    if not params or not params[-1].startswith(("CUstream ", "cudaStream_t ")):
        raise Unsupported("the exported host function's last parameter is not the stream")
    kinds = []
    for q in params[:-1]:
        ctype = "void *" if "*" in q else q.rsplit(" ", 1)[0].strip()
        if ctype not in _HEADER_TYPES:
            raise Unsupported(f"exported host parameter {q!r}: kernelgraft passes pointers and integer/float scalars")
        kinds.append(_HEADER_TYPES[ctype])
    return ciface.group(1), kinds, indirect


_SHIM = r"""
/* Generated by kernelgraft: the uniform entry point of one exported CuTe DSL host function.
   The driver calls resolve through libcuda.so.1, a DT_NEEDED of this library (linked against a
   stub of that name); no CUDA header is used. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define NUM_ARGS @NUM_ARGS@
typedef int CUresult;
typedef void *CUlibrary;
typedef void *CUcontext;

CUresult cuInit(unsigned);
CUresult cuCtxGetCurrent(CUcontext *);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxGetDevice(int *);
CUresult cuDeviceGet(int *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
CUresult cuGetErrorString(CUresult, const char **);

void @INIT@(void **);
void @LOAD@(void **);
void @ENTRY@(void **args, int32_t num_args);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static CUlibrary library;
static int loaded, initialized;
static volatile unsigned char ready[1024];  /* devices the kernels are loaded for */
static CUcontext primary[1024];

static int fail(char *error, size_t size, const char *what, int code) {
  const char *text = NULL;
  if (code > 0) cuGetErrorString(code, &text);
  if (error != NULL && size > 0)
    snprintf(error, size, "%s: CUDA error %d (%s)", what, code, text != NULL ? text : "unknown");
  return code != 0 ? code : -1;
}

#define CHECK(call, what) do { CUresult r_ = (call); if (r_ != 0) return fail(error, size, what, r_); } while (0)

/* The library's own functions return CUDA runtime errors (cudaError_t), whose numbers are not the
   driver's: named by number only. */
static int fail_runtime(char *error, size_t size, const char *what, int code) {
  if (error != NULL && size > 0) snprintf(error, size, "%s: CUDA runtime error %d (cudaError_t)", what, code);
  return code;
}

/* Makes `device`'s primary context current unless a context of that device is; *previous is then
   the context to restore (the host function launches on the current context). */
static int enter(int32_t device, CUcontext *previous, int *switched, char *error, size_t size) {
  CUcontext current = NULL;
  int dev = -1;
  *switched = 0;
  if (!initialized) {
    CHECK(cuInit(0), "cuInit");
    initialized = 1;
  }
  CHECK(cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != NULL && cuCtxGetDevice(&dev) == 0 && dev == device) return 0;
  if (primary[device] == NULL) {
    pthread_mutex_lock(&lock);
    CUresult r = 0;
    if (primary[device] == NULL) {
      int d;
      CUcontext ctx = NULL;
      r = cuDeviceGet(&d, device);
      if (r == 0) r = cuDevicePrimaryCtxRetain(&ctx, d);
      if (r == 0) primary[device] = ctx;
    }
    pthread_mutex_unlock(&lock);
    if (r != 0) return fail(error, size, "retaining the device's primary context", r);
  }
  CHECK(cuCtxSetCurrent(primary[device]), "cuCtxSetCurrent");
  *previous = current;
  *switched = 1;
  return 0;
}

/* What the library's JIT executor does (nvidia-cutlass-dsl's CudaDialectJitCompiledFunction):
   cuda_init once per process (the library is context-independent), then cuda_load_to_device once
   per device (each kernel resolved, its shared memory opted in for that device); errors are
   returned, not exit()ed on as in the header's Kernel_Metadata_Load. Runs under `lock`. */
static int prepare(int32_t device, char *error, size_t size) {
  int32_t ret = 0;
  if (!loaded) {
    CUlibrary *library_ptr = &library;
    struct { CUlibrary **library_ptr; int32_t *ret; } init_args = {&library_ptr, &ret};
    @INIT@((void **)&init_args);
    if (ret != 0) return fail_runtime(error, size, "loading the embedded cubin (cuda_init)", ret);
    loaded = 1;
  }
  int32_t dev = device;
  @LOAD_ARGS@
  @LOAD@((void **)&load_args);
  if (ret != 0) return fail_runtime(error, size, "loading the kernels on the device (cuda_load_to_device)", ret);
  ready[device] = 1;
  return 0;
}

int32_t kg_cutedsl_abi(void) { return @ABI@; }
int32_t kg_cutedsl_num_args(void) { return NUM_ARGS; }
const char *kg_cutedsl_kinds(void) { return "@KINDS@"; }

/* Calls the host function on `stream` (a CUstream; null: the legacy default stream) with args[i]
   pointing at argument i's value. 0 on success, else an error code with `error` filled. */
int32_t kg_cutedsl_launch(int32_t device, void *stream, void **args, int32_t num_args, char *error, size_t size) {
  if (num_args != NUM_ARGS) {
    if (error != NULL && size > 0) snprintf(error, size, "%d arguments given, the host function takes %d", num_args, NUM_ARGS);
    return -1;
  }
  if (device < 0 || device >= (int32_t)sizeof ready) return fail(error, size, "device index out of range", -1);
  CUcontext previous = NULL;
  int switched = 0;
  int status = enter(device, &previous, &switched, error, size);
  if (status != 0) return status;
  if (!ready[device]) {
    pthread_mutex_lock(&lock);
    status = ready[device] ? 0 : prepare(device, error, size);
    pthread_mutex_unlock(&lock);
  }
  if (status == 0) {
    int32_t ret = 0;
    void *packed[NUM_ARGS + 2];
    for (int i = 0; i < NUM_ARGS; ++i) packed[i] = args[i];
    packed[NUM_ARGS] = &stream;
    packed[NUM_ARGS + 1] = &ret;
    @ENTRY@(packed, NUM_ARGS + 2);
    if (ret != 0) status = fail_runtime(error, size, "the CuTe DSL host function", ret);
  }
  if (switched) cuCtxSetCurrent(previous);
  return status;
}
"""

_EXPORTS = "{ global: kg_cutedsl_abi; kg_cutedsl_num_args; kg_cutedsl_kinds; kg_cutedsl_launch; local: *; };\n"


# cuda_load_to_device's arguments: the library handle itself (4.3) or a pointer to it (4.4 on)
_LOAD_ARGS = {
    False: "struct { CUlibrary *library; int32_t *device; int32_t *ret; } load_args = {&library, &dev, &ret};",
    True: "CUlibrary *handle = &library;\n  "
          "struct { CUlibrary **library; int32_t *device; int32_t *ret; } load_args = {&handle, &dev, &ret};",
}


def shim_source(prefix: str, entry: str, kinds: list[str], indirect: bool = False) -> str:
    for k in kinds:
        if k not in C_TYPES:
            raise Unsupported(f"argument kind {k}")
    values = {"LOAD_ARGS": _LOAD_ARGS[indirect], "NUM_ARGS": str(len(kinds)), "INIT": f"_mlir_{prefix}_cuda_init",
              "LOAD": f"_mlir_{prefix}_cuda_load_to_device",
              "ENTRY": entry, "ABI": str(ABI), "KINDS": ",".join(kinds)}
    return re.sub(r"@(\w+)@", lambda m: values[m.group(1)], _SHIM)


@functools.cache
def _driver_stub(compiler: str) -> Path:
    """An empty shared object named ``libcuda.so.1``: linked against, it makes the library name the
    driver in its own ``DT_NEEDED``, so the shim's and the host code's ``cu*`` calls resolve where it
    loads (``RTLD_LOCAL`` included) without a driver on the building machine. The DSL's runtime
    library named the driver in 4.3 (``libcuda_dialect_runtime.so``); 4.8's
    (``libcute_dsl_runtime.so``) does not. Built once per process (and compiler), every library
    links against it; removed at exit."""
    folder = Path(tempfile.mkdtemp(prefix="kg-cute-driver-"))
    atexit.register(shutil.rmtree, folder, True)
    (folder / "driver_stub.c").write_text("/* the soname is what matters */\n")
    stub = folder / "libcuda.so.1"
    command = [compiler, "-shared", "-fPIC", "-o", str(stub), str(folder / "driver_stub.c"), "-Wl,-soname,libcuda.so.1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"building the driver's link stub: {' '.join(command)}\n{done.stderr.strip()}")
    return stub


def build_library(header: str, obj: bytes, prefix: str, kinds: list[str]) -> bytes:
    """The linked ``.so`` of one exported host function; ``kinds``: its runtime arguments as
    kernelgraft recorded them (checked against the header's)."""
    entry, declared, indirect = header_signature(header, prefix)
    for symbol in (entry, f"_mlir_{prefix}_cuda_init", f"_mlir_{prefix}_cuda_load_to_device"):
        if symbol.encode() + b"\0" not in obj:
            raise Unsupported(f"the exported object does not define {symbol}; this nvidia-cutlass-dsl version "
                              "is not supported")
    if declared != kinds:
        raise Unsupported(f"the exported host function takes {declared}, the launch gave {kinds}")
    runtime = runtime_library()
    with tempfile.TemporaryDirectory(prefix="kg-cute-link-") as tmp:
        d = Path(tmp)
        (d / "host.o").write_bytes(obj)
        (d / "shim.c").write_text(shim_source(prefix, entry, kinds, indirect))
        (d / "exports.map").write_text(_EXPORTS)
        compiler = _compiler()
        driver = _driver_stub(compiler)
        if not driver.is_file():  # removed meanwhile (a forked child's exit, a /tmp cleaner): again
            _driver_stub.cache_clear()
            driver = _driver_stub(compiler)
        command = [
            compiler, "-shared", "-fPIC", "-O2", "-o", str(d / "lib.so"), str(d / "shim.c"), str(d / "host.o"),
            f"-Wl,--version-script={d / 'exports.map'}", "-Wl,-z,notext", "-Wl,-z,noexecstack",
            "-Wl,--no-as-needed", str(runtime), str(driver), "-lpthread", f"-Wl,-soname,lib{prefix}.so",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"linking {prefix}: {' '.join(command)}\n{done.stderr.strip()}")
        return (d / "lib.so").read_bytes()
