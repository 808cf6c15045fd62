// Notices changes to Triton's knobs without looking them up on every launch. Attribute
// assignment goes through a notifying __setattr__ the Python layer installs on the knob
// classes (mark_knobs_dirty); edits of the dicts themselves (knobs.scope() restoring state) are
// caught by a dict watcher on Python >= 3.12 and by the dicts' version tags on 3.11. (Dict
// watchers alone miss assignment on 3.13, where attribute stores bypass the dict.)
#include "knob_watch.h"

#include <vector>

namespace fastkernel {
namespace {

KnobState g_state;
PyObject* g_refresh = nullptr;
std::vector<PyObject*> g_dicts;  // owned
bool g_dirty = true;

#if PY_VERSION_HEX >= 0x030C0000
int g_watcher_id = -1;

int on_dict_event(PyDict_WatchEvent, PyObject*, PyObject*, PyObject*) {
  g_dirty = true;
  return 0;
}

bool changed() { return g_dirty; }
void mark_clean() { g_dirty = false; }
#else
std::vector<uint64_t> g_versions;

bool changed() {
  if (g_dirty) {
    return true;
  }
  for (size_t i = 0; i < g_dicts.size(); ++i) {
    if (reinterpret_cast<PyDictObject*>(g_dicts[i])->ma_version_tag != g_versions[i]) {
      return true;
    }
  }
  return false;
}

void mark_clean() {
  g_versions.resize(g_dicts.size());
  for (size_t i = 0; i < g_dicts.size(); ++i) {
    g_versions[i] = reinterpret_cast<PyDictObject*>(g_dicts[i])->ma_version_tag;
  }
  g_dirty = false;
}
#endif

bool refresh() {
  PyObject* result = PyObject_CallNoArgs(g_refresh);
  if (result == nullptr) {
    return false;
  }
  PyObject *enter = nullptr, *exit = nullptr;
  unsigned long long word = 0;
  int disabled = 0, enter_plain = 0, exit_plain = 0;
  const bool ok = PyArg_ParseTuple(result, "KpOpOp", &word, &disabled, &enter, &enter_plain,
                                   &exit, &exit_plain);
  if (ok && ((enter != Py_None && !PyList_Check(enter)) || (exit != Py_None && !PyList_Check(exit)))) {
    PyErr_SetString(PyExc_TypeError, "fastkernel: knob refresh must return hook lists or None");
    Py_DECREF(result);
    return false;
  }
  if (ok) {
    g_state.key_word = word;
    g_state.native_disabled = disabled != 0;
    g_state.enter_plain = enter_plain != 0;
    g_state.exit_plain = exit_plain != 0;
    Py_XSETREF(g_state.enter_calls, enter == Py_None ? nullptr : Py_NewRef(enter));
    Py_XSETREF(g_state.exit_calls, exit == Py_None ? nullptr : Py_NewRef(exit));
  }
  Py_DECREF(result);
  if (ok) {
    // Read the version tags after the refresh: knob reads in it may not modify the dicts, but
    // if they did the new state already reflects those values.
    mark_clean();
  }
  return ok;
}

}  // namespace

void mark_knobs_dirty() noexcept { g_dirty = true; }

bool configure_knob_watch(PyObject* dicts, PyObject* refresh_fn) {
  if (!PyList_Check(dicts) || !PyCallable_Check(refresh_fn)) {
    PyErr_SetString(PyExc_TypeError, "fastkernel: configure_knob_watch(list of dicts, callable)");
    return false;
  }
  for (PyObject* d : g_dicts) {
#if PY_VERSION_HEX >= 0x030C0000
    PyDict_Unwatch(g_watcher_id, d);
#endif
    Py_DECREF(d);
  }
  g_dicts.clear();
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
#endif
    g_dicts.push_back(Py_NewRef(d));
  }
  Py_XSETREF(g_refresh, Py_NewRef(refresh_fn));
  g_dirty = true;
  return true;
}

const KnobState* current_knobs() {
  if (g_refresh != nullptr && changed() && !refresh()) {
    return nullptr;
  }
  return &g_state;
}

}  // namespace fastkernel
