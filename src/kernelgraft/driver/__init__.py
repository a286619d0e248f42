"""A small layer over the CUDA driver: load cubin/PTX images and launch their kernels on torch's
current stream. Used by the NVRTC backend, AOT bundles, and any backend that produces cubins.

The API::

    module = driver.load_module(image, "cubin")      # or "ptx"; loaded per device on first use
    fn = module.function("my_kernel")                 # mangled name unless extern "C"
    fn.launch(grid, block, [x, y, out, driver.i32(n)], shared_mem=0, stream=None)

    # hot path: fixed parameter kinds, raw values (device addresses as ints)
    run = fn.launcher(["ptr", "ptr", "ptr", "i32"])
    run(device_index, grid, block, [x.data_ptr(), y.data_ptr(), out.data_ptr(), n])

Tensors pass as device pointers; scalars must carry a C type (``i32`` ... ``f64`` below, or a
ctypes value), because a guessed width would shift every later parameter. Launches use torch's
current stream of the device unless ``stream`` is given, so they are captured by CUDA graphs.
Errors are ``kernelgraft.LaunchError`` naming the driver call and the CUDA error.
Requires ``cuda-bindings`` (``pip install 'kernelgraft[cuda]'``) and a driver at launch time only.
"""

from .cu import available, capability
from .module import Function, Launcher, Module, current_stream, load_module
from .params import KINDS, ParamBuffer, Scalar, f16, f32, f64, i8, i16, i32, i64, ptr, u8, u16, u32, u64

__all__ = [
    "load_module", "Module", "Function", "Launcher", "current_stream", "available", "capability",
    "Scalar", "KINDS", "ParamBuffer",
    "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "f32", "f64", "ptr",
]
