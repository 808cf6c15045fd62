// The specialization-key builder for Python calls: binds a call's arguments to the declared
// parameters and classifies each one the way Triton's specialize.cc does, reading tensors
// straight from the at::Tensor (dtype, device, data_ptr() & 15) with no Python attribute calls.
#include <ATen/core/Tensor.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstring>

#include "fastkernel/tensor_map.h"
#include "kernel_object.h"
#include "launch_context.h"

namespace fastkernel {
namespace {

// Finds `name` among `names` by identity: keyword names at call sites are interned, and so are
// the declared names, so this is the common case.
int find_interned(PyObject* name, PyObject* const* names, int count) {
  for (int i = 0; i < count; ++i) {
    if (names[i] == name) {
      return i;
    }
  }
  return -1;
}

// Finds `name` among `names` by value (a keyword built at run time, e.g. from **kwargs).
int find_by_value(PyObject* name, PyObject* const* names, int count) {
  for (int i = 0; i < count; ++i) {
    if (PyUnicode_Compare(name, names[i]) == 0) {
      return i;
    }
  }
  PyErr_Clear();
  return -1;
}

// Binds the keywords of `kwnames` (after `nargs` positional arguments) to parameters and
// compile options into kernel->state->keywords; true when bound. Once per call site: later
// calls passing the same kwnames tuple reuse the binding. False with Python's TypeError set for
// a name that is neither or a parameter also given by position, in keyword order; false with
// call->fallback_reason set for a name repeated within `kwnames` (a tuple CPython never builds,
// only a C caller can), which Triton's path takes, where **kwargs keeps the last value.
[[gnu::cold]] bool bind_keywords(KernelObject* kernel, PyObject* kwnames, Py_ssize_t nargs,
                                 BoundCall* call) {
  KernelState& st = *kernel->state;
  const int num_params = int(st.params.size());
  const int num_options = int(st.option_names.size());
  const Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
  std::vector<int16_t> slots(size_t(nkw), 0);
  std::vector<bool> bound(size_t(num_params), false);
  std::vector<bool> option_given(size_t(num_options), false);
  for (int i = 0; i < num_params && i < nargs; ++i) {
    bound[size_t(i)] = true;
  }
  const auto repeated = [&] {
    call->fallback_reason = "a keyword given twice in one call's kwnames";
    return false;
  };
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* kw = PyTuple_GET_ITEM(kwnames, k);
    int index = find_interned(kw, st.param_names.data(), num_params);
    int option = index < 0 ? find_interned(kw, st.option_names.data(), num_options) : -1;
    if (index < 0 && option < 0) {
      index = find_by_value(kw, st.param_names.data(), num_params);
      if (index < 0) {
        option = find_by_value(kw, st.option_names.data(), num_options);
      }
    }
    if (index >= 0) {
      if (bound[size_t(index)]) {
        if (index >= nargs) {
          return repeated();  // bound by an earlier keyword, not by position
        }
        PyErr_Format(PyExc_TypeError, "%U got multiple values for argument '%U'", kernel->name, kw);
        return false;
      }
      bound[size_t(index)] = true;
      slots[size_t(k)] = int16_t(index);
      continue;
    }
    if (option < 0) {
      PyErr_Format(PyExc_TypeError,
                   "%U got an unexpected keyword argument '%U' (neither a kernel parameter nor "
                   "a Triton compile option)",
                   kernel->name, kw);
      return false;
    }
    if (option_given[size_t(option)]) {
      return repeated();
    }
    option_given[size_t(option)] = true;
    slots[size_t(k)] = int16_t(-1 - option);
  }
  KeywordBinding& binding = st.keywords;
  clear_option_words(&binding);
  Py_INCREF(kwnames);
  Py_XSETREF(binding.kwnames, kwnames);
  binding.nargs = nargs;
  binding.slots = std::move(slots);
  binding.option_values.assign(size_t(nkw), nullptr);
  // Keywords that are all parameters make no option words: none to read, ever.
  binding.options_cached = std::all_of(binding.slots.begin(), binding.slots.end(),
                                       [](int16_t slot) { return slot >= 0; });
  binding.all_options = std::all_of(binding.slots.begin(), binding.slots.end(),
                                    [](int16_t slot) { return slot < 0; });
  return true;
}

// Keeps the option values of a call (the keywords after `nargs` positional arguments in
// `args`) and the key words key->words[first, key->size) they made, when every value is
// immutable and the binding is still the one the call used.
[[gnu::cold]] void keep_option_words(KeywordBinding& binding, uint64_t generation,
                                     PyObject* const* kw_values, const SpecializationKey& key,
                                     int first) {
  const int count = key.size - first;
  if (binding.generation != generation || key.overflowed ||
      count > KeywordBinding::kMaxOptionWords) {
    return;
  }
  const size_t nkw = binding.slots.size();
  for (size_t k = 0; k < nkw; ++k) {
    PyObject* v = kw_values[k];
    if (binding.slots[k] < 0 && !(PyLong_CheckExact(v) || PyFloat_CheckExact(v) ||
                                  PyUnicode_CheckExact(v) || PyBool_Check(v) || v == Py_None)) {
      return;
    }
  }
  clear_option_words(&binding);
  binding.option_values.assign(nkw, nullptr);
  for (size_t k = 0; k < nkw; ++k) {
    if (binding.slots[k] < 0) {
      binding.option_values[k] = Py_NewRef(kw_values[k]);
    }
  }
  std::copy(key.words + first, key.words + key.size, binding.option_words);
  binding.num_option_words = count;
  binding.options_cached = true;
}

// Types whose instances are keyed by identity, and Triton's constexpr wrapper class (set once
// at import by the Python layer; see set_constexpr_types).
PyObject* g_identity_types = nullptr;  // a tuple of types
PyObject* g_constexpr_type = nullptr;
PyObject* g_value_name = nullptr;
// triton.tools.tensor_descriptor.TensorDescriptor and the names of its fields (interned).
PyTypeObject* g_tensor_descriptor_type = nullptr;
struct DescriptorNames {
  PyObject* base;
  PyObject* shape;
  PyObject* strides;
  PyObject* block_shape;
  PyObject* padding;
  PyObject* round_f32_to_tf32;
  PyObject* nan;
};
DescriptorNames g_desc_names{};

bool is_identity_keyed(PyObject* v) {
  if (g_identity_types == nullptr) {
    return false;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(g_identity_types); ++i) {
    if (PyObject_TypeCheck(
            v, reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(g_identity_types, i)))) {
      return true;
    }
  }
  return false;
}

bool is_constexpr_wrapper(PyObject* v) {
  return g_constexpr_type != nullptr &&
         PyObject_TypeCheck(v, reinterpret_cast<PyTypeObject*>(g_constexpr_type));
}

// A constexpr (or option) value: ints, floats, bools, None and strings are keyed by value;
// tl.constexpr objects by their wrapped value; tl.dtype and jit functions by identity (the
// Python layer keeps every such object it registers alive, so an address is never reused
// while a record keyed on it exists). Anything else goes to the fallback path.
bool push_object_constexpr(PyObject* v, SpecializationKey* key, int depth);

// Tuples nest at most this deep on the native path (deeper ones take Triton's own).
constexpr int kMaxTupleDepth = 4;

// Out of line: inlined into push_constexpr_param, its registers' saves would move onto the
// common path there.
[[gnu::noinline]] bool push_constexpr(PyObject* v, SpecializationKey* key, int depth = 0) {
  if (v == Py_None) {
    key->push(uint64_t(ArgKind::ConstexprNone));
    return true;
  }
  if (PyBool_Check(v)) {
    key->push(uint64_t(ArgKind::ConstexprBool) | (uint64_t(v == Py_True) << 8));
    return true;
  }
  if (PyLong_CheckExact(v)) {
    int overflow = 0;
    long long value;
    if (!compact_int(v, &value)) {
      value = PyLong_AsLongLongAndOverflow(v, &overflow);
    }
    if (overflow == 0) {
      key->push(uint64_t(ArgKind::ConstexprInt));
      key->push(uint64_t(value));
      return true;
    }
    if (overflow > 0) {
      unsigned long long u = PyLong_AsUnsignedLongLong(v);
      if (!PyErr_Occurred()) {
        key->push(uint64_t(ArgKind::ConstexprInt) | (1ull << 8));  // unsigned beyond int64
        key->push(uint64_t(u));
        return true;
      }
      PyErr_Clear();
    }
    return false;
  }
  if (PyFloat_CheckExact(v)) {
    double d = PyFloat_AS_DOUBLE(v);
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    key->push(uint64_t(ArgKind::ConstexprFloat));
    key->push(bits);
    return true;
  }
  if (PyUnicode_CheckExact(v)) {
    Py_ssize_t length = 0;
    const char* data = PyUnicode_AsUTF8AndSize(v, &length);
    if (data == nullptr) {
      PyErr_Clear();
      return false;
    }
    key->push(uint64_t(ArgKind::ConstexprStr) | (uint64_t(uint32_t(length)) << 8));
    key->push_bytes(data, size_t(length));
    return true;
  }
  if (PyTuple_CheckExact(v) && depth < kMaxTupleDepth) {
    const Py_ssize_t n = PyTuple_GET_SIZE(v);
    key->push(uint64_t(ArgKind::ConstexprTuple) | (uint64_t(uint32_t(n)) << 8));
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!push_constexpr(PyTuple_GET_ITEM(v, i), key, depth + 1)) {
        return false;
      }
    }
    return true;
  }
  return push_object_constexpr(v, key, depth);
}

// A constexpr parameter's value: the common one, a block size (an int of at most 30 bits),
// without push_constexpr's general dispatch; the same words.
[[gnu::noinline]] bool push_constexpr_param(PyObject* v, SpecializationKey* key) {
  long long value;
  if (PyLong_CheckExact(v) && compact_int(v, &value)) {
    key->push(uint64_t(ArgKind::ConstexprInt));
    key->push(uint64_t(value));
    return true;
  }
  return push_constexpr(v, key);
}

// A number of a type other than int, float and bool: an int or float subclass (IntEnum
// members, numpy.float64) or a numpy integer or floating scalar. Triton keys a constexpr by its
// repr (the type shows in it) and compiles the object itself, so the key holds the type's
// address (the registrant keeps the type alive) and the value.
bool push_typed_number(PyObject* v, SpecializationKey* key) {
  PyTypeObject* type = Py_TYPE(v);
  const PyNumberMethods* number = type->tp_as_number;
  const bool numpy = std::strncmp(type->tp_name, "numpy.", 6) == 0 && number != nullptr;
  if (PyLong_Check(v) || (numpy && number->nb_index != nullptr && !PyFloat_Check(v))) {
    PyObject* index = PyNumber_Index(v);
    if (index == nullptr) {
      PyErr_Clear();
      return false;
    }
    int overflow = 0;
    const long long value = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (overflow != 0 || (value == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;
    }
    key->push(uint64_t(ArgKind::ConstexprTyped));
    key->push(reinterpret_cast<uint64_t>(type));
    key->push(uint64_t(value));
    return true;
  }
  if (PyFloat_Check(v) || (numpy && number->nb_float != nullptr)) {
    const double d = PyFloat_AsDouble(v);
    if (d == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    key->push(uint64_t(ArgKind::ConstexprTyped) | (1ull << 8));
    key->push(reinterpret_cast<uint64_t>(type));
    key->push(bits);
    return true;
  }
  return false;
}

// The object kinds, checked after the exact value kinds above since they cost type walks.
bool push_object_constexpr(PyObject* v, SpecializationKey* key, int depth) {
  if (is_identity_keyed(v)) {
    key->push(uint64_t(ArgKind::ConstexprObject));
    key->push(reinterpret_cast<uint64_t>(v));
    return true;
  }
  if (is_constexpr_wrapper(v) && depth == 0) {
    PyObject* inner = PyObject_GetAttr(v, g_value_name);
    if (inner == nullptr) {
      PyErr_Clear();
      return false;
    }
    key->push(uint64_t(ArgKind::ConstexprWrapped));
    const bool ok = push_constexpr(inner, key, depth + 1);
    Py_DECREF(inner);
    return ok;
  }
  return push_typed_number(v, key);
}

// Sets a Python exception naming the kernel and parameter; returns KeyStatus::Error.
KeyStatus arg_error(KernelObject* kernel, PyObject* exc_type, const ParamSpec& param,
                    const char* message) {
  PyErr_Format(exc_type, "%U: argument '%U': %s", kernel->name, param.name, message);
  return KeyStatus::Error;
}

[[gnu::always_inline]] inline KeyStatus push_int(KernelObject* kernel, const ParamSpec& param,
                                                 PyObject* v, ArgValue* value,
                                                 SpecializationKey* key) {
  int overflow = 0;
  long long s;
  if (!compact_int(v, &s)) {
    s = PyLong_AsLongLongAndOverflow(v, &overflow);
  }
  value->kind = ArgKind::Int;
  if (overflow == 0) {
    value->i = s;
    value->width = signed_width(s);
    key->push(
        int_word(value->width, int_class(uint64_t(s), s == 1, param.specialize, param.align)));
    return KeyStatus::Ok;
  }
  if (overflow > 0) {
    unsigned long long u = PyLong_AsUnsignedLongLong(v);
    if (!PyErr_Occurred()) {
      value->u = u;
      value->width = IntWidth::U64;
      key->push(int_word(IntWidth::U64, int_class(u, false, param.specialize, param.align)));
      return KeyStatus::Ok;
    }
    PyErr_Clear();
  }
  // Triton (specialize.cc) rejects ints outside [-2**63, 2**64) the same way.
  return arg_error(kernel, PyExc_OverflowError, param,
                   "integer does not fit in 64 bits (Triton's widest integer parameter)");
}

// The errors a tensor argument can raise, kept out of line so the hot path stays small.
[[gnu::noinline, gnu::cold]] KeyStatus tensor_error(KernelObject* kernel, const ParamSpec& param,
                                                    const at::Tensor& tensor) {
  const c10::Device device = tensor.device();
  if (tensor.layout() != c10::kStrided) {
    // Triton kernels take a strided tensor's data pointer; sparse, mkldnn and other layouts
    // have none (data_ptr() would throw).
    PyErr_Format(PyExc_ValueError,
                 "%U: argument '%U' is a tensor with a %s layout; Triton kernels take strided "
                 "tensors",
                 kernel->name, param.name, c10::str(tensor.layout()).c_str());
  } else {
    PyErr_Format(PyExc_ValueError,
                 "%U: argument '%U' is a tensor on '%s'; a GPU launch needs CUDA tensors",
                 kernel->name, param.name, c10::DeviceTypeName(device.type(), true).c_str());
  }
  return KeyStatus::Error;
}

// The autotune words of a tensor (fastkernel.autotune's key): every stride classed as 0, 1 or
// other, and the sizes when the autotune key names the tensor.
[[gnu::noinline]] void push_tensor_tuning_slow(const ParamSpec& param, const at::Tensor& tensor,
                                               SpecializationKey* key) {
  const c10::IntArrayRef strides = tensor.strides();
  const uint64_t dim = uint64_t(strides.size());
  if (param.tune & kTuneLayout) {
    // 24 classes fit beside the tag and dim; the rest follow 32 to a word.
    uint64_t word = uint64_t(ArgKind::TuneLayout) | (dim << 8);
    int shift = 16;
    for (uint64_t d = 0; d < dim; ++d) {
      if (shift == 64) {
        key->push(word);
        word = 0;
        shift = 0;
      }
      word |= stride_class(strides[d]) << shift;
      shift += 2;
    }
    key->push(word);
  }
  if (param.tune & kTuneSizes) {
    key->push(uint64_t(ArgKind::TuneSizes) | (dim << 8));
    for (const int64_t size : tensor.sizes()) {
      key->push(uint64_t(size));
    }
  }
  if (param.tune & kTuneStrides) {
    key->push(uint64_t(ArgKind::TuneStrides) | (dim << 8));
    for (const int64_t stride : strides) {
      key->push(uint64_t(stride));
    }
  }
}

// The common case inline: only the stride pattern, of a tensor of at most 24 dims.
[[gnu::always_inline]] inline void push_tensor_tuning(const ParamSpec& param,
                                                      const at::Tensor& tensor,
                                                      SpecializationKey* key) {
  if (param.tune != kTuneLayout) {
    push_tensor_tuning_slow(param, tensor, key);
    return;
  }
  const c10::IntArrayRef strides = tensor.strides();
  const size_t dim = strides.size();
  if (C10_UNLIKELY(dim > 24)) {
    push_tensor_tuning_slow(param, tensor, key);
    return;
  }
  uint64_t word = uint64_t(ArgKind::TuneLayout) | (uint64_t(dim) << 8);
  for (size_t d = 0; d < dim; ++d) {
    word |= stride_class(strides[d]) << (16 + 2 * d);
  }
  key->push(word);
}

// data_ptr() threw: a tensor without storage. One with a layout other than strided (sparse,
// mkldnn...) gets the error naming the argument and its layout; any other keeps torch's own.
[[gnu::noinline, gnu::cold]] KeyStatus storageless_tensor_error(KernelObject* kernel,
                                                                const ParamSpec& param,
                                                                const at::Tensor& tensor) {
  if (tensor.layout() != c10::kStrided) {
    return tensor_error(kernel, param, tensor);
  }
  throw;
}

// Whether the native path launches with pointers on `device`: CUDA, or the CPU (standing for
// it) under host testing.
[[gnu::always_inline]] inline bool launches_on(c10::Device device) {
  return device.type() == c10::DeviceType::CUDA ||
         (host_testing() && device.type() == c10::DeviceType::CPU);
}

// The key word of a pointer argument of `scalar_type` on `device`, before its alignment class
// (pointer_class, bits 24..31) is or-ed in.
[[gnu::always_inline]] inline uint64_t pointer_word(int scalar_type, c10::Device device) {
  return tensor_word(scalar_type, int(device.type()), ValueClass::NotSpecialized) |
         (uint64_t(uint16_t(device.index())) << 32);
}

// A tensor argument's data pointer, as Triton's launcher takes it (`tensor.data_ptr()`), into
// `out`; or the error naming the argument when the tensor is on a device other than CUDA (the
// CPU under host testing) or has no storage. data_ptr() checks has_storage() itself (a virtual
// call) and throws without one, so the layout is asked only then.
[[gnu::always_inline]] inline KeyStatus tensor_address(KernelObject* kernel, const ParamSpec& param,
                                                       const at::Tensor& tensor, c10::Device device,
                                                       uint64_t* out) {
  if (!launches_on(device)) {
    return tensor_error(kernel, param, tensor);
  }
  try {
    *out = reinterpret_cast<uint64_t>(tensor.data_ptr());
  } catch (const c10::Error&) {
    return storageless_tensor_error(kernel, param, tensor);
  }
  return KeyStatus::Ok;
}

// The address of an object that stands for a tensor (below): its data_ptr(), as Triton's
// launcher reads it (an int, taken as unsigned 64-bit). False with an exception set otherwise.
bool stand_in_address(PyObject* v, uint64_t* out) {
  static PyObject* const data_ptr = PyUnicode_InternFromString("data_ptr");
  if (data_ptr == nullptr) {
    return false;
  }
  const Ref ptr(PyObject_CallMethodNoArgs(v, data_ptr));
  if (!ptr) {
    return false;
  }
  if (!PyLong_Check(ptr.get())) {
    PyErr_SetString(PyExc_TypeError, "data_ptr() did not return an int");
    return false;
  }
  const unsigned long long value = PyLong_AsUnsignedLongLong(ptr.get());
  if (value == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    return false;
  }
  *out = value;
  return true;
}

// An object other than a tensor that Triton takes as a pointer argument for its data_ptr()
// method (specialize.cc specialize_arg: `hasattr(arg, "data_ptr")` after its tuple and class
// checks, then handle_tensor, which specializes it by its `dtype` and the 16-byte alignment of
// data_ptr(); the launcher packs data_ptr()): FlagGems' StridedBuffer, the strided view its
// generated pointwise kernels take. Keyed natively as the tensor it stands for, when its
// `dtype` is a torch.dtype and its `device` a torch.device the native path launches on
// (Triton's launcher asks the driver instead, cuPointerGetAttribute): the same key word as
// that tensor, whose binary is the one Triton specializes it to. Fallback, with nothing set,
// for any other object (tuples, tensor subclasses), an attribute missing or of another type,
// or a `device` that raises an Exception (Triton never reads it): Triton's own path takes
// the call. Error for anything else `dtype` or `data_ptr()` raise, which Triton raises too,
// and for a BaseException that is not an Exception (KeyboardInterrupt) from any of them.
[[gnu::noinline, gnu::cold]] KeyStatus push_tensor_stand_in(const ParamSpec& param, PyObject* v,
                                                            ArgValue* value,
                                                            SpecializationKey* key) {
  static PyObject* const dtype_name = PyUnicode_InternFromString("dtype");
  static PyObject* const device_name = PyUnicode_InternFromString("device");
  if (dtype_name == nullptr || device_name == nullptr) {
    return KeyStatus::Error;
  }
  if (PyTuple_Check(v) ||
      PyObject_TypeCheck(v, reinterpret_cast<PyTypeObject*>(THPVariableClass)) || param.tune != 0) {
    return KeyStatus::Fallback;  // a tensor in an autotune key is keyed by identity by Triton
  }
  // Falls back for a missing attribute (or, for `device`, any Exception); Error otherwise.
  const auto failed = [](PyObject* tolerated) {
    if (PyErr_ExceptionMatches(tolerated)) {
      PyErr_Clear();
      return KeyStatus::Fallback;
    }
    return KeyStatus::Error;
  };
  const Ref dtype(PyObject_GetAttr(v, dtype_name));
  if (!dtype) {
    return failed(PyExc_AttributeError);
  }
  if (!THPDtype_Check(dtype.get())) {
    return KeyStatus::Fallback;
  }
  const Ref device(PyObject_GetAttr(v, device_name));
  if (!device) {
    return failed(PyExc_Exception);
  }
  if (!THPDevice_Check(device.get())) {
    return KeyStatus::Fallback;
  }
  const c10::Device dev = reinterpret_cast<THPDevice*>(device.get())->device;
  if (!launches_on(dev)) {
    return KeyStatus::Fallback;
  }
  uint64_t ptr = 0;
  if (!stand_in_address(v, &ptr)) {
    // data_ptr() missing, or returning what Triton refuses (not an int, out of range): its
    // path raises its own error. Anything data_ptr() itself raised propagates.
    if (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_OverflowError)) {
      PyErr_Clear();
      return KeyStatus::Fallback;
    }
    return failed(PyExc_AttributeError);
  }
  const auto scalar_type = reinterpret_cast<THPDtype*>(dtype.get())->scalar_type;
  value->kind = ArgKind::Tensor;
  value->u = ptr;
  key->push(pointer_word(int(scalar_type), dev) |
            (uint64_t(pointer_class(ptr, param.specialize, param.align)) << 24));
  return KeyStatus::Ok;
}

[[gnu::always_inline]] inline KeyStatus push_tensor(KernelObject* kernel, const ParamSpec& param,
                                                    PyObject* v, ArgValue* value,
                                                    SpecializationKey* key) {
  const at::Tensor& tensor = THPVariable_Unpack(v);
  const c10::Device device = tensor.device();
  // The dtype and device are read once, before data_ptr()'s virtual call, into the key word
  // (its alignment class, zero here, is or-ed in once the address is known).
  const uint64_t word = pointer_word(int(tensor.scalar_type()), device);
  uint64_t ptr = 0;
  const KeyStatus status = tensor_address(kernel, param, tensor, device, &ptr);
  if (status != KeyStatus::Ok) {
    return status;
  }
  value->kind = ArgKind::Tensor;
  value->u = ptr;
  key->push(word | (uint64_t(pointer_class(ptr, param.specialize, param.align)) << 24));
  if (C10_UNLIKELY(param.tune != 0)) {
    push_tensor_tuning(param, tensor, key);
  }
  return KeyStatus::Ok;
}

// The exact value of a scalar the autotune key (or a heuristic) names: ints by value, floats by
// bits, bools by value (a runtime bool's own key word holds only its kind); None is keyed by
// its kind already. The key builder gives its float and bool values width I32 (0), so the
// width is read without asking the kind.
[[gnu::noinline]] void push_tuned_value(const ArgValue& value, SpecializationKey* key) {
  static_assert(uint8_t(ArgKind::Float) == uint8_t(ArgKind::Int) + 1 &&
                uint8_t(ArgKind::Bool) == uint8_t(ArgKind::Int) + 2 && uint8_t(IntWidth::I32) == 0);
  const uint64_t kind = uint8_t(value.kind);
  if (kind - uint8_t(ArgKind::Int) > 2) {
    return;  // not Int, Float or Bool
  }
  // Both words or neither (SpecializationKey::push, with one room check for the two).
  const int at = key->size;
  if (at + 2 > kMaxKeyWords - SpecializationKey::kTailWords) {
    key->overflowed = true;
    return;
  }
  key->words[at] =
      uint64_t(ArgKind::TuneValue) | (kind << 8) | (uint64_t(uint8_t(value.width)) << 16);
  key->words[at + 1] = value.u;
  key->size = at + 2;
}

// A sequence of ints (list, tuple or torch.Size) of exactly `rank` items into leaf values.
bool read_int_leaves(PyObject* seq, int rank, ArgValue* out) {
  if (!PyList_Check(seq) && !PyTuple_Check(seq)) {
    return false;
  }
  const bool is_list = PyList_Check(seq);
  if ((is_list ? PyList_GET_SIZE(seq) : PyTuple_GET_SIZE(seq)) != rank) {
    return false;
  }
  for (int d = 0; d < rank; ++d) {
    PyObject* item = is_list ? PyList_GET_ITEM(seq, d) : PyTuple_GET_ITEM(seq, d);
    if (!PyLong_CheckExact(item)) {
      return false;
    }
    int overflow = 0;
    const long long value = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (overflow != 0) {
      return false;
    }
    out[d].kind = ArgKind::Int;
    out[d].width = signed_width(value);
    out[d].i = value;
  }
  return true;
}

// A host tensor descriptor (triton.tools.tensor_descriptor.TensorDescriptor): keyed as Triton
// specializes it (the base's dtype and the block shape; plus the base's device), its fields
// captured in descriptor_leaves(rank) leaf slots: base pointer, shape, strides, nan padding,
// tf32 rounding. Which of them reach the kernel, and how, the record's plan says (a tensor map
// under TMA lowering, the decomposed fields otherwise).
[[gnu::noinline]] KeyStatus push_tensor_descriptor(KernelObject* kernel, const ParamSpec& param,
                                                   PyObject* v, ArgValue* value, BoundCall* call) {
  struct Fields {
    PyObject* base = nullptr;
    PyObject* shape = nullptr;
    PyObject* strides = nullptr;
    PyObject* block = nullptr;
    PyObject* padding = nullptr;
    PyObject* tf32 = nullptr;
    ~Fields() {
      Py_XDECREF(base);
      Py_XDECREF(shape);
      Py_XDECREF(strides);
      Py_XDECREF(block);
      Py_XDECREF(padding);
      Py_XDECREF(tf32);
    }
  } f;
  const DescriptorNames& n = g_desc_names;
  f.base = PyObject_GetAttr(v, n.base);
  f.shape = f.base ? PyObject_GetAttr(v, n.shape) : nullptr;
  f.strides = f.shape ? PyObject_GetAttr(v, n.strides) : nullptr;
  f.block = f.strides ? PyObject_GetAttr(v, n.block_shape) : nullptr;
  f.padding = f.block ? PyObject_GetAttr(v, n.padding) : nullptr;
  if (f.padding == nullptr) {
    PyErr_Clear();
    call->fallback_reason = "a tensor descriptor without the fields of Triton's TensorDescriptor";
    return KeyStatus::Fallback;
  }
  // Triton < 3.7's TensorDescriptor has no round_f32_to_tf32.
  f.tf32 = PyObject_GetAttr(v, n.round_f32_to_tf32);
  if (f.tf32 == nullptr) {
    PyErr_Clear();
  }
  const bool block_is_list = PyList_Check(f.block);
  if (!THPVariable_CheckExact(f.base) || (!block_is_list && !PyTuple_Check(f.block))) {
    call->fallback_reason = "a tensor descriptor whose base is not a plain tensor";
    return KeyStatus::Fallback;
  }
  const Py_ssize_t rank = block_is_list ? PyList_GET_SIZE(f.block) : PyTuple_GET_SIZE(f.block);
  const int num_params = int(kernel->state->params.size());
  const int first = num_params + call->num_leaves;
  if (rank < 1 || rank > kMaxTensorMapRank || first + descriptor_leaves(int(rank)) > kMaxArgs) {
    call->fallback_reason =
        "a tensor descriptor of a rank or count the native buffer does not hold";
    return KeyStatus::Fallback;
  }
  ArgValue* leaves = &call->values[first];
  for (int j = 0; j < descriptor_leaves(int(rank)); ++j) {
    call->leaf_owner[first - num_params + j] = uint16_t(call->current_param);
  }
  call->num_leaves += descriptor_leaves(int(rank));
  ArgValue block[kMaxTensorMapRank];
  if (!read_int_leaves(f.shape, int(rank), leaves + 1) ||
      !read_int_leaves(f.strides, int(rank), leaves + 1 + rank) ||
      !read_int_leaves(f.block, int(rank), block)) {
    call->fallback_reason = "a tensor descriptor whose shape, strides or block shape are not ints";
    return KeyStatus::Fallback;
  }
  const int nan = PyUnicode_Check(f.padding) ? PyUnicode_Compare(f.padding, n.nan) : -1;
  if (nan == -1 && PyErr_Occurred()) {
    PyErr_Clear();
  }
  const bool tf32 = f.tf32 == Py_True;
  if (f.tf32 != nullptr && f.tf32 != Py_True && f.tf32 != Py_False) {
    call->fallback_reason = "a tensor descriptor whose round_f32_to_tf32 is not a bool";
    return KeyStatus::Fallback;
  }
  const at::Tensor& tensor = THPVariable_Unpack(f.base);
  const c10::Device device = tensor.device();
  const KeyStatus status = tensor_address(kernel, param, tensor, device, &leaves[0].u);
  if (status != KeyStatus::Ok) {
    return status;
  }
  leaves[0].kind = ArgKind::Tensor;
  ArgValue& padding = leaves[1 + 2 * rank];
  padding.kind = ArgKind::Bool;
  padding.width = IntWidth::I32;  // push_tuned_value keys every scalar's width
  padding.i = nan == 0;
  ArgValue& rounding = leaves[2 + 2 * rank];
  rounding.kind = ArgKind::Bool;
  rounding.width = IntWidth::I32;
  rounding.i = tf32;
  value->kind = ArgKind::None;  // the descriptor itself is never packed; its leaves are
  SpecializationKey& key = call->key;
  key.push(uint64_t(ArgKind::TensorDesc) | (uint64_t(rank) << 8) |
           (uint64_t(uint8_t(tensor.scalar_type())) << 16) |
           (uint64_t(uint8_t(device.type())) << 24) | (uint64_t(uint16_t(device.index())) << 32));
  for (Py_ssize_t d = 0; d < rank; ++d) {
    key.push(uint64_t(block[d].i));
  }
  return KeyStatus::Ok;
}

// One runtime (non-constexpr) argument: its key words and captured value. A tuple is keyed by
// its length and elements, each element's value captured in the next leaf slot.
[[gnu::noinline]] KeyStatus push_runtime_arg(KernelObject* kernel, const ParamSpec& param,
                                             PyObject* v, ArgValue* value, BoundCall* call,
                                             int depth) {
  SpecializationKey& key = call->key;
  if (THPVariable_CheckExact(v)) {
    return push_tensor(kernel, param, v, value, &key);
  }
  if (PyBool_Check(v)) {
    value->kind = ArgKind::Bool;
    value->width = IntWidth::I32;  // push_tuned_value keys every scalar's width
    value->i = v == Py_True;
    key.push(uint64_t(ArgKind::Bool));
    return KeyStatus::Ok;
  }
  if (PyLong_Check(v)) {
    // Subclasses too (IntEnum members): Triton specializes and packs them as the int they are.
    return push_int(kernel, param, v, value, &key);
  }
  if (PyFloat_Check(v)) {
    // Subclasses too (numpy.float64): Triton specializes them as fp32 and packs their value.
    value->kind = ArgKind::Float;
    value->width = IntWidth::I32;
    value->d = PyFloat_AS_DOUBLE(v);
    key.push(uint64_t(ArgKind::Float));
    return KeyStatus::Ok;
  }
  if (v == Py_None) {
    value->kind = ArgKind::None;
    value->u = 0;
    key.push(uint64_t(ArgKind::None));
    return KeyStatus::Ok;
  }
  if ((is_constexpr_wrapper(v) || is_identity_keyed(v)) && push_constexpr(v, &key)) {
    // Triton specializes tl.constexpr objects and jit functions to constexprs wherever they
    // are passed (specialize.cc); they never reach the parameter buffer.
    value->kind = ArgKind::None;
    return KeyStatus::Ok;
  }
  if (PyTuple_CheckExact(v) && depth < kMaxTupleDepth) {
    value->kind = ArgKind::None;  // the tuple itself is never packed; its leaves are
    const Py_ssize_t n = PyTuple_GET_SIZE(v);
    key.push(uint64_t(ArgKind::Tuple) | (uint64_t(uint32_t(n)) << 8));
    const int num_params = int(kernel->state->params.size());
    // Triton specializes tuple elements fully whatever the parameter's do_not_specialize /
    // do_not_specialize_on_alignment (specialize.cc recurses with both on).
    ParamSpec element = param;
    element.specialize = true;
    element.align = true;
    element.tune = 0;
    const int first_slot = num_params + call->num_leaves;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* item = PyTuple_GET_ITEM(v, i);
      ArgValue* leaf = value;  // a nested tuple or a descriptor takes no slot of its own
      if (!PyTuple_CheckExact(item) && Py_TYPE(item) != g_tensor_descriptor_type) {
        const int slot = num_params + call->num_leaves++;
        if (slot >= kMaxArgs) {
          call->fallback_reason = "tuple arguments with more elements than the native buffer holds";
          return KeyStatus::Fallback;
        }
        call->leaf_owner[slot - num_params] = uint16_t(call->current_param);
        leaf = &call->values[slot];
      }
      const KeyStatus status = push_runtime_arg(kernel, element, item, leaf, call, depth + 1);
      if (status != KeyStatus::Ok) {
        return status;
      }
    }
    if (param.tune & kTuneValue) {
      // Named in the autotune key: the values of its scalar elements, which its own words
      // hold only by class (as Triton specializes them).
      for (int slot = first_slot; slot < num_params + call->num_leaves; ++slot) {
        push_tuned_value(call->values[slot], &key);
      }
    }
    return KeyStatus::Ok;
  }
  if (Py_TYPE(v) == g_tensor_descriptor_type && g_tensor_descriptor_type != nullptr) {
    return push_tensor_descriptor(kernel, param, v, value, call);
  }
  if (const KeyStatus status = push_tensor_stand_in(param, v, value, &key);
      status != KeyStatus::Fallback) {
    return status;
  }
  // Tensor subclasses (FakeTensor under torch.compile), named tuples, Gluon's descriptors,
  // other objects: Triton's own path handles them.
  call->fallback_reason = "an argument of a kind the native key does not cover";
  call->fallback_name = param.name;
  call->fallback_value = v;
  return KeyStatus::Fallback;
}

}  // namespace

void prefer_missing_argument_error(KernelObject* kernel, const BoundCall* call) {
  if (!PyErr_ExceptionMatches(PyExc_ValueError) && !PyErr_ExceptionMatches(PyExc_OverflowError)) {
    return;  // a binding error (TypeError): Python reports it first as well
  }
  // The key builder stopped at a value; the parameters after it are still unbound (nullptr)
  // unless the call passed them. The ones before it hold their argument or default.
  const KernelState& st = *kernel->state;
  for (size_t j = 0; j < st.params.size(); ++j) {
    const ParamSpec& p = st.params[j];
    if (call->args[j] == nullptr && p.default_value == nullptr && !(p.tune & kTuneConfigProvided)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "%U missing required argument '%U'", kernel->name, p.name);
      return;
    }
  }
}

void set_tensor_descriptor_type(PyObject* type) {
  if (type != nullptr && !PyType_Check(type)) {
    return;
  }
  Py_XINCREF(type);
  Py_XDECREF(reinterpret_cast<PyObject*>(g_tensor_descriptor_type));
  g_tensor_descriptor_type = reinterpret_cast<PyTypeObject*>(type);
  if (g_desc_names.base == nullptr) {
    g_desc_names = {
        PyUnicode_InternFromString("base"),    PyUnicode_InternFromString("shape"),
        PyUnicode_InternFromString("strides"), PyUnicode_InternFromString("block_shape"),
        PyUnicode_InternFromString("padding"), PyUnicode_InternFromString("round_f32_to_tf32"),
        PyUnicode_InternFromString("nan")};
  }
}

void set_constexpr_types(PyObject* constexpr_type, PyObject* identity_types) {
  Py_XINCREF(constexpr_type);
  Py_XINCREF(identity_types);
  Py_XSETREF(g_constexpr_type, constexpr_type);
  Py_XSETREF(g_identity_types, identity_types);
  if (g_value_name == nullptr) {
    g_value_name = PyUnicode_InternFromString("value");
  }
}

// Whether an int option value fits a half of an OptionIntPair word.
constexpr bool pairable_option(long long value) { return value >= 0 && value < (1LL << 20); }

// The compile options' key words made from the values (`kw_values`, in kwnames order), kept
// for the next call, and moved to the front of the key (out of line: a call site passing the
// kept values never gets here).
[[gnu::noinline]] KeyStatus make_option_words(KernelObject* kernel, PyObject* const* kw_values,
                                              BoundCall* call) {
  SpecializationKey& key = call->key;
  const int first_option_word = key.size;
  for (int j = 0; j < call->num_set_options; ++j) {
    const int i = call->set_options[j];
    PyObject* option = call->options[i];
    long long small;
    if (PyLong_CheckExact(option) && compact_int(option, &small)) {
      const int following = j + 1 < call->num_set_options ? call->set_options[j + 1] : -1;
      long long next;
      if (following >= 0 && pairable_option(small) && PyLong_CheckExact(call->options[following]) &&
          compact_int(call->options[following], &next) && pairable_option(next)) {
        key.push(uint64_t(ArgKind::OptionIntPair) | (uint64_t(i) << 8) | (uint64_t(small) << 16) |
                 (uint64_t(following) << 36) | (uint64_t(next) << 44));
        ++j;
        continue;
      }
      key.push(uint64_t(ArgKind::OptionInt) | (uint64_t(i) << 8) | (uint64_t(small) << 16));
      continue;
    }
    key.push(uint64_t(ArgKind::Option) | (uint64_t(i) << 8));
    if (!push_constexpr(option, &key)) {
      call->fallback_reason = "a compile option value of a kind the native key does not cover";
      call->fallback_name = kernel->state->option_names[size_t(i)];
      call->fallback_value = call->options[i];
      return KeyStatus::Fallback;
    }
  }
  keep_option_words(kernel->state->keywords, call->keyword_generation, kw_values, key,
                    first_option_word);
  if (!key.overflowed) {
    // The options' words lead the key, where a call passing the kept values pushes them.
    std::rotate(key.words, key.words + first_option_word, key.words + key.size);
  }
  return KeyStatus::Ok;
}

// The key words and captured value of parameter `i`, whose argument is `v` (nullptr when the
// call left it out: its default, or the tuned config's value), stored in call->args[i].
// `kPositional`: `v` is a positional argument, never nullptr.
template <bool kPositional>
[[gnu::always_inline]] inline KeyStatus key_param(KernelObject* kernel, const KernelState& st,
                                                  int i, PyObject* v, BoundCall* call) {
  SpecializationKey& key = call->key;
  const ParamSpec& param = st.params[i];
  ArgValue* value = &call->values[i];
  if (!kPositional && v == nullptr && (param.tune & kTuneConfigProvided)) {
    // The record's tuned config supplies it (LaunchRecord::tuned_args); a call that passes it
    // keys differently and reaches the miss path, which reports the conflict.
    value->kind = ArgKind::None;
    key.push(uint64_t(ArgKind::TunedAbsent));
    return KeyStatus::Ok;
  }
  if (!kPositional && v == nullptr) {
    v = param.default_value;
    if (v == nullptr) {
      if (param.tune & kTuneMayBeProvided) {
        call->fallback_reason =
            "a required argument left out, which no declared config sets (a pruned one may)";
        return KeyStatus::Fallback;
      }
      PyErr_Format(PyExc_TypeError, "%U missing required argument '%U'", kernel->name, param.name);
      return KeyStatus::Error;
    }
    if (C10_UNLIKELY(param.tune & kTuneValue)) {
      key.push(uint64_t(ArgKind::TuneDefaulted));
    }
  }
  call->args[i] = v;
  if (param.is_constexpr) {
    value->kind = ArgKind::None;
    if (!push_constexpr_param(v, &key)) {
      call->fallback_reason = "a constexpr value of a kind the native key does not cover";
      call->fallback_name = param.name;
      call->fallback_value = v;
      return KeyStatus::Fallback;
    }
    return KeyStatus::Ok;
  }
  // The common kinds inline (the hot path); constexpr objects, tuples and the fallback out
  // of line.
  KeyStatus status;
  if (THPVariable_CheckExact(v)) {
    status = push_tensor(kernel, param, v, value, &key);
  } else if (PyLong_CheckExact(v)) {
    status = push_int(kernel, param, v, value, &key);
  } else {
    call->current_param = i;  // the owner of any leaves (tuple elements, descriptor fields)
    status = push_runtime_arg(kernel, param, v, value, call, 0);
  }
  if (status == KeyStatus::Ok && C10_UNLIKELY(param.tune & kTuneValue) &&
      value->kind != ArgKind::Tensor) {
    push_tuned_value(*value, &key);
  }
  return status;
}

KeyStatus reread_tensor_addresses(KernelObject* kernel, BoundCall* call, bool leaves) {
  if (leaves && call->num_leaves > 0) {
    return KeyStatus::Fallback;  // leaves keep no object to read again: the caller rebinds
  }
  const KernelState& st = *kernel->state;
  for (size_t i = 0; i < st.params.size(); ++i) {
    ArgValue& value = call->values[i];
    if (value.kind != ArgKind::Tensor) {
      continue;
    }
    uint64_t ptr = 0;
    if (!THPVariable_CheckExact(call->args[i])) {  // an object standing for a tensor
      if (!stand_in_address(call->args[i], &ptr)) {
        return KeyStatus::Error;
      }
      value.u = ptr;
      continue;
    }
    const at::Tensor& tensor = THPVariable_Unpack(call->args[i]);
    if (tensor_address(kernel, st.params[i], tensor, tensor.device(), &ptr) != KeyStatus::Ok) {
      return KeyStatus::Error;
    }
    value.u = ptr;
  }
  return KeyStatus::Ok;
}

KeyStatus bind_and_build_key(KernelObject* kernel, PyObject* const* args, Py_ssize_t nargs,
                             PyObject* kwnames, BoundCall* call) {
  KernelState& st = *kernel->state;
  const int num_params = int(st.params.size());
  if (nargs > num_params) {
    PyErr_Format(PyExc_TypeError, "%U takes %d arguments but %zd were given", kernel->name,
                 num_params, nargs);
    return KeyStatus::Error;
  }
  if (kwnames == nullptr && nargs < num_params) {
    // Left out. The usual one (a tuned config's parameter) is cleared inline, not through a
    // memset call.
    call->args[nargs] = nullptr;
    for (int i = int(nargs) + 1; i < num_params; ++i) {
      call->args[i] = nullptr;
    }
  }
  SpecializationKey& key = call->key;
  key.size = 0;
  key.overflowed = false;
  call->num_leaves = 0;
  call->num_set_options = 0;
  if (kwnames != nullptr) {
    for (int i = int(nargs); i < num_params; ++i) {
      call->args[i] = nullptr;  // bound below by keyword, or left out
    }
    const KeywordBinding& binding = st.keywords;
    if ((kwnames != binding.kwnames || nargs != binding.nargs) &&
        !bind_keywords(kernel, kwnames, nargs, call)) {
      return call->fallback_reason != nullptr ? KeyStatus::Fallback : KeyStatus::Error;
    }
    const uint64_t generation = binding.generation;
    call->keyword_generation = generation;
    const int16_t* slots = binding.slots.data();
    PyObject* const* kept = binding.option_values.data();
    const Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
    bool same_options = binding.options_cached;
    if (binding.all_options) {
      // Straight-line compares for the usual one to four options.
      PyObject* const* given = args + nargs;
      switch (nkw) {
        case 4:
          same_options &= given[3] == kept[3];
          [[fallthrough]];
        case 3:
          same_options &= given[2] == kept[2];
          [[fallthrough]];
        case 2:
          same_options &= given[1] == kept[1];
          [[fallthrough]];
        case 1:
          same_options &= given[0] == kept[0];
          [[fallthrough]];
        case 0:
          break;
        default:
          for (Py_ssize_t k = 0; k < nkw; ++k) {
            same_options &= given[k] == kept[k];
          }
      }
    } else {
      for (Py_ssize_t k = 0; k < nkw; ++k) {
        PyObject* value = args[nargs + k];
        const int slot = slots[k];
        if (slot >= 0) {
          call->args[slot] = value;
          continue;
        }
        same_options &= value == kept[k];
      }
    }
    if (same_options) {
      // The kept words, pushed before any value is read: a value's key read can run Python
      // that calls this kernel with other keywords and rebinds the binding.
      for (int k = 0; k < binding.num_option_words; ++k) {
        key.push(binding.option_words[k]);
      }
    } else {
      for (Py_ssize_t k = 0; k < nkw; ++k) {
        const int slot = slots[k];
        if (slot >= 0) {
          continue;
        }
        const int option = -1 - slot;
        // Keep the given options sorted by index so keyword order never changes the key
        // (insertion into a list that is almost always 0-2 long).
        int at = call->num_set_options++;
        while (at > 0 && call->set_options[at - 1] > option) {
          call->set_options[at] = call->set_options[at - 1];
          --at;
        }
        call->set_options[at] = option;
        call->options[option] = args[nargs + k];
      }
    }
  }

  // Positional arguments are read in place; the others from the slots the keywords filled.
  KeyStatus status = KeyStatus::Ok;
  int i = 0;
  for (; i < nargs && status == KeyStatus::Ok; ++i) {
    status = key_param<true>(kernel, st, i, args[i], call);
  }
  for (; i < num_params && status == KeyStatus::Ok; ++i) {
    status = key_param<false>(kernel, st, i, call->args[i], call);
  }
  if (status != KeyStatus::Ok) {
    // The error reports (prefer_missing_argument_error) read which parameters the call bound.
    for (int j = 0; j < nargs; ++j) {
      call->args[j] = args[j];
    }
    return status;
  }
  if (kwnames != nullptr && call->num_set_options > 0) {
    const KeyStatus status = make_option_words(kernel, args + nargs, call);
    if (status != KeyStatus::Ok) {
      return status;
    }
  }
  if (key.overflowed) {
    call->fallback_reason = "the specialization key is longer than the native buffer";
    return KeyStatus::Fallback;
  }
  return KeyStatus::Ok;
}

void clear_option_words(KeywordBinding* binding) {
  for (PyObject*& v : binding->option_values) {
    Py_CLEAR(v);
  }
  binding->num_option_words = 0;
  binding->options_cached = false;
  ++binding->generation;
}

}  // namespace fastkernel
