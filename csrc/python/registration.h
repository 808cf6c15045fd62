// Registration of a compiled specialization from Python: the typed launch facts
// (`_C.LaunchFacts`, `_C.TensorMapFacts`, the core's structs) and `_C.register`.
#pragma once

#include <pybind11/pybind11.h>

namespace fastkernel {

/// Adds LaunchFacts, TensorMapFacts and register(...) to the extension module `m`.
void register_registration(pybind11::module_& m);

}  // namespace fastkernel
