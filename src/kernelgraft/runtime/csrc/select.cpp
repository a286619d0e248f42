#include "select.h"

#include <algorithm>

namespace kgrt {
namespace {

// CUDA's limits on every arch kernelgraft targets (sm_70 and later), as the Python runner checks.
constexpr int64_t kMaxGrid[3] = {2147483647LL, 65535, 65535};
constexpr int64_t kMaxShared = 228 * 1024;

// The first input `k` was traced contiguous that is not, or -1.
int layout_miss(const Kernel& k, const std::vector<ArgView>& args) {
  for (int i : k.contiguous)
    if (!args[i].contiguous) return i;  // its strides are expressions of its sizes in the kernel
  return -1;
}

bool fits(const Kernel& k, const std::vector<ArgView>& args, const std::vector<Input>& inputs) {
  if (!typed_fit(k.dtypes, k.ranks, args) || !pins_hold(k.pinned, args)) return false;
  if (layout_miss(k, args) >= 0) return false;
  for (int i : k.aligned)
    if (args[i].is_tensor && !args[i].aligned16) return false;
  return all_hold(k.guards, inputs);
}

bool shapes_of(const std::vector<std::vector<Program>>& programs, const std::vector<Input>& inputs,
               std::vector<std::vector<int64_t>>* out) {
  out->clear();
  for (const auto& shape : programs) {
    std::vector<int64_t> dims;
    for (const auto& p : shape) {
      int64_t v;
      if (!to_int64(p.run(inputs), &v) || v < 0) return false;
      dims.push_back(v);
    }
    out->push_back(std::move(dims));
  }
  return true;
}

// Grid, shared memory, scalars and output shapes of `k`; false with `why` when they are out of range.
bool prepare(const Kernel& k, const std::vector<Input>& inputs, Plan* plan, std::string* why) {
  for (int d = 0; d < 3; ++d) {
    int64_t g;
    if (!to_int64(k.grid[d].run(inputs), &g) || g < 1 || g > kMaxGrid[d]) {
      *why = k.where + ": grid dimension " + std::to_string(d) + " is " + describe(k.grid[d].run(inputs)) +
             ", outside the device limits (1.." + std::to_string(kMaxGrid[d]) + ")";
      return false;
    }
    plan->grid[d] = g;
  }
  Value smem = k.shared_mem.run(inputs);
  if (!to_int64(smem, &plan->shared_mem) || plan->shared_mem < 0 || plan->shared_mem > kMaxShared) {
    *why = k.where + ": shared memory " + describe(smem) + " bytes is outside 0.." + std::to_string(kMaxShared);
    return false;
  }
  plan->scalars.assign(k.params.size(), Value::integer(0));
  for (size_t i = 0; i < k.params.size(); ++i) {
    if (k.params[i].kind == "ptr") continue;
    plan->scalars[i] = k.params[i].expr.run(inputs);
    if (plan->scalars[i].kind == Value::Error) {
      *why = k.where + ": parameter " + std::to_string(i) + " cannot be evaluated (" + plan->scalars[i].why + ")";
      return false;
    }
  }
  if (!shapes_of(k.out_shapes, inputs, &plan->out_shapes)) {
    *why = k.where + ": an output size cannot be evaluated";
    return false;
  }
  plan->kernel = &k;
  return true;
}

bool row_matches(const DecisionRow& row, const std::vector<ArgView>& args) {
  for (const auto& t : row.tensors) {
    const ArgView& a = args[t.input];
    if (!a.is_tensor || a.dtype != t.dtype || a.sizes.size() != t.dims.size()) return false;
    for (size_t d = 0; d < t.dims.size(); ++d)
      if (a.sizes[d] < t.dims[d].first || a.sizes[d] > t.dims[d].second) return false;
  }
  for (const auto& r : row.ints) {
    const Json& v = args[r.first].value;
    if (!v.is<int64_t>() || v.get<int64_t>() < r.second.first || v.get<int64_t>() > r.second.second) return false;
  }
  for (const auto& v : row.values)
    if (canonical_json(args[v.first].value) != canonical_json(v.second)) return false;
  return true;
}

}  // namespace

bool all_hold(const std::vector<Program>& guards, const std::vector<Input>& inputs) {
  for (const auto& g : guards) {
    Value v = g.run(inputs);
    if (v.kind == Value::Error || !v.truthy()) return false;  // an error does not hold, as in Python
  }
  return true;
}

bool typed_fit(const std::vector<std::pair<int, std::string>>& dtypes,
               const std::vector<std::pair<int, int64_t>>& ranks, const std::vector<ArgView>& args) {
  for (const auto& d : dtypes)
    if (!args[d.first].is_tensor || args[d.first].dtype != d.second) return false;
  for (const auto& r : ranks)
    if (!args[r.first].is_tensor || static_cast<int64_t>(args[r.first].sizes.size()) != r.second) return false;
  return true;
}

bool pins_hold(const std::vector<std::pair<int, std::string>>& pinned, const std::vector<ArgView>& args) {
  for (const auto& p : pinned) {
    const Json& v = args[p.first].value;
    if (!v.is<std::string>() || v.get<std::string>() != p.second) return false;
  }
  return true;
}

std::vector<Input> inputs_of(const std::vector<ArgView>& args) {
  std::vector<Input> out(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgView& a = args[i];
    if (a.is_tensor) {
      out[i].is_tensor = true;
      out[i].sizes = a.sizes.data();
      out[i].rank = static_cast<int64_t>(a.sizes.size());
      out[i].strides = a.strides.size() == a.sizes.size() ? a.strides.data() : nullptr;
    } else if (a.value.is<bool>()) {
      out[i].scalar = Value::integer(a.value.get<bool>() ? 1 : 0);
    } else if (a.value.is<int64_t>()) {
      out[i].scalar = Value::integer(a.value.get<int64_t>());
    } else if (a.value.is<double>()) {
      Json copy = a.value;  // get<double>() of a shared value must not change it
      out[i].scalar = Value::real(copy.get<double>());
    }
  }
  return out;
}

bool choose(const OpEntry& op, const std::vector<ArgView>& args, const std::vector<Input>& inputs, Plan* plan,
            std::string* why) {
  std::vector<int> order;
  for (const auto& row : op.decisions) {
    if (row_matches(row, args)) {
      order = row.ranking;
      break;
    }
  }
  for (int c = 0; c < static_cast<int>(op.candidates.size()); ++c)
    if (std::find(order.begin(), order.end(), c) == order.end()) order.push_back(c);
  std::string last, layout;
  for (int c : order) {
    for (const Kernel& k : op.candidates[c].kernels) {
      if (layout.empty() && typed_fit(k.dtypes, k.ranks, args) && pins_hold(k.pinned, args)) {
        int miss = layout_miss(k, args);
        if (miss >= 0)
          layout = op.candidates[c].label + " needs " + op.params[miss].name + " contiguous";
      }
      if (!fits(k, args, inputs)) continue;
      if (prepare(k, inputs, plan, &last)) {
        plan->candidate = c;
        return true;
      }
    }
  }
  *why = op.qualified + ": no bundled kernel serves these inputs (" + describe_args(op, args) + ")";
  if (!last.empty()) *why += "; " + last;
  if (!layout.empty()) *why += "; " + layout + " (its kernels were built for that layout only)";
  std::string held;
  size_t shown = 0;
  for (const auto& rule : op.meta) {
    if (shown++ == 4) { held += ", ..."; break; }
    std::string sig;
    for (const auto& d : rule.dtypes) {
      int64_t rank = 0;
      for (const auto& r : rule.ranks) if (r.first == d.first) rank = r.second;
      sig += (sig.empty() ? "" : " ") + op.params[d.first].name + ": " + d.second + " rank " + std::to_string(rank);
    }
    for (const auto& p : rule.pinned) sig += " " + op.params[p.first].name + "='" + p.second + "'";
    held += (held.empty() ? "" : "; ") + sig;
  }
  *why += ". The bundle's kernels serve contiguous inputs of: " + (held.empty() ? std::string("nothing") : held) +
          " (strided ones too where their candidates take strides; and where their guards hold); rebuild it with "
          "samples of these shapes and layouts (`kernelgraft aot`)";
  return false;
}

bool contiguous_layout(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  if (strides.size() != sizes.size()) return false;
  for (int64_t s : sizes)
    if (s == 0) return true;  // an empty tensor is contiguous
  int64_t expected = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

std::string describe_args(const OpEntry& op, const std::vector<ArgView>& args) {
  std::string out;
  for (size_t i = 0; i < args.size() && i < op.params.size(); ++i) {
    if (!out.empty()) out += ", ";
    out += op.params[i].name + ": ";
    const ArgView& a = args[i];
    if (a.is_tensor) {
      out += a.dtype + "[";
      for (size_t d = 0; d < a.sizes.size(); ++d)
        out += (d ? ", " : "") + (d < a.size_text.size() ? a.size_text[d] : std::to_string(a.sizes[d]));
      out += "]";
      if (!a.contiguous) {
        out += " (not contiguous)";
      } else if (!a.aligned16) {
        out += " (not 16-byte aligned)";
      }
    } else {
      out += canonical_json(a.value);
    }
  }
  return out;
}

}  // namespace kgrt
