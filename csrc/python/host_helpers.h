// A native host-call slot for Triton's ConstexprFunction (triton.cdiv, triton.next_power_of_2,
// every @triton.constexpr_function): installed by fastkernel.patch() or
// fastkernel.patch_host_helpers().
#pragma once

#include <Python.h>

namespace fastkernel {

/// Installs the native `__call__` on `constexpr_function_type` (Triton's ConstexprFunction).
/// `constexpr_type` is triton.language.constexpr, `triton_call` Triton's own __call__ (taken
/// for every call that is not a plain host call), `cdiv` and `next_power_of_2` Triton's (their
/// bodies are computed natively on small exact ints), `call_model` a native type whose `__call__`
/// slot wrapper lends its wrapperbase. The caller restores the original attribute to undo it.
/// False with an exception set on failure.
bool install_host_helpers(PyObject* constexpr_function_type, PyObject* constexpr_type,
                          PyObject* triton_call, PyObject* cdiv, PyObject* next_power_of_2,
                          PyTypeObject* call_model);

}  // namespace fastkernel
