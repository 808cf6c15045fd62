// The patch hook behind fastkernel.patch(): Triton's own JITFunction.__getitem__ replaced, at the
// type's slot, by a native subscript that serves every Triton kernel in the process through a
// fastkernel dispatch object (a Kernel) created on the kernel's first launch.
#pragma once

#include <Python.h>

#include "kernel_object.h"

namespace fastkernel {

/// A slot wrapper (wrapper_descriptor) on `type` for the slot behind `name`, wrapping the C
/// function `fn`: assigned as `type.<name>`, CPython's update_one_slot puts `fn` itself into the
/// slot of `type` and of its subclasses that inherit it. The slot's wrapperbase is borrowed from
/// `model`'s own wrapper of that name (a native type defining the slot). New reference, or
/// nullptr with an exception set.
PyObject* new_slot_wrapper(PyObject* type, PyTypeObject* model, const char* name, void* fn);

/// Installs the native subscript as `jit_type.__getitem__` (called once per served type: Triton's
/// JITFunction and Autotuner; the last factory and triton_getitem given serve all of them).
/// `factory(obj)` returns the dispatch Kernel of a kernel object (keeping it alive itself), None
/// when that object keeps Triton's own path, or False when every instance of its type does (a
/// subclass with its own run; remembered until uninstall_patch). `triton_getitem(obj, grid)` is
/// Triton's KernelInterface.__getitem__, used for those. `type_served(type)` says whether a
/// type's `run` is still the one the patch serves (another library may assign its own on the
/// class, for a while): asked before a type's dispatches are used, and again only after the
/// type changed (its tp_version_tag, which any assignment on the class or a base resets); while
/// it says no, `obj[grid]` takes triton_getitem, which calls that run. False with an exception
/// set on failure.
bool install_patch(PyObject* jit_type, PyObject* factory, PyObject* triton_getitem,
                   PyObject* type_served);

/// Forgets every dispatch and the callables given to install_patch (the caller restores the
/// type's attribute).
void uninstall_patch();

/// Forgets the types the factory refused as a whole: their instances ask the factory again at
/// their next launch (a subclass with its own run that was registered since).
void forget_refused_types();

/// `jit[grid]` under the patch: the dispatch's bound launch, or Triton's proxy (Triton's
/// `__getitem__`, which calls `run`) while a `run` another library assigned is on `jit`'s class
/// or on one the dispatch launches through underneath.
PyObject* patched_subscript(PyObject* jit, PyObject* grid);

/// The dispatch Kernel serving `jit` (created through the factory on first use), or Py_None
/// when it keeps Triton's path, as it does while a `run` another library assigned is on a class
/// it launches through underneath (KernelObject::under_types). New reference; nullptr with an
/// exception set on failure.
PyObject* patched_dispatch(PyObject* jit);

/// Whether `type`'s mp_subscript slot is the native patched subscript (no Python in between).
bool patch_slot_is_native(PyTypeObject* type);

/// Called when a dispatch Kernel is deallocated: drops its entry.
void forget_patched_dispatch(KernelObject* kernel);

/// Drops the entry of `jit` (if any): its next launch asks the factory again, which may keep
/// Triton's path for it (a `run` assigned on the instance) or give back the same dispatch.
void drop_patched_dispatch(PyObject* jit);

/// `_C.DispatchInput(name, on_change)`: a data descriptor for an instance attribute a native
/// dispatch is built from (fastkernel.patch installs it on Triton's Autotuner and Heuristics).
/// Read and stored in the instance __dict__ as without it; a store or delete then calls
/// `on_change(obj)`. Native, so that the reads Triton's own Python makes on every call
/// (Autotuner.run reads self.fn, self.keys, self.configs, self.cache) stay a dict lookup.
extern PyTypeObject DispatchInputType;

}  // namespace fastkernel
