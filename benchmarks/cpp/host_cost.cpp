// Host cost per call from C++ of bundled kernelgraft ops through the dispatcher, side by side with
// at::add, on tiny CUDA tensors. Each round times CALLS back-to-back calls and rounds of the
// variants alternate, so drift hits all alike. Two modes per variant:
//   queued: a spin kernel (at::cuda::sleep) keeps the GPU busy for CALLS x COVERED_US before the
//           round, so every timed call only queues its launch: the host's own cost. A round whose
//           spin ended before its last call is dropped and counted.
//   idle:   the GPU idle at the round's start, as benchmarks/results/2026-12-01-h200-3 measured (its 2000 calls per round
//           overran the launch queue, so the GPU's pace per tiny launch set the number).
// Two floors are timed beside them: a bare kernel launch and an output allocation.
// Prints one JSON object: the median microseconds per call of each variant and mode.
//
//   ./host_cost BUNDLE_DIR [--calls 400] [--rounds 25] [--n 4096] [--covered-us 40]
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/cuda/Sleep.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <iomanip>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

c10::OperatorHandle op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

void sync() { at::detail::getCUDAHooks().deviceSynchronize(0); }  // the tensors live on cuda:0

// Spin-kernel cycles per microsecond: one long spin timed by the host (its launch and sync are noise).
double spin_rate() {
  const int64_t cycles = 50'000'000;
  at::cuda::sleep(1000);
  sync();
  auto start = std::chrono::steady_clock::now();
  at::cuda::sleep(cycles);
  sync();
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return cycles / us;
}

// The median, or NaN when every round was dropped (printed as null).
double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int run(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " BUNDLE_DIR [--calls N<=900] [--rounds R] [--n N] [--covered-us US]\n";
    return 2;
  }
  int calls = 400, rounds = 25;
  int64_t n = 4096;
  double covered_us = 40.0;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--calls") calls = std::stoi(argv[i + 1]);
    else if (a == "--rounds") rounds = std::stoi(argv[i + 1]);
    else if (a == "--n") n = std::stoll(argv[i + 1]);
    else if (a == "--covered-us") covered_us = std::stod(argv[i + 1]);
    else {
      std::cerr << "unknown argument " << a << "\n";
      return 2;
    }
  }
  if (calls < 1 || calls > 900) {
    std::cerr << "--calls must be 1 to 900 (the launch queue holds about 1000 launches)\n";
    return 2;
  }
  // the bundle's CuTe DSL libraries too (a bundle this benchmark's caller built: native code allowed)
  auto load = op("kernelgraft::load_bundle")
                  .typed<std::vector<std::string>(const std::string&, const std::optional<std::string>&,
                                                  const std::optional<std::string>&, bool)>();
  std::vector<std::string> served = load.call(argv[1], std::nullopt, std::nullopt, true);

  auto f32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  at::Tensor x = at::randn({n}, f32), y = at::randn({n}, f32);
  at::Tensor rows = at::randn({4, 256}, f32), w = at::randn({256}, f32);
  auto add_relu = op("kgexamples::add_relu").typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  auto rmsnorm = op("kgexamples::rmsnorm").typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();

  std::vector<std::pair<std::string, std::function<at::Tensor()>>> variants = {
      {"at::add (C++)", [&] { return at::add(x, y); }},
      {"kgexamples::add_relu, bundled (C++ dispatcher)", [&] { return add_relu.call(x, y); }},
      {"kgexamples::rmsnorm, bundled (C++ dispatcher)", [&] { return rmsnorm.call(rows, w, 1e-6); }},
      // The floor under any op on this host: one kernel launch through the CUDA runtime on the
      // current stream with nothing around it (at::cuda::sleep(0): spin_kernel<<<1, 1>>>), and
      // one output allocation from the caching allocator.
      {"bare kernel launch (at::cuda::sleep(0))", [&] { at::cuda::sleep(0); return x; }},
      {"output allocation (at::empty_like)", [&] { return at::empty_like(x); }},
  };
  // correctness before timing: a fast wrong answer is not a result
  at::Tensor got = add_relu.call(x, y);
  TORCH_CHECK(at::equal(got, at::relu(x + y)), "bundled add_relu differs from ATen");
  for (auto& v : variants)
    for (int i = 0; i < 50; ++i) v.second();
  sync();

  const double rate = spin_rate();
  auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  const c10::Stream stream = guard->getStream(c10::Device(c10::DeviceType::CUDA, 0));
  std::vector<std::vector<double>> queued(variants.size()), idle(variants.size());
  int uncovered = 0;
  for (int r = 0; r < rounds; ++r) {
    for (size_t k = 0; k < variants.size(); ++k) {
      for (int mode = 0; mode < 2; ++mode) {
        sync();
        c10::Event spun(c10::DeviceType::CUDA);
        if (mode == 0) {
          at::cuda::sleep(static_cast<int64_t>(calls * covered_us * rate));
          spun.record(stream);
        }
        auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < calls; ++i) variants[k].second();
        double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
        if (mode == 0 && spun.query()) {  // the GPU caught up with the host: not the host's cost alone
          ++uncovered;
          continue;
        }
        sync();
        (mode == 0 ? queued : idle)[k].push_back(us / calls);
      }
    }
  }
  std::cout << std::setprecision(4) << "{\"served\": [";
  for (size_t i = 0; i < served.size(); ++i) std::cout << (i ? ", " : "") << '"' << served[i] << '"';
  std::cout << "], \"calls\": " << calls << ", \"rounds\": " << rounds << ", \"n\": " << n
            << ", \"covered_us\": " << covered_us << ", \"spin_cycles_per_us\": " << rate
            << ", \"uncovered_rounds\": " << uncovered << ", \"host_us_median\": {";
  auto value = [](double v) { return std::isnan(v) ? std::string("null") : std::to_string(v); };
  for (size_t k = 0; k < variants.size(); ++k)
    std::cout << (k ? ", " : "") << '"' << variants[k].first << "\": " << value(median(queued[k])) << ", \""
              << variants[k].first << " [idle GPU]\": " << value(median(idle[k]));
  std::cout << "}}\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const c10::Error& e) {
    std::cerr << "host_cost: " << e.what_without_backtrace() << "\n";
    return 1;
  }
}
