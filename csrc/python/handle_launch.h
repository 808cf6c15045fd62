// Native subscripts for kept compiled-kernel handles: `compiled[grid]` of a Triton CompiledKernel
// under the patch, and `handle[grid]` of what a @fastkernel kernel's warmup returns
// (fastkernel.kernel.WarmupHandle). The Python layer makes a handle's launcher (a Kernel:
// fastkernel.kernel.CompiledLaunch) on the handle's first launch and gives it here; later
// launches of the handle with a grid of three dims, while no launch hook is set, are one C call
// into the launcher's own subscript, with no Python frame. Everything else (a first launch,
// another grid, a launch hook set, a handle without a launcher) takes the Python path given at
// install, which counts fallbacks and makes launchers.
#pragma once

#include <Python.h>

namespace fastkernel {

/// Remembers `launcher` (a Kernel) as the native launch of the binary `compiled` holds, until
/// `compiled` is freed (a callback of a weak reference to it drops the entry) or
/// forget_handle_launches(). False with an exception set when `launcher` is not a Kernel or
/// `compiled` cannot be weakly referenced.
bool remember_handle_launch(PyObject* compiled, PyObject* launcher);

/// The launcher remembered for `compiled` (new reference), or Py_None (new reference).
PyObject* handle_launcher(PyObject* compiled);

/// Forgets every remembered launcher (their next launches take the Python path again).
void forget_handle_launches();

/// The number of remembered launchers.
size_t num_handle_launches();

/// Installs the native handle subscript as `type.__getitem__` (a slot wrapper). With `attr`
/// nullptr the instances are the handles (Triton's CompiledKernel, fastkernel's CachedKernel);
/// else the handle is the instance's attribute `attr` (WarmupHandle.compiled: one such type is
/// served). `slow(self, grid)` serves what the native path does not take; installing on a type
/// again replaces its `slow`. The caller restores the type's attribute to undo it. False with an
/// exception set on failure.
bool install_handle_subscript(PyObject* type, PyObject* attr, PyObject* slow);

/// The type of new_run_launcher's objects (readied by the module).
extern PyTypeObject RunLauncherType;

/// What `compiled.run` gives under the patch for a handle with a launcher: an object called as
/// Triton's launcher is (`run(gridX, gridY, gridZ, stream, function, kernel_metadata,
/// launch_metadata, enter_hook, exit_hook, *args)`: CudaLauncher.__call__,
/// triton/backends/nvidia/driver.py) that launches the handle's binary through `launcher` (its
/// CompiledLaunch) when Triton's launcher would launch exactly that: the handle's `function`
/// and `packed_metadata`, no launch hook given (None or an empty `hook_chain_type`) or set in
/// the knobs, on torch's current stream. Any other call goes to `triton_run` (Triton's own
/// launcher object of the handle), counted through `on_fallback(reason)`. The object keeps
/// `handle` alive, so the launcher's own references to it (and to its kernel) hold while it is
/// called. New reference, or nullptr with TypeError for arguments of the wrong kind.
PyObject* new_run_launcher(PyObject* handle, PyObject* launcher, PyObject* triton_run,
                           PyObject* function, PyObject* packed_metadata, PyObject* hook_chain_type,
                           PyObject* on_fallback);

}  // namespace fastkernel
