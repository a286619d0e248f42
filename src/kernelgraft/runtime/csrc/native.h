// Bundled kernels that are native code: a CuTe DSL candidate's shared library, which exports
// kg_cutedsl_launch (kernelgraft/backends/cutedsl/so.py documents the C ABI), and the CUDA dialect
// runtime library it needs. Loading one runs its code, so bundle.cpp reads these only from a
// signed bundle or with allow_native. What is opened are the verified bytes themselves, copied to
// an anonymous in-memory file (memfd_create) and dlopen-ed from /proc/self/fd: a file swapped in
// bin/ after the check is never what runs. The runtime library is opened first; the candidate's
// DT_NEEDED names it by soname, which the dynamic loader matches to that copy, and libcuda.so.1
// comes in from the system as its dependency (a process that already loaded a library of that
// soname, the wheel's, has that one matched instead). Opened on the first launch (per process), so
// a process without a driver still loads bundles.
#pragma once

#include <mutex>
#include <string>
#include <vector>

namespace kgrt {

// BundleError unless `image` is a 64-bit little-endian ELF shared object for this host's machine
// (and, with `entry`, defines kg_cutedsl_launch).
void check_library(const std::string& where, const std::string& image, bool entry);

class NativeFunction {
 public:
  // `library` and `runtime` must outlive this object (the bundle owns them).
  NativeFunction(const std::string* library, const std::string* runtime, std::vector<std::string> kinds,
                 std::string where)
      : library_(library), runtime_(runtime), kinds_(std::move(kinds)), where_(std::move(where)) {}
  // Calls the host function on `stream` with params[i] pointing at argument i's value (as
  // cuLaunchKernel's array). Throws std::runtime_error naming the kernel and the error.
  void launch(int device, void* stream, void** params);

 private:
  using Entry = int (*)(int, void*, void**, int, char*, size_t);
  Entry entry();
  const std::string* library_;
  const std::string* runtime_;
  std::vector<std::string> kinds_;
  std::string where_;
  std::mutex mutex_;
  Entry entry_ = nullptr;
};

}  // namespace kgrt
