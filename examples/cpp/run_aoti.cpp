// Runs an AOTInductor package whose graph calls kernelgraft ops, with no Python: the runtime
// library (linked in) serves the ops from a bundle, and AOTInductor's proxy executor reaches them
// through the dispatcher like any other custom op.
//
//   ./run_aoti BUNDLE_DIR PACKAGE.pt2 [IO.pt] [--arch sm_90] [--atol A] [--rtol R] [--runs N] [--allow-native]
//
// IO.pt (torch.save of {"inputs": [tensors], "outputs": [tensors]}, as benchmarks/build_llama_aoti.py
// writes it) gives the inputs, and the outputs the results must match; with "reference" (float64
// outputs) and "python" (the Python model's outputs) also that the package is no less accurate
// against the reference than the Python model is; without it the program
// only loads the bundle and the package and prints the package's metadata. --arch loads a bundle
// where no GPU can be asked its arch (a CPU machine: the ops then refuse CPU tensors, by name).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Milliseconds since the kernel started this process (Linux: /proc), so the dynamic loading of
// libtorch before main() counts; -1 where /proc is not there.
double process_age_ms() {
  std::ifstream stat("/proc/self/stat"), uptime("/proc/uptime");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  double up = -1;
  uptime >> up;
  size_t paren = text.rfind(')');
  if (!stat || paren == std::string::npos || up < 0) return -1;
  std::istringstream fields(text.substr(paren + 2));
  std::string field;
  for (int i = 0; i < 20 && fields >> field; ++i) {}  // field 22 of stat: start time in clock ticks
  return (up - std::stod(field) / sysconf(_SC_CLK_TCK)) * 1e3;
}

std::vector<at::Tensor> tensors(const c10::IValue& list, const char* what) {
  TORCH_CHECK(list.isList() || list.isTuple(), "IO file: '", what, "' must be a list of tensors, got ",
              list.tagKind());
  std::vector<at::Tensor> out;
  if (list.isTuple()) {
    for (const auto& v : list.toTupleRef().elements()) out.push_back(v.toTensor());
  } else {
    for (const auto& v : list.toListRef()) out.push_back(v.toTensor());
  }
  return out;
}

struct Io {
  std::vector<at::Tensor> inputs, outputs;
  std::vector<at::Tensor> reference, python;  // optional: float64 logits, and the Python model's
};

// The error of `x` against the float64 `ref`, at the scale of the output: max |x - ref| / rms(ref)
// (the absolute term of kernelgraft's oracle), so a large logit's rounding is not over-counted.
double scaled_error(const at::Tensor& x, const at::Tensor& ref) {
  at::Tensor r = ref.cpu().to(at::kDouble);
  double rms = r.square().mean().sqrt().item<double>();
  return (x.cpu().to(at::kDouble) - r).abs().max().item<double>() / (rms > 0 ? rms : 1.0);
}

Io read_io(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  TORCH_CHECK(file, "cannot read the IO file ", path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  c10::IValue value = torch::jit::pickle_load(bytes);
  TORCH_CHECK(value.isGenericDict(), "IO file ", path, ": expected a dict {'inputs': [...], 'outputs': [...]}, got ",
              value.tagKind());
  auto dict = value.toGenericDict();
  Io io;
  io.inputs = tensors(dict.at("inputs"), "inputs");
  if (dict.contains("outputs")) io.outputs = tensors(dict.at("outputs"), "outputs");
  if (dict.contains("reference")) io.reference = tensors(dict.at("reference"), "reference");
  if (dict.contains("python")) io.python = tensors(dict.at("python"), "python");
  return io;
}

int run(int argc, char** argv) {
  Clock::time_point start = Clock::now();
  std::vector<std::string> positional;
  std::optional<std::string> arch;
  bool allow_native = false;
  double atol = 1e-2, rtol = 1e-2;
  int runs = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--allow-native") {  // CuTe DSL libraries from an unsigned bundle: native code you trust
      allow_native = true;
    } else if ((a == "--arch" || a == "--atol" || a == "--rtol" || a == "--runs") && i + 1 < argc) {
      std::string v = argv[++i];
      if (a == "--arch") arch = v;
      else if (a == "--atol") atol = std::stod(v);
      else if (a == "--rtol") rtol = std::stod(v);
      else runs = std::stoi(v);
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() < 2) {
    std::cerr << "usage: " << argv[0]
              << " BUNDLE_DIR PACKAGE.pt2 [IO.pt] [--arch sm_90] [--atol A] [--rtol R] [--runs N] [--allow-native]\n";
    return 2;
  }
  auto load = c10::Dispatcher::singleton()
                  .findSchemaOrThrow("kernelgraft::load_bundle", "")
                  .typed<std::vector<std::string>(const std::string&, const std::optional<std::string>&,
                                                  const std::optional<std::string>&, bool)>();
  for (const auto& name : load.call(positional[0], std::nullopt, arch, allow_native))
    std::cout << "serving " << name << "\n";
  double bundle_ms = ms_since(start);

  Clock::time_point t = Clock::now();
  torch::inductor::AOTIModelPackageLoader loader(positional[1]);
  double package_ms = ms_since(t);
  auto metadata = loader.get_metadata();
  std::string device = metadata.count("AOTI_DEVICE_KEY") ? metadata["AOTI_DEVICE_KEY"] : "cpu";
  std::cout << "package " << positional[1] << " (device " << device << ") loaded in " << package_ms << " ms; bundle in "
            << bundle_ms << " ms\n";
  if (positional.size() < 3) return 0;

  Clock::time_point io_start = Clock::now();
  Io io = read_io(positional[2]);
  double io_ms = ms_since(io_start);  // the test harness's file, not part of a deployment's start
  for (auto& x : io.inputs) x = x.to(c10::Device(device));
  t = Clock::now();
  std::vector<at::Tensor> got = loader.run(io.inputs);
  if (!got.empty()) (void)got[0].cpu();  // waits for the GPU
  double first_ms = ms_since(t);
  double age_ms = process_age_ms();
  std::cout << "first run " << first_ms << " ms; main() to first result " << ms_since(start)
            << " ms; process start to first result " << age_ms << " ms; reading the IO file " << io_ms
            << " ms; process start to first result without it " << age_ms - io_ms << " ms\n";
  if (runs > 1) {
    t = Clock::now();
    for (int i = 1; i < runs; ++i) got = loader.run(io.inputs);
    if (!got.empty()) (void)got[0].cpu();
    std::cout << "mean of " << runs - 1 << " more runs: " << ms_since(t) / (runs - 1) << " ms\n";
  }
  bool ok = got.size() == io.outputs.size() || io.outputs.empty();
  for (size_t i = 0; i < io.outputs.size() && i < got.size(); ++i) {
    at::Tensor a = got[i].cpu().to(at::kFloat), b = io.outputs[i].cpu().to(at::kFloat);
    bool same_shape = a.sizes() == b.sizes();
    bool close = same_shape && at::allclose(a, b, rtol, atol);
    double diff = same_shape ? (a - b).abs().max().item<double>() : -1.0;
    std::cout << "output " << i << " " << a.sizes() << ": " << (close ? "matches" : "DIFFERS") << " (max abs diff "
              << diff << ", atol " << atol << ", rtol " << rtol << ")\n";
    ok &= close;
  }
  // Accuracy: the package's error against the float64 reference may not exceed the worst of the
  // Python model's own outputs' errors (IO["python"]) by more than a quarter.
  if (!io.reference.empty() && !got.empty() && got[0].sizes() == io.reference[0].sizes()) {
    double mine = scaled_error(got[0], io.reference[0]), theirs = 0.0;
    std::cout << "error vs the float64 reference, max |x - ref| / rms(ref): package " << mine;
    for (size_t i = 0; i < io.python.size(); ++i) {
      double e = scaled_error(io.python[i], io.reference[0]);
      theirs = std::max(theirs, e);
      std::cout << ", Python output " << i << " " << e;
    }
    bool accurate = io.python.empty() || mine <= 1.25 * theirs;
    std::cout << ": " << (accurate ? "as accurate as Python's" : "LESS ACCURATE than Python's") << "\n";
    ok &= accurate;
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const c10::Error& e) {  // no GPU, a bundle that does not verify, an op that refuses its inputs
    std::cerr << "run_aoti: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {  // AOTInductor's loader throws std::runtime_error
    std::cerr << "run_aoti: " << e.what() << "\n";
    return 1;
  }
}
