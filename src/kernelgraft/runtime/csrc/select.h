// Which bundled kernel serves a call, and its launch plan: decision rows first (the tuner's
// ranking for the shapes a row covers), then every candidate in manifest order; a kernel serves
// when its dtypes, ranks, layout (the inputs it was traced contiguous are), alignment and guards
// hold; its guards and parameters may read the other inputs' strides. Torch-free: ops.cpp describes
// each argument as an ArgView, and so do the test hooks, which plan calls without tensors.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "bundle.h"

namespace kgrt {

struct ArgView {
  bool is_tensor = false;
  std::string dtype;             // a tensor's dtype as the manifest names it ("float16")
  std::vector<int64_t> sizes;     // a symbolic size (export, fake tensors): -1, its text in size_text
  std::vector<std::string> size_text;
  std::vector<int64_t> strides;   // in elements, one per size (empty: unknown, e.g. symbolic)
  bool contiguous = true;         // as torch's is_contiguous() says
  bool aligned16 = true;         // its data pointer is a multiple of 16 bytes
  Json value;                    // a scalar: its value (null for None)
};

// Each argument as programs see it (sizes point into `args`, which must outlive the result).
std::vector<Input> inputs_of(const std::vector<ArgView>& args);

struct Plan {
  const Kernel* kernel = nullptr;
  int candidate = -1;
  std::array<int64_t, 3> grid{};
  int64_t shared_mem = 0;
  std::vector<Value> scalars;                   // per kernel parameter (pointers: unused)
  std::vector<std::vector<int64_t>> out_shapes;
};

// The plan of the first kernel that serves the call, or false with `why` (naming the op, the
// arguments and what the bundle holds).
bool choose(const OpEntry& op, const std::vector<ArgView>& args, const std::vector<Input>& inputs, Plan* plan,
            std::string* why);

// Whether every guard program holds (an error value does not): the AND of a kernel's guards, each
// compiled from its own text, as the Python runner evaluates the texts one by one.
bool all_hold(const std::vector<Program>& guards, const std::vector<Input>& inputs);

// Whether the arguments have these dtypes and ranks (a kernel's or a meta rule's).
bool typed_fit(const std::vector<std::pair<int, std::string>>& dtypes,
               const std::vector<std::pair<int, int64_t>>& ranks, const std::vector<ArgView>& args);

// Whether each pinned string argument has the value a kernel (or meta rule) was recorded with.
bool pins_hold(const std::vector<std::pair<int, std::string>>& pinned, const std::vector<ArgView>& args);

// torch's is_contiguous() of these sizes and strides (size-1 dimensions' strides do not matter).
bool contiguous_layout(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides);

// "x: float16[3, 5], eps: 1e-06": what an error shows of a call.
std::string describe_args(const OpEntry& op, const std::vector<ArgView>& args);

}  // namespace kgrt
