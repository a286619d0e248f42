#include "driver.h"

#include <dlfcn.h>

#include <stdexcept>

namespace kgrt {
namespace {

// The driver API's types, as opaque as the runtime needs them.
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
constexpr int kAttrMaxDynamicShared = 8;     // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kAttrComputeMajor = 75;        // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrComputeMinor = 76;

struct Api {
  std::string error;
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
};

template <class F>
bool find(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

const Api& api() {
  static const Api loaded = [] {
    Api a;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      a.error = std::string("the CUDA driver (libcuda.so.1) cannot be opened: ") + dlerror();
      return a;
    }
    bool ok = find(lib, "cuInit", &a.cuInit) && find(lib, "cuDeviceGet", &a.cuDeviceGet) &&
              find(lib, "cuDeviceGetAttribute", &a.cuDeviceGetAttribute) &&
              find(lib, "cuDevicePrimaryCtxRetain", &a.cuDevicePrimaryCtxRetain) &&
              find(lib, "cuCtxGetCurrent", &a.cuCtxGetCurrent) && find(lib, "cuCtxSetCurrent", &a.cuCtxSetCurrent) &&
              find(lib, "cuModuleLoadData", &a.cuModuleLoadData) &&
              find(lib, "cuModuleGetFunction", &a.cuModuleGetFunction) &&
              find(lib, "cuFuncSetAttribute", &a.cuFuncSetAttribute) &&
              find(lib, "cuLaunchKernel", &a.cuLaunchKernel) && find(lib, "cuGetErrorString", &a.cuGetErrorString);
    if (!ok) {
      a.error = "libcuda.so.1 lacks a driver entry point the runtime needs (a driver older than CUDA 11?)";
      return a;
    }
    CUresult r = a.cuInit(0);
    if (r != 0) a.error = "cuInit failed with CUDA error " + std::to_string(r);
    return a;
  }();
  return loaded;
}

void check(CUresult r, const std::string& what) {
  if (r == 0) return;
  const char* text = nullptr;
  api().cuGetErrorString(r, &text);
  throw std::runtime_error(what + " failed: CUDA error " + std::to_string(r) + " (" + (text ? text : "unknown") + ")");
}

const Api& usable() {
  const Api& a = api();
  if (!a.error.empty()) throw std::runtime_error(a.error);
  return a;
}

// Makes `device`'s primary context current when no context is (torch normally made it current).
void ensure_context(int device) {
  const Api& a = usable();
  CUcontext current = nullptr;
  check(a.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != nullptr) return;
  CUdevice dev;
  check(a.cuDeviceGet(&dev, device), "cuDeviceGet");
  CUcontext ctx;
  check(a.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(a.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

}  // namespace

std::string driver_unavailable() { return api().error; }

std::string device_arch(int device) {
  const Api& a = usable();
  CUdevice dev;
  check(a.cuDeviceGet(&dev, device), "cuDeviceGet");
  int major = 0, minor = 0;
  check(a.cuDeviceGetAttribute(&major, kAttrComputeMajor, dev), "cuDeviceGetAttribute");
  check(a.cuDeviceGetAttribute(&minor, kAttrComputeMinor, dev), "cuDeviceGetAttribute");
  return "sm_" + std::to_string(major) + std::to_string(minor);
}

void* LazyFunction::function(int device, int64_t shared_mem) {
  std::lock_guard<std::mutex> guard(mutex_);
  const Api& a = usable();
  Loaded& l = loaded_[device];
  if (l.function == nullptr) {
    ensure_context(device);
    check(a.cuModuleLoadData(&l.module, cubin_->data()), "cuModuleLoadData of " + name_);
    check(a.cuModuleGetFunction(&l.function, l.module, name_.c_str()), "cuModuleGetFunction of " + name_);
  }
  if (shared_mem > l.shared_opt_in) {  // above 48 KB a kernel must opt in, once per context
    check(a.cuFuncSetAttribute(l.function, kAttrMaxDynamicShared, static_cast<int>(shared_mem)),
          "cuFuncSetAttribute(max dynamic shared memory) of " + name_);
    l.shared_opt_in = shared_mem;
  }
  return l.function;
}

void LazyFunction::launch(int device, const int64_t grid[3], const int64_t block[3], int64_t shared_mem,
                          void* stream, void** params) {
  void* f = function(device, shared_mem);
  check(api().cuLaunchKernel(f, static_cast<unsigned>(grid[0]), static_cast<unsigned>(grid[1]),
                             static_cast<unsigned>(grid[2]), static_cast<unsigned>(block[0]),
                             static_cast<unsigned>(block[1]), static_cast<unsigned>(block[2]),
                             static_cast<unsigned>(shared_mem), stream, params, nullptr),
        "cuLaunchKernel of " + name_);
}

}  // namespace kgrt
