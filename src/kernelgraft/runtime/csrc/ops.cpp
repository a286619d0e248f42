// The runtime's face to PyTorch: torch.ops.kernelgraft.load_bundle(path, key=None, arch=None, allow_native=False)
// registers every op of a bundle with the dispatcher under its schema, with a CUDA kernel (choose
// a kernel, allocate outputs, launch the cubin, or call a CuTe DSL library, on the current stream) and a Meta kernel (output
// shapes, so fake tensors and export work), and the admission rule's kernels (admit.h: sparse,
// nested, quantized tensors refused, negative and conjugate views resolved). Errors are c10::Errors
// naming the op, the argument, what was expected and what came.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Half.h>
#include <c10/util/env.h>
#include <torch/library.h>

#include <cctype>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>

#include "admit.h"
#include "bundle.h"
#include "driver.h"
#include "launch_cache.h"
#include "native.h"
#include "select.h"
#include "spec.h"
#include "symbolic.h"

namespace kgrt {
namespace {

// The bundle spec's dtypes (bundle_spec.h), by name.
const std::map<std::string, at::ScalarType>& dtypes() {
  static const std::map<std::string, at::ScalarType> table = {
#define KG_DTYPE(name, scalar_type) {name, at::ScalarType::scalar_type},
#include "bundle_spec.h"
  };
  return table;
}

at::ScalarType dtype_named(const std::string& name, const std::string& where) {
  auto it = dtypes().find(name);
  if (it == dtypes().end()) throw BundleError(where + ": dtype '" + name + "' is not one the runtime knows");
  return it->second;
}

std::string dtype_name(at::ScalarType t) {
  for (const auto& kv : dtypes())
    if (kv.second == t) return kv.first;
  return c10::toString(t);
}

// A registered op: the bundle it came from (which owns the kernels' cubins) and its launchers.
struct LoadedOp {
  std::shared_ptr<Bundle> bundle;
  const OpEntry* op = nullptr;
  std::map<const Kernel*, std::unique_ptr<LazyFunction>> functions;
  std::map<const Kernel*, std::unique_ptr<NativeFunction>> natives;  // CuTe DSL kernels
  LaunchCache cache;
};

struct State {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<LoadedOp>> ops;       // qualified name -> what serves it
  std::vector<std::unique_ptr<torch::Library>> libraries;     // alive for the process: registrations stay
};

State& state() {
  static State* s = new State();  // never destroyed: the dispatcher may call kernels during exit
  return *s;
}

// The call's arguments as selection sees them; TORCH_CHECK naming the argument otherwise.
std::vector<ArgView> views(const OpEntry& op, c10::ArrayRef<c10::IValue> args, bool meta, c10::Device* device,
                           bool require_cuda = true) {
  std::vector<ArgView> out(op.params.size());
  bool have_device = false;
  for (size_t i = 0; i < op.params.size(); ++i) {
    const OpParam& p = op.params[i];
    const c10::IValue& v = args[i];
    ArgView& a = out[i];
    if (p.kind == "tensor") {
      if (v.isNone()) continue;
      TORCH_CHECK(v.isTensor(), op.qualified, ": argument ", p.name, " must be a Tensor, got ", v.tagKind());
      const at::Tensor& t = v.toTensor();
      admit(op.qualified, p.name, t);
      if (!meta) {
        TORCH_CHECK(t.is_cuda() || !require_cuda, op.qualified, ": argument ", p.name, " must be a CUDA tensor, got a tensor on ",
                    t.device(), " (the bundle's kernels run on CUDA devices)");
        TORCH_CHECK(!have_device || t.device() == *device, op.qualified, ": argument ", p.name,
                    " is on ", t.device(), ", expected ", *device, " like the arguments before it");
      }
      if (!have_device) {
        *device = t.device();
        have_device = true;
      }
      a.is_tensor = true;
      a.dtype = dtype_name(t.scalar_type());
      if (meta) {  // sizes may be symbolic (export, fake tensors); the Meta kernel reads them as SymInts
        bool symbolic = false;
        for (const c10::SymInt& s : t.sym_sizes()) {
          auto c = s.maybe_as_int();
          symbolic |= !c.has_value();
          a.sizes.push_back(c.has_value() ? *c : -1);
          a.size_text.push_back(c10::str(s));
        }
        if (!symbolic) a.size_text.clear();
      } else {
        a.sizes = t.sizes().vec();
        a.strides = t.strides().vec();
        a.contiguous = t.is_contiguous();
        a.aligned16 = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
      }
    } else if (v.isBool()) {
      a.value = Json(v.toBool());
    } else if (v.isInt()) {
      a.value = Json(static_cast<int64_t>(v.toInt()));
    } else if (v.isDouble()) {
      a.value = Json(v.toDouble());
    } else if (v.isString()) {
      a.value = Json(v.toStringRef());
    }
  }
  TORCH_CHECK(have_device, op.qualified, ": no tensor argument to take the device from");
  return out;
}

// Packs one scalar parameter of `kind` into `slot` (8 bytes), TORCH_CHECK when it does not fit.
void pack(const std::string& where, size_t index, const std::string& kind, const Value& v, uint64_t* slot) {
  auto fail = [&]() {
    TORCH_CHECK(false, where, ": parameter ", index, " of kind ", kind, " cannot hold ", describe(v));
  };
  if (kind[0] == 'f') {
    double d = v.kind == Value::Int ? static_cast<double>(v.i) : v.f;
    if (kind == "f64") std::memcpy(slot, &d, 8);
    else if (kind == "f32") { float f = static_cast<float>(d); std::memcpy(slot, &f, 4); }
    else { c10::Half h(static_cast<float>(d)); std::memcpy(slot, &h, 2); }
    return;
  }
  int64_t x;
  if (!to_int64(v, &x)) fail();
  if (kind == "i8") { if (x < INT8_MIN || x > INT8_MAX) fail(); int8_t y = static_cast<int8_t>(x); std::memcpy(slot, &y, 1); }
  else if (kind == "i16") { if (x < INT16_MIN || x > INT16_MAX) fail(); int16_t y = static_cast<int16_t>(x); std::memcpy(slot, &y, 2); }
  else if (kind == "i32") { if (x < INT32_MIN || x > INT32_MAX) fail(); int32_t y = static_cast<int32_t>(x); std::memcpy(slot, &y, 4); }
  else if (kind == "i64") { std::memcpy(slot, &x, 8); }
  else if (kind == "u8") { if (x < 0 || x > UINT8_MAX) fail(); uint8_t y = static_cast<uint8_t>(x); std::memcpy(slot, &y, 1); }
  else if (kind == "u16") { if (x < 0 || x > UINT16_MAX) fail(); uint16_t y = static_cast<uint16_t>(x); std::memcpy(slot, &y, 2); }
  else if (kind == "u32") { if (x < 0 || x > UINT32_MAX) fail(); uint32_t y = static_cast<uint32_t>(x); std::memcpy(slot, &y, 4); }
  else { if (x < 0) fail(); uint64_t y = static_cast<uint64_t>(x); std::memcpy(slot, &y, 8); }
}

// A packed parameter read back as text (what the CPU planning hook reports).
std::string unpack(const std::string& kind, uint64_t slot) {
  auto read = [&](auto v) {
    std::memcpy(&v, &slot, sizeof v);
    return v;
  };
  if (kind == "f64") return std::to_string(read(double{}));
  if (kind == "f32") return std::to_string(read(float{}));
  if (kind == "f16") return std::to_string(static_cast<float>(read(c10::Half{})));
  if (kind == "i8") return std::to_string(read(int8_t{}));
  if (kind == "i16") return std::to_string(read(int16_t{}));
  if (kind == "i32") return std::to_string(read(int32_t{}));
  if (kind == "u8") return std::to_string(read(uint8_t{}));
  if (kind == "u16") return std::to_string(read(uint16_t{}));
  if (kind == "u32") return std::to_string(read(uint32_t{}));
  if (kind == "u64") return std::to_string(read(uint64_t{}));
  return std::to_string(read(int64_t{}));
}

at::ScalarType out_dtype(const Kernel& k, size_t i) { return dtype_named(k.out_dtypes[i], k.where); }

// The full path: views, choice, programs; TORCH_CHECK naming the op and argument when the call is
// wrong. What it returns depends only on the call's signature (launch_cache.h).
std::shared_ptr<const Launch> plan_launch(const OpEntry& op, c10::ArrayRef<c10::IValue> args, c10::Device* device,
                                          bool require_cuda = true) {
  std::vector<ArgView> views_ = views(op, args, false, device, require_cuda);
  std::vector<Input> inputs = inputs_of(views_);
  Plan plan;
  std::string why;
  TORCH_CHECK(choose(op, views_, inputs, &plan, &why), why);
  const Kernel& k = *plan.kernel;
  auto launch = std::make_shared<Launch>();
  launch->kernel = &k;
  launch->candidate = plan.candidate;
  launch->grid = plan.grid;
  launch->shared_mem = plan.shared_mem;
  launch->out_shapes = plan.out_shapes;
  for (size_t i = 0; i < plan.out_shapes.size(); ++i) launch->out_dtypes.push_back(out_dtype(k, i));
  launch->storage.assign(k.params.size(), 0);
  for (size_t i = 0; i < k.params.size(); ++i) {
    const KernelParam& p = k.params[i];
    if (p.kind == "ptr") {
      if (p.input >= 0)
        TORCH_CHECK(args[p.input].isTensor(), op.qualified, ": argument ", op.params[p.input].name,
                    " must be a Tensor (the kernel reads it), got None");
      launch->pointers.push_back({i, p.input, p.output});
    } else {
      pack(k.where, i, p.kind, plan.scalars[i], &launch->storage[i]);
    }
  }
  return launch;
}

// The launch plan of this call: from the op's cache when its signature was planned before.
std::shared_ptr<const Launch> launch_for(LoadedOp& loaded, c10::ArrayRef<c10::IValue> args, c10::Device* device,
                                         bool cuda, bool* cached = nullptr) {
  std::string key;
  key.reserve(64);
  bool keyed = signature(*loaded.op, args, cuda, &key, device);
  if (keyed) {
    if (auto found = loaded.cache.find(key)) {
      if (cached) *cached = true;
      return found;
    }
  }
  if (cached) *cached = false;
  auto launch = plan_launch(*loaded.op, args, device, cuda);
  if (keyed) loaded.cache.put(key, launch);
  return launch;
}

class CudaKernel : public c10::OperatorKernel {
 public:
  explicit CudaKernel(std::shared_ptr<LoadedOp> loaded) : loaded_(std::move(loaded)) {}

  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const OpEntry& op = *loaded_->op;
    size_t n = op.params.size();
    auto args = torch::jit::last(*stack, n);
    c10::Device device(c10::kCUDA);
    std::shared_ptr<const Launch> launch = launch_for(*loaded_, args, &device, true);
    const Kernel& k = *launch->kernel;
    c10::DeviceGuard guard(device);
    std::vector<at::Tensor> outs;
    outs.reserve(launch->out_shapes.size());
    for (size_t i = 0; i < launch->out_shapes.size(); ++i)
      outs.push_back(at::empty(launch->out_shapes[i], at::TensorOptions().dtype(launch->out_dtypes[i]).device(device)));
    std::vector<uint64_t> storage(launch->storage);
    std::vector<void*> pointers(storage.size());
    for (const Launch::Pointer& p : launch->pointers) {
      void* ptr = p.input >= 0 ? args[p.input].toTensor().data_ptr() : p.output >= 0 ? outs[p.output].data_ptr() : nullptr;
      std::memcpy(&storage[p.slot], &ptr, sizeof ptr);
    }
    for (size_t i = 0; i < storage.size(); ++i) pointers[i] = &storage[i];
    // torch's current stream of the device (whatever backs it: graph capture records the launch)
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    void* stream = impl.getStream(device).native_handle();
    try {
      // functions and natives are filled before the op is registered and never change: no lock
      if (k.native)
        loaded_->natives.at(&k)->launch(device.index(), stream, pointers.data());
      else
        loaded_->functions.at(&k)->launch(device.index(), launch->grid.data(), k.block.data(), launch->shared_mem,
                                          stream, pointers.data());
    } catch (const std::runtime_error& e) {
      TORCH_CHECK(false, op.qualified, " (", op.candidates[launch->candidate].label, "): ", e.what());
    }
    torch::jit::drop(*stack, n);
    for (auto& t : outs) stack->emplace_back(std::move(t));
  }

 private:
  std::shared_ptr<LoadedOp> loaded_;
};

class MetaKernel : public c10::OperatorKernel {
 public:
  explicit MetaKernel(std::shared_ptr<LoadedOp> loaded) : loaded_(std::move(loaded)) {}

  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const OpEntry& op = *loaded_->op;
    size_t n = op.params.size();
    auto args = torch::jit::last(*stack, n);
    c10::Device device(c10::kMeta);
    std::vector<ArgView> views_ = views(op, args, true, &device);
    std::vector<Input> scalars = inputs_of(views_);
    std::vector<SymInput> inputs(n);
    for (size_t i = 0; i < n; ++i) {
      if (views_[i].is_tensor) {
        inputs[i].is_tensor = true;
        inputs[i].sizes = args[i].toTensor().sym_sizes().vec();
        inputs[i].strides = args[i].toTensor().sym_strides().vec();
      } else {
        inputs[i].scalar = scalars[i].scalar;
      }
    }
    std::vector<std::vector<c10::SymInt>> shapes;
    std::vector<std::string> names;
    std::string why;
    TORCH_CHECK(meta_shapes(op, views_, inputs, &shapes, &names, &why), why);
    std::vector<at::Tensor> outs;
    for (size_t i = 0; i < shapes.size(); ++i)
      outs.push_back(at::empty_symint(shapes[i], at::TensorOptions().dtype(dtype_named(names[i], op.qualified)).device(device)));
    torch::jit::drop(*stack, n);
    for (auto& t : outs) stack->emplace_back(std::move(t));
  }

 private:
  std::shared_ptr<LoadedOp> loaded_;
};

// CPU tensors: the error says what the op expects instead of the dispatcher's list of backends.
class CpuKernel : public c10::OperatorKernel {
 public:
  explicit CpuKernel(std::shared_ptr<LoadedOp> loaded) : loaded_(std::move(loaded)) {}

  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const OpEntry& op = *loaded_->op;
    auto args = torch::jit::last(*stack, op.params.size());
    c10::Device device(c10::kCUDA);
    if (plan_on_cpu()) {  // test hook: plan as the CUDA kernel would (cache included), then refuse
      bool cached = false;
      auto launch = launch_for(*loaded_, args, &device, false, &cached);
      std::string scalars;  // the packed scalar parameters, strides included, read back
      for (size_t i = 0; i < launch->storage.size(); ++i) {
        const std::string& kind = launch->kernel->params[i].kind;
        if (kind != "ptr") scalars += (scalars.empty() ? "" : ", ") + unpack(kind, launch->storage[i]);
      }
      TORCH_CHECK(false, op.qualified, ": planned ", op.candidates[launch->candidate].label, " kernel ",
                  launch->kernel->name, " grid [", launch->grid[0], ", ", launch->grid[1], ", ", launch->grid[2],
                  "] (", cached ? "cached" : "new", ", ", loaded_->cache.size(), " cached) scalars [", scalars,
                  "]; the bundle's kernels run on CUDA devices");
    }
    views(op, args, false, &device);  // names the CPU argument
    TORCH_CHECK(false, op.qualified, ": the bundle's kernels run on CUDA devices, got no CUDA tensor");
  }

 private:
  // KERNELGRAFT_RUNTIME_PLAN_ON_CPU=1 (read once): tests on machines without a GPU exercise the
  // CUDA kernel's planning and its cache with CPU tensors.
  static bool plan_on_cpu() {
    static const bool on = c10::utils::get_env("KERNELGRAFT_RUNTIME_PLAN_ON_CPU") == std::optional<std::string>("1");
    return on;
  }

 private:
  std::shared_ptr<LoadedOp> loaded_;
};

// Registers `op` unless an op of its name is there: the same op from an earlier load (same
// fingerprint) is skipped, an op of the same schema registered by someone else (kernelgraft's
// Python op) is left to serve and skipped, anything else is an error. Returns whether it registered.
bool register_op(const std::shared_ptr<Bundle>& bundle, const OpEntry& op) {
  State& s = state();
  auto found = s.ops.find(op.qualified);
  if (found != s.ops.end()) {
    TORCH_CHECK(found->second->op->fingerprint == op.fingerprint, "bundle ", bundle->path, ": op ", op.qualified,
                " is already registered from bundle ", found->second->bundle->path,
                " built from different code (fingerprints differ); load one of them");
    return false;
  }
  std::string def = op.name + op.schema;
  // The kernels pop params.size() arguments and push n_returns outputs: the schema the dispatcher
  // holds them to must say exactly that (the bundle spec made it so; this keeps it so here).
  c10::FunctionSchema parsed = torch::schema(def.c_str());
  TORCH_CHECK(parsed.arguments().size() == op.params.size() &&
                  parsed.returns().size() == static_cast<size_t>(op.n_returns),
              "bundle ", bundle->path, ": op ", op.qualified, ": schema ", op.schema, " does not have the op's ",
              op.params.size(), " parameters and ", op.n_returns, " returns");
  auto existing = c10::Dispatcher::singleton().findOp(c10::OperatorName(op.qualified, ""));
  if (existing.has_value()) {
    std::string have = c10::toString(existing->schema());
    std::string want = c10::toString(torch::schema((op.qualified + op.schema).c_str()));
    TORCH_CHECK(have == want, "bundle ", bundle->path, ": op ", op.qualified, " is already registered with schema ",
                have, ", the bundle's is ", want, "; it cannot be registered twice");
    TORCH_WARN("bundle ", bundle->path, ": op ", op.qualified,
               " is already registered in this process (by kernelgraft's Python op?); that registration serves it");
    return false;
  }
  auto loaded = std::make_shared<LoadedOp>();
  loaded->bundle = bundle;
  loaded->op = &op;
  for (const auto& cand : op.candidates)
    for (const auto& k : cand.kernels) {
      if (k.native) {
        std::vector<std::string> kinds;
        for (const auto& p : k.params) kinds.push_back(p.kind);
        loaded->natives[&k] = std::make_unique<NativeFunction>(k.library.get(), k.runtime.get(), kinds, k.where);
      } else {
        loaded->functions[&k] = std::make_unique<LazyFunction>(k.cubin.get(), k.name);
      }
    }
  auto lib = std::make_unique<torch::Library>(torch::Library::FRAGMENT, op.ns, std::nullopt, __FILE__, __LINE__);
  lib->def(def.c_str());
  lib->impl(op.name.c_str(), c10::DispatchKey::CUDA,
            torch::CppFunction::makeFromBoxedFunctor(std::make_unique<CudaKernel>(loaded)));
  lib->impl(op.name.c_str(), c10::DispatchKey::CPU,
            torch::CppFunction::makeFromBoxedFunctor(std::make_unique<CpuKernel>(loaded)));
  lib->impl(op.name.c_str(), c10::DispatchKey::Meta,
            torch::CppFunction::makeFromBoxedFunctor(std::make_unique<MetaKernel>(loaded)));
  register_admission(*lib, op.qualified, op.name);  // sparse, nested, negative bit...: never as they are
  s.libraries.push_back(std::move(lib));
  s.ops[op.qualified] = loaded;
  return true;
}

std::string current_arch() {
  std::string why = driver_unavailable();
  TORCH_CHECK(why.empty(), "load_bundle: no arch given and ", why,
              "; pass arch='sm_90' (or the bundle's arch) to load it anyway");
  std::string arch, error;
  try {
    arch = device_arch(0);
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  TORCH_CHECK(error.empty(), "load_bundle: no arch given and the GPU's cannot be read (", error, ")");
  return arch;
}

std::string normalize_arch(const std::string& arch) {
  std::string t;
  for (char c : arch) if (c != '.' && c != ' ') t += static_cast<char>(std::tolower(c));
  if (t.rfind("sm", 0) == 0) t = t.substr(2);
  if (!t.empty() && t[0] == '_') t = t.substr(1);
  std::string digits = !t.empty() && t.back() == 'a' ? t.substr(0, t.size() - 1) : t;
  TORCH_CHECK(digits.size() >= 2 && digits.size() <= 3 && digits.find_first_not_of("0123456789") == std::string::npos,
              "load_bundle: arch '", arch, "' is not a CUDA arch; write sm_90, sm_100, sm_90a, ...");
  return "sm_" + t;
}

// Every dtype the op names is one torch has (before anything is registered).
void validate(const OpEntry& op, const std::string& path) {
  for (const auto& cand : op.candidates)
    for (const auto& k : cand.kernels) {
      for (const auto& d : k.dtypes) dtype_named(d.second, k.where);
      for (size_t i = 0; i < k.out_dtypes.size(); ++i) out_dtype(k, i);
    }
  for (const auto& rule : op.meta) {
    for (const auto& d : rule.dtypes) dtype_named(d.second, "bundle " + path + ": op " + op.qualified + " meta");
    for (const auto& d : rule.out_dtypes) dtype_named(d, "bundle " + path + ": op " + op.qualified + " meta");
  }
}

// Registers the bundle's ops; returns their names (those already served included).
std::vector<std::string> load_bundle(const std::string& path, const std::optional<std::string>& key,
                                     const std::optional<std::string>& arch, bool allow_native) {
  std::string chosen = arch.has_value() ? normalize_arch(*arch) : current_arch();
  std::shared_ptr<Bundle> bundle;
  try {
    bundle = read_bundle(path, chosen, key.has_value() ? read_key_file(*key) : std::string(), allow_native);
  } catch (const BundleError& e) {
    TORCH_CHECK(false, e.what());
  }
  if (!bundle->left_out.empty()) {
    std::string names;
    for (const auto& l : bundle->left_out) names += (names.empty() ? "" : ", ") + l;
    TORCH_WARN("bundle ", path, ": ", bundle->left_out.size(), " CuTe DSL candidates are native code (shared ",
               "libraries) and are not loaded from an unsigned bundle: ", names, ". Load it with key=... (a signed ",
               "bundle) or allow_native=True (a bundle you trust) to serve them");
  }
  try {
    for (const auto& op : bundle->ops) validate(op, path);
  } catch (const BundleError& e) {
    TORCH_CHECK(false, e.what());
  }
  std::vector<std::string> names;
  std::lock_guard<std::mutex> lock(state().mutex);
  for (const auto& op : bundle->ops) {
    register_op(bundle, op);
    names.push_back(op.qualified);
  }
  return names;
}

// Test hooks: evaluate a program, and plan a call described without tensors, in C++.
Json arg_json(const std::string& text) { return parse_json(text, "the test arguments"); }

std::vector<ArgView> views_of(const Json& list) {
  std::vector<ArgView> out;
  for (const auto& item : as_array(list, "the test arguments")) {
    ArgView a;
    if (item.is<picojson::object>()) {
      a.is_tensor = true;
      a.dtype = item.contains("dtype") ? item.get("dtype").to_str() : "float32";
      for (const auto& d : as_array(field(item, "shape", "a test tensor"), "a test shape"))
        a.sizes.push_back(as_int(d, "a test size"));
      if (item.contains("stride")) {
        for (const auto& d : as_array(item.get("stride"), "a test stride")) a.strides.push_back(as_int(d, "a test stride"));
        a.contiguous = contiguous_layout(a.sizes, a.strides);
      } else if (item.contains("contiguous")) {  // a layout without strides: programs cannot read them
        a.contiguous = item.get("contiguous").evaluate_as_boolean();
      } else {  // the contiguous strides of the shape
        a.strides.assign(a.sizes.size(), 1);
        for (size_t d = a.sizes.size(); d-- > 1;) a.strides[d - 1] = a.strides[d] * std::max<int64_t>(a.sizes[d], 1);
      }
      if (item.contains("aligned")) a.aligned16 = item.get("aligned").evaluate_as_boolean();
    } else {
      a.value = item;
    }
    out.push_back(std::move(a));
  }
  return out;
}

std::string eval_program(const std::string& program, const std::string& args) {
  try {
    std::vector<ArgView> views_ = views_of(arg_json(args));
    std::vector<Input> inputs = inputs_of(views_);
    Program p(parse_json(program, "the test program"), inputs.size(), "the test program");
    return describe(p.run(inputs));
  } catch (const BundleError& e) {
    TORCH_CHECK(false, e.what());
  }
}

std::string plan_call(const std::string& name, const std::string& args) {
  std::shared_ptr<LoadedOp> loaded;
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    auto it = state().ops.find(name);
    TORCH_CHECK(it != state().ops.end(), "_plan: no op ", name, " was registered from a bundle");
    loaded = it->second;
  }
  const OpEntry& op = *loaded->op;
  std::vector<ArgView> views_;
  try {
    views_ = views_of(arg_json(args));
  } catch (const BundleError& e) {
    TORCH_CHECK(false, e.what());
  }
  TORCH_CHECK(views_.size() == op.params.size(), name, ": ", op.params.size(), " arguments expected");
  std::vector<Input> inputs = inputs_of(views_);
  Plan plan;
  std::string why;
  TORCH_CHECK(choose(op, views_, inputs, &plan, &why), why);
  picojson::object o;
  o["candidate"] = Json(op.candidates[plan.candidate].label);
  o["kernel"] = Json(plan.kernel->name);
  picojson::array grid, params, outs;
  for (int64_t g : plan.grid) grid.emplace_back(g);
  for (size_t i = 0; i < plan.kernel->params.size(); ++i)
    params.emplace_back(plan.kernel->params[i].kind == "ptr" ? Json() : Json(describe(plan.scalars[i])));
  for (const auto& s : plan.out_shapes) {
    picojson::array dims;
    for (int64_t d : s) dims.emplace_back(d);
    outs.emplace_back(dims);
  }
  o["grid"] = Json(grid);
  o["shared_mem"] = Json(plan.shared_mem);
  o["params"] = Json(params);
  o["outputs"] = Json(outs);
  return canonical_json(Json(o));
}

// Test hook: opens every CuTe DSL library of a registered op and calls it once with zeroed
// arguments on device 0 and the null stream; returns [{"kernel", "error"}] ("" when it ran). On a
// machine without a GPU this runs the open/verify/call path up to the first driver call.
std::string probe_native(const std::string& name) {
  std::shared_ptr<LoadedOp> loaded;
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    auto it = state().ops.find(name);
    TORCH_CHECK(it != state().ops.end(), "_native_probe: no op ", name, " was registered from a bundle");
    loaded = it->second;
  }
  picojson::array out;
  for (const auto& kv : loaded->natives) {
    std::vector<uint64_t> storage(kv.first->params.size(), 0);
    std::vector<void*> pointers(storage.size());
    for (size_t i = 0; i < storage.size(); ++i) pointers[i] = &storage[i];
    std::string error;
    try {
      kv.second->launch(0, nullptr, pointers.data());
    } catch (const std::runtime_error& e) {
      error = e.what();
    }
    picojson::object o;
    o["kernel"] = Json(kv.first->name);
    o["error"] = Json(error);
    out.emplace_back(o);
  }
  return canonical_json(Json(out));
}

// KERNELGRAFT_BUNDLES=DIR[:DIR...] loads bundles when the library loads (KERNELGRAFT_BUNDLE_KEY: a
// key file, KERNELGRAFT_BUNDLE_ARCH: the arch, default the GPU's, KERNELGRAFT_BUNDLE_ALLOW_NATIVE=1:
// load CuTe DSL libraries from unsigned bundles), so a program that links the
// runtime serves them without calling load_bundle. A bundle that does not load is reported on
// stderr and skipped: throwing here would abort the process that loads the library.
struct LoadFromEnvironment {
  LoadFromEnvironment() {
    auto dirs = c10::utils::get_env("KERNELGRAFT_BUNDLES");
    if (!dirs.has_value() || dirs->empty()) return;
    auto key = c10::utils::get_env("KERNELGRAFT_BUNDLE_KEY");
    auto arch = c10::utils::get_env("KERNELGRAFT_BUNDLE_ARCH");
    auto native = c10::utils::get_env("KERNELGRAFT_BUNDLE_ALLOW_NATIVE");
    bool allow_native = native.has_value() && *native == "1";
    size_t start = 0;
    while (start <= dirs->size()) {
      size_t end = dirs->find(':', start);
      std::string dir = dirs->substr(start, end == std::string::npos ? std::string::npos : end - start);
      start = end == std::string::npos ? dirs->size() + 1 : end + 1;
      if (dir.empty()) continue;
      try {
        load_bundle(dir, key, arch, allow_native);
      } catch (const std::exception& e) {
        std::cerr << "kernelgraft runtime: KERNELGRAFT_BUNDLES: bundle " << dir << " not loaded: " << e.what()
                  << std::endl;
      }
    }
  }
};

}  // namespace
}  // namespace kgrt

TORCH_LIBRARY_FRAGMENT(kernelgraft, m) {
  m.def("load_bundle(str path, str? key=None, str? arch=None, bool allow_native=False) -> str[]", &kgrt::load_bundle);
  m.def("_runtime_eval(str program, str args) -> str", &kgrt::eval_program);
  m.def("_runtime_plan(str op, str args) -> str", &kgrt::plan_call);
  m.def("_runtime_native_probe(str op) -> str", &kgrt::probe_native);
}

// After the registrations above (one translation unit initializes in order of definition).
static kgrt::LoadFromEnvironment kgrt_load_from_environment;
