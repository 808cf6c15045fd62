// Notices changes to Triton's knobs without looking them up on every launch. Attribute
// assignment goes through a notifying __setattr__ the Python layer installs on the knob
// classes (mark_knobs_dirty); edits of the dicts themselves (knobs.scope() restoring state) are
// caught by a dict watcher on Python >= 3.12 and by the dicts' version tags on 3.11. (Dict
// watchers alone miss assignment on 3.13, where attribute stores bypass the dict.)
#include "knob_watch.h"

#include <vector>

namespace fastkernel {
namespace knob_watch_detail {

KnobState state;
bool dirty = true;
int num_watched = 0;
#if PY_VERSION_HEX < 0x030C0000
PyDictObject* watched[kMaxWatched];
uint64_t versions[kMaxWatched];
#endif

}  // namespace knob_watch_detail

namespace {

using namespace knob_watch_detail;

PyObject* g_refresh = nullptr;
std::vector<PyObject*> g_dicts;  // owned; what `watched` points into

#if PY_VERSION_HEX >= 0x030C0000
int g_watcher_id = -1;

int on_dict_event(PyDict_WatchEvent, PyObject*, PyObject*, PyObject*) {
  dirty = true;
  return 0;
}
#endif

void mark_clean() {
#if PY_VERSION_HEX < 0x030C0000
  for (int i = 0; i < num_watched; ++i) {
    versions[i] = dict_version(reinterpret_cast<PyObject*>(watched[i]));
  }
#endif
  dirty = false;
}

void set_hook(LaunchHook* hook, PyObject* calls, bool reversed, PyObject* callable) {
  Py_XSETREF(hook->calls, calls == Py_None ? nullptr : Py_NewRef(calls));
  hook->reversed = reversed;
  Py_XSETREF(hook->callable, callable == Py_None ? nullptr : Py_NewRef(callable));
}

// Where a hook list's size is kept (read on every launch), or kNoHooks without a list.
const Py_ssize_t* list_size(PyObject* list) {
  return list != nullptr ? &reinterpret_cast<PyVarObject*>(list)->ob_size : &kNoHooks;
}

}  // namespace

const KnobState* knob_watch_detail::refresh() {
  if (g_refresh == nullptr) {
    return &state;  // not configured (the Python layer configures it at import)
  }
  PyObject* result = PyObject_CallNoArgs(g_refresh);
  if (result == nullptr) {
    return nullptr;
  }
  PyObject *enter = nullptr, *enter_callable = nullptr, *exit = nullptr, *exit_callable = nullptr;
  unsigned long long word = 0;
  int disabled = 0, enter_reversed = 0, exit_reversed = 0;
  bool ok = PyArg_ParseTuple(result, "KpOpOOpO", &word, &disabled, &enter, &enter_reversed,
                             &enter_callable, &exit, &exit_reversed, &exit_callable);
  if (ok &&
      ((enter != Py_None && !PyList_Check(enter)) || (exit != Py_None && !PyList_Check(exit)))) {
    PyErr_SetString(PyExc_TypeError, "fastkernel: knob refresh must return hook lists or None");
    ok = false;
  }
  if (ok) {
    state.key_word = word;
    state.native_disabled = disabled != 0;
    set_hook(&state.enter, enter, enter_reversed != 0, enter_callable);
    set_hook(&state.exit, exit, exit_reversed != 0, exit_callable);
    state.any_hook_callable = state.enter.callable != nullptr || state.exit.callable != nullptr;
    state.hook_list_sizes[0] = list_size(state.enter.calls);
    state.hook_list_sizes[1] = list_size(state.exit.calls);
    mark_clean();
  }
  Py_DECREF(result);
  return ok ? &state : nullptr;
}

void mark_knobs_dirty() noexcept { dirty = true; }

bool configure_knob_watch(PyObject* dicts, PyObject* refresh_fn) {
  if (!PyList_Check(dicts) || !PyCallable_Check(refresh_fn) ||
      PyList_GET_SIZE(dicts) > kMaxWatched) {
    PyErr_SetString(PyExc_TypeError,
                    "fastkernel: configure_knob_watch(list of at most 4 dicts, callable)");
    return false;
  }
  for (PyObject* d : g_dicts) {
#if PY_VERSION_HEX >= 0x030C0000
    PyDict_Unwatch(g_watcher_id, d);
#endif
    Py_DECREF(d);
  }
  g_dicts.clear();
  num_watched = 0;
#if PY_VERSION_HEX >= 0x030C0000
  if (g_watcher_id < 0) {
    g_watcher_id = PyDict_AddWatcher(on_dict_event);
    if (g_watcher_id < 0) {
      return false;
    }
  }
#endif
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(dicts); ++i) {
    PyObject* d = PyList_GET_ITEM(dicts, i);
    if (!PyDict_CheckExact(d)) {
      PyErr_SetString(PyExc_TypeError, "fastkernel: knob watch needs plain dicts");
      return false;
    }
#if PY_VERSION_HEX >= 0x030C0000
    if (PyDict_Watch(g_watcher_id, d) < 0) {
      return false;
    }
#else
    watched[num_watched] = reinterpret_cast<PyDictObject*>(d);
#endif
    g_dicts.push_back(Py_NewRef(d));
    ++num_watched;
  }
  Py_XSETREF(g_refresh, Py_NewRef(refresh_fn));
  dirty = true;
  return true;
}

}  // namespace fastkernel
