// Crossing from C++ into Python in pybind11 functions: native exceptions become fastkernel's
// typed Python exceptions (CudaError with the CUDA error's name and number,
// DriverUnavailableError), and the kernel-object argument check those functions share.
#pragma once

#include <pybind11/pybind11.h>

#include "kernel_object.h"

namespace fastkernel {

/// The KernelObject behind `obj`; pybind11::type_error when it is not a fastkernel kernel.
inline KernelObject* as_kernel(pybind11::handle obj) {
  if (!PyObject_TypeCheck(obj.ptr(), &KernelType)) {
    throw pybind11::type_error("expected a fastkernel kernel object");
  }
  return reinterpret_cast<KernelObject*>(obj.ptr());
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
  } catch (...) {
    set_python_error_from_current_exception(nullptr);
    throw pybind11::error_already_set();
  }
}

}  // namespace fastkernel
