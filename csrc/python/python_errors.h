// Crossing from C++ into Python in pybind11 functions: native exceptions become fastkernel's
// typed Python exceptions (CudaError with the CUDA error's name and number,
// DriverUnavailableError), the kernel-object argument check those functions share, and the
// definition of the kernel type's methods.
#pragma once

#include <cxxabi.h>
#include <pybind11/pybind11.h>

#include <utility>

#include "kernel_object.h"

namespace fastkernel {

/// The KernelObject behind `obj`; pybind11::type_error when it is not a fastkernel kernel.
inline KernelObject* as_kernel(pybind11::handle obj) {
  if (!PyObject_TypeCheck(obj.ptr(), &KernelType)) {
    throw pybind11::type_error("expected a fastkernel kernel object");
  }
  return reinterpret_cast<KernelObject*>(obj.ptr());
}

/// Adds a method to the native kernel type (`_C.Kernel`, a static type, so its dict is written
/// directly and the type's method cache invalidated). `fn` takes the kernel as a pybind11
/// handle first; `extra` are pybind11 attributes (arguments, docstring). Call at module init.
template <typename Fn, typename... Extra>
void def_kernel_method(const char* name, Fn&& fn, const Extra&... extra) {
  const pybind11::handle type(reinterpret_cast<PyObject*>(&KernelType));
  pybind11::cpp_function method(std::forward<Fn>(fn), pybind11::name(name),
                                pybind11::is_method(type), extra...);
  if (PyDict_SetItemString(KernelType.tp_dict, name, method.ptr()) < 0) {
    throw pybind11::error_already_set();
  }
  PyType_Modified(&KernelType);
}

/// Runs `fn`, translating native exceptions into fastkernel's Python exception types;
/// pybind11's own exceptions pass through unchanged.
template <typename Fn>
auto with_python_errors(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (pybind11::error_already_set&) {
    throw;
  } catch (pybind11::builtin_exception&) {
    throw;
  } catch (abi::__forced_unwind&) {
    throw;  // a thread ended by pthread_exit (CPython at exit): its unwinding must go on
  } catch (...) {
    set_python_error_from_current_exception(nullptr);
    throw pybind11::error_already_set();
  }
}

}  // namespace fastkernel
