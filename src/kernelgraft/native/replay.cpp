// kernelgraft's native replay: the steady-state eager call of an op whose plan is one kernel launch.
//
// A Replay holds everything one call signature (dtypes, devices, shapes, strides, alignment, scalar
// values) fixes: the output shapes, the kernel, its grid and block, and its parameter bytes. Per
// call it only checks that the arguments still have that signature, allocates the outputs, writes
// the tensors' data pointers into the parameter bytes, reads torch's current stream and launches.
// Anything it does not handle (another signature, autograd, a tensor subclass, a dispatch or
// torch-function mode, functorch, a failed launch) returns NotImplemented and the caller takes the
// Python path, which handles it and raises the errors.
//
// Launch kinds:
//   0 "driver": CUresult cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra),
//               with params[i] = buffer + offsets[i] (the layout of kernelgraft.driver.ParamBuffer);
//   1 "packed": void fn(void** packed) with packed[i] = buffer + offsets[i] followed by the raw
//               `tail` pointers; the CUDA result is the int32 at `result` (zeroed before the call),
//               when given. This is the packed C ABI of a compiled CuTe DSL host function (its stream is
//               one of the slots: `stream_offset`).
// The GIL is held throughout, so the one parameter buffer is never used by two threads at once.
//
// Devices: a replay recorded for device d (its tensors' device) launches with d current, so d's
// primary context (where its function handle lives) is the driver's current one, and on d's current
// stream, whatever device the caller has current (one process driving several GPUs). The device is
// switched (c10::DeviceGuard, which for CUDA is CUDAGuard's cudaSetDevice and restores it on return)
// only when the current device differs: the common case adds one cudaGetDevice.

#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

using LaunchFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         void*, void**, void**);
using PackedFn = void (*)(void**);

struct TensorSpec {
  at::ScalarType dtype;
  c10::DeviceType device_type;
  c10::DeviceIndex device_index;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t align;  // expected data_ptr % 16, or -1: not part of the signature
};

struct ArgSpec {
  bool is_tensor = false;
  TensorSpec tensor;
  PyObject* value = nullptr;  // owned; compared by exact type and ==
};

struct OutSpec {
  std::vector<int64_t> sizes;
  at::TensorOptions options;
};

struct Patch {
  size_t offset;   // into the buffer
  size_t source;   // argument index, then outputs after the arguments
  int64_t delta;   // bytes added to the tensor's data pointer
};

// Two tensor arguments that must not share an element (one of them is mutated by the op): their
// byte extents [data_ptr, data_ptr + span) are disjoint, or (modulus != 0) their pointer
// difference d satisfies width_a <= d mod modulus <= modulus - width_b, which proves strided views
// of one buffer disjoint element by element (kernelgraft/op/overlap.py). A call that is neither
// is handed back to Python, which raises.
struct Disjoint {
  size_t a, b;
  uint64_t span_a, span_b;
  uint64_t modulus, width_a, width_b;
};

struct Replay {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  std::vector<ArgSpec>* args;
  std::vector<OutSpec>* outs;
  std::vector<Patch>* patches;
  std::vector<char>* buffer;
  std::vector<void*>* params;
  std::vector<Disjoint>* disjoint;
  PyObject* tensor_types;  // tuple of the exact Python types accepted as plain tensors
  PyObject* keepalive;     // what owns the function, result slot and tail pointers (kept alive)
  int out_kind;            // 0: None, 1: one tensor, 2: tuple
  int launch_kind;         // 0 driver, 1 packed
  void* fn;
  void* function;
  unsigned grid[3];
  unsigned block[3];
  unsigned smem;
  Py_ssize_t stream_offset;  // packed: where the stream goes; driver: -1
  int32_t* result;
  c10::DeviceType stream_device_type;
  c10::DeviceIndex stream_device_index;
  long long calls;
  long long misses;
};

bool as_int64s(PyObject* seq, std::vector<int64_t>& out) {
  PyObject* fast = PySequence_Fast(seq, "expected a sequence of ints");
  if (!fast) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  out.resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    if (out[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return false;
    }
  }
  Py_DECREF(fast);
  return true;
}

bool parse_dtype(PyObject* obj, at::ScalarType& out) {
  if (!THPDtype_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "expected a torch.dtype");
    return false;
  }
  out = reinterpret_cast<THPDtype*>(obj)->scalar_type;
  return true;
}

// ("t", dtype, device_type, device_index, sizes, strides, align) or ("v", value)
bool parse_arg(PyObject* item, ArgSpec& spec) {
  if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 2 || !PyUnicode_Check(PyTuple_GET_ITEM(item, 0))) {
    PyErr_SetString(PyExc_ValueError, "an argument spec is ('t', ...) or ('v', value)");
    return false;
  }
  PyObject* tag = PyTuple_GET_ITEM(item, 0);
  if (PyUnicode_CompareWithASCIIString(tag, "v") == 0 && PyTuple_GET_SIZE(item) == 2) {
    spec.value = PyTuple_GET_ITEM(item, 1);
    Py_INCREF(spec.value);
    return true;
  }
  if (PyUnicode_CompareWithASCIIString(tag, "t") != 0 || PyTuple_GET_SIZE(item) != 7) {
    PyErr_SetString(PyExc_ValueError, "an argument spec is ('t', dtype, device_type, index, sizes, strides, align) or ('v', value)");
    return false;
  }
  PyObject *dtype, *sizes, *strides;
  const char* unused;
  int device_type, index;
  long long align;
  if (!PyArg_ParseTuple(item, "sOiiOOL", &unused, &dtype, &device_type, &index, &sizes, &strides, &align))
    return false;
  spec.is_tensor = true;
  if (!parse_dtype(dtype, spec.tensor.dtype)) return false;
  spec.tensor.device_type = static_cast<c10::DeviceType>(device_type);
  spec.tensor.device_index = static_cast<c10::DeviceIndex>(index);
  spec.tensor.align = align;
  return as_int64s(sizes, spec.tensor.sizes) && as_int64s(strides, spec.tensor.strides);
}

PyObject* replay_call(PyObject* self, PyObject* const* argv, size_t nargsf, PyObject* kwnames);

int replay_init(Replay* self, PyObject* a, PyObject* kw) {
  static const char* names[] = {"tensor_types", "args", "outs", "out_kind", "launch_kind", "fn",
                                "function", "grid", "block", "smem", "buffer", "offsets", "tail",
                                "patches", "stream_offset", "result", "stream_device", "keepalive",
                                "disjoint", nullptr};
  PyObject *types, *args, *outs, *grid, *block, *buffer, *offsets, *tail, *patches, *stream_device;
  PyObject* keepalive = Py_None;
  PyObject* disjoint = Py_None;
  int out_kind, launch_kind;
  unsigned long long fn, function, result;
  unsigned smem;
  Py_ssize_t stream_offset;
  if (!PyArg_ParseTupleAndKeywords(a, kw, "O!O!O!iiKKOOIOOOOnKO|OO", const_cast<char**>(names),
                                   &PyTuple_Type, &types, &PyTuple_Type, &args, &PyTuple_Type, &outs,
                                   &out_kind, &launch_kind, &fn, &function, &grid, &block, &smem,
                                   &buffer, &offsets, &tail, &patches, &stream_offset, &result,
                                   &stream_device, &keepalive, &disjoint))
    return -1;
  if (launch_kind != 0 && launch_kind != 1) {
    PyErr_SetString(PyExc_ValueError, "launch_kind is 0 (driver) or 1 (packed)");
    return -1;
  }
  if (out_kind < 0 || out_kind > 2) {
    PyErr_SetString(PyExc_ValueError, "out_kind is 0 (None), 1 (tensor) or 2 (tuple)");
    return -1;
  }
  if (fn == 0) {
    PyErr_SetString(PyExc_ValueError, "fn must be a function address");
    return -1;
  }
  Py_INCREF(types);
  Py_XSETREF(self->tensor_types, types);
  Py_INCREF(keepalive);
  Py_XSETREF(self->keepalive, keepalive);
  self->out_kind = out_kind;
  self->launch_kind = launch_kind;
  self->fn = reinterpret_cast<void*>(fn);
  self->function = reinterpret_cast<void*>(function);
  self->smem = smem;
  self->stream_offset = stream_offset;
  self->result = reinterpret_cast<int32_t*>(result);

  std::vector<int64_t> dims;
  if (!as_int64s(grid, dims) || dims.size() != 3) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "grid has 3 dimensions");
    return -1;
  }
  for (int i = 0; i < 3; ++i) self->grid[i] = static_cast<unsigned>(dims[i]);
  if (!as_int64s(block, dims) || dims.size() != 3) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "block has 3 dimensions");
    return -1;
  }
  for (int i = 0; i < 3; ++i) self->block[i] = static_cast<unsigned>(dims[i]);

  int stream_type, stream_index;
  if (!PyArg_ParseTuple(stream_device, "ii", &stream_type, &stream_index)) return -1;
  self->stream_device_type = static_cast<c10::DeviceType>(stream_type);
  self->stream_device_index = static_cast<c10::DeviceIndex>(stream_index);

  Py_ssize_t n = PyTuple_GET_SIZE(args);
  for (auto& spec : *self->args) Py_XDECREF(spec.value);  // a second __init__ drops the first's
  self->args->clear();
  self->args->resize(n);
  for (Py_ssize_t i = 0; i < n; ++i)
    if (!parse_arg(PyTuple_GET_ITEM(args, i), (*self->args)[i])) return -1;

  n = PyTuple_GET_SIZE(outs);
  self->outs->clear();
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *sizes, *dtype;
    int device_type, index;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(outs, i), "OOii", &sizes, &dtype, &device_type, &index))
      return -1;
    OutSpec out;
    at::ScalarType st;
    if (!as_int64s(sizes, out.sizes) || !parse_dtype(dtype, st)) return -1;
    out.options = at::TensorOptions()
                      .dtype(st)
                      .device(c10::Device(static_cast<c10::DeviceType>(device_type),
                                          static_cast<c10::DeviceIndex>(index)));
    self->outs->push_back(std::move(out));
  }
  if ((out_kind == 1 && self->outs->size() != 1) || (out_kind == 0 && !self->outs->empty())) {
    PyErr_SetString(PyExc_ValueError, "out_kind does not match the number of outputs");
    return -1;
  }

  Py_buffer view;
  if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0) return -1;
  self->buffer->assign(static_cast<char*>(view.buf), static_cast<char*>(view.buf) + view.len);
  PyBuffer_Release(&view);
  if (self->buffer->empty()) self->buffer->resize(8);

  std::vector<int64_t> offs, tails;
  if (!as_int64s(offsets, offs) || !as_int64s(tail, tails)) return -1;
  self->params->clear();
  for (int64_t o : offs) {
    if (o < 0 || static_cast<size_t>(o) >= self->buffer->size()) {
      PyErr_SetString(PyExc_ValueError, "a parameter offset lies outside the buffer");
      return -1;
    }
    self->params->push_back(self->buffer->data() + o);
  }
  for (int64_t t : tails) self->params->push_back(reinterpret_cast<void*>(t));
  if (self->params->empty()) self->params->push_back(nullptr);

  PyObject* fast = PySequence_Fast(patches, "patches is a sequence");
  if (!fast) return -1;
  self->patches->clear();
  size_t sources = self->args->size() + self->outs->size();
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    unsigned long long offset, source;
    long long delta;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "KKL", &offset, &source, &delta)) {
      Py_DECREF(fast);
      return -1;
    }
    bool tensor_source = source >= self->args->size() || (*self->args)[source].is_tensor;
    if (offset + 8 > self->buffer->size() || source >= sources || !tensor_source) {
      Py_DECREF(fast);
      PyErr_SetString(PyExc_ValueError, "a patch writes outside the buffer or reads no tensor");
      return -1;
    }
    self->patches->push_back(Patch{static_cast<size_t>(offset), static_cast<size_t>(source), delta});
  }
  Py_DECREF(fast);
  self->disjoint->clear();
  if (disjoint != Py_None) {
    PyObject* pairs = PySequence_Fast(
        disjoint, "disjoint is a sequence of (a, b, span_a, span_b, modulus, width_a, width_b)");
    if (!pairs) return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(pairs); ++i) {
      unsigned long long a, b, span_a, span_b, modulus, width_a, width_b;
      if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(pairs, i), "KKKKKKK", &a, &b, &span_a, &span_b, &modulus,
                            &width_a, &width_b)) {
        Py_DECREF(pairs);
        return -1;
      }
      if (a >= self->args->size() || b >= self->args->size() || !(*self->args)[a].is_tensor ||
          !(*self->args)[b].is_tensor) {
        Py_DECREF(pairs);
        PyErr_SetString(PyExc_ValueError, "a disjoint pair names an argument that is not a tensor");
        return -1;
      }
      self->disjoint->push_back(Disjoint{static_cast<size_t>(a), static_cast<size_t>(b), span_a, span_b, modulus,
                                         width_a, width_b});
    }
    Py_DECREF(pairs);
  }
  if (stream_offset >= 0 && static_cast<size_t>(stream_offset) + 8 > self->buffer->size()) {
    PyErr_SetString(PyExc_ValueError, "the stream slot lies outside the buffer");
    return -1;
  }
  self->vectorcall = replay_call;
  return 0;
}

PyObject* replay_new(PyTypeObject* type, PyObject*, PyObject*) {
  Replay* self = reinterpret_cast<Replay*>(type->tp_alloc(type, 0));
  if (!self) return nullptr;
  self->args = new std::vector<ArgSpec>();
  self->outs = new std::vector<OutSpec>();
  self->patches = new std::vector<Patch>();
  self->buffer = new std::vector<char>();
  self->params = new std::vector<void*>();
  self->disjoint = new std::vector<Disjoint>();
  self->vectorcall = replay_call;
  return reinterpret_cast<PyObject*>(self);
}

void replay_dealloc(Replay* self) {
  if (self->args)
    for (auto& a : *self->args) Py_XDECREF(a.value);
  delete self->args;
  delete self->outs;
  delete self->patches;
  delete self->disjoint;
  delete self->buffer;
  delete self->params;
  Py_XDECREF(self->tensor_types);
  Py_XDECREF(self->keepalive);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

inline PyObject* miss(Replay* self) {
  ++self->misses;
  Py_RETURN_NOTIMPLEMENTED;
}

bool plain_type(Replay* self, PyObject* obj) {
  PyTypeObject* tp = Py_TYPE(obj);
  PyObject* types = self->tensor_types;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(types); ++i)
    if (reinterpret_cast<PyObject*>(tp) == PyTuple_GET_ITEM(types, i)) return true;
  return false;
}

bool same_ints(c10::IntArrayRef got, const std::vector<int64_t>& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) return false;
  return true;
}

// Keys that mean the tensor is not plain data a kernel can read through its pointer: a wrapper
// (Python subclass, functorch, functionalization), values that are a function of the memory
// (negative and conjugate bits, ZeroTensor), or a layout other than dense strided (sparse, sparse
// compressed, mkldnn, quantized, nested). The Python path admits or refuses those
// (kernelgraft/admit.py); a replay only ever serves the dense tensors it was recorded from. The
// per-backend functionality keys (Sparse, Quantized, NestedTensor) match whatever the backend.
const c10::DispatchKeySet kUnplain = c10::DispatchKeySet({
    c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::FuncTorchBatched,
    c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::Functionalize, c10::DispatchKey::Conjugate,
    c10::DispatchKey::Negative, c10::DispatchKey::ZeroTensor, c10::DispatchKey::BatchedNestedTensor,
    c10::DispatchKey::Sparse, c10::DispatchKey::SparseCsr, c10::DispatchKey::MkldnnCPU,
    c10::DispatchKey::Quantized, c10::DispatchKey::NestedTensor, c10::DispatchKey::AutogradNestedTensor,
});

PyObject* replay_call(PyObject* obj, PyObject* const* argv, size_t nargsf, PyObject* kwnames) {
  Replay* self = reinterpret_cast<Replay*>(obj);
  if (PyVectorcall_NARGS(nargsf) != 1 || kwnames) {
    PyErr_SetString(PyExc_TypeError, "a Replay takes the call's argument tuple");
    return nullptr;
  }
  PyObject* call = argv[0];
  if (!PyTuple_Check(call) || static_cast<size_t>(PyTuple_GET_SIZE(call)) != self->args->size())
    return miss(self);
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0 || at::impl::torch_function_mode_enabled() ||
      c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode))
    return miss(self);
  const bool grad = at::GradMode::is_enabled();
  const auto& specs = *self->args;
  const size_t nargs = specs.size();
  // The tensors of this call: arguments first, outputs after them (patch sources index this).
  at::Tensor tensors[16];
  std::vector<at::Tensor> spill;
  const size_t total = nargs + self->outs->size();
  at::Tensor* slots = tensors;
  if (total > 16) {
    spill.resize(total);
    slots = spill.data();
  }
  // Nothing below may throw through Python: a tensor whose metadata torch refuses to give is
  // handed back (the Python path names it).
  try {
    for (size_t i = 0; i < nargs; ++i) {
      PyObject* item = PyTuple_GET_ITEM(call, i);
      const ArgSpec& spec = specs[i];
      if (!spec.is_tensor) {
        if (Py_TYPE(item) != Py_TYPE(spec.value)) return miss(self);
        if (item == spec.value) continue;
        int eq = PyObject_RichCompareBool(item, spec.value, Py_EQ);
        if (eq < 0) {
          PyErr_Clear();
          return miss(self);
        }
        if (!eq) return miss(self);
        continue;
      }
      if (!plain_type(self, item)) return miss(self);
      const at::Tensor& t = THPVariable_Unpack(item);
      const TensorSpec& want = spec.tensor;
      // The key set and layout first: sizes() and strides() throw for nested and sparse tensors.
      if (!t.defined() || (t.key_set() & kUnplain).empty() == false || t.layout() != c10::kStrided ||
          !t.has_storage() || t.scalar_type() != want.dtype || t.device().type() != want.device_type ||
          t.device().index() != want.device_index || (grad && t.requires_grad()) ||
          !same_ints(t.sizes(), want.sizes) || !same_ints(t.strides(), want.strides))
        return miss(self);
      if (want.align >= 0 && (reinterpret_cast<uintptr_t>(t.const_data_ptr()) & 15) != static_cast<uintptr_t>(want.align))
        return miss(self);
      slots[i] = t;
    }
  } catch (const std::exception&) {
    return miss(self);
  }
  for (const Disjoint& d : *self->disjoint) {
    uint64_t pa = reinterpret_cast<uint64_t>(slots[d.a].const_data_ptr());
    uint64_t pb = reinterpret_cast<uint64_t>(slots[d.b].const_data_ptr());
    if (pa < pb + d.span_b && pb < pa + d.span_a) {
      if (d.modulus == 0) return miss(self);  // Python raises InputError
      // (pb - pa) mod modulus, non-negative, as Python's % computes it
      const uint64_t r = pb >= pa ? (pb - pa) % d.modulus : (d.modulus - (pa - pb) % d.modulus) % d.modulus;
      if (r < d.width_a || r > d.modulus - d.width_b) return miss(self);
    }
  }
  // Switch to the recorded device before allocating and launching, only if it is not current.
  const c10::impl::DeviceGuardImplInterface* impl = nullptr;
  std::optional<c10::DeviceGuard> guard;
  if (self->stream_device_type != c10::DeviceType::CPU) {
    impl = c10::impl::getDeviceGuardImpl(self->stream_device_type);
    if (impl->getDevice().index() != self->stream_device_index)
      guard.emplace(c10::Device(self->stream_device_type, self->stream_device_index));
  }
  const auto& outs = *self->outs;
  try {
    for (size_t j = 0; j < outs.size(); ++j) slots[nargs + j] = at::empty(outs[j].sizes, outs[j].options);
  } catch (const std::exception&) {
    return miss(self);  // the Python path allocates again and reports the error
  }
  char* buf = self->buffer->data();
  for (const Patch& p : *self->patches) {
    const at::Tensor& t = slots[p.source];
    uint64_t address = reinterpret_cast<uint64_t>(t.const_data_ptr()) + static_cast<uint64_t>(p.delta);
    std::memcpy(buf + p.offset, &address, 8);
  }
  void* stream = nullptr;
  if (impl != nullptr)
    stream = impl->getStream(c10::Device(self->stream_device_type, self->stream_device_index)).native_handle();
  int err;
  if (self->launch_kind == 0) {
    err = reinterpret_cast<LaunchFn>(self->fn)(self->function, self->grid[0], self->grid[1], self->grid[2],
                                              self->block[0], self->block[1], self->block[2], self->smem,
                                              stream, self->params->data(), nullptr);
  } else {
    if (self->stream_offset >= 0) {
      uint64_t s = reinterpret_cast<uint64_t>(stream);
      std::memcpy(buf + self->stream_offset, &s, 8);
    }
    if (self->result) *self->result = 0;
    reinterpret_cast<PackedFn>(self->fn)(self->params->data());
    err = self->result ? *self->result : 0;
  }
  if (PyErr_Occurred()) return nullptr;  // a Python callback (tests) raised
  if (err != 0) return miss(self);        // nothing ran; the Python path launches and reports
  ++self->calls;
  if (self->out_kind == 0) Py_RETURN_NONE;
  if (self->out_kind == 1) return THPVariable_Wrap(std::move(slots[nargs]));
  PyObject* result = PyTuple_New(static_cast<Py_ssize_t>(outs.size()));
  if (!result) return nullptr;
  for (size_t j = 0; j < outs.size(); ++j) {
    PyObject* o = THPVariable_Wrap(std::move(slots[nargs + j]));
    if (!o) {
      Py_DECREF(result);
      return nullptr;
    }
    PyTuple_SET_ITEM(result, static_cast<Py_ssize_t>(j), o);
  }
  return result;
}

PyObject* replay_stats(PyObject* obj, PyObject*) {
  Replay* self = reinterpret_cast<Replay*>(obj);
  return Py_BuildValue("{s:L,s:L}", "calls", self->calls, "misses", self->misses);
}

PyObject* replay_buffer(PyObject* obj, PyObject*) {
  Replay* self = reinterpret_cast<Replay*>(obj);
  return PyBytes_FromStringAndSize(self->buffer->data(), static_cast<Py_ssize_t>(self->buffer->size()));
}

PyMethodDef replay_methods[] = {
    {"stats", replay_stats, METH_NOARGS, "{'calls': launches made, 'misses': calls handed back}"},
    {"buffer", replay_buffer, METH_NOARGS, "the parameter bytes as the last call wrote them"},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject ReplayType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "kernelgraft_native",
                          "kernelgraft's native replay of one-launch plans", -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit_kernelgraft_native(void) {
  ReplayType.tp_name = "kernelgraft_native.Replay";
  ReplayType.tp_basicsize = sizeof(Replay);
  ReplayType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  ReplayType.tp_new = replay_new;
  ReplayType.tp_init = reinterpret_cast<initproc>(replay_init);
  ReplayType.tp_dealloc = reinterpret_cast<destructor>(replay_dealloc);
  ReplayType.tp_call = PyVectorcall_Call;
  ReplayType.tp_vectorcall_offset = offsetof(Replay, vectorcall);
  ReplayType.tp_methods = replay_methods;
  ReplayType.tp_doc = "Replay(...)(args) -> outputs, or NotImplemented for the Python path";
  if (PyType_Ready(&ReplayType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  Py_INCREF(&ReplayType);
  if (PyModule_AddObject(m, "Replay", reinterpret_cast<PyObject*>(&ReplayType)) < 0) {
    Py_DECREF(&ReplayType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
