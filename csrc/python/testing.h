// The test-only `_testing` submodule of `fastkernel._C` (builds with -DFASTKERNEL_TESTING=ON).
#pragma once

#include <pybind11/pybind11.h>

namespace fastkernel {

/// Adds the `_testing` submodule to the extension module `m`.
void register_testing(pybind11::module_& m);

}  // namespace fastkernel
