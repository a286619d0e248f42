// A bundle read into memory: the manifest (version 4) checked against its checksum and then
// held to the bundle spec (spec.h) before anything else reads it, the signature checked with a
// key when one is given, every binary of the chosen arch read (stat'ed first, each file once,
// all reads charged to one budget) and its sha256 checked, and each op's candidates, kernels,
// programs, output rules and decision rows decoded. Nothing here touches torch or CUDA: ops.cpp
// registers the ops, driver.cpp launches.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "json.h"
#include "program.h"

namespace kgrt {

struct OpParam {
  std::string name;
  std::string kind;  // tensor | tensor_list | int | float | bool | str | dtype
};

struct KernelParam {
  std::string kind;       // ptr | i8 ... u64 | f16 | f32 | f64
  int input = -1;         // ptr: the input tensor it points at
  int output = -1;        // ptr: or the output
  bool null = false;      // ptr: a null pointer (Triton's scratch)
  Program expr;           // a scalar: its value
};

struct Kernel {
  std::string name;                                  // the cubin's entry point
  std::vector<std::pair<int, std::string>> dtypes;   // input index -> dtype name
  std::vector<std::pair<int, int64_t>> ranks;        // input index -> rank
  std::vector<std::pair<int, std::string>> pinned;   // string input -> the value it was recorded with (v3)
  std::vector<int> aligned;                          // inputs that must be 16-byte aligned
  std::vector<int> contiguous;                       // inputs traced contiguous: selected only where they are
  std::vector<Program> guards;                       // one per guard: the kernel serves where all hold
  std::array<Program, 3> grid;
  std::array<int64_t, 3> block{};
  Program shared_mem;
  std::vector<KernelParam> params;
  std::vector<std::vector<Program>> out_shapes;
  std::vector<std::string> out_dtypes;
  std::shared_ptr<const std::string> cubin;          // verified bytes (shared by the kernels of one file)
  bool native = false;                               // a CuTe DSL shared library (native.h), not a cubin
  // native: the library and the runtime it needs, verified; shared between the kernels that name the
  // same file (every CuTe DSL kernel names the one runtime library)
  std::shared_ptr<const std::string> library, runtime;
  std::string where;                                 // "bundle DIR: OP CANDIDATE kernel NAME"
};

struct Candidate {
  std::string label;
  std::vector<Kernel> kernels;
};

struct MetaRule {
  std::vector<std::pair<int, std::string>> dtypes;
  std::vector<std::pair<int, int64_t>> ranks;
  std::vector<std::pair<int, std::string>> pinned;
  std::vector<Program> guards;  // the kernel's guards that read no stride: the rule holds where all do
  std::vector<std::vector<Program>> shapes;
  std::vector<std::string> out_dtypes;
};

struct DecisionRow {
  struct TensorRange {
    int input;
    std::string dtype;
    std::vector<std::pair<int64_t, int64_t>> dims;
  };
  std::vector<TensorRange> tensors;
  std::vector<std::pair<int, std::pair<int64_t, int64_t>>> ints;
  std::vector<std::pair<int, Json>> values;
  std::vector<int> ranking;  // candidate positions
  std::string source;
};

struct OpEntry {
  std::string qualified;  // "kgexamples::add_relu"
  std::string ns, name, schema, fingerprint;
  std::vector<OpParam> params;
  int n_returns = 0;
  std::vector<Candidate> candidates;
  std::vector<MetaRule> meta;
  std::vector<DecisionRow> decisions;
};

struct Bundle {
  std::string path, arch, checksum;
  bool signed_ = false;
  std::vector<OpEntry> ops;
  std::vector<std::string> left_out;  // native candidates not loaded (unsigned, allow_native off)
};

// Reads and verifies the bundle in `path` for `arch` ("sm_90"). `key`: the HMAC key (empty: the
// signature is not checked). Native kernels (CuTe DSL libraries) are read only from a bundle
// verified with a key or with `allow_native`; otherwise they are left out (named in left_out).
// BundleError saying what is wrong otherwise.
std::shared_ptr<Bundle> read_bundle(const std::string& path, const std::string& arch, const std::string& key,
                                    bool allow_native = false);

// The key in a key file, as Python's load_key reads it (surrounding whitespace stripped, >= 16 bytes).
std::string read_key_file(const std::string& path);

}  // namespace kgrt
