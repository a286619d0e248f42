"""The CUDA driver layer: parameter packing and typing on the CPU; real launches on a GPU."""

from __future__ import annotations

import ctypes
import struct

import pytest
import torch

from kernelgraft import LaunchError, driver


@pytest.mark.parametrize(
    "kinds,offsets,size",
    [
        (["ptr", "i32", "ptr"], (0, 8, 16), 24),
        (["i32", "i64"], (0, 8), 16),
        (["i8", "i16", "f32", "f64"], (0, 2, 4, 8), 16),
        (["f16", "ptr"], (0, 8), 16),
    ],
    ids=["ptr-i32-ptr", "i32-i64-aligned", "small-ints", "f16-ptr"],
)
def test_param_layout_follows_c_alignment(kinds, offsets, size):
    buf = driver.ParamBuffer(kinds)
    assert buf.offsets == offsets
    assert buf.size == size


def test_param_buffer_packs_values_where_pointers_point():
    buf = driver.ParamBuffer(["ptr", "i32", "f32", "i64"])
    addr = buf.address([0xDEAD0000, -7, 1.5, 2**40 + 3])
    pointers = (ctypes.c_void_p * 4).from_address(addr)
    assert ctypes.c_uint64.from_address(pointers[0]).value == 0xDEAD0000
    assert ctypes.c_int32.from_address(pointers[1]).value == -7
    assert ctypes.c_float.from_address(pointers[2]).value == 1.5
    assert ctypes.c_int64.from_address(pointers[3]).value == 2**40 + 3
    assert buf.pack([1, 2, 3.0, 4]) == struct.pack("=Qifq", 1, 2, 3.0, 4)
    assert buf.offsets == (0, 8, 12, 16)


def test_untyped_python_scalars_are_refused_with_a_fix():
    assert driver.Scalar("i32", 3).kind == "i32"
    from kernelgraft.driver.params import kind_of

    assert kind_of(torch.zeros(1), 0) == "ptr"
    assert kind_of(ctypes.c_int64(5), 1) == "i64"
    assert kind_of(driver.f32(0.5), 2) == "f32"
    with pytest.raises(LaunchError, match=r"argument 3 is a bare Python int 7.*driver.i32"):
        kind_of(7, 3)
    with pytest.raises(LaunchError, match="unknown parameter kind"):
        driver.ParamBuffer(["int"])


def test_pack_error_names_kinds():
    with pytest.raises(LaunchError, match=r"cannot pack kernel arguments.*\['i32'\]"):
        driver.ParamBuffer(["i32"]).address([2**40])


def test_load_module_validates_images_without_a_gpu():
    with pytest.raises(LaunchError, match="ELF"):
        driver.load_module(b"not an elf", "cubin")
    with pytest.raises(LaunchError, match="'cubin' or 'ptx'"):
        driver.load_module(b"\x7fELF", "fatbin")
    a = driver.load_module(b"\x7fELF-same-bytes", "cubin")
    assert driver.load_module(b"\x7fELF-same-bytes", "cubin") is a
    assert a.function("k") is a.function("k")


def test_launch_on_cpu_tensors_is_refused():
    fn = driver.load_module(b"\x7fELF-cpu", "cubin").function("k")
    with pytest.raises(LaunchError, match="CUDA devices"):
        fn.launch(1, 32, [torch.zeros(2), driver.i32(2)])


_SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def _cubin(source: str, name: str) -> bytes:
    from cuda.core import Program, ProgramOptions

    major, minor = torch.cuda.get_device_capability()
    return Program(source, "c++", ProgramOptions(arch=f"sm_{major}{minor}", name=name)).compile("cubin").code


@pytest.mark.gpu
def test_launch_saxpy_on_current_stream_and_in_a_cuda_graph():
    fn = driver.load_module(_cubin(_SAXPY, "saxpy.cu"), "cubin").function("saxpy")
    n = 10_007
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    want = (2.5 * x.double() + y.double()).float()
    fn.launch((n + 255) // 256, 256, [driver.f32(2.5), x, y, driver.i64(n)])
    torch.testing.assert_close(y, want)

    # the hot-path launcher on a side stream, then captured into a CUDA graph and replayed
    run = fn.launcher(["f32", "ptr", "ptr", "i64"])
    y2 = torch.randn(n, device="cuda")
    start = y2.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            run(y2.device.index, (n + 127) // 128, 128, [1.0, x.data_ptr(), y2.data_ptr(), n])
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(y2, start)  # capture does not run the kernel
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y2, (start.double() + 2 * x.double()).float())


@pytest.mark.gpu
def test_launch_ptx_module_and_large_shared_memory():
    from cuda.core import Program, ProgramOptions

    src = r"""
    extern "C" __global__ void fill(float* out, int n) {
        extern __shared__ float tile[];
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        tile[threadIdx.x] = (float)i;
        __syncthreads();
        if (i < n) out[i] = tile[threadIdx.x] * 2.0f;
    }"""
    major, minor = torch.cuda.get_device_capability()
    ptx = Program(src, "c++", ProgramOptions(arch=f"sm_{major}{minor}", name="fill.cu")).compile("ptx").code
    fn = driver.load_module(ptx, "ptx").function("fill")
    out = torch.full((1000,), float("nan"), device="cuda")
    fn.launch(4, 256, [out, driver.i32(1000)], shared_mem=64 * 1024)
    torch.testing.assert_close(out, torch.arange(1000, device="cuda", dtype=torch.float32) * 2)
