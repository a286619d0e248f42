// A per-op memo of launch plans, keyed by the call's signature. Everything the runtime works out
// per call (argument views, decision rows, guards, the grid, shared-memory, parameter and
// output-shape programs) depends only on each tensor's dtype, sizes, strides and 16-byte
// alignment, on which arguments are None, and on the scalar values: a call whose signature was
// planned before reuses that plan and only allocates outputs, fills pointers and launches (what
// the Python op's native replay does). Bounded: cleared when full.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "bundle.h"

namespace kgrt {

struct Launch {
  const Kernel* kernel = nullptr;
  int candidate = -1;
  std::array<int64_t, 3> grid{};
  int64_t shared_mem = 0;
  std::vector<std::vector<int64_t>> out_shapes;
  std::vector<at::ScalarType> out_dtypes;
  std::vector<uint64_t> storage;  // each parameter's bytes: scalars packed, pointer slots filled per call
  struct Pointer {
    size_t slot;
    int input = -1;   // that argument's data
    int output = -1;  // or that output's; neither: a null pointer
  };
  std::vector<Pointer> pointers;
};

// The call's signature as bytes (appended to `key`) and the device of its tensors. False when the
// cache does not serve the call (an argument of a kind it does not key, a tensor that is not on a
// CUDA device when `cuda`, tensors on two devices, no tensor): the full path then runs and says
// what is wrong.
bool signature(const OpEntry& op, c10::ArrayRef<c10::IValue> args, bool cuda, std::string* key, c10::Device* device);

class LaunchCache {
 public:
  std::shared_ptr<const Launch> find(const std::string& key);
  void put(const std::string& key, std::shared_ptr<const Launch> launch);
  size_t size();

  static constexpr size_t kMaxEntries = 256;

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const Launch>> map_;
};

}  // namespace kgrt
