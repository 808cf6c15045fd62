// A native host-call slot for Triton's ConstexprFunction (triton.cdiv, triton.next_power_of_2,
// every @triton.constexpr_function): installed by fastkernel.patch() or
// fastkernel.patch_host_helpers().
#pragma once

#include <Python.h>

#include <climits>

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

/// Python's `a // b` on ints: true with the quotient (rounded toward negative infinity) in
/// `out`; false when b == 0 or the quotient does not fit (LLONG_MIN // -1).
inline bool python_floor_div(long long a, long long b, long long* out) {
  if (b == 0 || (a == LLONG_MIN && b == -1)) {
    return false;
  }
  long long q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) {
    --q;
  }
  *out = q;
  return true;
}

/// Python's `a % b` on ints: true with the remainder (of the sign of b) in `out`; false when
/// b == 0 or C++ leaves it undefined (LLONG_MIN % -1).
inline bool python_floor_mod(long long a, long long b, long long* out) {
  if (b == 0 || (a == LLONG_MIN && b == -1)) {
    return false;
  }
  long long r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) {
    r += b;
  }
  *out = r;
  return true;
}

/// triton.cdiv's body, `(x + y - 1) // y` (triton/__init__.py), on ints: true with the result
/// in `out`, false where Python's arithmetic has to decide (y == 0, or a result past 64 bits).
inline bool triton_cdiv(long long x, long long y, long long* out) {
  long long a;
  return !__builtin_add_overflow(x, y, &a) && !__builtin_sub_overflow(a, 1, &a) &&
         python_floor_div(a, y, out);
}

/// triton.next_power_of_2's body (triton/__init__.py: the smallest power of 2 >= n) for
/// 1 <= n < 2**62: true with the result in `out`; false for other n (Python decides).
bool triton_next_power_of_2(long long n, long long* out);

}  // namespace fastkernel
