// Native evaluation of grid functions (grid_program.h). The program of a code object is built
// once per kernel by the Python translator and cached here by the code object's identity; each
// call re-reads every input (the call's arguments, the function's closure cells and globals,
// module attributes), so a changed global or a rebound closure variable is seen as the function
// would see it. Anything outside the ints-only fast case makes the evaluator give up before any
// observable effect, and the function is called as before.
#include "grid_program.h"

#include <array>
#include <climits>
#include <cstring>
#include <vector>

#include "host_helpers.h"
#include "knob_watch.h"

namespace fastkernel {

enum class GridOp : uint8_t {
  Arg,     // push the call's argument for parameter `index`
  Const,   // push `value`
  Cell,    // push the contents of closure cell `index`
  Global,  // push the function's global `name`
  Attr,    // replace the module on top by its attribute `name`
  Call,    // call the callee below `index` arguments
  Add,
  Sub,
  Mul,
  FloorDiv,
  Mod,
  Return,          // the top `index` values are the grid
  Default,         // push the default value of the function's parameter `index`
  ReturnTuple,     // the top value, a tuple of 1 to 3 ints, is the grid
  GlobalAttr,      // Global `name` then Attr `attr`, fused here (not a translator step)
  CallGlobalAttr,  // GlobalAttr, its `num_operands` int operands, then Call: fused here too
};

// The step names the translator emits, in GridOp order.
constexpr std::array<const char*, 14> kStepNames = {
    "ARG", "CONST", "CELL",     "GLOBAL", "ATTR",   "CALL",    "ADD",
    "SUB", "MUL",   "FLOORDIV", "MOD",    "RETURN", "DEFAULT", "RETURN_TUPLE"};

// The translator's limits (fastkernel._grid_program.MAX_STEPS / MAX_DEPTH), checked again here.
constexpr size_t kMaxSteps = 64;
constexpr int kMaxDepth = 16;
// Code objects whose programs one kernel keeps (a call site passes one grid function; a
// kernel launched from several call sites has a few).
constexpr size_t kProgramSlots = 8;

// The last successful dict lookup of a Global or Attr step, valid while the dict it came from
// (and, for a builtin, the globals that did not have it) are unchanged: the value is borrowed
// from the dict, which holds it as long as it does not change.
struct LookupCache {
  PyObject* dict = nullptr;  // not owned: compared by address, with its version
  uint64_t version = 0;
  PyObject* globals = nullptr;  // a builtin's: the globals that did not have the name
  uint64_t globals_version = 0;
  PyObject* value = nullptr;  // borrowed from `dict`
};

// An operand of a fused call: an Arg, Const or Cell step (none of which runs Python).
struct GridOperand {
  GridOp op = GridOp::Const;
  int index = 0;
  long long value = 0;
};

struct GridStep {
  GridOp op;
  int index = 0;
  long long value = 0;
  PyObject* name = nullptr;  // interned str, owned
  PyObject* attr = nullptr;  // GlobalAttr's attribute name, interned, owned
  mutable LookupCache cache;
  mutable LookupCache attr_cache;  // GlobalAttr's attribute in the module's dict
  // CallGlobalAttr's operands, in the call's order (1 to 3: a Call step's limit).
  std::array<GridOperand, 3> operands{};
  int num_operands = 0;
};

inline void release_steps(std::vector<GridStep>* steps) {
  for (GridStep& s : *steps) {
    Py_XDECREF(s.name);
    Py_XDECREF(s.attr);
  }
  steps->clear();
}

// Counted references, held by the kernel's slots and, while it runs, by the evaluation: a
// re-entrant call that replaces or clears the slots (possible only from Python code run by a
// dict lookup) leaves a running program intact. Counted and destroyed only with the GIL held,
// so the count needs no atomics.
struct GridProgram {
  PyObject* code = nullptr;  // owned (keeps its address from being reused)
  bool native = false;       // false: the function is always called
  std::vector<GridStep> steps;
  mutable int refs = 1;

  GridProgram() = default;
  GridProgram(const GridProgram&) = delete;
  GridProgram& operator=(const GridProgram&) = delete;
  ~GridProgram() {
    release_steps(&steps);
    Py_XDECREF(code);
  }
};

inline void unref(const GridProgram* p) {
  if (p != nullptr && --p->refs == 0) {
    delete p;
  }
}

struct GridPrograms {
  std::array<const GridProgram*, kProgramSlots> slots{};  // one reference each
  size_t next = 0;                                        // the slot a new code object replaces

  GridPrograms() = default;
  GridPrograms(const GridPrograms&) = delete;
  GridPrograms& operator=(const GridPrograms&) = delete;
  ~GridPrograms() {
    for (const GridProgram* p : slots) {
      unref(p);
    }
  }
};

namespace {

PyObject* g_compiler = nullptr;
PyObject* g_cdiv = nullptr;
PyObject* g_next_power_of_2 = nullptr;
PyObject* g_max = nullptr;
PyObject* g_min = nullptr;

// The steps the translator returned, checked; false when they are not a well-formed program.
bool convert(PyObject* result, std::vector<GridStep>* out) {
  if (!PyTuple_Check(result) || PyTuple_GET_SIZE(result) < 1 ||
      size_t(PyTuple_GET_SIZE(result)) > kMaxSteps) {
    return false;
  }
  int depth = 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(result); ++i) {
    PyObject* item = PyTuple_GET_ITEM(result, i);
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 ||
        !PyUnicode_Check(PyTuple_GET_ITEM(item, 0))) {
      return false;
    }
    const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(item, 0));
    if (name == nullptr) {
      PyErr_Clear();
      return false;
    }
    size_t op = 0;
    while (op < kStepNames.size() && std::strcmp(kStepNames[op], name) != 0) {
      ++op;
    }
    if (op == kStepNames.size()) {
      return false;
    }
    GridStep step;
    step.op = GridOp(op);
    PyObject* operand = PyTuple_GET_ITEM(item, 1);
    if (step.op == GridOp::Global || step.op == GridOp::Attr) {
      if (!PyUnicode_CheckExact(operand)) {
        return false;
      }
      step.name = operand;  // borrowed until the step is checked and kept, below
    } else {
      if (!PyLong_CheckExact(operand)) {
        return false;
      }
      int overflow = 0;
      step.value = PyLong_AsLongLongAndOverflow(operand, &overflow);
      if (overflow != 0 || (step.value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return false;
      }
      if (step.op != GridOp::Const && (step.value < INT_MIN || step.value > INT_MAX)) {
        return false;
      }
      step.index = int(step.value);
    }
    // Stack effects, so the evaluator's fixed stack can never over- or underflow.
    switch (step.op) {
      case GridOp::Arg:
        if (step.index < 0 || step.index >= kMaxArgs) {
          return false;
        }
        ++depth;
        break;
      case GridOp::Cell:
      case GridOp::Default:
        if (step.index < 0) {
          return false;
        }
        ++depth;
        break;
      case GridOp::Const:
      case GridOp::Global:
        ++depth;
        break;
      case GridOp::Attr:
        if (depth < 1) {
          return false;
        }
        break;
      case GridOp::Call:
        if (step.index < 1 || step.index > 3 || depth < step.index + 1) {
          return false;
        }
        depth -= step.index;
        break;
      case GridOp::Return:
        if (step.index < 1 || step.index > 3 || depth != step.index ||
            i != PyTuple_GET_SIZE(result) - 1) {
          return false;
        }
        break;
      case GridOp::ReturnTuple:
        if (depth != 1 || i != PyTuple_GET_SIZE(result) - 1) {
          return false;
        }
        break;
      default:  // binary operators
        if (depth < 2) {
          return false;
        }
        --depth;
        break;
    }
    if (step.name != nullptr) {  // owned (interned) by the steps from here on
      Py_INCREF(step.name);
      PyUnicode_InternInPlace(&step.name);
    }
    out->push_back(step);
    if (depth > kMaxDepth) {
      return false;
    }
  }
  return out->back().op == GridOp::Return || out->back().op == GridOp::ReturnTuple;
}

inline bool is_int_operand(GridOp op) {
  return op == GridOp::Arg || op == GridOp::Const || op == GridOp::Cell;
}

// A module global's attribute (`triton.cdiv`) as one step: one dispatch, no module on the stack,
// and a cache hit that needs no call to find the module's dict. Then a call of such an
// attribute on operands that are arguments, constants or closure cells (the tutorials'
// `triton.cdiv(meta["n"], meta["BLOCK"])`) as one step as well: the callee is not pushed, so
// on a cache hit it is used borrowed (nothing between its lookup and the call runs Python).
void fuse_global_attr(std::vector<GridStep>* steps) {
  std::vector<GridStep> fused;
  for (size_t i = 0; i < steps->size(); ++i) {
    GridStep s = (*steps)[i];
    if (s.op == GridOp::Global && i + 1 < steps->size() && (*steps)[i + 1].op == GridOp::Attr) {
      s.op = GridOp::GlobalAttr;
      s.attr = (*steps)[i + 1].name;  // the reference moves with it
      ++i;
      size_t k = 0;
      while (k < s.operands.size() && i + 1 + k < steps->size() &&
             is_int_operand((*steps)[i + 1 + k].op)) {
        ++k;
      }
      const size_t call = i + 1 + k;
      if (k >= 1 && call < steps->size() && (*steps)[call].op == GridOp::Call &&
          size_t((*steps)[call].index) == k) {
        s.op = GridOp::CallGlobalAttr;
        for (size_t j = 0; j < k; ++j) {
          const GridStep& operand = (*steps)[i + 1 + j];
          s.operands[j] = {operand.op, operand.index, operand.value};
        }
        s.num_operands = int(k);
        i = call;
      }
    }
    fused.push_back(s);
  }
  *steps = std::move(fused);
}

// The program of `code` for this kernel, from the translator (a Python call, once per code
// object and kernel), with one reference, the caller's. A failing translator leaves the
// function to be called.
GridProgram* compile_program(const KernelState& st, PyObject* code) {
  GridProgram* created = new GridProgram();
  GridProgram& program = *created;
  program.code = Py_NewRef(code);
  if (g_compiler == nullptr) {
    return created;
  }
  PyObject* names = PyTuple_New(Py_ssize_t(st.params.size()));
  if (names == nullptr) {
    PyErr_Clear();
    return created;
  }
  for (size_t i = 0; i < st.params.size(); ++i) {
    PyTuple_SET_ITEM(names, Py_ssize_t(i), Py_NewRef(st.params[i].name));
  }
  PyObject* result = PyObject_CallFunctionObjArgs(g_compiler, code, names, nullptr);
  Py_DECREF(names);
  if (result == nullptr) {
    PyErr_Clear();
    return created;
  }
  program.native = result != Py_None && convert(result, &program.steps);
  Py_DECREF(result);
  if (program.native) {
    fuse_global_attr(&program.steps);
  } else {
    release_steps(&program.steps);
  }
  return created;
}

// The program of `code` with a reference for the caller (to unref when done).
const GridProgram* program_for(KernelState& st, PyObject* code) {
  if (st.grid_programs != nullptr) {
    for (const GridProgram* p : st.grid_programs->slots) {
      if (p != nullptr && p->code == code) {
        ++p->refs;
        return p;
      }
    }
  }
  // The translator runs Python, which may re-enter this kernel or reconfigure it: the program
  // is stored only once it returns, and only if the parameters it indexes are still the
  // kernel's (a reconfigured kernel's is used once, as "call the function").
  const uint64_t epoch = st.grid_program_epoch;
  GridProgram* program = compile_program(st, code);
  if (st.grid_program_epoch != epoch) {
    program->native = false;
    return program;
  }
  if (st.grid_programs == nullptr) {
    st.grid_programs = new GridPrograms();
  }
  GridPrograms& gp = *st.grid_programs;
  const GridProgram* replaced = gp.slots[gp.next];
  gp.slots[gp.next] = program;
  ++program->refs;  // the slot's and the caller's
  gp.next = (gp.next + 1) % kProgramSlots;
  // Last: destroying it releases its code object, which may run Python (a weakref callback)
  // that launches this kernel again; the slots are consistent by then.
  unref(replaced);
  return program;
}

// The version of a dict whose lookups may be cached; 0 (never cached) for a split-table dict,
// an instance __dict__ whose values CPython 3.13 can change through the instance without a new
// version.
inline uint64_t cacheable_version(PyObject* dict) {
  return reinterpret_cast<PyDictObject*>(dict)->ma_values == nullptr ? dict_version(dict) : 0;
}

// The step's cached value of its name in `dict` (borrowed), when the cache was filled from
// `dict` with `absent_from` (a dict that did not have the name, or nullptr) and neither has
// changed since; else nullptr.
inline PyObject* cache_hit(const GridStep& s, PyObject* dict, PyObject* absent_from) {
  const LookupCache& c = s.cache;
  const uint64_t version = cacheable_version(dict);
  if (version == 0 || c.dict != dict || c.version != version || c.globals != absent_from) {
    return nullptr;
  }
  if (absent_from == nullptr) {
    return c.value;
  }
  return c.globals_version != 0 && c.globals_version == cacheable_version(absent_from) ? c.value
                                                                                       : nullptr;
}

// `name` in `dict` (borrowed), from the step's cache when it is valid, else looked up (and
// cached when found). nullptr when absent, with no exception set.
PyObject* cached_lookup(const GridStep& s, PyObject* dict, PyObject* absent_from) {
  if (PyObject* hit = cache_hit(s, dict, absent_from)) {
    return hit;
  }
  const uint64_t version = cacheable_version(dict);
  const uint64_t absent_version = absent_from != nullptr ? cacheable_version(absent_from) : 0;
  PyObject* v = PyDict_GetItemWithError(dict, s.name);
  if (v == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  s.cache = {dict, version, absent_from, absent_version, v};
  return v;
}

// One stack value: an int (object == nullptr) or an object (a callee or a module), owned.
struct Value {
  long long i;
  PyObject* object;  // nullptr for an int
};

// An exact int of at most 64 bits into `out`; false for anything else.
inline bool int_value(PyObject* o, long long* out) {
  if (!PyLong_CheckExact(o)) {
    return false;
  }
  if (compact_int(o, out)) {
    return true;
  }
  int overflow = 0;
  *out = PyLong_AsLongLongAndOverflow(o, &overflow);
  return overflow == 0;
}

// Pushes `o` as an int when it is an exact int within 64 bits, else as an object; false for an
// exact int past 64 bits.
inline bool push_object(PyObject* o, Value* v) {
  if (PyLong_CheckExact(o)) {
    v->object = nullptr;
    return int_value(o, &v->i);
  }
  v->object = Py_NewRef(o);
  return true;
}

// A call of a known pure callee on ints.
inline bool call_known_ints(PyObject* callee, const long long* args, int n, long long* out) {
  if (callee == g_cdiv && n == 2) {
    return triton_cdiv(args[0], args[1], out);
  }
  if (callee == g_next_power_of_2 && n == 1) {
    return triton_next_power_of_2(args[0], out);
  }
  if ((callee == g_max || callee == g_min) && n >= 2) {
    long long r = args[0];
    for (int k = 1; k < n; ++k) {
      r = callee == g_max ? (args[k] > r ? args[k] : r) : (args[k] < r ? args[k] : r);
    }
    *out = r;
    return true;
  }
  return false;
}

// call_known_ints on stack values, which must all be ints.
bool call_known(PyObject* callee, const Value* args, int n, long long* out) {
  long long ints[3];
  for (int k = 0; k < n; ++k) {
    if (args[k].object != nullptr) {
      return false;
    }
    ints[k] = args[k].i;
  }
  return call_known_ints(callee, ints, n, out);
}

// The call's argument for parameter `index` (borrowed), or nullptr when the call bound none.
inline PyObject* call_argument(const BoundCall& call, int num_params, int index) {
  return index < num_params ? call.args[index] : nullptr;
}

// The contents of closure cell `index` (borrowed), or nullptr when there is no such cell or it
// is empty.
inline PyObject* cell_contents(PyObject* closure, int index) {
  if (closure == nullptr || !PyTuple_Check(closure) || index >= PyTuple_GET_SIZE(closure)) {
    return nullptr;
  }
  PyObject* cell = PyTuple_GET_ITEM(closure, index);
  return PyCell_Check(cell) ? PyCell_GET(cell) : nullptr;
}

// A fused call's operand, read as its step would push it; false when it is not an int.
inline bool read_operand(const GridOperand& o, const BoundCall& call, int num_params,
                         PyObject* closure, long long* out) {
  if (o.op == GridOp::Const) {
    *out = o.value;
    return true;
  }
  PyObject* v = o.op == GridOp::Arg ? call_argument(call, num_params, o.index)
                                    : cell_contents(closure, o.index);
  return v != nullptr && int_value(v, out);
}

// A GlobalAttr step's value from its caches, borrowed, while the globals are unchanged (so the
// global is the same object, alive: still an exact module unless its __class__ was
// reassigned, and a module's __dict__ is fixed for its lifetime) and the module's dict is
// unchanged; else nullptr.
inline PyObject* cached_global_attr(const GridStep& s, PyObject* globals) {
  const LookupCache& a = s.attr_cache;
  PyObject* module = a.dict != nullptr ? cache_hit(s, globals, nullptr) : nullptr;
  if (module != nullptr && PyModule_CheckExact(module) && a.version != 0 &&
      cacheable_version(a.dict) == a.version) {
    return a.value;
  }
  return nullptr;
}

// A GlobalAttr step's value looked up (and cached), with a new reference, or nullptr when it
// is not found so (no exception set). A module found in the builtins is left to Python.
[[gnu::noinline]] PyObject* lookup_global_attr(const GridStep& s, PyObject* globals) {
  s.attr_cache = LookupCache{};  // refilled below only from the module found now
  PyObject* module = cached_lookup(s, globals, nullptr);
  if (module == nullptr || !PyModule_CheckExact(module)) {
    return nullptr;
  }
  // Held: the lookup below can run Python (a colliding key's __eq__) that drops it.
  Py_INCREF(module);
  PyObject* dict = PyModule_GetDict(module);  // borrowed from the module
  PyObject* v = nullptr;
  if (dict != nullptr && PyDict_CheckExact(dict)) {
    const uint64_t version = cacheable_version(dict);
    v = PyDict_GetItemWithError(dict, s.attr);
    if (v == nullptr) {
      PyErr_Clear();  // the module's __getattr__, or an AttributeError: Python's
    } else {
      s.attr_cache = {dict, version, nullptr, 0, v};
      Py_INCREF(v);  // before the module goes
    }
  }
  Py_DECREF(module);
  return v;
}

// A GlobalAttr step's value: borrowed from its caches (*owned stays nullptr), else looked up,
// with the new reference in *owned; nullptr when not found so.
inline PyObject* global_attr(const GridStep& s, PyObject* globals, PyObject** owned) {
  if (PyObject* v = cached_global_attr(s, globals)) {
    return v;
  }
  *owned = lookup_global_attr(s, globals);
  return *owned;
}

// Runs `steps`; false as soon as a value is not what the fast case handles. Inlined into its one
// caller: built with link-time optimization, as the wheel is, GCC otherwise kept it a function
// of its own, which cost a two-step program about 30 instructions more (callgrind).
[[gnu::always_inline]] inline bool run(const std::vector<GridStep>& steps, PyObject* fn,
                                       const BoundCall& call, int num_params, Value* stack,
                                       int* stack_size, long long dims[3], int* num_dims) {
  // The next free slot lives in a register while the steps run (calls out could otherwise
  // alias the caller's count) and the depth reaches the caller, which releases what is left,
  // however the run ends.
  Value* top = stack + *stack_size;
  struct Publish {
    Value* const& top;
    Value* stack;
    int* out;
    ~Publish() { *out = int(top - stack); }
  } publish{top, stack, stack_size};
  PyObject* globals = PyFunction_GET_GLOBALS(fn);
  PyObject* closure = PyFunction_GET_CLOSURE(fn);
  if (!PyDict_CheckExact(globals)) {
    return false;  // a dict subclass's lookups can run Python code
  }
  // Triton passes only the first parameter: every other one needs a default, or calling the
  // function raises (a TypeError the function's own call reports).
  const int argcount = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fn))->co_argcount;
  if (argcount > 1) {
    PyObject* defaults = PyFunction_GET_DEFAULTS(fn);
    if (defaults == nullptr || !PyTuple_Check(defaults) ||
        PyTuple_GET_SIZE(defaults) < argcount - 1) {
      return false;
    }
  }
  for (const GridStep& s : steps) {
    switch (s.op) {
      case GridOp::Arg: {
        PyObject* v = call_argument(call, num_params, s.index);
        if (v == nullptr || !PyLong_CheckExact(v) || !push_object(v, top)) {
          return false;
        }
        ++top;
        break;
      }
      case GridOp::Const:
        top->i = s.value;
        top->object = nullptr;
        ++top;
        break;
      case GridOp::Cell: {
        PyObject* v = cell_contents(closure, s.index);
        if (v == nullptr || !push_object(v, top)) {
          return false;
        }
        ++top;
        break;
      }
      case GridOp::Global: {
        // LOAD_GLOBAL's order: the function's globals, then its builtins (func_builtins,
        // CPython 3.10+).
        PyObject* builtins = reinterpret_cast<PyFunctionObject*>(fn)->func_builtins;
        if (builtins != nullptr && !PyDict_CheckExact(builtins)) {
          builtins = nullptr;
        }
        // A builtin cached with these globals unchanged (so still without the name) is taken
        // without looking in the globals first.
        PyObject* v = builtins != nullptr ? cache_hit(s, builtins, globals) : nullptr;
        if (v == nullptr) {
          v = cached_lookup(s, globals, nullptr);
        }
        if (v == nullptr && builtins != nullptr) {
          v = cached_lookup(s, builtins, globals);
        }
        if (v == nullptr) {
          return false;  // a NameError: Python raises it
        }
        if (!push_object(v, top)) {
          return false;
        }
        ++top;
        break;
      }
      case GridOp::GlobalAttr: {
        PyObject* owned = nullptr;
        PyObject* v = global_attr(s, globals, &owned);
        const bool pushed = v != nullptr && push_object(v, top);
        Py_XDECREF(owned);
        if (!pushed) {
          return false;
        }
        ++top;
        break;
      }
      case GridOp::CallGlobalAttr: {
        // Python's order: the callee, then the operands (reading them runs no Python).
        PyObject* owned = nullptr;
        PyObject* callee = global_attr(s, globals, &owned);
        long long operands[3];
        bool ok = callee != nullptr;
        for (int k = 0; ok && k < s.num_operands; ++k) {
          ok = read_operand(s.operands[k], call, num_params, closure, &operands[k]);
        }
        ok = ok && call_known_ints(callee, operands, s.num_operands, &top->i);
        Py_XDECREF(owned);
        if (!ok) {
          return false;
        }
        top->object = nullptr;
        ++top;
        break;
      }
      case GridOp::Attr: {
        Value* obj = top - 1;
        if (obj->object == nullptr || !PyModule_CheckExact(obj->object)) {
          return false;
        }
        PyObject* dict = PyModule_GetDict(obj->object);  // borrowed
        PyObject* v =
            dict != nullptr && PyDict_CheckExact(dict) ? cached_lookup(s, dict, nullptr) : nullptr;
        if (v == nullptr) {
          return false;  // the module's __getattr__, or an AttributeError
        }
        Value attr;
        if (!push_object(v, &attr)) {
          return false;
        }
        Py_DECREF(obj->object);
        *obj = attr;
        break;
      }
      case GridOp::Call: {
        Value* callee = top - s.index - 1;
        long long r;
        if (callee->object == nullptr || !call_known(callee->object, callee + 1, s.index, &r)) {
          return false;
        }
        Py_DECREF(callee->object);
        callee->object = nullptr;
        callee->i = r;
        top -= s.index;
        break;
      }
      case GridOp::Default: {
        // CPython binds a positional parameter past the ones passed to the last
        // len(__defaults__) defaults; Triton passes only the first.
        PyObject* defaults = PyFunction_GET_DEFAULTS(fn);
        const int argcount = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fn))->co_argcount;
        const Py_ssize_t j = defaults != nullptr && PyTuple_Check(defaults)
                                 ? s.index - (argcount - PyTuple_GET_SIZE(defaults))
                                 : -1;
        if (j < 0 || j >= PyTuple_GET_SIZE(defaults) ||
            !push_object(PyTuple_GET_ITEM(defaults, j), top)) {
          return false;
        }
        ++top;
        break;
      }
      case GridOp::ReturnTuple: {
        PyObject* t = top[-1].object;
        if (t == nullptr || !PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) < 1 ||
            PyTuple_GET_SIZE(t) > 3) {
          return false;
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(t); ++k) {
          Value item;
          if (!PyLong_CheckExact(PyTuple_GET_ITEM(t, k)) ||
              !push_object(PyTuple_GET_ITEM(t, k), &item)) {
            return false;
          }
          dims[k] = item.i;
        }
        *num_dims = int(PyTuple_GET_SIZE(t));
        return true;
      }
      case GridOp::Return: {
        const Value* items = top - s.index;
        for (int k = 0; k < s.index; ++k) {
          if (items[k].object != nullptr) {
            return false;
          }
          dims[k] = items[k].i;
        }
        *num_dims = s.index;
        top -= s.index;  // plain ints, nothing to release
        return true;
      }
      case GridOp::Add:
      case GridOp::Sub:
      case GridOp::Mul:
      case GridOp::FloorDiv:
      case GridOp::Mod: {
        Value* a = top - 2;
        const Value* b = top - 1;
        if (a->object != nullptr || b->object != nullptr) {
          return false;
        }
        long long r;
        bool ok;
        switch (s.op) {
          case GridOp::Add:
            ok = !__builtin_add_overflow(a->i, b->i, &r);
            break;
          case GridOp::Sub:
            ok = !__builtin_sub_overflow(a->i, b->i, &r);
            break;
          case GridOp::Mul:
            ok = !__builtin_mul_overflow(a->i, b->i, &r);
            break;
          case GridOp::FloorDiv:
            ok = python_floor_div(a->i, b->i, &r);
            break;
          default:
            ok = python_floor_mod(a->i, b->i, &r);
            break;
        }
        if (!ok) {
          return false;
        }
        a->i = r;
        --top;
        break;
      }
      default:
        // convert() admits only the ops above (and the fusion makes GlobalAttr and
        // CallGlobalAttr): none other.
        __builtin_unreachable();
    }
  }
  return false;
}

}  // namespace

bool eval_grid_program(KernelObject* kernel, PyObject* fn, const BoundCall& call, long long dims[3],
                       int* num_dims) {
  KernelState& st = *kernel->state;
  if (!PyFunction_Check(fn)) {
    return false;
  }
  const GridProgram* program = program_for(st, PyFunction_GET_CODE(fn));
  if (!program->native) {
    unref(program);
    return false;
  }
  Value stack[kMaxDepth];
  int sp = 0;
  const bool ok = run(program->steps, fn, call, int(st.params.size()), stack, &sp, dims, num_dims);
  for (int k = 0; k < sp; ++k) {
    Py_XDECREF(stack[k].object);
  }
  unref(program);
  return ok;
}

void clear_grid_programs(KernelState* state) {
  ++state->grid_program_epoch;  // a translation in flight is for the old parameters
  // Detached first: destroying the programs releases code objects, which may run Python (a
  // weakref callback) that launches this kernel again.
  GridPrograms* old = state->grid_programs;
  state->grid_programs = nullptr;
  delete old;
}

void set_grid_program_support(PyObject* compiler, PyObject* cdiv, PyObject* next_power_of_2,
                              PyObject* max, PyObject* min) {
  Py_XSETREF(g_compiler, Py_XNewRef(compiler));
  Py_XSETREF(g_cdiv, Py_XNewRef(cdiv));
  Py_XSETREF(g_next_power_of_2, Py_XNewRef(next_power_of_2));
  Py_XSETREF(g_max, Py_XNewRef(max));
  Py_XSETREF(g_min, Py_XNewRef(min));
}

PyObject* grid_program_step_names() {
  PyObject* t = PyTuple_New(Py_ssize_t(kStepNames.size()));
  if (t == nullptr) {
    return nullptr;
  }
  for (size_t i = 0; i < kStepNames.size(); ++i) {
    PyObject* s = PyUnicode_FromString(kStepNames[i]);
    if (s == nullptr) {
      Py_DECREF(t);
      return nullptr;
    }
    PyTuple_SET_ITEM(t, Py_ssize_t(i), s);
  }
  return t;
}

}  // namespace fastkernel
