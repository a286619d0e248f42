// The CUDA driver, reached without CUDA headers or a link-time dependency: libcuda.so.1 is
// opened with dlopen on first use and the few entry points the runtime needs are looked up with
// dlsym (as Triton's launcher does), so the runtime builds on machines without CUDA and a
// process without a GPU can still load bundles (the launch is what fails, with a clear error).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace kgrt {

// Why the driver cannot be used ("" when it can).
std::string driver_unavailable();

// The compute capability of `device` as "sm_90"; throws std::runtime_error without a driver.
std::string device_arch(int device);

// One kernel's cubin, loaded into each device's primary context the first time it launches there.
class LazyFunction {
 public:
  // `cubin` must outlive this object (the bundle owns both).
  LazyFunction(const std::string* cubin, std::string name) : cubin_(cubin), name_(std::move(name)) {}
  // Launches on `stream` (a CUstream, null for the legacy default stream); `params` points at each
  // argument's bytes. Throws std::runtime_error naming the kernel and the driver's error.
  void launch(int device, const int64_t grid[3], const int64_t block[3], int64_t shared_mem, void* stream,
              void** params);

 private:
  void* function(int device, int64_t shared_mem);
  const std::string* cubin_;
  std::string name_;
  std::mutex mutex_;
  struct Loaded {
    void* module = nullptr;
    void* function = nullptr;
    int64_t shared_opt_in = 48 * 1024;  // dynamic shared memory allowed without an attribute
  };
  std::unordered_map<int, Loaded> loaded_;
};

}  // namespace kgrt
