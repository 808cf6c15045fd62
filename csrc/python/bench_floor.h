// The benchmark floor: a C++ loop of raw cuLaunchKernel calls on a cubin, built with the project
// so the dispatch benchmark compares fastkernel with the driver's own cost in the same process.
#pragma once

#include <pybind11/pybind11.h>

namespace fastkernel {

/// Adds `_C.bench_floor(...)` to the extension module.
void register_bench_floor(pybind11::module_& m);

}  // namespace fastkernel
