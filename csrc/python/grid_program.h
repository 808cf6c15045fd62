// Callable grids run as native programs: a grid function that is one side-effect-free
// expression over ints (what python/fastkernel/_grid_program.py translates, from the function's
// bytecode) is evaluated here on each call, reading the same arguments, closure cells and
// globals the function would read, without calling it.
#pragma once

#include <Python.h>

#include "fastkernel/trampoline.h"
#include "kernel_object.h"

namespace fastkernel {

/// The grid `fn` (a Python function) returns for this call, computed natively into `out`. True
/// when computed; false when the function has to be called instead (its code has no native
/// program, or a value is not an exact int in 64 bits, a name is missing, a callee is not one
/// of the known pure functions, a division is by zero or the arithmetic overflows). Never sets
/// a Python exception. Each grid dimension is range-checked by the caller.
bool eval_grid_program(KernelObject* kernel, PyObject* fn, const BoundCall& call, long long dims[3],
                       int* num_dims);

/// Drops the kernel's cached grid programs (its parameters changed, or it is going away).
void clear_grid_programs(KernelState* state);

/// Sets what grid programs need (once, at import): `compiler(code, param_names)` returning the
/// steps or None (fastkernel._grid_program.compile_grid), and the callees a program may call by
/// identity: triton.cdiv, triton.next_power_of_2, builtins max and min.
void set_grid_program_support(PyObject* compiler, PyObject* cdiv, PyObject* next_power_of_2,
                              PyObject* max, PyObject* min);

/// The step names a compiler may emit (the order of GridOp), for the Python side's tests.
PyObject* grid_program_step_names();

}  // namespace fastkernel
