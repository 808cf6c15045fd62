// Host calls of Triton's constexpr functions (`triton.cdiv`, `triton.next_power_of_2`, any
// `@triton.constexpr_function`) without ConstexprFunction.__call__'s per-call Python: on a host
// call no argument is a tl.constexpr and no `_semantic` is passed, so Triton's __call__
// (runtime/jit.py) reduces to `self.fn(*args, **kwargs)`; that is what the native slot does.
// Every other call (constexpr arguments, a `_semantic` keyword from Triton's code generator)
// goes to Triton's own __call__, unchanged.
#include "host_helpers.h"

#include "patch_hook.h"

namespace fastkernel {
namespace {

PyObject* g_constexpr_type = nullptr;   // triton.language.constexpr
PyObject* g_triton_call = nullptr;      // Triton's ConstexprFunction.__call__
PyObject* g_cdiv = nullptr;             // triton.cdiv (a ConstexprFunction)
PyObject* g_next_power_of_2 = nullptr;  // triton.next_power_of_2
PyObject* g_str_fn = nullptr;
PyObject* g_str_semantic = nullptr;

bool is_constexpr(PyObject* o) {
  return PyObject_TypeCheck(o, reinterpret_cast<PyTypeObject*>(g_constexpr_type));
}

// Whether Triton's __call__ would do more than call self.fn with the same arguments.
bool needs_triton_call(PyObject* args, PyObject* kwargs) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); ++i) {
    if (is_constexpr(PyTuple_GET_ITEM(args, i))) {
      return true;
    }
  }
  if (kwargs != nullptr) {
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(kwargs, &pos, &key, &value)) {
      if (is_constexpr(value)) {
        return true;
      }
      const int semantic = PyUnicode_Compare(key, g_str_semantic);
      if (semantic == 0 || (semantic == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return true;
      }
    }
  }
  return false;
}

// Values whose arithmetic below cannot overflow 64 bits, so it equals Python's on ints.
constexpr long long kSmall = 1ll << 62;

bool small_int(PyObject* o, long long* out) {
  if (!PyLong_CheckExact(o)) {
    return false;
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  *out = v;
  return v > -kSmall && v < kSmall;
}

// triton.cdiv's and triton.next_power_of_2's bodies on small exact ints, computed natively;
// nullptr (no exception) when the call is not of that form.
PyObject* known_helper(PyObject* self, PyObject* args, PyObject* kwargs) {
  if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) {
    return nullptr;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  long long x, y, result;
  if (self == g_cdiv && n == 2) {
    if (!small_int(PyTuple_GET_ITEM(args, 0), &x) || !small_int(PyTuple_GET_ITEM(args, 1), &y) ||
        !triton_cdiv(x, y, &result)) {
      return nullptr;  // Python's arithmetic (and its ZeroDivisionError) in Triton's body
    }
    return PyLong_FromLongLong(result);
  }
  if (self == g_next_power_of_2 && n == 1) {
    if (!small_int(PyTuple_GET_ITEM(args, 0), &x) || !triton_next_power_of_2(x, &result)) {
      return nullptr;
    }
    return PyLong_FromLongLong(result);
  }
  return nullptr;
}

PyObject* constexpr_function_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  if (PyObject* known = known_helper(self, args, kwargs)) {
    return known;
  }
  if (needs_triton_call(args, kwargs)) {
    const Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject* full = PyTuple_New(n + 1);
    if (full == nullptr) {
      return nullptr;
    }
    PyTuple_SET_ITEM(full, 0, Py_NewRef(self));
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyTuple_SET_ITEM(full, i + 1, Py_NewRef(PyTuple_GET_ITEM(args, i)));
    }
    PyObject* result = PyObject_Call(g_triton_call, full, kwargs);
    Py_DECREF(full);
    return result;
  }
  PyObject* fn = PyObject_GetAttr(self, g_str_fn);
  if (fn == nullptr) {
    return nullptr;
  }
  PyObject* result = PyObject_Call(fn, args, kwargs);
  Py_DECREF(fn);
  return result;
}

}  // namespace

bool triton_next_power_of_2(long long n, long long* out) {
  if (n < 1 || n >= kSmall) {
    return false;
  }
  long long p = 1;
  while (p < n) {
    p <<= 1;
  }
  *out = p;
  return true;
}

bool install_host_helpers(PyObject* constexpr_function_type, PyObject* constexpr_type,
                          PyObject* triton_call, PyObject* cdiv, PyObject* next_power_of_2,
                          PyTypeObject* call_model) {
  if (!PyType_Check(constexpr_type)) {
    PyErr_SetString(PyExc_TypeError, "fastkernel: constexpr_type must be a type");
    return false;
  }
  if (g_str_fn == nullptr) {
    g_str_fn = PyUnicode_InternFromString("fn");
    g_str_semantic = PyUnicode_InternFromString("_semantic");
    if (g_str_fn == nullptr || g_str_semantic == nullptr) {
      return false;
    }
  }
  PyObject* descr = new_slot_wrapper(constexpr_function_type, call_model, "__call__",
                                     reinterpret_cast<void*>(&constexpr_function_call));
  if (descr == nullptr) {
    return false;
  }
  Py_XSETREF(g_constexpr_type, Py_NewRef(constexpr_type));
  Py_XSETREF(g_triton_call, Py_NewRef(triton_call));
  Py_XSETREF(g_cdiv, Py_NewRef(cdiv));
  Py_XSETREF(g_next_power_of_2, Py_NewRef(next_power_of_2));
  const int rc = PyObject_SetAttrString(constexpr_function_type, "__call__", descr);
  Py_DECREF(descr);
  return rc == 0;
}

}  // namespace fastkernel
