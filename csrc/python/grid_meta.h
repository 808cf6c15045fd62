// What a callable grid receives: a read-only mapping of every declared parameter to its
// argument in the call, as Triton's JITFunction.run passes its bound_args dict, without building
// a dict per call.
#pragma once

#include <Python.h>

#include "kernel_object.h"

namespace fastkernel {

extern PyTypeObject GridMetaType;

/// Calls the callable grid `grid` with the call's bound arguments as a mapping (new reference
/// to its result, or nullptr with an exception set). The mapping reads `call.args` in place
/// while `grid` runs; a grid function that keeps it past the call gets a snapshot (a dict of
/// its own, taken when the call returns), so it never reads a later call's arguments.
PyObject* call_grid(KernelObject* kernel, PyObject* grid, const BoundCall& call);

/// Drops the kernel's cached mapping (its parameters changed, or the kernel is going away).
void clear_grid_meta(KernelState* state);

}  // namespace fastkernel
