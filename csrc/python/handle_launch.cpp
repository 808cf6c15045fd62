// Native subscripts for kept compiled-kernel handles (see handle_launch.h).
//
// A remembered launcher is keyed by the handle's address. The entry holds a weak reference to
// the handle whose callback erases it while the handle is being freed, before its memory can be
// reused by another object; a lookup also checks that the weak reference still points at the
// handle, so an address is never matched to an entry made for an object that no longer exists.
#include "handle_launch.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernel_object.h"
#include "knob_watch.h"
#include "launch_context.h"
#include "patch_hook.h"

namespace fastkernel {
namespace {

struct HandleLaunch {
  PyObject* ref = nullptr;           // owned weak reference to the handle
  KernelObject* launcher = nullptr;  // owned
};

// Handle address -> its launcher; the last one found is cached in front of the map.
std::unordered_map<PyObject*, HandleLaunch>& handle_launches() {
  static auto* map = new std::unordered_map<PyObject*, HandleLaunch>();
  return *map;
}
PyObject* g_last_handle = nullptr;
HandleLaunch g_last_launch;  // borrowed copies of the map's entry for g_last_handle

// The types whose instances are handles (Triton's CompiledKernel, fastkernel's CachedKernel),
// each with its slow(handle, grid); owned.
std::vector<std::pair<PyObject*, PyObject*>>& handle_types() {
  static auto* types = new std::vector<std::pair<PyObject*, PyObject*>>();
  return *types;
}
PyObject* g_holder_slow = nullptr;  // slow(holder, grid) for WarmupHandle
PyObject* g_holder_attr = nullptr;  // the holder's attribute naming its handle

// Whether the weak reference `ref` still refers to `obj` (an object that was freed leaves it
// referring to None).
inline bool refers_to(PyObject* ref, PyObject* obj) {
  return reinterpret_cast<PyWeakReference*>(ref)->wr_object == obj;
}

// Clears the cache in front of the map when it holds `handle`'s entry.
void forget_last(PyObject* handle) {
  if (g_last_handle == handle) {
    g_last_handle = nullptr;
    g_last_launch = HandleLaunch{};
  }
}

// Releases an entry no longer in the map. Last in any change: releasing the launcher releases
// its records, which may run Python.
void release(const HandleLaunch& entry) {
  Py_DECREF(entry.ref);
  Py_DECREF(reinterpret_cast<PyObject*>(entry.launcher));
}

void erase(std::unordered_map<PyObject*, HandleLaunch>::iterator it) {
  const HandleLaunch entry = it->second;
  forget_last(it->first);
  handle_launches().erase(it);
  release(entry);
}

// The weak reference's callback: `key` is the handle's address (an int), `ref` the entry's weak
// reference, whose handle is being freed.
PyObject* forget_handle(PyObject* key, PyObject* ref) {
  auto* handle = static_cast<PyObject*>(PyLong_AsVoidPtr(key));
  if (handle == nullptr && PyErr_Occurred()) {
    return nullptr;
  }
  auto& map = handle_launches();
  auto it = map.find(handle);
  if (it != map.end() && it->second.ref == ref) {
    erase(it);
  }
  Py_RETURN_NONE;
}

PyMethodDef g_forget_def = {"forget_handle_launch", forget_handle, METH_O,
                            "Drops the launcher of a freed compiled-kernel handle."};

[[gnu::noinline]] KernelObject* find_launcher_slow(PyObject* handle) {
  auto& map = handle_launches();
  auto it = map.find(handle);
  if (it == map.end() || !refers_to(it->second.ref, handle)) {
    return nullptr;
  }
  g_last_handle = handle;
  g_last_launch = it->second;
  return it->second.launcher;
}

// The launcher remembered for `handle`, or nullptr.
inline KernelObject* find_launcher(PyObject* handle) {
  if (handle == g_last_handle && refers_to(g_last_launch.ref, handle)) {
    return g_last_launch.launcher;
  }
  return find_launcher_slow(handle);
}

// The native launch of `handle` on `grid` (a new bound launch), Py_None (borrowed) when it takes
// the Python path, or nullptr with an exception set.
inline PyObject* native_handle_subscript(PyObject* handle, PyObject* grid) {
  if (!((PyTuple_CheckExact(grid) || PyList_CheckExact(grid)) && Py_SIZE(grid) == 3)) {
    return Py_None;
  }
  // The knobs first: reading them can run Python (a refresh), which may drop the launcher.
  const KnobState* knobs = current_knobs();
  if (knobs == nullptr) {
    return nullptr;
  }
  if (hooks_active(*knobs)) {
    return Py_None;  // Triton's runner, counted as a fallback by the Python path
  }
  KernelObject* launcher = find_launcher(handle);
  if (launcher == nullptr) {
    return Py_None;
  }
  // Held across the subscript, whose allocation can run the garbage collector.
  PyObject* held = Py_NewRef(reinterpret_cast<PyObject*>(launcher));
  PyObject* bound = kernel_subscript(launcher, grid);
  Py_DECREF(held);
  return bound;
}

PyObject* compiled_subscript(PyObject* compiled, PyObject* grid) {
  PyObject* bound = native_handle_subscript(compiled, grid);
  if (bound != Py_None) {
    return bound;
  }
  for (const auto& [type, slow] : handle_types()) {
    if (PyObject_TypeCheck(compiled, reinterpret_cast<PyTypeObject*>(type))) {
      return PyObject_CallFunctionObjArgs(slow, compiled, grid, nullptr);
    }
  }
  PyErr_Format(PyExc_RuntimeError, "fastkernel: no handle subscript was installed for %s",
               Py_TYPE(compiled)->tp_name);
  return nullptr;
}

PyObject* holder_subscript(PyObject* holder, PyObject* grid) {
  if (g_holder_slow == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "fastkernel: the handle subscript was never installed");
    return nullptr;
  }
  PyObject* handle = PyObject_GetAttr(holder, g_holder_attr);
  if (handle == nullptr) {
    return nullptr;
  }
  PyObject* bound = native_handle_subscript(handle, grid);
  Py_DECREF(handle);  // the holder keeps it alive
  if (bound != Py_None) {
    return bound;
  }
  return PyObject_CallFunctionObjArgs(g_holder_slow, holder, grid, nullptr);
}

}  // namespace

bool remember_handle_launch(PyObject* compiled, PyObject* launcher) {
  if (!PyObject_TypeCheck(launcher, &KernelType)) {
    PyErr_Format(PyExc_TypeError, "fastkernel: a handle's launcher must be a Kernel, not %s",
                 Py_TYPE(launcher)->tp_name);
    return false;
  }
  PyObject* key = PyLong_FromVoidPtr(compiled);
  if (key == nullptr) {
    return false;
  }
  PyObject* callback = PyCFunction_New(&g_forget_def, key);
  Py_DECREF(key);
  if (callback == nullptr) {
    return false;
  }
  PyObject* ref = PyWeakref_NewRef(compiled, callback);
  Py_DECREF(callback);
  if (ref == nullptr) {
    return false;
  }
  const HandleLaunch entry{ref, reinterpret_cast<KernelObject*>(Py_NewRef(launcher))};
  auto [it, inserted] = handle_launches().try_emplace(compiled, entry);
  if (!inserted) {  // replaced (the entry of a handle whose launcher was made again)
    const HandleLaunch old = it->second;
    it->second = entry;
    forget_last(compiled);
    release(old);
  }
  return true;
}

PyObject* handle_launcher(PyObject* compiled) {
  KernelObject* launcher = find_launcher(compiled);
  return Py_NewRef(launcher != nullptr ? reinterpret_cast<PyObject*>(launcher) : Py_None);
}

void forget_handle_launches() {
  auto& map = handle_launches();
  while (!map.empty()) {
    erase(map.begin());  // one at a time: a released launcher may run Python that remembers
  }
}

size_t num_handle_launches() { return handle_launches().size(); }

bool install_handle_subscript(PyObject* type, PyObject* attr, PyObject* slow) {
  if (attr != nullptr && !PyUnicode_Check(attr)) {
    PyErr_SetString(PyExc_TypeError, "fastkernel: the handle attribute must be a str");
    return false;
  }
  if (!PyCallable_Check(slow)) {
    PyErr_SetString(PyExc_TypeError,
                    "fastkernel: the handle subscript's slow path must be "
                    "callable");
    return false;
  }
  void* fn = attr == nullptr ? reinterpret_cast<void*>(&compiled_subscript)
                             : reinterpret_cast<void*>(&holder_subscript);
  PyObject* descr = new_slot_wrapper(type, &KernelType, "__getitem__", fn);
  if (descr == nullptr) {
    return false;
  }
  if (attr == nullptr) {
    auto& types = handle_types();
    auto it = std::find_if(types.begin(), types.end(),
                           [type](const auto& entry) { return entry.first == type; });
    if (it == types.end()) {
      types.emplace_back(Py_NewRef(type), Py_NewRef(slow));
    } else {
      Py_SETREF(it->second, Py_NewRef(slow));
    }
  } else {
    Py_XSETREF(g_holder_slow, Py_NewRef(slow));
    PyObject* name = Py_NewRef(attr);
    PyUnicode_InternInPlace(&name);
    Py_XSETREF(g_holder_attr, name);
  }
  const int rc = PyObject_SetAttrString(type, "__getitem__", descr);
  Py_DECREF(descr);
  return rc == 0;
}

}  // namespace fastkernel

// ---------------------------------------------------------------------------------------------
// Native launcher objects: what `compiled.run` gives under the patch (see handle_launch.h).

namespace fastkernel {
namespace {

struct RunLauncherObject {
  PyObject_HEAD vectorcallfunc vectorcall;
  PyObject* handle;             // owned: the CompiledKernel or CachedKernel
  KernelObject* launcher;       // owned: the handle's CompiledLaunch
  PyObject* triton_run;         // owned: Triton's own launcher object of the handle
  PyObject* packed_metadata;    // owned: the handle's packed_metadata
  PyObject* hook_chain_type;    // owned: triton.knobs.HookChain, or None
  PyObject* on_fallback;        // owned: on_fallback(reason) counts a call given to triton_run
  unsigned long long function;  // the handle's CUfunction, as Triton's `compiled.function`
  PyObject* hook_chains[2];     // owned or nullptr: the last HookChain given as each hook
  PyObject* hook_lists[2];      // owned or nullptr: its `calls` list
};

// The leading arguments of Triton's launcher (CudaLauncher.__call__, triton/backends/nvidia/
// driver.py): gridX, gridY, gridZ, stream, function, kernel_metadata (packed), launch_metadata,
// launch_enter_hook, launch_exit_hook; the kernel's arguments follow.
constexpr Py_ssize_t kRunLeadingArgs = 9;

// Whether hook `i` (0: enter, 1: exit) given to the launcher would run anything: None and an
// empty HookChain (what Triton's knobs hold by default from 3.9) run nothing. The last chain
// seen and its list are kept, so a caller passing the same chain each call reads only the
// list's size (a chain adds and removes hooks in that list).
bool hook_runs(RunLauncherObject* self, int i, PyObject* hook, bool* error) {
  if (hook == Py_None) {
    return false;
  }
  if (hook == self->hook_chains[i]) {
    return PyList_GET_SIZE(self->hook_lists[i]) != 0;
  }
  if (self->hook_chain_type == Py_None ||
      !PyObject_TypeCheck(hook, reinterpret_cast<PyTypeObject*>(self->hook_chain_type))) {
    return true;
  }
  PyObject* calls = PyObject_GetAttrString(hook, "calls");
  if (calls == nullptr) {
    *error = true;
    return true;
  }
  if (!PyList_Check(calls)) {
    Py_DECREF(calls);
    return true;
  }
  const bool runs = PyList_GET_SIZE(calls) != 0;
  Py_XSETREF(self->hook_lists[i], calls);
  Py_XSETREF(self->hook_chains[i], Py_NewRef(hook));
  return runs;
}

// Why this call goes to Triton's own launcher, or nullptr when the native launch of the
// handle's binary is what Triton's launcher would do: the handle's own function and packed
// metadata, no launch hook given or set, int grid dims, and torch's current stream (the native
// launch runs on it; another stream goes to Triton's launcher). `*error` with an exception set.
const char* run_refusal(RunLauncherObject* self, PyObject* const* args, Py_ssize_t nargs,
                        PyObject* kwnames, bool* error) {
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) > 0) {
    return "keyword arguments to Triton's launcher";
  }
  if (nargs < kRunLeadingArgs) {
    return "fewer arguments than Triton's launcher takes";
  }
  for (int i = 0; i < 5; ++i) {
    if (!PyLong_CheckExact(args[i])) {
      return "a grid dim, stream or function that is not an int";
    }
  }
  const unsigned long long function = PyLong_AsUnsignedLongLong(args[4]);
  if (function != self->function) {
    PyErr_Clear();  // a negative or oversized value: not the handle's function either
    return "a function other than the handle's";
  }
  if (args[5] != self->packed_metadata) {
    const int same = PyObject_RichCompareBool(args[5], self->packed_metadata, Py_EQ);
    if (same != 1) {
      PyErr_Clear();
      return "kernel metadata other than the handle's";
    }
  }
  if (hook_runs(self, 0, args[7], error) || hook_runs(self, 1, args[8], error)) {
    return "launch hooks given to Triton's launcher";
  }
  const KnobState* knobs = current_knobs();
  if (knobs == nullptr) {
    *error = true;
    return "";
  }
  if (hooks_active(*knobs)) {
    return "a launch hook set";
  }
  const unsigned long long stream = PyLong_AsUnsignedLongLong(args[3]);
  if (stream == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    return "a stream that is not a CUstream";
  }
  LaunchContext ctx{};
  try {
    ctx = current_launch_context();
  } catch (const std::exception&) {
    return "no current CUDA stream";  // Triton's launcher reports what is wrong
  }
  if (reinterpret_cast<uintptr_t>(ctx.stream) != stream) {
    return "a stream other than torch's current stream";
  }
  return nullptr;
}

PyObject* run_launcher_call(PyObject* obj, PyObject* const* args, size_t nargsf,
                            PyObject* kwnames) {
  auto* self = reinterpret_cast<RunLauncherObject*>(obj);
  if (self->launcher == nullptr) {
    // Only a finalizer run while the collector breaks a cycle can call a cleared launcher.
    PyErr_SetString(PyExc_RuntimeError,
                    "fastkernel: this launcher was cleared by the garbage collector");
    return nullptr;
  }
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  bool error = false;
  const char* refusal = run_refusal(self, args, nargs, kwnames, &error);
  if (error) {
    return nullptr;
  }
  if (refusal != nullptr) {
    // Counted once Triton's launcher has launched: a call it rejects is no fallback.
    PyObject* result = PyObject_Vectorcall(self->triton_run, args, nargsf, kwnames);
    if (result == nullptr) {
      return nullptr;
    }
    PyObject* reason = PyUnicode_FromString(refusal);
    PyObject* counted = reason ? PyObject_CallOneArg(self->on_fallback, reason) : nullptr;
    Py_XDECREF(reason);
    if (counted == nullptr) {
      Py_DECREF(result);
      return nullptr;
    }
    Py_DECREF(counted);
    return result;
  }
  PyObject* grid = PyTuple_Pack(3, args[0], args[1], args[2]);
  if (grid == nullptr) {
    return nullptr;
  }
  PyObject* held = Py_NewRef(reinterpret_cast<PyObject*>(self->launcher));
  PyObject* bound = kernel_subscript(self->launcher, grid);
  Py_DECREF(grid);
  PyObject* result = nullptr;
  if (bound != nullptr) {
    result = PyObject_Vectorcall(bound, args + kRunLeadingArgs, nargs - kRunLeadingArgs, nullptr);
    Py_DECREF(bound);
  }
  Py_DECREF(held);
  return result;
}

int run_launcher_traverse(PyObject* obj, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<RunLauncherObject*>(obj);
  Py_VISIT(self->handle);
  Py_VISIT(reinterpret_cast<PyObject*>(self->launcher));
  Py_VISIT(self->triton_run);
  Py_VISIT(self->packed_metadata);
  Py_VISIT(self->hook_chain_type);
  Py_VISIT(self->on_fallback);
  for (int i = 0; i < 2; ++i) {
    Py_VISIT(self->hook_chains[i]);
    Py_VISIT(self->hook_lists[i]);
  }
  return 0;
}

// Drops every reference: the collector breaks a cycle through a kept hook chain (whose hooks
// may hold whatever keeps this launcher) here. A cleared launcher is never called again.
int run_launcher_clear(PyObject* obj) {
  auto* self = reinterpret_cast<RunLauncherObject*>(obj);
  Py_CLEAR(self->launcher);  // first: a call its release makes sees a cleared launcher
  Py_CLEAR(self->handle);
  Py_CLEAR(self->triton_run);
  Py_CLEAR(self->packed_metadata);
  Py_CLEAR(self->hook_chain_type);
  Py_CLEAR(self->on_fallback);
  for (int i = 0; i < 2; ++i) {
    Py_CLEAR(self->hook_chains[i]);
    Py_CLEAR(self->hook_lists[i]);
  }
  return 0;
}

void run_launcher_dealloc(PyObject* obj) {
  PyObject_GC_UnTrack(obj);
  run_launcher_clear(obj);
  PyObject_GC_Del(obj);
}

}  // namespace

PyTypeObject RunLauncherType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "fastkernel._C.RunLauncher";
  t.tp_doc =
      "A kept handle's launcher object under the patch: called as Triton's launcher is\n"
      "(gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata, enter_hook,\n"
      "exit_hook, *args), it launches the handle's binary natively, or calls Triton's own.";
  t.tp_basicsize = sizeof(RunLauncherObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC;
  t.tp_vectorcall_offset = offsetof(RunLauncherObject, vectorcall);
  t.tp_call = PyVectorcall_Call;
  t.tp_dealloc = run_launcher_dealloc;
  t.tp_traverse = run_launcher_traverse;
  t.tp_clear = run_launcher_clear;
  return t;
}();

PyObject* new_run_launcher(PyObject* handle, PyObject* launcher, PyObject* triton_run,
                           PyObject* function, PyObject* packed_metadata, PyObject* hook_chain_type,
                           PyObject* on_fallback) {
  if (!PyObject_TypeCheck(launcher, &KernelType)) {
    PyErr_SetString(PyExc_TypeError, "fastkernel: a run launcher's launcher must be a Kernel");
    return nullptr;
  }
  if (!PyCallable_Check(triton_run) || !PyCallable_Check(on_fallback)) {
    PyErr_SetString(PyExc_TypeError,
                    "fastkernel: a run launcher needs Triton's launcher and on_fallback callables");
    return nullptr;
  }
  if (hook_chain_type != Py_None && !PyType_Check(hook_chain_type)) {
    PyErr_SetString(PyExc_TypeError, "fastkernel: hook_chain_type must be a type or None");
    return nullptr;
  }
  const unsigned long long fn = PyLong_AsUnsignedLongLong(function);
  if (fn == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    return nullptr;
  }
  auto* self = PyObject_GC_New(RunLauncherObject, &RunLauncherType);
  if (self == nullptr) {
    return nullptr;
  }
  self->vectorcall = run_launcher_call;
  self->handle = Py_NewRef(handle);
  self->launcher = reinterpret_cast<KernelObject*>(Py_NewRef(launcher));
  self->triton_run = Py_NewRef(triton_run);
  self->packed_metadata = Py_NewRef(packed_metadata);
  self->hook_chain_type = Py_NewRef(hook_chain_type);
  self->on_fallback = Py_NewRef(on_fallback);
  self->function = fn;
  for (int i = 0; i < 2; ++i) {
    self->hook_chains[i] = nullptr;
    self->hook_lists[i] = nullptr;
  }
  PyObject_GC_Track(self);
  return reinterpret_cast<PyObject*>(self);
}

}  // namespace fastkernel
