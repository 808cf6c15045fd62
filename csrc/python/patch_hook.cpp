// The patch hook: `kernel[grid]` of any Triton JITFunction, served natively.
//
// The native subscript is installed as a slot wrapper (a wrapper_descriptor whose wrapped
// function is patched_subscript): CPython's update_one_slot (Objects/typeobject.c) then puts
// patched_subscript itself into the mp_subscript slot of JITFunction and of every subclass that
// inherits __getitem__, so `jit[grid]` costs one C call plus one table lookup, with no Python
// frame, exactly like a @fastkernel kernel's own subscript.
#include "patch_hook.h"

#include <structmember.h>

#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace fastkernel {
namespace {

PyObject* g_factory = nullptr;         // Python callable(jit) -> dispatch Kernel or None
PyObject* g_triton_getitem = nullptr;  // Triton's KernelInterface.__getitem__
PyObject* g_type_served = nullptr;     // Python callable(type) -> bool

// Never a type's version tag (CPython gives out small ones, and 0 for none): what the one-entry
// cache holds while the cached kernel's type is unchecked.
constexpr unsigned int kUnchecked = ~0u;

// A type's version tag (tp_version_tag, Objects/typeobject.c): given out on a method-cache
// lookup, unique, and reset to 0 by any assignment on the type or a base (PyType_Modified), so
// an unchanged tag means an unchanged `run`. 0 when it has none (up to 3.11 the flag says so).
inline unsigned int version_tag(PyTypeObject* type) {
#if PY_VERSION_HEX < 0x030C0000
  if (!PyType_HasFeature(type, Py_TPFLAGS_VALID_VERSION_TAG)) {
    return 0;
  }
#endif
  return type->tp_version_tag;
}

// Each type found serving, by the version tag it had then (borrowed pointers: a freed type's
// address may be reused, but never with the same tag).
std::unordered_map<PyTypeObject*, unsigned int>& served_tags() {
  static auto* map = new std::unordered_map<PyTypeObject*, unsigned int>();
  return *map;
}

// JITFunction -> its dispatch Kernel (borrowed: the JITFunction's __dict__ keeps it alive, and
// the Kernel removes its entry when it is deallocated). The last lookup is cached in front of
// the map: a loop launching one kernel never reaches the map.
std::unordered_map<PyObject*, KernelObject*>& dispatches() {
  static auto* map = new std::unordered_map<PyObject*, KernelObject*>();
  return *map;
}
PyObject* g_last_jit = nullptr;
KernelObject* g_last_dispatch = nullptr;
unsigned int g_last_tag = kUnchecked;  // the version tag g_last_jit's type was served under

// Types the factory refused as a whole (it returned False: a subclass with its own run), owned:
// their instances go to Triton's __getitem__ without calling the factory on every launch.
std::unordered_set<PyTypeObject*>& refused_types() {
  static auto* set = new std::unordered_set<PyTypeObject*>();
  return *set;
}
// Counts forget_refused_types calls: a refusal the factory gave before one (another thread
// registered the class while the factory ran) is not remembered.
uint64_t g_refused_generation = 0;

// find_or_create past the one-entry cache: the map, then the factory (out of line, so the
// cached case stays inline in patched_subscript). A Kernel the factory made is returned with
// its new reference in *owned, which the caller releases after using it: once the factory has
// returned, another thread can unpatch and drop the JITFunction's own reference.
[[gnu::noinline]] PyObject* find_or_create_slow(PyObject* jit, PyObject** owned) {
  auto& map = dispatches();
  auto it = map.find(jit);
  if (it != map.end()) {
    g_last_jit = jit;
    g_last_dispatch = it->second;
    g_last_tag = kUnchecked;
    return reinterpret_cast<PyObject*>(it->second);
  }
  if (g_factory == nullptr) {  // unpatched meanwhile (another thread): Triton's path
    return Py_None;
  }
  auto& refused = refused_types();
  if (!refused.empty() && refused.count(Py_TYPE(jit)) != 0) {
    return Py_None;
  }
  const uint64_t generation = g_refused_generation;
  PyObject* made = PyObject_CallOneArg(g_factory, jit);
  if (made == nullptr) {
    return nullptr;
  }
  if (made == Py_False) {
    Py_DECREF(made);
    if (g_factory != nullptr && generation == g_refused_generation &&
        refused.insert(Py_TYPE(jit)).second) {
      Py_INCREF(Py_TYPE(jit));
    }
    return Py_None;
  }
  if (made == Py_None || g_factory == nullptr) {
    // Triton's own path (not cached: the JITFunction may be freed and its address reused), or
    // unpatched by another thread while the factory ran.
    Py_DECREF(made);
    return Py_None;
  }
  if (!PyObject_TypeCheck(made, &KernelType)) {
    PyErr_Format(PyExc_TypeError, "fastkernel: the patch factory returned %s, not a Kernel",
                 Py_TYPE(made)->tp_name);
    Py_DECREF(made);
    return nullptr;
  }
  KernelObject* kernel = reinterpret_cast<KernelObject*>(made);
  if (kernel->patched_jit != nullptr && kernel->patched_jit != jit) {
    PyErr_SetString(PyExc_RuntimeError, "fastkernel: a dispatch Kernel serves one JITFunction");
    Py_DECREF(made);
    return nullptr;
  }
  // The factory keeps the Kernel alive (in the JITFunction's __dict__); the map borrows it,
  // and the Kernel's deallocation removes it (forget_patched_dispatch).
  kernel->patched_jit = jit;
  map[jit] = kernel;
  g_last_jit = jit;
  g_last_dispatch = kernel;
  g_last_tag = kUnchecked;
  *owned = made;
  return made;
}

// 1 when `type` still launches through the run the patch serves, with the version tag that
// says so in *tag (kUnchecked when the type has none: asked again next time); 0 when another
// run was assigned on it or a base; -1 with an exception set.
int type_served(PyTypeObject* type, unsigned int* tag) {
  auto& tags = served_tags();
  unsigned int now = version_tag(type);
  if (now != 0) {
    auto it = tags.find(type);
    if (it != tags.end() && it->second == now) {
      *tag = now;
      return 1;
    }
  }
  if (g_type_served == nullptr) {
    *tag = kUnchecked;
    return 1;
  }
  PyObject* answer = PyObject_CallOneArg(g_type_served, reinterpret_cast<PyObject*>(type));
  if (answer == nullptr) {
    return -1;
  }
  const int served = PyObject_IsTrue(answer);
  Py_DECREF(answer);
  if (served <= 0) {
    tags.erase(type);
    return served;
  }
  now = version_tag(type);  // the callback's lookup of `run` gave the type one if it could
  if (now != 0) {
    tags[type] = now;
  }
  *tag = now != 0 ? now : kUnchecked;
  return 1;
}

// Whether the classes a launch of `kernel` goes through underneath (under_types) are unchanged
// since each was found serving: one compare per class, none for a plain kernel's dispatch. The
// raw tag is compared, without version_tag's flag test before 3.12: a noted tag is never 0,
// and a change of the class sets its tag to 0 on every supported CPython (PyType_Modified),
// until a lookup gives it a new one.
inline bool under_tags_match(const KernelObject* kernel) {
  for (int i = 0; i < kernel->num_under_types; ++i) {
    if (kernel->under_types[i]->tp_version_tag != kernel->under_tags[i]) {
      return false;
    }
  }
  return true;
}

inline bool under_unchanged(const KernelObject* kernel) {
  return __builtin_expect(kernel->num_under_types == 0, 1) || under_tags_match(kernel);
}

// type_served for each class under `kernel`, noting the tags it gives: 1 when all still launch
// through the run the patch serves, 0 when one does not (another library's `run` is on it), -1
// with an exception set.
[[gnu::noinline]] int under_served(KernelObject* kernel) {
  for (int i = 0; i < kernel->num_under_types; ++i) {
    unsigned int tag = kUnchecked;
    const int served = type_served(kernel->under_types[i], &tag);
    kernel->under_tags[i] = served > 0 ? tag : kUnchecked;  // type_served never gives 0
    if (served <= 0) {
      return served;
    }
  }
  return 1;
}

// The dispatch of `jit`, or Py_None (borrowed, or owned through *owned as above), or nullptr
// with an exception set.
inline PyObject* find_or_create(PyObject* jit, PyObject** owned) {
  if (jit == g_last_jit) {
    return reinterpret_cast<PyObject*>(g_last_dispatch);
  }
  return find_or_create_slow(jit, owned);
}

// patched_subscript past the one-entry cache: the map or the factory, or Triton's __getitem__.
[[gnu::noinline]] PyObject* patched_subscript_slow(PyObject* jit, PyObject* grid) {
  PyObject* owned = nullptr;
  PyObject* dispatch = find_or_create_slow(jit, &owned);
  if (dispatch == nullptr) {
    return nullptr;
  }
  if (dispatch != Py_None) {
    // type_served and under_served may call Python, where another thread can drop the
    // dispatch (unpatch(), an assigned attribute it was built from): held until it is used.
    if (owned == nullptr) {
      owned = Py_NewRef(dispatch);
    }
    unsigned int tag = kUnchecked;
    int served = type_served(Py_TYPE(jit), &tag);
    if (served > 0 && !under_unchanged(reinterpret_cast<KernelObject*>(dispatch))) {
      served = under_served(reinterpret_cast<KernelObject*>(dispatch));
    }
    if (served < 0) {
      Py_XDECREF(owned);
      return nullptr;
    }
    if (served == 0) {  // a run assigned on a class: it is what Triton's [grid] calls
      Py_XDECREF(owned);
      owned = nullptr;
      dispatch = Py_None;
    } else if (g_last_jit == jit && g_last_dispatch == reinterpret_cast<KernelObject*>(dispatch)) {
      g_last_tag = tag;
    }
  }
  if (dispatch == Py_None) {
    if (g_triton_getitem == nullptr) {
      PyErr_SetString(PyExc_RuntimeError, "fastkernel: the patch was never installed");
      return nullptr;
    }
    return PyObject_CallFunctionObjArgs(g_triton_getitem, jit, grid, nullptr);
  }
  // The bound launch holds its own reference to the Kernel.
  PyObject* bound = kernel_subscript(reinterpret_cast<KernelObject*>(dispatch), grid);
  Py_XDECREF(owned);
  return bound;
}

}  // namespace

PyObject* patched_subscript(PyObject* jit, PyObject* grid) {
  // The kernel launched last (always a dispatch: the cache holds no other), its type unchanged
  // since it was found serving: two compares and a jump into its own subscript.
  if (jit == g_last_jit && version_tag(Py_TYPE(jit)) == g_last_tag &&
      under_unchanged(g_last_dispatch)) {
    return kernel_subscript(g_last_dispatch, grid);
  }
  return patched_subscript_slow(jit, grid);
}

PyObject* patched_dispatch(PyObject* jit) {
  PyObject* owned = nullptr;
  PyObject* dispatch = find_or_create(jit, &owned);
  if (dispatch == nullptr || dispatch == Py_None) {
    return dispatch == nullptr ? nullptr : Py_NewRef(Py_None);
  }
  // Owned from here: under_served may call Python, where another thread can drop it.
  if (owned == nullptr) {
    owned = Py_NewRef(dispatch);
  }
  KernelObject* kernel = reinterpret_cast<KernelObject*>(dispatch);
  if (!under_unchanged(kernel)) {
    const int served = under_served(kernel);
    if (served <= 0) {  // a run another library assigned under it: Triton's run calls that
      Py_DECREF(owned);
      return served < 0 ? nullptr : Py_NewRef(Py_None);
    }
  }
  return owned;
}

PyObject* new_slot_wrapper(PyObject* type, PyTypeObject* model, const char* name, void* fn) {
  if (!PyType_Check(type)) {
    PyErr_Format(PyExc_TypeError, "fastkernel: a slot wrapper for %s needs a type", name);
    return nullptr;
  }
  PyObject* model_descr = PyObject_GetAttrString(reinterpret_cast<PyObject*>(model), name);
  if (model_descr == nullptr) {
    return nullptr;
  }
  if (!Py_IS_TYPE(model_descr, &PyWrapperDescr_Type)) {
    Py_DECREF(model_descr);
    PyErr_Format(PyExc_RuntimeError, "fastkernel: %s.%s is not a slot wrapper", model->tp_name,
                 name);
    return nullptr;
  }
  struct wrapperbase* base = reinterpret_cast<PyWrapperDescrObject*>(model_descr)->d_base;
  Py_DECREF(model_descr);  // the wrapperbase is a static slotdefs entry: it outlives the descr
  return PyDescr_NewWrapper(reinterpret_cast<PyTypeObject*>(type), base, fn);
}

bool install_patch(PyObject* jit_type, PyObject* factory, PyObject* triton_getitem,
                   PyObject* type_served) {
  if (!PyCallable_Check(type_served)) {
    PyErr_SetString(PyExc_TypeError, "fastkernel: install_patch: type_served must be callable");
    return false;
  }
  PyObject* descr = new_slot_wrapper(jit_type, &KernelType, "__getitem__",
                                     reinterpret_cast<void*>(&patched_subscript));
  if (descr == nullptr) {
    return false;
  }
  Py_XSETREF(g_factory, Py_NewRef(factory));
  Py_XSETREF(g_triton_getitem, Py_NewRef(triton_getitem));
  Py_XSETREF(g_type_served, Py_NewRef(type_served));
  const int rc = PyObject_SetAttrString(jit_type, "__getitem__", descr);
  Py_DECREF(descr);
  return rc == 0;
}

void uninstall_patch() {
  for (auto& [jit, kernel] : dispatches()) {
    kernel->patched_jit = nullptr;
  }
  dispatches().clear();
  forget_refused_types();
  served_tags().clear();
  g_last_jit = nullptr;
  g_last_dispatch = nullptr;
  g_last_tag = kUnchecked;
  // Triton's __getitem__ stays referenced: a launch that entered the slot before the type's
  // attribute was restored still completes through it.
  Py_CLEAR(g_factory);
}

void forget_refused_types() {
  ++g_refused_generation;
  auto& refused = refused_types();
  std::vector<PyTypeObject*> types(refused.begin(), refused.end());
  refused.clear();  // before the references go: a type's deallocation may run Python
  for (PyTypeObject* type : types) {
    Py_DECREF(type);
  }
}

bool patch_slot_is_native(PyTypeObject* type) {
  return type->tp_as_mapping != nullptr &&
         type->tp_as_mapping->mp_subscript == reinterpret_cast<binaryfunc>(&patched_subscript);
}

namespace {

struct DispatchInputObject {
  PyObject_HEAD PyObject* name;  // str
  PyObject* on_change;           // callable(obj)
};

PyObject* dispatch_input_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* name = nullptr;
  PyObject* on_change = nullptr;
  static const char* keywords[] = {"name", "on_change", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UO:DispatchInput", const_cast<char**>(keywords),
                                   &name, &on_change)) {
    return nullptr;
  }
  if (!PyCallable_Check(on_change)) {
    PyErr_SetString(PyExc_TypeError, "DispatchInput: argument 'on_change' must be callable");
    return nullptr;
  }
  auto* self = reinterpret_cast<DispatchInputObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    return nullptr;
  }
  self->name = Py_NewRef(name);
  PyUnicode_InternInPlace(&self->name);
  self->on_change = Py_NewRef(on_change);
  return reinterpret_cast<PyObject*>(self);
}

void dispatch_input_dealloc(DispatchInputObject* self) {
  Py_CLEAR(self->name);
  Py_CLEAR(self->on_change);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyObject* no_attribute(DispatchInputObject* self, PyObject* obj, PyObject* type) {
  PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute '%U'",
               obj != nullptr && obj != Py_None ? Py_TYPE(obj)->tp_name
                                                : reinterpret_cast<PyTypeObject*>(type)->tp_name,
               self->name);
  return nullptr;
}

PyObject* dispatch_input_get(PyObject* descr, PyObject* obj, PyObject* type) {
  auto* self = reinterpret_cast<DispatchInputObject*>(descr);
  if (obj == nullptr || obj == Py_None) {
    return no_attribute(self, obj, type);
  }
  PyObject* dict = PyObject_GenericGetDict(obj, nullptr);
  if (dict == nullptr) {
    return nullptr;
  }
  PyObject* value = PyDict_GetItemWithError(dict, self->name);
  Py_DECREF(dict);
  if (value == nullptr) {
    return PyErr_Occurred() ? nullptr : no_attribute(self, obj, type);
  }
  return Py_NewRef(value);
}

int dispatch_input_set(PyObject* descr, PyObject* obj, PyObject* value) {
  auto* self = reinterpret_cast<DispatchInputObject*>(descr);
  PyObject* dict = PyObject_GenericGetDict(obj, nullptr);
  if (dict == nullptr) {
    return -1;
  }
  int rc =
      value != nullptr ? PyDict_SetItem(dict, self->name, value) : PyDict_DelItem(dict, self->name);
  Py_DECREF(dict);
  if (rc < 0) {
    if (value == nullptr && PyErr_ExceptionMatches(PyExc_KeyError)) {
      PyErr_Clear();
      no_attribute(self, obj, reinterpret_cast<PyObject*>(Py_TYPE(obj)));
    }
    return -1;
  }
  PyObject* result = PyObject_CallOneArg(self->on_change, obj);
  if (result == nullptr) {
    return -1;
  }
  Py_DECREF(result);
  return 0;
}

PyMemberDef dispatch_input_members[] = {
    {"name", T_OBJECT_EX, offsetof(DispatchInputObject, name), READONLY,
     "The instance attribute's name."},
    {nullptr, 0, 0, 0, nullptr},
};

}  // namespace

PyTypeObject DispatchInputType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "fastkernel._C.DispatchInput";
  t.tp_doc =
      "DispatchInput(name, on_change): an instance attribute kept in the instance __dict__; "
      "storing or deleting it calls on_change(obj).";
  t.tp_basicsize = sizeof(DispatchInputObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT;
  t.tp_new = dispatch_input_new;
  t.tp_dealloc = reinterpret_cast<destructor>(dispatch_input_dealloc);
  t.tp_descr_get = dispatch_input_get;
  t.tp_descr_set = dispatch_input_set;
  t.tp_members = dispatch_input_members;
  return t;
}();

void drop_patched_dispatch(PyObject* jit) {
  auto& map = dispatches();
  auto it = map.find(jit);
  if (it != map.end()) {
    forget_patched_dispatch(it->second);
  }
}

void forget_patched_dispatch(KernelObject* kernel) {
  PyObject* jit = kernel->patched_jit;
  if (jit == nullptr) {
    return;
  }
  auto& map = dispatches();
  auto it = map.find(jit);
  if (it != map.end() && it->second == kernel) {
    map.erase(it);
  }
  if (g_last_jit == jit) {
    g_last_jit = nullptr;
    g_last_dispatch = nullptr;
  }
  kernel->patched_jit = nullptr;
}

}  // namespace fastkernel
