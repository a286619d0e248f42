// Serves a kernelgraft bundle from C++ with no Python: loads it through the runtime's
// kernelgraft::load_bundle op, then calls the bundled ops through the dispatcher and checks them
// against ATen.
//
//   ./run_bundle BUNDLE_DIR [KEY_FILE]
//
// CuTe DSL candidates (shared libraries) are loaded from a bundle the key verifies, or from an
// unsigned one with KERNELGRAFT_BUNDLE_ALLOW_NATIVE=1.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace {

c10::OperatorHandle op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

}  // namespace

int run(int argc, char** argv);

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const c10::Error& e) {  // a bundle that does not verify, no GPU, a shape it cannot serve
    std::cerr << "run_bundle: " << e.what_without_backtrace() << "\n";
    return 1;
  }
}

int run(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " BUNDLE_DIR [KEY_FILE]\n";
    return 2;
  }
  std::optional<std::string> key;
  if (argc > 2) key = argv[2];
  const char* native = std::getenv("KERNELGRAFT_BUNDLE_ALLOW_NATIVE");
  bool allow_native = native != nullptr && std::string(native) == "1";
  auto load = op("kernelgraft::load_bundle")
                  .typed<std::vector<std::string>(const std::string&, const std::optional<std::string>&,
                                                  const std::optional<std::string>&, bool)>();
  for (const auto& name : load.call(argv[1], key, std::nullopt, allow_native)) std::cout << "serving " << name << "\n";

  auto options = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
  at::Tensor x = at::randn({33, 97}, options), y = at::randn({33, 97}, options);
  auto add_relu = op("kgexamples::add_relu").typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  at::Tensor out = add_relu.call(x, y);
  bool add_ok = at::equal(out, at::relu(x + y));

  at::Tensor w = at::randn({97}, options);
  auto rmsnorm = op("kgexamples::rmsnorm").typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
  at::Tensor norm = rmsnorm.call(x, w, 1e-6);
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor ref = (xf * at::rsqrt(xf.pow(2).mean({-1}, true) + 1e-6) * w.to(at::kFloat)).to(at::kHalf);
  bool norm_ok = at::allclose(norm, ref, 2e-2, 2e-2);

  std::cout << "add_relu equals ATen: " << (add_ok ? "yes" : "NO") << "\n"
            << "rmsnorm close to ATen: " << (norm_ok ? "yes" : "NO") << "\n";
  return add_ok && norm_ok ? 0 : 1;
}
