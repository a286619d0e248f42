// Which tensors may reach a bundle's kernel: the admission rule of kernelgraft/admit.py, applied
// by the runtime's ops. A kernel reads a tensor through its data pointer, dtype, sizes and
// strides, so only a dense strided tensor whose values are its memory is served:
// - sparse (COO, CSR, CSC, BSR, BSC), mkldnn, quantized and nested tensors are refused;
// - a view with the negative or conjugate bit, or a ZeroTensor, is resolved (materialized into a
//   copy) when the op only reads it, and refused when the op mutates it (the kernel would write its
//   memory, not its values, and a copy would lose the write).
// Each error is a c10::Error naming the op and the argument.
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>

namespace kgrt {

// Whether `t` needs this rule's attention (any layout or key it refuses or resolves): cheap, for
// the launch cache's signature.
bool unusual(const at::Tensor& t);

// TORCH_CHECK that `t` (argument `name` of `op`) is a tensor a kernel may read as stored.
void admit(const std::string& op, const std::string& name, const at::Tensor& t);

// Registers, for op `name` of `lib`, the kernels that apply the rule at the dispatch keys of
// those tensors (sparse, mkldnn, quantized, nested: refused; Negative, Conjugate, ZeroTensor:
// resolved and sent on to the op's backend kernel), so its CUDA, CPU and Meta kernels see
// admitted tensors only.
void register_admission(torch::Library& lib, const std::string& qualified, const std::string& name);

}  // namespace kgrt
