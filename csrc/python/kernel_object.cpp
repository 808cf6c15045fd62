// The per-call entry: `kernel[grid]` returns a bound launch whose vectorcall binds the
// arguments, builds the key, looks it up and launches. Only a miss, a fallback or a callable
// grid calls back into Python.
#include "kernel_object.h"

#include <ATen/record_function.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <cxxabi.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>
#include <string>

#include "fastkernel/trampoline.h"
#include "grid_meta.h"
#include "grid_program.h"
#include "knob_watch.h"
#include "launch_context.h"
#include "patch_hook.h"
#include "registration.h"

namespace fastkernel {

PyObject* g_cuda_error_type = nullptr;
PyObject* g_driver_unavailable_type = nullptr;

namespace {

// Launch hook support (set_launch_hook_support): Triton's LazyDict class, the Python helper that
// adds a kernel's launch_metadata callback to it, and the interned names the metadata uses.
PyObject* g_lazy_dict_type = nullptr;
PyObject* g_add_launch_metadata = nullptr;
struct HookNames {
  PyObject *name, *function, *stream, *jit_function, *launch_metadata, *data, *extras;
} g_hook_names{};
// Whether LazyDict(data) is object.__new__ followed by `self.data = data; self.extras = []`:
// the Python predicate that decides it (set_launch_hook_support's `plain_check`), its answer,
// and the type's version tag when it answered. CPython gives a type a new tag (PyType_Modified)
// whenever it or a base changes, so the answer stands while the tag is the same.
PyObject* g_lazy_dict_check = nullptr;
unsigned int g_lazy_dict_checked_tag = 0;
bool g_lazy_dict_plain = false;
// add_run_options(jit_function, kwargs) (set_pre_run_options), or nullptr.
PyObject* g_add_run_options = nullptr;
PyObject* g_empty_tuple = nullptr;

}  // namespace

thread_local int t_launch_nesting = 0;

namespace {

// CUDA's limit on grid dimensions y and z (x: kMaxGridX, fastkernel/trampoline.h).
constexpr uint64_t kMaxGridYZ = 65535ull;

// The largest value grid dimension `axis` may take.
constexpr uint64_t grid_dim_limit(int axis) { return axis == 0 ? kMaxGridX : kMaxGridYZ; }

// Whether `v` is a valid grid dimension `axis`: within [0, grid_dim_limit(axis)].
inline bool grid_dim_in_range(long long v, int axis) {
  return v >= 0 && uint64_t(v) <= grid_dim_limit(axis);
}

bool read_grid_dim(KernelObject* kernel, PyObject* item, int axis, uint32_t* out) {
  long long v;
  if (PyLong_CheckExact(item)) {
    if (!compact_int(item, &v)) {
      v = PyLong_AsLongLong(item);
    }
  } else {
    Ref index(PyNumber_Index(item));
    if (!index) {
      if (PyErr_ExceptionMatches(PyExc_TypeError)) {  // not an int; what __index__ raised stays
        PyErr_Format(PyExc_TypeError, "%U: grid[%d] must be an int, got %s", kernel->name, axis,
                     Py_TYPE(item)->tp_name);
      }
      return false;
    }
    v = PyLong_AsLongLong(index.get());
  }
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "%U: grid[%d] does not fit in 64 bits", kernel->name, axis);
    return false;
  }
  if (!grid_dim_in_range(v, axis)) {
    PyErr_Format(PyExc_ValueError, "%U: grid[%d] = %lld is outside [0, %llu]", kernel->name, axis,
                 v, (unsigned long long)grid_dim_limit(axis));
    return false;
  }
  *out = uint32_t(v);
  return true;
}

bool read_grid_dims(KernelObject* kernel, PyObject* const* items, Py_ssize_t n, LaunchGrid* out) {
  if (n < 1 || n > 3) {
    PyErr_Format(PyExc_ValueError, "%U: grid must have 1 to 3 dimensions, got %zd", kernel->name,
                 n);
    return false;
  }
  uint32_t dims[3] = {1, 1, 1};
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!read_grid_dim(kernel, items[i], int(i), &dims[i])) {
      return false;
    }
  }
  *out = {dims[0], dims[1], dims[2]};
  return true;
}

// A grid computed natively (grid_program.h), when every dimension is within CUDA's limits;
// false (nothing set) otherwise, and the grid function then reports it as a Python grid would.
inline bool grid_dims_in_range(const long long* dims, int n, LaunchGrid* out) {
  uint32_t d[3] = {1, 1, 1};
  for (int i = 0; i < n; ++i) {
    if (!grid_dim_in_range(dims[i], i)) {
      return false;
    }
    d[i] = uint32_t(dims[i]);
  }
  *out = {d[0], d[1], d[2]};
  return true;
}

// A grid other than a tuple, read as Triton reads one (triton/runtime/jit.py JITFunction.run):
// len(grid), then grid[0], grid[1], grid[2] by subscript (a dict {0: n} is a 1-D grid; a set or
// a generator is no grid). Out of line (not marked cold: callgrind counted one more instruction
// per tuple-grid hit with the mark), so the tuple path stays as the compiler lays it out alone.
[[gnu::noinline]] bool parse_other_grid(KernelObject* kernel, PyObject* grid, LaunchGrid* out) {
  const Py_ssize_t n = PyObject_Size(grid);
  if (n < 0) {
    if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
      return false;  // what __len__ raised
    }
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError,
                 "%U: grid must be a tuple of 1 to 3 ints or a callable returning one, got %s",
                 kernel->name, Py_TYPE(grid)->tp_name);
    return false;
  }
  if (n < 1 || n > 3) {
    return read_grid_dims(kernel, nullptr, n, out);
  }
  Ref items[3];
  PyObject* borrowed[3] = {nullptr, nullptr, nullptr};
  for (Py_ssize_t i = 0; i < n; ++i) {
    Ref index(PyLong_FromSsize_t(i));
    items[i].reset(index ? PyObject_GetItem(grid, index.get()) : nullptr);
    if (!items[i]) {
      return false;  // what grid[i] raised
    }
    borrowed[i] = items[i].get();
  }
  return read_grid_dims(kernel, borrowed, n, out);
}

// A grid: a tuple (the common case, read in place) or any other sequence of 1-3 ints. A tuple
// of small exact ints within CUDA's limits is read inline; anything else (other int kinds, the
// errors) by read_grid_dims.
inline bool parse_grid(KernelObject* kernel, PyObject* grid, LaunchGrid* out) {
  if (PyTuple_CheckExact(grid)) {
    PyObject* const* items = &PyTuple_GET_ITEM(grid, 0);
    const Py_ssize_t n = PyTuple_GET_SIZE(grid);
    if (n < 1 || n > 3) {
      return read_grid_dims(kernel, items, n, out);
    }
    uint32_t dims[3] = {1, 1, 1};
    for (Py_ssize_t i = 0; i < n; ++i) {
      long long v;
      if (!PyLong_CheckExact(items[i]) || !compact_int(items[i], &v) ||
          !grid_dim_in_range(v, int(i))) {
        return read_grid_dims(kernel, items, n, out);
      }
      dims[i] = uint32_t(v);
    }
    *out = {dims[0], dims[1], dims[2]};
    return true;
  }
  return parse_other_grid(kernel, grid, out);
}

// The call's positional arguments as a tuple and keywords as a dict (new references), for the
// Python paths (misses, fallbacks, pre-run hooks). False with an exception set on failure.
bool call_as_tuple_and_dict(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, Ref* pos,
                            Ref* kw) {
  pos->reset(PyTuple_New(nargs));
  kw->reset(PyDict_New());
  if (!*pos || !*kw) {
    return false;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyTuple_SET_ITEM(pos->get(), i, Py_NewRef(args[i]));
  }
  if (kwnames != nullptr) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); ++k) {
      if (PyDict_SetItem(kw->get(), PyTuple_GET_ITEM(kwnames, k), args[nargs + k]) < 0) {
        return false;
      }
    }
  }
  return true;
}

// Calls the Python miss handler: handler(kernel, grid, args, kwargs, key, device, reason).
// Returns its result (new reference) or nullptr with an exception set.
PyObject* call_miss_handler(KernelObject* kernel, PyObject* grid, PyObject* const* args,
                            Py_ssize_t nargs, PyObject* kwnames, const BoundCall* call, int device,
                            const char* reason) {
  Ref pos, kw;
  if (!call_as_tuple_and_dict(args, nargs, kwnames, &pos, &kw)) {
    return nullptr;
  }
  Ref key(call ? PyBytes_FromStringAndSize(reinterpret_cast<const char*>(call->key.words),
                                           Py_ssize_t(call->key.size * sizeof(uint64_t)))
               : Py_NewRef(Py_None));
  Ref dev(PyLong_FromLong(device));
  Ref why(reason ? PyUnicode_FromString(reason) : Py_NewRef(Py_None));
  if (!key || !dev || !why) {
    return nullptr;
  }
  PyObject* handler_args[] = {reinterpret_cast<PyObject*>(kernel),
                              grid,
                              pos.get(),
                              kw.get(),
                              key.get(),
                              dev.get(),
                              why.get()};
  return call_from_launch(
      [&] { return PyObject_Vectorcall(kernel->miss_handler, handler_args, 7, nullptr); });
}

// The reason a call falls back, naming the argument and its type where one is the cause:
// "argument 'x' of type numpy.ndarray: an argument of a kind the native key does not cover".
[[gnu::cold]] std::string fallback_reason(const BoundCall& call) {
  std::string reason = call.fallback_reason ? call.fallback_reason : "unsupported call";
  if (call.fallback_name == nullptr || call.fallback_value == nullptr) {
    return reason;
  }
  const char* name = PyUnicode_AsUTF8(call.fallback_name);
  if (name == nullptr) {
    PyErr_Clear();
    return reason;
  }
  PyTypeObject* type = Py_TYPE(call.fallback_value);
  std::string type_name = type->tp_name;
  if (std::strchr(type->tp_name, '.') == nullptr) {  // heap types: module.qualname
    PyObject* module = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__module__");
    const char* m =
        module != nullptr && PyUnicode_Check(module) ? PyUnicode_AsUTF8(module) : nullptr;
    if (m != nullptr && std::strcmp(m, "builtins") != 0) {
      type_name = std::string(m) + "." + type_name;
    }
    Py_XDECREF(module);
    PyErr_Clear();
  }
  return "argument '" + std::string(name) + "' of type " + type_name + ": " + reason;
}

// Triton's per-call check (JITFunction.run) that the globals a kernel read when it was compiled
// still hold the same values: identity first (free for unchanged globals), then equality.
bool globals_unchanged(KernelObject* kernel) {
  // Held for the loop: a global's __eq__ runs Python, which may register another record (whose
  // insertion replaces the kernel's checks) or switch to a thread that does.
  const Ref held(Py_NewRef(kernel->global_checks));
  PyObject* checks = held.get();
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(checks); ++i) {
    PyObject* check = PyTuple_GET_ITEM(checks, i);
    PyObject* dict = PyTuple_GET_ITEM(check, 0);
    PyObject* name = PyTuple_GET_ITEM(check, 1);
    PyObject* expected = PyTuple_GET_ITEM(check, 2);
    PyObject* now = PyDict_GetItemWithError(dict, name);  // borrowed
    if (now == expected) {
      continue;
    }
    if (now == nullptr && PyErr_Occurred()) {
      return false;
    }
    int same = now == nullptr ? 0 : PyObject_RichCompareBool(now, expected, Py_EQ);
    if (same < 0) {
      return false;
    }
    if (!same) {
      // JITFunction.run's own message.
      PyErr_Format(PyExc_RuntimeError,
                   "Global variable %S has changed since we compiled this kernel, from %S to %S",
                   name, expected, now ? now : Py_None);
      return false;
    }
  }
  return true;
}

// Runs the JITFunction's pre-run hooks with the call's arguments, as JITFunction.run does.
bool run_pre_run_hooks(KernelObject* kernel, PyObject* const* args, Py_ssize_t nargs,
                       PyObject* kwnames) {
  Ref pos, kw;
  if (!call_as_tuple_and_dict(args, nargs, kwnames, &pos, &kw)) {
    return false;
  }
  if (g_add_run_options != nullptr) {
    // The compile options JITFunction.run adds to the keywords before its hooks see them.
    Ref jit(kernel->jit_function != nullptr
                ? Py_NewRef(kernel->jit_function)
                : PyObject_GetAttr(reinterpret_cast<PyObject*>(kernel), g_hook_names.jit_function));
    Ref added(jit ? PyObject_CallFunctionObjArgs(g_add_run_options, jit.get(), kw.get(), nullptr)
                  : nullptr);
    if (!added) {
      return false;
    }
  }
  // Iterate over a snapshot: a hook may add or remove hooks.
  Ref hooks(PySequence_Tuple(kernel->pre_run_hooks));
  if (!hooks) {
    return false;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(hooks.get()); ++i) {
    Ref r(call_from_launch(
        [&] { return PyObject_Call(PyTuple_GET_ITEM(hooks.get(), i), pos.get(), kw.get()); }));
    if (!r) {
      return false;
    }
  }
  return true;
}

// reread_tensor_addresses with nothing thrown into CPython (torch's accessors can throw), as
// bind_call binds: Error comes with the exception set.
[[gnu::noinline, gnu::cold]] KeyStatus reread_pointers(KernelObject* kernel, BoundCall* call,
                                                       bool leaves) {
  try {
    return reread_tensor_addresses(kernel, call, leaves);
  } catch (abi::__forced_unwind&) {
    throw;  // a thread ended by pthread_exit: see with_python_errors
  } catch (...) {
    set_python_error_from_current_exception(kernel);
    return KeyStatus::Error;
  }
}

// A launch inside an at::RecordFunction range named for the kernel (out of line: the range
// object is large, and only profiled launches pay for it).
[[gnu::noinline, gnu::cold]] void launch_in_profiler_range(const LaunchRecord& rec,
                                                           const LaunchGrid& grid, CUstream stream,
                                                           const ArgValue* args,
                                                           CUdeviceptr global_scratch,
                                                           CUdeviceptr profile_scratch) {
  at::RecordFunction range(at::RecordScope::USER_SCOPE);
  if (range.isActive()) {
    range.before(rec.profile_name.c_str());
  }
  launch(rec, grid, stream, args, global_scratch, profile_scratch);
}

// A record whose plan reads argument slots this call did not bind: refused, never packed.
[[gnu::noinline, gnu::cold]] PyObject* unbound_slots_error(KernelObject* kernel,
                                                           const LaunchRecord& rec,
                                                           const BoundCall& call) {
  PyErr_Format(PyExc_RuntimeError,
               "%U: the launch record for this specialization reads %d argument slots but the "
               "call binds %d; it was registered under a key it was not compiled for",
               kernel->name, rec.values_read, int(kernel->state->params.size()) + call.num_leaves);
  return nullptr;
}

// Gives the parameters a tuned config provides (absent from the call) the record's values, so
// the callable grid and the hooks see them as Triton's autotuner passes them.
void fill_tuned_args(const KernelState& st, const LaunchRecord& rec, BoundCall* call) {
  // Only a parameter a tuned config provides can be left unbound by a call that bound.
  PyObject* tuned = static_cast<PyObject*>(rec.tuned_args);
  for (const int i : st.config_params) {
    if (call->args[i] == nullptr) {
      call->args[i] = tuned != nullptr ? PyTuple_GET_ITEM(tuned, Py_ssize_t(i)) : Py_None;
    }
  }
}

// A hit's check that the owner's instance dict still maps the published name to the value it
// published last. Its dict's version (PEP 509) changes with every store through the dict and is
// never reused, so while the owner has the dict a hit last read, at the version it had then,
// nothing changed the mapping and the lookup is skipped; the dict is read from the owner's dict
// slot, found once. Not on CPython 3.13 and later, whose instance dicts can change without
// their version through the object's inline values (knob_watch.h dict_version), where every hit
// reads the dict.
#if PY_VERSION_HEX < 0x030D0000
constexpr bool kVersionedInstanceDicts = true;

// Where the owner keeps its instance dict, the dict made if the owner has none yet, or nullptr
// (no dict slot, or an allocation failed: cleared, the caller then reads the dict the general
// way).
PyObject** owner_dict_slot(PyObject* owner) {
  PyObject** slot = _PyObject_GetDictPtr(owner);
  if (slot == nullptr) {
    PyErr_Clear();
  }
  return slot;
}
#else
constexpr bool kVersionedInstanceDicts = false;
PyObject** owner_dict_slot(PyObject*) { return nullptr; }
#endif

// Whether the owner's instance dict maps the published name to `value`, read from the dict
// itself, so no descriptor or __getattr__ of the owner runs on a hit. When it does, the dict
// and its version are kept for the next hit's check.
bool dict_maps_published(KernelObject* kernel, PyObject* value) {
  PyObject* dict = PyObject_GenericGetDict(kernel->publish_owner, nullptr);
  if (dict == nullptr) {
    PyErr_Clear();  // an owner without a __dict__: set the attribute on every hit
    return false;
  }
  // An exact dict looked up with an exact str raises nothing; PyDict_GetItem would still save
  // and restore the error state around the lookup (about 30 instructions a hit).
  const bool same =
      PyDict_CheckExact(dict) && PyDict_GetItemWithError(dict, kernel->publish_name) == value;
  if (PyErr_Occurred()) {
    PyErr_Clear();  // never for the dict and name above; the attribute is then set again
  }
  if (same && kVersionedInstanceDicts) {
    PyObject** slot = owner_dict_slot(kernel->publish_owner);
    if (slot != nullptr && *slot == dict) {
      kernel->published_dict = dict;
      kernel->published_version = dict_version(dict);
      kernel->published_slot = slot;
    }
  }
  Py_DECREF(dict);
  return same;
}

// Whether the owner still holds `value` under the published name: user code can set or
// delete the attribute between hits (`autotuner.best_config = None`), where Triton's
// Autotuner.run sets it again on every call.
bool still_published(KernelObject* kernel, PyObject* value) {
  if (kVersionedInstanceDicts && kernel->published_dict != nullptr &&
      *kernel->published_slot == kernel->published_dict &&
      dict_version(kernel->published_dict) == kernel->published_version) {
    return true;
  }
  return dict_maps_published(kernel, value);
}

// Sets the owner's attribute to the record's published object, unless it already holds it.
bool publish(KernelObject* kernel, const LaunchRecord& rec) {
  PyObject* value = static_cast<PyObject*>(rec.published);
  if (value == nullptr || (value == kernel->last_published && still_published(kernel, value))) {
    return true;
  }
  kernel->published_dict = nullptr;
  if (PyObject_SetAttr(kernel->publish_owner, kernel->publish_name, value) != 0) {
    return false;
  }
  // The next hit with this value reads the dict (a descriptor or __setattr__ may have stored
  // the value elsewhere) and, finding it there, keeps the dict's version for the hits after.
  Py_XSETREF(kernel->last_published, Py_NewRef(value));
  return true;
}

// Whether LazyDict(data) may be built without the class call: the predicate's answer for the
// type's current version tag, asked again when the tag changed.
bool lazy_dict_is_plain(PyTypeObject* type) {
  if (g_lazy_dict_check == nullptr || Py_TYPE(type) != &PyType_Type) {
    return false;
  }
  const unsigned int tag = type->tp_version_tag;
  if (tag == g_lazy_dict_checked_tag) {
    return g_lazy_dict_plain;
  }
  // Asked again after a change. The predicate's own lookups give the type a tag (0 only when
  // CPython has none left to give: then the answer is no, and stays cached under 0).
  PyObject* answer = PyObject_CallOneArg(g_lazy_dict_check, reinterpret_cast<PyObject*>(type));
  const bool plain = answer != nullptr && answer == Py_True;
  if (answer == nullptr) {
    PyErr_Clear();  // a predicate that fails says no: the class is then called
  }
  Py_XDECREF(answer);
  g_lazy_dict_checked_tag = type->tp_version_tag;
  g_lazy_dict_plain = plain && g_lazy_dict_checked_tag != 0;
  return g_lazy_dict_plain;
}

// Triton's LazyDict(data): without LazyDict.__init__'s frame while the type is as verified
// (lazy_dict_is_plain), by the class call otherwise. A new reference, or nullptr with an
// exception set.
PyObject* new_lazy_dict(PyObject* data) {
  auto* type = reinterpret_cast<PyTypeObject*>(g_lazy_dict_type);
  if (!lazy_dict_is_plain(type)) {
    return PyObject_CallOneArg(g_lazy_dict_type, data);
  }
  Ref obj(type->tp_new(type, g_empty_tuple, nullptr));  // object.__new__, as type.__call__ does
  if (!obj || PyObject_SetAttr(obj.get(), g_hook_names.data, data) < 0) {
    return nullptr;
  }
  Ref extras(PyList_New(0));
  if (!extras || PyObject_SetAttr(obj.get(), g_hook_names.extras, extras.get()) < 0) {
    return nullptr;
  }
  return obj.release();
}

// Sets `key` to `value` (a new reference, or nullptr after a failed creation) in `dict`.
bool set_hook_value(PyObject* dict, PyObject* key, PyObject* value) {
  if (value == nullptr) {
    return false;
  }
  const int rc = PyDict_SetItem(dict, key, value);
  Py_DECREF(value);
  return rc == 0;
}

// The dict Triton's launcher builds per launch, {"name": ..., "function": ..., "stream": ...}:
// a copy of the kernel's template dict, whose values are made anew only when the record's name
// or function handle or the stream differ from the last launch's (they rarely do). A new
// reference, or nullptr with an exception set.
PyObject* hook_data(KernelState& st, const LaunchRecord& rec, CUstream stream) {
  const bool fresh = st.hook_template == nullptr;
  if (fresh && (st.hook_template = PyDict_New()) == nullptr) {
    return nullptr;
  }
  PyObject* t = st.hook_template;
  bool ok = true;
  if (fresh || st.hook_name != rec.kernel_name) {
    ok = set_hook_value(
        t, g_hook_names.name,
        PyUnicode_FromStringAndSize(rec.kernel_name.data(), Py_ssize_t(rec.kernel_name.size())));
    st.hook_name = rec.kernel_name;
  }
  if (ok && (fresh || st.hook_function != rec.function)) {
    ok = set_hook_value(t, g_hook_names.function, PyLong_FromVoidPtr(rec.function));
    st.hook_function = rec.function;
  }
  if (ok && (fresh || st.hook_stream != stream)) {
    ok = set_hook_value(t, g_hook_names.stream, PyLong_FromVoidPtr(stream));
    st.hook_stream = stream;
  }
  if (!ok) {
    Py_CLEAR(st.hook_template);  // out of step with the raw values: made anew next time
    return nullptr;
  }
  return PyDict_Copy(t);
}

// The launch hooks' metadata, as Triton's launcher makes it (triton/compiler/compiler.py
// CompiledKernel.launch_metadata): a LazyDict of the kernel's name, function handle and stream,
// plus the kernel's own launch_metadata callback when it has one. A new reference, or nullptr
// with an exception set.
PyObject* make_hook_metadata(KernelObject* kernel, const LaunchRecord& rec, const LaunchGrid& grid,
                             CUstream stream, const BoundCall& call) {
  Ref data(hook_data(*kernel->state, rec, stream));
  Ref metadata(data ? new_lazy_dict(data.get()) : nullptr);
  Ref jit(!metadata ? nullptr
          : kernel->jit_function != nullptr
              ? Py_NewRef(kernel->jit_function)
              : PyObject_GetAttr(reinterpret_cast<PyObject*>(kernel), g_hook_names.jit_function));
  Ref callback(jit ? PyObject_GetAttr(jit.get(), g_hook_names.launch_metadata) : nullptr);
  if (!callback) {
    return nullptr;
  }
  PyObject* compiled = static_cast<PyObject*>(rec.user_data);
  if (callback.get() == Py_None || compiled == nullptr || compiled == Py_None) {
    return metadata.release();
  }
  const size_t n = kernel->state->params.size();
  Ref bound(PyTuple_New(Py_ssize_t(n)));
  Ref grid_tuple(Py_BuildValue("(III)", grid.x, grid.y, grid.z));
  if (!bound || !grid_tuple) {
    return nullptr;
  }
  for (size_t i = 0; i < n; ++i) {
    PyTuple_SET_ITEM(bound.get(), Py_ssize_t(i), Py_NewRef(call.args[i]));
  }
  PyObject* add_args[] = {metadata.get(), jit.get(), grid_tuple.get(), compiled, bound.get()};
  Ref added(PyObject_Vectorcall(g_add_launch_metadata, add_args, 5, nullptr));
  return added ? metadata.release() : nullptr;
}

// One launch hook knob as a launch took it, held: the hooks it runs may change the knobs.
struct HeldHook {
  Ref calls, callable;
  bool reversed = false;
  explicit HeldHook(const LaunchHook& hook)
      : calls(hook.calls ? Py_NewRef(hook.calls) : nullptr),
        callable(hook.callable ? Py_NewRef(hook.callable) : nullptr),
        reversed(hook.reversed) {}
};

// Calls one launch hook knob with `metadata` as Triton does: a HookChain's hooks in order (in
// reverse for a reversed chain, as `reversed(list)` walks a list that may change under it),
// or the plain callable set in its place. False with an exception set when a hook raised.
bool call_launch_hook(const HeldHook& hook, PyObject* metadata) {
  if (hook.callable.get() != nullptr) {
    Ref r(call_from_launch([&] { return PyObject_CallOneArg(hook.callable.get(), metadata); }));
    return bool(r);
  }
  PyObject* list = hook.calls.get();
  if (list == nullptr) {
    return true;
  }
  const auto call_at = [&](Py_ssize_t i) {  // the hook is held: it may remove itself
    Ref f(Py_NewRef(PyList_GET_ITEM(list, i)));
    return Ref(call_from_launch([&] { return PyObject_CallOneArg(f.get(), metadata); })).get() !=
           nullptr;
  };
  if (!hook.reversed) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i) {
      if (!call_at(i)) {
        return false;
      }
    }
    return true;
  }
  for (Py_ssize_t i = PyList_GET_SIZE(list) - 1; i >= 0 && i < PyList_GET_SIZE(list); --i) {
    if (!call_at(i)) {
      return false;
    }
  }
  return true;
}

// scratch_bytes(...) as a Python int, exact where it does not fit 64 bits. A new reference, or
// nullptr with an exception set.
PyObject* exact_scratch_bytes(const LaunchGrid& grid, unsigned num_ctas, uint64_t per_cta) {
  const uint64_t factors[] = {grid.x, grid.y, grid.z, num_ctas, per_cta};
  Ref product(PyLong_FromUnsignedLongLong(1));
  for (const uint64_t f : factors) {
    Ref factor(PyLong_FromUnsignedLongLong(f));
    if (!product || !factor) {
      return nullptr;
    }
    product.reset(PyNumber_Multiply(product.get(), factor.get()));
  }
  return product.release();
}

// Allocates one scratch buffer of scratch_bytes(...) through the Python allocator. Returns the
// buffer object (new reference; it must outlive the launch call) and its device pointer, or nullptr
// with an exception set.
PyObject* allocate_scratch(KernelObject* kernel, uint64_t per_cta, uint64_t align,
                           const LaunchRecord& rec, const LaunchGrid& grid, CUstream stream,
                           const char* kind, CUdeviceptr* out) {
  const uint64_t bytes = scratch_bytes(grid, rec.num_ctas, per_cta);
  // Past 64 bits the allocator gets the exact size, as Triton's Python ints give it.
  Ref size(bytes != UINT64_MAX ? PyLong_FromUnsignedLongLong(bytes)
                               : exact_scratch_bytes(grid, rec.num_ctas, per_cta));
  Ref alignment(PyLong_FromUnsignedLongLong(align));
  Ref stream_handle(PyLong_FromVoidPtr(stream));
  Ref which(PyUnicode_FromString(kind));
  if (!size || !alignment || !stream_handle || !which) {
    return nullptr;
  }
  PyObject* call_args[] = {size.get(), alignment.get(), stream_handle.get(), which.get()};
  Ref buffer(PyObject_Vectorcall(kernel->scratch_allocator, call_args, 4, nullptr));
  if (!buffer) {
    return nullptr;
  }
  Ref ptr(PyObject_CallMethod(buffer.get(), "data_ptr", nullptr));
  if (!ptr) {
    return nullptr;
  }
  *out = PyLong_AsUnsignedLongLong(ptr.get());
  if (PyErr_Occurred()) {
    return nullptr;
  }
  return buffer.release();
}

// The steps of a launch after the key: registration on a miss, the grid, the scratch buffers.

// A miss: the Python handler compiles (or loads) the specialization and returns its loaded
// launch record, which is inserted under the call's key, or launches through Triton itself.
// Returns the record now registered, or nullptr with `*handled` set to the handler's result (a
// new reference: what Triton's launch returned) or left nullptr with an exception.
[[gnu::cold]] const LaunchRecord* register_on_miss(BoundLaunchObject* self, PyObject* const* args,
                                                   Py_ssize_t nargs, PyObject* kwnames,
                                                   const BoundCall& call, int device,
                                                   PyObject** handled) {
  KernelObject* kernel = self->kernel;
  ++kernel->state->misses;
  const uint64_t invalidations = kernel->state->table.invalidations();
  Ref result(call_miss_handler(kernel, self->grid, args, nargs, kwnames, &call, device, nullptr));
  if (!result) {
    return nullptr;
  }
  bool is_record = false;
  const LaunchRecord* rec = insert_returned_record(kernel, call.key, result.get(), &is_record);
  if (!is_record) {
    *handled = result.release();
  } else if (rec != nullptr && kernel->state->table.invalidations() != invalidations) {
    // The records were invalidated while this one compiled (the kernel's debug changed): it
    // launches this call, begun before, and is not kept for the next.
    kernel->state->table.retire(call.key);
  }
  return rec;
}

// The grid of this launch: a tuple, or what a callable grid returns for the call's arguments;
// checked against the record's cluster size. False with an exception set when malformed.
inline bool resolve_grid(KernelObject* kernel, PyObject* grid_arg, const BoundCall& call,
                         const LaunchRecord& rec, LaunchGrid* grid, bool* python_ran) {
  // A Python function is the common callable: told apart inline, before the call-out check.
  if (!PyTuple_CheckExact(grid_arg) && (PyFunction_Check(grid_arg) || PyCallable_Check(grid_arg))) {
    long long dims[3];
    int num_dims = 0;
    if (eval_grid_program(kernel, grid_arg, call, dims, &num_dims) &&
        grid_dims_in_range(dims, num_dims, grid)) {
      ++kernel->state->native_grids;
    } else {
      ++kernel->state->called_grids;
      *python_ran = true;
      Ref result(call_grid(kernel, grid_arg, call));
      if (!result || !parse_grid(kernel, result.get(), grid)) {
        return false;
      }
      // Triton reads the launch hook knobs after the grid function returns: one it assigned
      // runs for this launch. The knob state is one object, refreshed in place.
      if (current_knobs() == nullptr) {
        return false;
      }
    }
  } else if (!parse_grid(kernel, grid_arg, grid)) {
    return false;
  }
  if (uint64_t(grid->x) * rec.num_ctas > kMaxGridX) {
    PyErr_Format(PyExc_ValueError, "%U: grid[0] * num_ctas exceeds %llu", kernel->name,
                 (unsigned long long)kMaxGridX);
    return false;
  }
  return true;
}

// The global and profile scratch buffers of one launch and their device pointers (0: none).
struct Scratch {
  Ref global_buffer, profile_buffer;
  CUdeviceptr global_pointer = 0, profile_pointer = 0;
};

// Allocates the record's scratch buffers for `grid` through the Python allocator. False with an
// exception set when an allocation fails.
[[gnu::cold]] bool allocate_scratch_buffers(KernelObject* kernel, const LaunchRecord& rec,
                                            const LaunchGrid& grid, CUstream stream,
                                            Scratch* scratch) {
  if (rec.global_scratch_size > 0) {
    scratch->global_buffer.reset(allocate_scratch(kernel, rec.global_scratch_size,
                                                  rec.global_scratch_align, rec, grid, stream,
                                                  "global", &scratch->global_pointer));
    if (!scratch->global_buffer) {
      return false;
    }
  }
  if (rec.profile_scratch_size > 0) {
    scratch->profile_buffer.reset(allocate_scratch(kernel, rec.profile_scratch_size,
                                                   rec.profile_scratch_align, rec, grid, stream,
                                                   "profile", &scratch->profile_pointer));
    if (!scratch->profile_buffer) {
      return false;
    }
  }
  return true;
}

// Binds and keys a call (bind_and_build_key) with nothing thrown into CPython. Error comes with
// the exception set; for a value error, the TypeError of a required argument the call left out
// instead, since Python binds every argument before it checks a value.
[[gnu::always_inline]] inline KeyStatus bind_call(KernelObject* kernel, PyObject* const* args,
                                                  Py_ssize_t nargs, PyObject* kwnames,
                                                  BoundCall* call) {
  KeyStatus status;
  try {
    // torch can throw (c10::Error) from a tensor accessor; nothing may escape into CPython.
    status = bind_and_build_key(kernel, args, nargs, kwnames, call);
  } catch (abi::__forced_unwind&) {
    throw;  // a thread ended by pthread_exit: see with_python_errors
  } catch (...) {
    set_python_error_from_current_exception(kernel);
    return KeyStatus::Error;
  }
  if (status == KeyStatus::Error) {
    prefer_missing_argument_error(kernel, call);
  }
  return status;
}

// A call the native path does not take: counted as a fallback and launched through Triton's
// own path, whose run calls the pre-run and launch hooks itself.
[[gnu::noinline, gnu::cold]] PyObject* launch_through_triton(BoundLaunchObject* self,
                                                             PyObject* const* args,
                                                             Py_ssize_t nargs, PyObject* kwnames,
                                                             const BoundCall& call) {
  ++self->kernel->state->fallbacks;
  return call_miss_handler(self->kernel, self->grid, args, nargs, kwnames, nullptr, -1,
                           fallback_reason(call).c_str());
}

// Runs the kernel's pre-run hooks, then binds the call again: Triton runs the hooks before it
// binds the arguments (JITFunction.run), and a hook may change one (`out.set_(...)`, a new data
// pointer), so the key and the packed values must be the arguments as the hooks left them.
// False when the launch must not go on natively: *handled is then nullptr with an exception
// set, or the result of a fallback through Triton's path (whose run calls the hooks again).
[[gnu::noinline, gnu::cold]] bool rebind_after_pre_run_hooks(BoundLaunchObject* self,
                                                             PyObject* const* args,
                                                             Py_ssize_t nargs, PyObject* kwnames,
                                                             BoundCall* call, PyObject** handled) {
  *handled = nullptr;
  if (!run_pre_run_hooks(self->kernel, args, nargs, kwnames)) {
    return false;
  }
  const KeyStatus status = bind_call(self->kernel, args, nargs, kwnames, call);
  if (status == KeyStatus::Fallback) {
    *handled = launch_through_triton(self, args, nargs, kwnames, *call);
  }
  return status == KeyStatus::Ok;
}

// Reads the arguments again after Python ran between the key and the launch (a grid function,
// the scratch allocator): Triton's launcher reads each argument after both, so a tensor given
// new storage there (`out.set_(...)`) launches with its storage as they left it, never with a
// pointer read before (which may have been freed). The tensors' pointers are read again; a
// call with tuple or descriptor leaves is bound again. The binary stays the one looked up, as
// Triton's does: its specialization was taken before the grid. False with an exception set.
[[gnu::noinline, gnu::cold]] bool rebind_after_python(KernelObject* kernel, PyObject* const* args,
                                                      Py_ssize_t nargs, PyObject* kwnames,
                                                      const LaunchRecord& rec, BoundCall* call) {
  // The common case: only the tensors' pointers read again (a fraction of binding anew).
  KeyStatus status = reread_pointers(kernel, call, /*leaves=*/true);
  if (status != KeyStatus::Fallback) {
    return status == KeyStatus::Ok;
  }
  status = bind_call(kernel, args, nargs, kwnames, call);
  if (status == KeyStatus::Error) {
    return false;
  }
  if (status == KeyStatus::Fallback) {
    PyErr_Format(PyExc_TypeError,
                 "%U: an argument changed to a kind the native path does not launch (%s) while "
                 "Python ran during the launch (its grid, allocator or launch hooks)",
                 kernel->name, call->fallback_reason ? call->fallback_reason : "unsupported");
    return false;
  }
  if (rec.leaves_read > call->num_leaves) {
    unbound_slots_error(kernel, rec, *call);
    return false;
  }
  const KernelState& st = *kernel->state;
  if (st.hit_extras && !st.config_params.empty()) {
    fill_tuned_args(st, rec, call);
  }
  return true;
}

// Whether torch's profiler is active on this thread: profilerEnabled() (torch/csrc/profiler/
// orchestration/observer.cpp), whose state is the thread's PROFILER_STATE debug info
// (ProfilerStateBase::get(false) reads c10::ThreadLocalDebugInfo), asked only when that entry
// exists. Asking the debug info first saves two calls into libtorch per launch (63 -> 49
// instructions, callgrind); at::hasCallbacks() would scan callback lists, about 200.
[[gnu::always_inline]] inline bool profiler_active() {
  return c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != nullptr &&
         torch::profiler::impl::profilerEnabled();
}

// A hit on a record whose hit_call is set (LaunchRecord::hit_call): the call is served by
// hit_call(grid, *args, **kwargs), with the call's own arguments, and returns what it returns.
[[gnu::noinline, gnu::cold]] PyObject* call_hit_call(BoundLaunchObject* self,
                                                     const LaunchRecord& rec, PyObject* const* args,
                                                     Py_ssize_t nargs, PyObject* kwnames) {
  const Py_ssize_t total = nargs + (kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0);
  std::vector<PyObject*> stack(size_t(total) + 1);
  stack[0] = self->grid;
  std::copy(args, args + total, stack.begin() + 1);
  const Ref hit_call(Py_NewRef(static_cast<PyObject*>(rec.hit_call)));
  return PyObject_Vectorcall(hit_call.get(), stack.data(), size_t(nargs) + 1, kwnames);
}

PyObject* launch_bound(BoundLaunchObject* self, PyObject* const* args, size_t nargsf,
                       PyObject* kwnames) {
  KernelObject* kernel = self->kernel;
  KernelState& st = *kernel->state;
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  BoundCall call;
  KeyStatus status = bind_call(kernel, args, nargs, kwnames, &call);
  if (status == KeyStatus::Error) {
    return nullptr;
  }
  const KnobState* knobs = current_knobs();
  if (knobs == nullptr) {
    return nullptr;
  }
  if (status == KeyStatus::Ok && knobs->native_disabled) {
    status = KeyStatus::Fallback;
    call.fallback_reason =
        "a Triton knob the native path does not honour is set (a "
        "stages-inspection hook)";
  }
  if (status == KeyStatus::Fallback) {
    return launch_through_triton(self, args, nargs, kwnames, call);
  }
  // Triton reads the binary-changing knobs into the options before the pre-run hooks run.
  const uint64_t knob_word = knobs->key_word;
  if (kernel->pre_run_hooks != nullptr && PyList_GET_SIZE(kernel->pre_run_hooks) > 0) {
    if (st.hooks_through_triton) {
      call.fallback_reason =
          "the kernel has pre-run hooks, which Triton's run passes the tuned or computed values";
      return launch_through_triton(self, args, nargs, kwnames, call);
    }
    PyObject* handled = nullptr;
    if (!rebind_after_pre_run_hooks(self, args, nargs, kwnames, &call, &handled)) {
      return handled;  // an error (nullptr), or the call launched through Triton as a fallback
    }
    // ... and the launch hook knobs when it launches, after them (a hook they set runs).
    if (current_knobs() == nullptr) {
      return nullptr;
    }
  }
  try {
    const LaunchContext ctx = current_launch_context();
    finish_key(&call.key, ctx.device, knob_word);
    const LaunchRecord* rec = st.table.lookup(call.key);
    if (rec != nullptr) {
      ++st.hits;
    } else {
      PyObject* handled = nullptr;
      rec = register_on_miss(self, args, nargs, kwnames, call, ctx.device, &handled);
      if (rec == nullptr) {
        return handled;  // launched through Triton by the handler, or nullptr with an error
      }
    }
    // From here Python runs (globals' __eq__, a callable grid, the scratch allocator, hooks) and
    // may launch this kernel again; the pin keeps `rec` from being evicted under us.
    const RecordPin pin(rec);
    if (C10_UNLIKELY(rec->leaves_read > call.num_leaves)) {
      // A record whose hits call Python instead of launching (leaves_read is kHitCallLeaves).
      // The call sets best_config itself, first, as Triton's Autotuner.run does.
      if (rec->hit_call != nullptr) {
        return call_hit_call(self, *rec, args, nargs, kwnames);
      }
      // Only a record inserted under a key it was not compiled for reads past what the call
      // bound (its plan names tuple leaves the call does not have); never pack those slots.
      return unbound_slots_error(kernel, *rec, call);
    }
    if (C10_UNLIKELY(st.hit_extras)) {
      // The tuned values are read only by a callable grid (here) and the launch hooks (below):
      // the launch packs no constexpr.
      if (!st.config_params.empty() && !PyTuple_CheckExact(self->grid)) {
        fill_tuned_args(st, *rec, &call);
      }
      if (kernel->publish_owner != nullptr && !publish(kernel, *rec)) {
        return nullptr;
      }
    }
    if (kernel->global_checks != nullptr && !globals_unchanged(kernel)) {
      if (!PyErr_Occurred()) {
        PyErr_Format(PyExc_RuntimeError, "%U: a global it reads has changed since it was compiled",
                     kernel->name);
      }
      return nullptr;
    }
    LaunchGrid grid;
    bool python_ran = false;  // since the key was built: then the arguments are read again
    if (!resolve_grid(kernel, self->grid, call, *rec, &grid, &python_ran)) {
      return nullptr;
    }
    Scratch scratch;  // its buffers live until the launch is issued
    if (rec->needs_scratch() && grid.x && grid.y && grid.z) {
      python_ran = true;  // the allocator is Python's (triton.set_allocator)
      if (!allocate_scratch_buffers(kernel, *rec, grid, ctx.stream, &scratch)) {
        return nullptr;
      }
    }
    if (C10_UNLIKELY(python_ran) &&
        !rebind_after_python(kernel, args, nargs, kwnames, *rec, &call)) {
      return nullptr;
    }
    // Launch hooks (Triton's knobs.runtime.launch_enter_hook / launch_exit_hook), only when set.
    // Both knobs are read before the enter hooks run, as Triton's launcher takes them
    // (CompiledKernel.__getitem__'s runner passes both to the launch).
    Ref hook_metadata;
    const bool hooked = g_lazy_dict_type != nullptr && hooks_active(*knobs);
    std::optional<HeldHook> exit_hook;
    if (hooked) {
      exit_hook.emplace(knobs->exit);
      const HeldHook enter_hook(knobs->enter);
      if (!st.config_params.empty()) {
        fill_tuned_args(st, *rec, &call);  // what the hooks see (a tuple grid left them out)
      }
      hook_metadata.reset(make_hook_metadata(kernel, *rec, grid, ctx.stream, call));
      // Triton's C launcher reads the tensors' data pointers after the enter hooks, but its
      // Python side expanded host tensor descriptors before them (driver.py
      // make_tensordesc_arg): only the tensor parameters are read again.
      if (!hook_metadata || !call_launch_hook(enter_hook, hook_metadata.get()) ||
          reread_pointers(kernel, &call, /*leaves=*/false) != KeyStatus::Ok) {
        return nullptr;
      }
    }
    // A profiler range named for the kernel, only while torch's profiler is active.
    if (C10_UNLIKELY(profiler_active())) {
      launch_in_profiler_range(*rec, grid, ctx.stream, call.values, scratch.global_pointer,
                               scratch.profile_pointer);
    } else {
      launch(*rec, grid, ctx.stream, call.values, scratch.global_pointer, scratch.profile_pointer);
    }
    if (hooked && !call_launch_hook(*exit_hook, hook_metadata.get())) {
      return nullptr;
    }
    PyObject* compiled = static_cast<PyObject*>(rec->user_data);
    return Py_NewRef(compiled ? compiled : Py_None);
  } catch (const ParamError& e) {
    // A leaf (tuple element, descriptor field) is reported under the parameter it belongs to.
    const int num_params = int(st.params.size());
    int owner = e.arg_index;
    if (owner >= num_params && owner < num_params + call.num_leaves) {
      owner = call.leaf_owner[owner - num_params];
    }
    if (owner >= 0 && owner < num_params) {
      PyErr_Format(e.overflow ? PyExc_OverflowError : PyExc_TypeError, "%U: argument '%U': %s",
                   kernel->name, st.params[owner].name, e.what());
    } else {
      PyErr_Format(PyExc_TypeError, "%U: %s", kernel->name, e.what());
    }
    return nullptr;
  } catch (abi::__forced_unwind&) {
    throw;  // a thread ended by pthread_exit: see with_python_errors
  } catch (...) {
    set_python_error_from_current_exception(kernel);
    return nullptr;
  }
}

// ---- BoundLaunch type ------------------------------------------------------------------------

void bound_dealloc(BoundLaunchObject* self) {
  PyObject_GC_UnTrack(self);
  Py_CLEAR(self->kernel);
  Py_CLEAR(self->grid);
  PyObject_GC_Del(self);
}

int bound_traverse(BoundLaunchObject* self, visitproc visit, void* arg) {
  Py_VISIT(self->kernel);
  Py_VISIT(self->grid);
  return 0;
}

int bound_clear(BoundLaunchObject* self) {
  Py_CLEAR(self->kernel);
  Py_CLEAR(self->grid);
  return 0;
}

PyObject* bound_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  return PyVectorcall_Call(self, args, kwargs);
}

PyObject* make_bound(KernelObject* kernel, PyObject* grid) {
  // Referenced before allocating: an allocation can collect garbage, and finalizers run Python.
  Py_INCREF(reinterpret_cast<PyObject*>(kernel));
  BoundLaunchObject* b = PyObject_GC_New(BoundLaunchObject, &BoundLaunchType);
  if (b == nullptr) {
    Py_DECREF(reinterpret_cast<PyObject*>(kernel));
    return nullptr;
  }
  b->kernel = kernel;
  b->grid = Py_NewRef(grid);
  b->vectorcall = reinterpret_cast<vectorcallfunc>(launch_bound);
  PyObject_GC_Track(b);
  return reinterpret_cast<PyObject*>(b);
}

// ---- Kernel type -----------------------------------------------------------------------------

void kernel_release_state(KernelObject* self) {
  if (self->state != nullptr) {
    for (ParamSpec& p : self->state->params) {
      Py_XDECREF(p.name);
      Py_XDECREF(p.default_value);
    }
    for (PyObject* o : self->state->option_names) {
      Py_XDECREF(o);
    }
    clear_grid_meta(self->state);
    clear_grid_programs(self->state);
    Py_CLEAR(self->state->hook_template);
    clear_option_words(&self->state->keywords);
    Py_XDECREF(self->state->keywords.kwnames);
    delete self->state;
    self->state = nullptr;
  }
}

int kernel_traverse(KernelObject* self, visitproc visit, void* arg) {
  Py_VISIT(self->miss_handler);
  Py_VISIT(self->scratch_allocator);
  Py_VISIT(self->cached_bound);
  Py_VISIT(self->pre_run_hooks);
  Py_VISIT(self->global_checks);
  Py_VISIT(self->publish_owner);
  Py_VISIT(self->last_published);
  Py_VISIT(self->jit_function);
  for (int i = 0; i < self->num_under_types; ++i) {
    Py_VISIT(self->under_types[i]);
  }
  if (self->state != nullptr) {
    for (ParamSpec& p : self->state->params) {
      Py_VISIT(p.default_value);
    }
    // What a launch returns (a compiled kernel, whose source function can be the very
    // JITFunction that holds this kernel under the patch), tuned arguments, published configs.
    return self->state->table.visit_records(
        [&](const LaunchRecord& rec) { return visit_record_references(rec, visit, arg); });
  }
  return 0;
}

int kernel_clear(KernelObject* self) {
  Py_CLEAR(self->miss_handler);
  Py_CLEAR(self->scratch_allocator);
  Py_CLEAR(self->cached_bound);
  Py_CLEAR(self->pre_run_hooks);
  Py_CLEAR(self->global_checks);
  Py_CLEAR(self->publish_owner);
  Py_CLEAR(self->publish_name);
  Py_CLEAR(self->last_published);
  Py_CLEAR(self->jit_function);
  clear_under_types(self);
  if (self->state != nullptr) {
    for (ParamSpec& p : self->state->params) {
      Py_CLEAR(p.default_value);
    }
    self->state->table.clear();  // its records' references (kernel_traverse); modules unloaded
  }
  return 0;
}

void kernel_dealloc(KernelObject* self) {
  PyObject_GC_UnTrack(self);
  if (self->weakrefs != nullptr) {
    PyObject_ClearWeakRefs(reinterpret_cast<PyObject*>(self));
  }
  forget_patched_dispatch(self);
  kernel_clear(self);
  kernel_release_state(self);
  Py_CLEAR(self->name);
  // A Python subclass's subtype_dealloc releases the type reference itself.
  Py_TYPE(self)->tp_free(self);
}

PyObject* kernel_get_jit_function(KernelObject* self, void*) {
  if (self->jit_function == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "jit_function");
    return nullptr;
  }
  return Py_NewRef(self->jit_function);
}

int kernel_set_jit_function(KernelObject* self, PyObject* value, void*) {
  if (value == nullptr && self->jit_function == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "jit_function");
    return -1;
  }
  Py_XSETREF(self->jit_function, Py_XNewRef(value));
  return 0;
}

PyGetSetDef kernel_getset[] = {
    {"jit_function", reinterpret_cast<getter>(kernel_get_jit_function),
     reinterpret_cast<setter>(kernel_set_jit_function),
     "The wrapped triton.jit function (JITFunction).", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyObject* kernel_new(PyTypeObject* type, PyObject*, PyObject*) {
  KernelObject* self = reinterpret_cast<KernelObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    return nullptr;
  }
  self->state = new KernelState();
  self->name = PyUnicode_FromString("<kernel>");
  return reinterpret_cast<PyObject*>(self);
}

PyMappingMethods kernel_mapping = {nullptr, reinterpret_cast<binaryfunc>(kernel_subscript),
                                   nullptr};

}  // namespace

void clear_under_types(KernelObject* kernel) {
  const int count = kernel->num_under_types;
  kernel->num_under_types = 0;  // before the references go: a hit reads the count first
  for (int i = 0; i < count; ++i) {
    Py_CLEAR(kernel->under_types[i]);
  }
}

PyObject* kernel_subscript(KernelObject* self, PyObject* grid) {
  // Reuse the cached bound launch when only this kernel holds it: `kernel[grid](...)` then
  // allocates nothing. Safe under the GIL: the refcount cannot change underneath us.
  PyObject* cached = self->cached_bound;
  if (cached != nullptr && Py_REFCNT(cached) == 1) {
    BoundLaunchObject* b = reinterpret_cast<BoundLaunchObject*>(cached);
    Py_INCREF(cached);  // before the old grid's release, which can run Python that launches
    if (b->grid != grid) {
      PyObject* old = b->grid;
      b->grid = Py_NewRef(grid);
      Py_DECREF(old);
    }
    return cached;
  }
  PyObject* fresh = make_bound(self, grid);
  if (fresh != nullptr && cached == nullptr) {
    // The cache holds the bound launch, which holds the kernel: a cycle the GC can see.
    self->cached_bound = Py_NewRef(fresh);
  }
  return fresh;
}

void set_launch_hook_support(PyObject* lazy_dict_type, PyObject* add_launch_metadata,
                             PyObject* plain_check) {
  if (g_hook_names.name == nullptr) {
    g_hook_names = {PyUnicode_InternFromString("name"),
                    PyUnicode_InternFromString("function"),
                    PyUnicode_InternFromString("stream"),
                    PyUnicode_InternFromString("jit_function"),
                    PyUnicode_InternFromString("launch_metadata"),
                    PyUnicode_InternFromString("data"),
                    PyUnicode_InternFromString("extras")};
    g_empty_tuple = PyTuple_New(0);
  }
  Py_XSETREF(g_lazy_dict_type, Py_NewRef(lazy_dict_type));
  Py_XSETREF(g_add_launch_metadata, Py_NewRef(add_launch_metadata));
  Py_XSETREF(g_lazy_dict_check, plain_check != Py_None ? Py_XNewRef(plain_check) : nullptr);
  g_lazy_dict_checked_tag = 0;  // asked at the first hooked launch
  g_lazy_dict_plain = false;
}

void set_python_error_from_current_exception(KernelObject* kernel) {
  try {
    throw;
  } catch (const CudaError& e) {
    PyObject* exc = PyObject_CallFunction(g_cuda_error_type, "s", e.what());
    if (exc != nullptr) {
      PyObject* code = PyLong_FromLong(e.code());
      PyObject_SetAttrString(exc, "code", code);
      Py_XDECREF(code);
      PyErr_SetObject(g_cuda_error_type, exc);
      Py_DECREF(exc);
    }
  } catch (const DriverUnavailable& e) {
    PyErr_SetString(g_driver_unavailable_type, e.what());
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::exception& e) {
    if (kernel != nullptr) {
      PyErr_Format(PyExc_RuntimeError, "%U: %s", kernel->name, e.what());
    } else {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  } catch (abi::__forced_unwind&) {
    throw;  // a thread ended by pthread_exit: see with_python_errors
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "fastkernel: unknown native error");
  }
}

PyTypeObject BoundLaunchType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "fastkernel._C.BoundLaunch";
  t.tp_doc = "A kernel with its grid: call it with the kernel's arguments to launch.";
  t.tp_basicsize = sizeof(BoundLaunchObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  t.tp_vectorcall_offset = offsetof(BoundLaunchObject, vectorcall);
  t.tp_call = bound_call;
  t.tp_dealloc = reinterpret_cast<destructor>(bound_dealloc);
  t.tp_traverse = reinterpret_cast<traverseproc>(bound_traverse);
  t.tp_clear = reinterpret_cast<inquiry>(bound_clear);
  return t;
}();

PyTypeObject KernelType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "fastkernel._C.Kernel";
  t.tp_doc = "Native state of a fastkernel kernel: parameters, launch table, launch entry.";
  t.tp_basicsize = sizeof(KernelObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC;
  t.tp_new = kernel_new;
  t.tp_dealloc = reinterpret_cast<destructor>(kernel_dealloc);
  t.tp_traverse = reinterpret_cast<traverseproc>(kernel_traverse);
  t.tp_clear = reinterpret_cast<inquiry>(kernel_clear);
  t.tp_as_mapping = &kernel_mapping;
  t.tp_getset = kernel_getset;
  t.tp_weaklistoffset = offsetof(KernelObject, weakrefs);
  return t;
}();

void set_pre_run_options(PyObject* add_run_options) {
  Py_XSETREF(g_add_run_options, add_run_options != Py_None ? Py_NewRef(add_run_options) : nullptr);
}

}  // namespace fastkernel
