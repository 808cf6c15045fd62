// The callable grid's mapping (grid_meta.h). A dict with every parameter, copied and filled per
// call, cost about 250 instructions per parameter on every hit with a callable grid; this type
// reads the call's bound arguments where they are, and one object per kernel is reused while no
// one else holds it.
#include "grid_meta.h"

namespace fastkernel {
namespace {

struct GridMetaObject {
  PyObject_HEAD PyObject* names;  ///< tuple of the parameter names (interned str), owned
  PyObject* const* values;        ///< the call's bound arguments while the grid runs, else nullptr
  PyObject* snapshot;  ///< a dict of them once the mapping outlived its call, else nullptr
};

// The index of `key` among the names, -1 when absent, or -2 with TypeError set for an
// unhashable key (as a dict raises). Interned names usually match by identity (a string literal
// in the grid function is interned too); otherwise by value.
Py_ssize_t find(GridMetaObject* self, PyObject* key) {
  const Py_ssize_t n = PyTuple_GET_SIZE(self->names);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (PyTuple_GET_ITEM(self->names, i) == key) {
      return i;
    }
  }
  if (!PyUnicode_Check(key)) {
    return PyObject_Hash(key) == -1 ? -2 : -1;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    const int eq = PyUnicode_Compare(PyTuple_GET_ITEM(self->names, i), key);
    if (eq == 0) {
      return i;
    }
    if (eq == -1 && PyErr_Occurred()) {
      PyErr_Clear();
    }
  }
  return -1;
}

// The mapping as a new dict (what Triton's bound_args holds).
PyObject* as_dict(GridMetaObject* self) {
  if (self->snapshot != nullptr) {
    return PyDict_Copy(self->snapshot);
  }
  PyObject* d = PyDict_New();
  if (d == nullptr) {
    return nullptr;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(self->names);
  for (Py_ssize_t i = 0; self->values != nullptr && i < n; ++i) {
    if (self->values[i] != nullptr &&
        PyDict_SetItem(d, PyTuple_GET_ITEM(self->names, i), self->values[i]) < 0) {
      Py_DECREF(d);
      return nullptr;
    }
  }
  return d;
}

PyObject* lookup(GridMetaObject* self, PyObject* key) {  // borrowed, nullptr if absent
  if (self->snapshot != nullptr) {
    return PyDict_GetItemWithError(self->snapshot, key);
  }
  const Py_ssize_t i = find(self, key);
  return i >= 0 && self->values != nullptr ? self->values[i] : nullptr;
}

PyObject* meta_subscript(GridMetaObject* self, PyObject* key) {
  PyObject* v = lookup(self, key);
  if (v == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetObject(PyExc_KeyError, key);
    }
    return nullptr;
  }
  return Py_NewRef(v);
}

Py_ssize_t meta_length(GridMetaObject* self) {
  return self->snapshot != nullptr ? PyDict_GET_SIZE(self->snapshot)
                                   : PyTuple_GET_SIZE(self->names);
}

int meta_contains(GridMetaObject* self, PyObject* key) {
  if (lookup(self, key) != nullptr) {
    return 1;
  }
  return PyErr_Occurred() ? -1 : 0;
}

PyObject* meta_iter(GridMetaObject* self) {
  return self->snapshot != nullptr ? PyObject_GetIter(self->snapshot)
                                   : PyObject_GetIter(self->names);
}

PyObject* meta_get(GridMetaObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs > 2) {
    PyErr_Format(PyExc_TypeError, "get expected 1 or 2 arguments, got %zd", nargs);
    return nullptr;
  }
  PyObject* v = lookup(self, args[0]);
  if (v == nullptr && PyErr_Occurred()) {
    return nullptr;
  }
  return Py_NewRef(v != nullptr ? v : (nargs == 2 ? args[1] : Py_None));
}

// keys(), values(), items() and copy() answer from a dict of the mapping: views of the same
// contents as the dict Triton passes.
PyObject* dict_method(GridMetaObject* self, const char* method) {
  PyObject* d = as_dict(self);
  if (d == nullptr) {
    return nullptr;
  }
  PyObject* r = PyObject_CallMethod(d, method, nullptr);
  Py_DECREF(d);
  return r;
}

PyObject* meta_keys(GridMetaObject* self, PyObject*) { return dict_method(self, "keys"); }
PyObject* meta_values(GridMetaObject* self, PyObject*) { return dict_method(self, "values"); }
PyObject* meta_items(GridMetaObject* self, PyObject*) { return dict_method(self, "items"); }

PyObject* meta_copy(GridMetaObject* self, PyObject*) { return as_dict(self); }

PyObject* meta_reversed(GridMetaObject* self, PyObject*) {
  return dict_method(self, "__reversed__");
}

// meta | other and other | meta: a new dict, as with the dict Triton passes.
PyObject* meta_or(PyObject* a, PyObject* b) {
  const bool left = Py_TYPE(a) == &GridMetaType;
  PyObject* d = as_dict(reinterpret_cast<GridMetaObject*>(left ? a : b));
  if (d == nullptr) {
    return nullptr;
  }
  PyObject* r = left ? PyNumber_Or(d, b) : PyNumber_Or(a, d);
  Py_DECREF(d);
  return r;
}

PyObject* meta_repr(GridMetaObject* self) {
  PyObject* d = as_dict(self);
  if (d == nullptr) {
    return nullptr;
  }
  PyObject* r = PyObject_Repr(d);
  Py_DECREF(d);
  return r;
}

PyObject* meta_richcompare(GridMetaObject* self, PyObject* other, int op) {
  if (op != Py_EQ && op != Py_NE) {
    Py_RETURN_NOTIMPLEMENTED;
  }
  PyObject* d = as_dict(self);
  if (d == nullptr) {
    return nullptr;
  }
  PyObject* o = Py_TYPE(other) == &GridMetaType ? as_dict(reinterpret_cast<GridMetaObject*>(other))
                                                : Py_NewRef(other);
  if (o == nullptr) {
    Py_DECREF(d);
    return nullptr;
  }
  PyObject* r = PyObject_RichCompare(d, o, op);
  Py_DECREF(d);
  Py_DECREF(o);
  return r;
}

int meta_traverse(GridMetaObject* self, visitproc visit, void* arg) {
  Py_VISIT(self->names);
  Py_VISIT(self->snapshot);
  return 0;
}

int meta_clear(GridMetaObject* self) {
  Py_CLEAR(self->names);
  Py_CLEAR(self->snapshot);
  self->values = nullptr;
  return 0;
}

void meta_dealloc(GridMetaObject* self) {
  PyObject_GC_UnTrack(self);
  meta_clear(self);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyMappingMethods meta_mapping = {
    reinterpret_cast<lenfunc>(meta_length),
    reinterpret_cast<binaryfunc>(meta_subscript),
    nullptr,
};

PyNumberMethods meta_number = [] {
  PyNumberMethods n{};
  n.nb_or = meta_or;
  return n;
}();

PySequenceMethods meta_sequence = [] {
  PySequenceMethods s{};
  s.sq_contains = reinterpret_cast<objobjproc>(meta_contains);
  return s;
}();

PyMethodDef meta_methods[] = {
    {"get", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(meta_get)), METH_FASTCALL,
     "get(name, default=None): the argument of parameter `name`, else default."},
    {"keys", reinterpret_cast<PyCFunction>(meta_keys), METH_NOARGS, "The parameter names."},
    {"values", reinterpret_cast<PyCFunction>(meta_values), METH_NOARGS, "The arguments."},
    {"items", reinterpret_cast<PyCFunction>(meta_items), METH_NOARGS, "(name, argument) pairs."},
    {"copy", reinterpret_cast<PyCFunction>(meta_copy), METH_NOARGS, "A dict of the mapping."},
    {"__copy__", reinterpret_cast<PyCFunction>(meta_copy), METH_NOARGS, "A dict of the mapping."},
    {"__reversed__", reinterpret_cast<PyCFunction>(meta_reversed), METH_NOARGS,
     "The names, last first."},
    {nullptr, nullptr, 0, nullptr},
};

// The parameter names as a tuple (built once per kernel configuration).
PyObject* names_of(KernelState& st) {
  if (st.param_name_tuple == nullptr) {
    PyObject* t = PyTuple_New(Py_ssize_t(st.params.size()));
    if (t == nullptr) {
      return nullptr;
    }
    for (size_t i = 0; i < st.params.size(); ++i) {
      PyTuple_SET_ITEM(t, Py_ssize_t(i), Py_NewRef(st.params[i].name));
    }
    st.param_name_tuple = t;
  }
  return st.param_name_tuple;
}

GridMetaObject* new_meta(KernelState& st) {
  PyObject* names = names_of(st);
  if (names == nullptr) {
    return nullptr;
  }
  GridMetaObject* m = PyObject_GC_New(GridMetaObject, &GridMetaType);
  if (m == nullptr) {
    return nullptr;
  }
  m->names = Py_NewRef(names);
  m->values = nullptr;
  m->snapshot = nullptr;
  PyObject_GC_Track(m);
  return m;
}

}  // namespace

PyObject* call_grid(KernelObject* kernel, PyObject* grid, const BoundCall& call) {
  KernelState& st = *kernel->state;
  auto* cached = reinterpret_cast<GridMetaObject*>(st.grid_meta);
  GridMetaObject* meta;
  Py_ssize_t held;  // references the cache and this call hold
  if (cached != nullptr && Py_REFCNT(cached) == 1) {
    meta = cached;  // only the cache holds it: free for this call
    Py_INCREF(meta);
    held = 2;
  } else {
    // None yet, or in use by an outer call of this kernel (the grid function launched it).
    meta = new_meta(st);
    if (meta == nullptr) {
      return nullptr;
    }
    held = 1;
    if (cached == nullptr) {
      st.grid_meta = Py_NewRef(reinterpret_cast<PyObject*>(meta));
      held = 2;
    }
  }
  meta->values = call.args;
  PyObject* result = call_from_launch(
      [&] { return PyObject_CallOneArg(grid, reinterpret_cast<PyObject*>(meta)); });
  if (Py_REFCNT(meta) > held) {
    // Kept past the call: from now on it holds its own dict of this call's arguments.
    PyObject* error_type = nullptr;
    PyObject* error_value = nullptr;
    PyObject* error_tb = nullptr;
    PyErr_Fetch(&error_type, &error_value, &error_tb);
    meta->snapshot = as_dict(meta);
    if (meta->snapshot == nullptr) {
      PyErr_Clear();
      meta->snapshot = PyDict_New();
    }
    PyErr_Restore(error_type, error_value, error_tb);
    if (st.grid_meta == reinterpret_cast<PyObject*>(meta)) {
      st.grid_meta = nullptr;
      Py_DECREF(meta);  // the cache's reference: the next call makes a fresh one
    }
  }
  meta->values = nullptr;
  Py_DECREF(meta);
  return result;
}

void clear_grid_meta(KernelState* state) {
  Py_CLEAR(state->grid_meta);
  Py_CLEAR(state->param_name_tuple);
}

PyTypeObject GridMetaType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "fastkernel._C.GridMeta";
  t.tp_doc =
      "What a callable grid receives: every declared parameter of the kernel by name, mapped to\n"
      "its argument in the call (Triton passes a dict of the same contents). Read-only: \n"
      "meta[name], meta.get(name, default), len, iteration, reversed, `in`, keys/values/items,\n"
      "**meta, `meta | other`, copy() and copy.copy (a dict) behave as on that dict. A\n"
      "collections.abc.Mapping, not a dict.";
  t.tp_basicsize = sizeof(GridMetaObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_MAPPING;
  t.tp_dealloc = reinterpret_cast<destructor>(meta_dealloc);
  t.tp_traverse = reinterpret_cast<traverseproc>(meta_traverse);
  t.tp_clear = reinterpret_cast<inquiry>(meta_clear);
  t.tp_as_mapping = &meta_mapping;
  t.tp_as_sequence = &meta_sequence;
  t.tp_as_number = &meta_number;
  t.tp_iter = reinterpret_cast<getiterfunc>(meta_iter);
  t.tp_methods = meta_methods;
  t.tp_repr = reinterpret_cast<reprfunc>(meta_repr);
  t.tp_richcompare = reinterpret_cast<richcmpfunc>(meta_richcompare);
  t.tp_hash = PyObject_HashNotImplemented;
  return t;
}();

}  // namespace fastkernel
