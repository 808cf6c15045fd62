// Registration of a compiled specialization from Python: the typed launch facts
// (`_C.LaunchFacts`, `_C.TensorMapFacts`, the core's structs), the loaded record a
// compile-on-miss handler returns (`_C.LaunchRecord`) and its insertion into a kernel's table.
#pragma once

#include <pybind11/pybind11.h>

#include "kernel_object.h"

namespace fastkernel {

/// Adds LaunchFacts, TensorMapFacts and LaunchRecord to the extension module `m`, and the
/// `_insert` method to the kernel type.
void register_registration(pybind11::module_& m);

/// The release function of records registered from Python: their user_data, tuned_args and
/// published are owned references to Python objects (or nullptr).
void release_python_reference(void* object);

/// Visits (tp_traverse) the Python objects a record registered from Python holds; a record
/// released otherwise holds none.
int visit_record_references(const LaunchRecord& rec, visitproc visit, void* arg);

/// When `obj` is a `_C.LaunchRecord` (`*is_record` set): inserts it into `kernel`'s table under
/// `key` and returns the record now registered there, or nullptr with a Python exception set
/// (a record already inserted, tuned_args of the wrong length). Otherwise returns nullptr
/// with `*is_record` false and no exception.
const LaunchRecord* insert_returned_record(KernelObject* kernel, const SpecializationKey& key,
                                           PyObject* obj, bool* is_record);

}  // namespace fastkernel
