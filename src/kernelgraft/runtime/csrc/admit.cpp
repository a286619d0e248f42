#include "admit.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <memory>

namespace kgrt {
namespace {

// The functionality keys of the tensors this rule refuses or resolves (whatever their backend).
const c10::DispatchKeySet kUnusual = c10::DispatchKeySet({
    c10::DispatchKey::Sparse, c10::DispatchKey::SparseCsr, c10::DispatchKey::MkldnnCPU,
    c10::DispatchKey::Quantized, c10::DispatchKey::NestedTensor, c10::DispatchKey::AutogradNestedTensor,
    c10::DispatchKey::Negative, c10::DispatchKey::Conjugate, c10::DispatchKey::ZeroTensor,
});

// What makes `t` unreadable by any kernel, or "" (the words of kernelgraft/admit.py).
std::string refusal(const at::Tensor& t) {
  switch (t.layout()) {
    case c10::kStrided: break;
    case c10::kSparse: return "a sparse COO tensor";
    case c10::kSparseCsr: return "a sparse CSR tensor";
    case c10::kSparseCsc: return "a sparse CSC tensor";
    case c10::kSparseBsr: return "a sparse BSR tensor";
    case c10::kSparseBsc: return "a sparse BSC tensor";
    case c10::kMkldnn: return "an mkldnn tensor";
    case c10::kJagged: return "a nested (jagged) tensor";
    default: return c10::str("a tensor of layout ", t.layout());
  }
  if (t.is_nested()) return "a nested tensor";
  if (t.is_quantized()) return "a quantized tensor";
  return "";
}

// Why `t`'s values are not its memory, or "".
std::string deferred(const at::Tensor& t) {
  if (t.is_neg()) return "a view with the negative bit (from z.conj().imag or torch._neg_view)";
  if (t.is_conj()) return "a view with the conjugate bit (from .conj())";
  if (t._is_zerotensor()) return "a ZeroTensor (no memory)";
  return "";
}

const char* fix(const std::string& kind) {
  if (kind.rfind("a nested", 0) == 0) return "pass its components (t.unbind()) or a padded dense tensor";
  if (kind.rfind("a quantized", 0) == 0) return "pass t.dequantize()";
  return "pass t.to_dense()";
}

void refuse(const std::string& op, const std::string& name, const at::Tensor& t, const std::string& kind) {
  TORCH_CHECK(false, op, ": argument ", name, " expected a dense strided tensor, got ", kind, " (dtype ",
              t.scalar_type(), ", on ", t.device(), "); kernels read a tensor through its data pointer and strides: ",
              fix(kind));
}

// The boxed kernel at the refused tensors' keys: names the first argument it refuses.
class RefuseKernel : public c10::OperatorKernel {
 public:
  explicit RefuseKernel(std::string op) : op_(std::move(op)) {}

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const auto& arguments = handle.schema().arguments();
    auto args = torch::jit::last(*stack, arguments.size());
    for (size_t i = 0; i < arguments.size(); ++i) {
      const c10::IValue& v = args[i];
      if (v.isTensor()) {
        admit(op_, arguments[i].name(), v.toTensor());
      } else if (v.isTensorList()) {
        auto list = v.toTensorList();
        for (size_t j = 0; j < list.size(); ++j) admit(op_, c10::str(arguments[i].name(), "[", j, "]"), list[j]);
      }
    }
    TORCH_CHECK(false, op_, ": expected dense strided tensors");
  }

 private:
  std::string op_;
};

// Materializes `t` when its values are deferred; refuses it when the op writes it.
at::Tensor resolved(const std::string& op, const std::string& name, const at::Tensor& t, bool mutated) {
  std::string why = deferred(t);
  if (why.empty()) return t;
  TORCH_CHECK(!mutated, op, ": argument ", name, " is mutated by the op but is ", why,
              ": a kernel would write its memory, not its values. Call the op on a plain tensor and copy the ",
              "result back into the view");
  if (t._is_zerotensor()) return at::zeros(t.sizes(), t.options());
  return t.resolve_conj().resolve_neg();
}

// The boxed kernel at the Negative, Conjugate and ZeroTensor keys: resolves, then sends the call
// on past those three keys (the backend kernel, or Python's for fake tensors, comes next).
class ResolveKernel : public c10::OperatorKernel {
 public:
  explicit ResolveKernel(std::string op) : op_(std::move(op)) {}

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    const auto& arguments = handle.schema().arguments();
    const size_t start = stack->size() - arguments.size();
    for (size_t i = 0; i < arguments.size(); ++i) {
      c10::IValue& v = (*stack)[start + i];
      const bool mutated = arguments[i].alias_info() != nullptr && arguments[i].alias_info()->isWrite();
      if (v.isTensor()) {
        v = resolved(op_, arguments[i].name(), v.toTensor(), mutated);
      } else if (v.isTensorList()) {
        auto list = v.toTensorList();
        for (size_t j = 0; j < list.size(); ++j)
          list[j] = resolved(op_, c10::str(arguments[i].name(), "[", j, "]"), list[j], mutated);
        v = list;
      }
    }
    handle.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Conjugate),
                           stack);
  }

 private:
  std::string op_;
};

}  // namespace

bool unusual(const at::Tensor& t) {
  return !(t.key_set() & kUnusual).empty() || t.layout() != c10::kStrided;
}

void admit(const std::string& op, const std::string& name, const at::Tensor& t) {
  std::string kind = refusal(t);
  if (!kind.empty()) refuse(op, name, t, kind);
  std::string why = deferred(t);
  TORCH_CHECK(why.empty(), op, ": argument ", name, " is ", why,
              ", which reached the kernel unresolved; call the op through torch.ops (the dispatcher resolves it)");
}

void register_admission(torch::Library& lib, const std::string& qualified, const std::string& name) {
  for (auto key : {c10::DispatchKey::SparseCPU, c10::DispatchKey::SparseCUDA, c10::DispatchKey::SparseCsrCPU,
                   c10::DispatchKey::SparseCsrCUDA, c10::DispatchKey::MkldnnCPU, c10::DispatchKey::QuantizedCPU,
                   c10::DispatchKey::QuantizedCUDA, c10::DispatchKey::NestedTensorCPU,
                   c10::DispatchKey::NestedTensorCUDA, c10::DispatchKey::AutogradNestedTensor})
    lib.impl(name.c_str(), key, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<RefuseKernel>(qualified)));
  for (auto key : {c10::DispatchKey::ZeroTensor, c10::DispatchKey::Negative, c10::DispatchKey::Conjugate})
    lib.impl(name.c_str(), key, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<ResolveKernel>(qualified)));
}

}  // namespace kgrt
