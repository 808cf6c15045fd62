// The native kernel object behind `@fastkernel`: its parameter description, its launch table,
// and the per-call entry (`kernel[grid](...)`) implemented with vectorcall.
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fastkernel/launch_table.h"
#include "fastkernel/specialization.h"

namespace fastkernel {

/// Owns one Python reference for a scope.
class Ref {
 public:
  explicit Ref(PyObject* p = nullptr) : p_(p) {}
  ~Ref() { Py_XDECREF(p_); }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  PyObject* get() const { return p_; }
  PyObject* release() {
    PyObject* p = p_;
    p_ = nullptr;
    return p;
  }
  void reset(PyObject* p) {
    Py_XDECREF(p_);
    p_ = p;
  }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  PyObject* p_;
};

/// The most declared parameters and keyword options one kernel may have on the native path.
constexpr int kMaxArgs = 128;
constexpr int kMaxOptions = 64;
/// The most kernel classes a patched dispatch launches through underneath (KernelObject).
constexpr int kMaxUnderTypes = 4;
/// LaunchRecord::leaves_read of a record with a hit_call: more than any call binds, so the
/// hit's check of the slots a record reads (taken on every hit) diverts it to the call.
constexpr int kHitCallLeaves = INT32_MAX;

/// One declared kernel parameter, as the key builder needs it.
struct ParamSpec {
  PyObject* name = nullptr;           ///< interned str, owned
  PyObject* default_value = nullptr;  ///< owned; nullptr when the parameter is required
  bool is_constexpr = false;          ///< annotated tl.constexpr: its value is part of the key
  bool specialize = true;  ///< false under do_not_specialize (or a float/bool annotation)
  bool align = true;       ///< false under do_not_specialize_on_alignment
  uint8_t tune = 0;        ///< TuneFlag bits (fastkernel.autotune); 0 otherwise
};

/// How the keywords of one kwnames tuple bind, for the call site that passed it last (CPython
/// passes a call site's literal keywords as the same constant tuple on every call): per keyword,
/// the parameter index (>= 0) or -1 - the compile option's index. Valid for calls passing
/// exactly this tuple after `nargs` positional arguments; checked (unknown names, a parameter
/// given twice) when it was made.
struct KeywordBinding {
  PyObject* kwnames = nullptr;  ///< owned, so that its address is not reused while cached
  Py_ssize_t nargs = -1;
  std::vector<int16_t> slots;
  /// The compile option values of the last call keyed through this binding, per keyword
  /// (owned; nullptr for parameters), and the key words they made. Only immutable values
  /// (exact int, float, str, bool, None) are kept, so a call passing the same objects (a call
  /// site's literals are the same objects every call) makes the same words: they are pushed
  /// without reading the values.
  std::vector<PyObject*> option_values;
  static constexpr int kMaxOptionWords = 4;  ///< longer option words are made anew per call
  uint64_t option_words[kMaxOptionWords] = {};
  int num_option_words = 0;
  bool options_cached = false;
  /// Every keyword names a compile option (the `kernel[grid](*args, num_warps=4)` call site):
  /// binding the call only compares the values with the kept ones.
  bool all_options = false;
  /// Advanced whenever the binding or its option words change: a call that made its option
  /// words keeps them only if no re-entrant call (a value's key read can run Python) rebound
  /// the binding meanwhile.
  uint64_t generation = 0;
};

/// Drops the binding's cached option values and words.
void clear_option_words(KeywordBinding* binding);

struct GridPrograms;  // grid_program.cpp

/// Per-kernel native state (owned by KernelObject).
struct KernelState {
  std::vector<ParamSpec> params;
  std::vector<PyObject*> param_names;   ///< params[i].name, contiguous for the keyword scan
  std::vector<PyObject*> option_names;  ///< interned, owned; the index is the option's key tag
  LaunchTable table;
  KeywordBinding keywords;                ///< the last kwnames tuple's binding
  PyObject* grid_meta = nullptr;          ///< the callable grid's mapping, reused (grid_meta.h)
  PyObject* param_name_tuple = nullptr;   ///< the parameter names as a tuple, owned
  GridPrograms* grid_programs = nullptr;  ///< native programs of grid functions (grid_program.h)
  uint64_t grid_program_epoch = 0;        ///< advanced when grid_programs is cleared
  std::vector<int> config_params;         ///< the kTuneConfigProvided parameters' indices, in order
  /// config_params is not empty, or a publish owner is set: a hit has more to do than launch
  /// (one test on the hot path for both).
  bool hit_extras = false;
  /// While the JITFunction has pre-run hooks, every call takes Triton's path, hooks unrun here:
  /// a dispatch whose records give values the call leaves out (a tuned config's, a heuristic's),
  /// which Triton's run passes the hooks among the keywords.
  bool hooks_through_triton = false;
  uint64_t hits = 0, misses = 0, fallbacks = 0;
  /// The launch hooks' metadata dict of the last hooked launch (owned; copied per launch) and
  /// the raw values its items were made from.
  PyObject* hook_template = nullptr;
  std::string hook_name;
  const void* hook_function = nullptr;
  const void* hook_stream = nullptr;
  uint64_t native_grids = 0;  ///< callable grids computed by their native program
  uint64_t called_grids = 0;  ///< callable grids called in Python
};

/// The Python-visible kernel object (`fastkernel._C.Kernel`, subclassed in Python).
struct KernelObject {
  PyObject_HEAD KernelState* state;
  PyObject* name;               ///< the kernel's name, for error messages
  PyObject* miss_handler;       ///< Python callable for misses and fallbacks
  PyObject* scratch_allocator;  ///< Python callable(size, align, stream, kind) -> buffer
  PyObject* cached_bound;       ///< a BoundLaunch reused by kernel[grid] when nobody else holds it
  PyObject* pre_run_hooks;      ///< the JITFunction's pre_run_hooks list (shared), or nullptr
  PyObject* global_checks;      ///< tuple of (globals dict, name, value compiled with), or nullptr
  PyObject* weakrefs;
  PyObject*
      patched_jit;  ///< the JITFunction this Kernel serves under fastkernel.patch() (borrowed)
  /// A hit sets `publish_owner.<publish_name>` to its record's `published` object when that
  /// differs from the last one set (Triton's Autotuner sets best_config on every call).
  PyObject* publish_owner;
  PyObject* publish_name;
  PyObject* last_published;
  /// The owner's instance dict and its version (PEP 509) when a hit last found or made it map
  /// publish_name to last_published: while the owner has this dict at this version, the
  /// mapping holds without a lookup. Not owned: read only once the owner's current dict is
  /// found to be this very object.
  PyObject* published_dict;
  uint64_t published_version;
  /// Where the owner keeps its instance dict (_PyObject_GetDictPtr), taken with published_dict:
  /// an object's dict slot does not move while it lives, and publish_owner is held.
  PyObject** published_slot;
  /// The `jit_function` attribute (the wrapped JITFunction), in a slot so that a hooked launch
  /// reads it without an attribute lookup; nullptr while unset.
  PyObject* jit_function;
  /// Under fastkernel.patch(), the classes of the kernel objects a launch of patched_jit goes
  /// through underneath (the JITFunction under an autotuner or heuristics, the autotuner and
  /// lower levels under a heuristics stack) other than patched_jit's own class, owned: Triton's
  /// run of patched_jit calls their `run`, so a `run` another library assigns on one of these
  /// classes sends launches back to Triton's path while it is there. With the version tag each
  /// was found serving under (~0u until checked).
  PyTypeObject* under_types[kMaxUnderTypes];
  unsigned int under_tags[kMaxUnderTypes];
  int num_under_types;
};

/// `kernel[grid]`: a kernel with its grid, called with the kernel's arguments.
struct BoundLaunchObject {
  PyObject_HEAD KernelObject* kernel;
  PyObject* grid;
  vectorcallfunc vectorcall;
};

extern PyTypeObject KernelType;
extern PyTypeObject BoundLaunchType;

/// Python exception types set by the native layer (created at module init).
extern PyObject* g_cuda_error_type;
extern PyObject* g_driver_unavailable_type;

/// What building a call's key produced.
enum class KeyStatus { Ok, Fallback, Error };

/// A call's arguments bound to the declared parameters, their captured values and the key.
struct BoundCall {
  PyObject* args[kMaxArgs];        ///< borrowed, one per declared parameter
  PyObject* options[kMaxOptions];  ///< borrowed; only the entries listed in set_options are valid
  int set_options[kMaxOptions];    ///< indices of the options given, ascending
  int num_set_options = 0;
  /// One per declared parameter, then the leaves of tuple and tensor descriptor arguments in
  /// depth-first order (slots num_params + 0, 1, ...: the indices the launch record's plan uses
  /// for them; a descriptor takes descriptor_leaves(rank) consecutive ones).
  ArgValue values[kMaxArgs];
  int num_leaves = 0;
  /// The declared parameter each leaf belongs to (leaf slot - num_params), for error messages.
  uint16_t leaf_owner[kMaxArgs];
  int current_param = 0;  ///< the parameter whose value is being keyed
  SpecializationKey key;
  /// With keywords: the binding generation the call started with (its option words are kept
  /// only if no re-entrant call rebound it meanwhile).
  uint64_t keyword_generation = 0;
  const char* fallback_reason = nullptr;
  /// What the fallback is about (borrowed): the parameter or option name and the value whose
  /// kind the native key does not cover; nullptr when the reason concerns no one argument.
  PyObject* fallback_name = nullptr;
  PyObject* fallback_value = nullptr;
};

/// `kernel[grid]`: the kernel's bound launch for `grid` (new reference).
PyObject* kernel_subscript(KernelObject* kernel, PyObject* grid);

/// Releases the kernel's under_types (its count set to 0 first).
void clear_under_types(KernelObject* kernel);

/// Binds vectorcall arguments to `kernel`'s parameters (TypeError on a bad call), then builds the
/// specialization key and captures argument values. Never calls into Python on supported kinds.
KeyStatus bind_and_build_key(KernelObject* kernel, PyObject* const* args, Py_ssize_t nargs,
                             PyObject* kwnames, BoundCall* call);

/// Reads each tensor parameter's data pointer again into call->values (Python ran since the
/// call was bound and may have given a tensor new storage). Error with an exception set for a
/// tensor no longer on the launch device. With `leaves`: Fallback, having read nothing, for a
/// call with leaves (tuple elements, descriptor fields), which only binding the call again
/// reads; without, the leaves keep the values they were bound with.
KeyStatus reread_tensor_addresses(KernelObject* kernel, BoundCall* call, bool leaves);

/// After bind_and_build_key returned KeyStatus::Error for a value (ValueError, OverflowError):
/// replaces that exception with the TypeError for a required argument the call left out, if
/// any, since Python binds every argument before it checks a value. Off the hit path.
void prefer_missing_argument_error(KernelObject* kernel, const BoundCall* call);

/// Sets Triton's constexpr wrapper class and the tuple of types keyed by identity (tl.dtype,
/// jit functions). Called once by the Python layer at import.
void set_constexpr_types(PyObject* constexpr_type, PyObject* identity_types);

/// Sets triton.tools.tensor_descriptor.TensorDescriptor: arguments of exactly this type are
/// host tensor descriptors on the native path (see key_builder.cpp). Called once at import.
void set_tensor_descriptor_type(PyObject* type);

/// The value of an exact int (PyLong_CheckExact) when CPython stores it in a single digit
/// (magnitude below 2**30), read from its representation without a call: CPython's own
/// compact-value accessor (PyUnstable_Long_CompactValue, 3.12+; MEDIUM_VALUE in 3.10-3.11
/// longobject.c). False for a larger magnitude: the caller converts it the general way.
[[gnu::always_inline]] inline bool compact_int(PyObject* v, long long* out) {
  const PyLongObject* number = reinterpret_cast<const PyLongObject*>(v);
#if PY_VERSION_HEX >= 0x030C0000
  if (!PyUnstable_Long_IsCompact(number)) {
    return false;
  }
  *out = PyUnstable_Long_CompactValue(number);
  return true;
#else
  const Py_ssize_t size = Py_SIZE(v);
  if (size < -1 || size > 1) {
    return false;
  }
  *out = size == 0 ? 0 : size * static_cast<long long>(number->ob_digit[0]);
  return true;
#endif
}

/// Appends the launch device and the binary-changing knob state to a built key.
inline void finish_key(SpecializationKey* key, int device, uint64_t knob_word) {
  key->push_tail(uint64_t(ArgKind::Device) | (uint64_t(uint32_t(device)) << 8), knob_word);
}

/// What a launch needs to run Triton's launch hooks natively (set at import): Triton's LazyDict
/// class (triton/compiler/compiler.py) and add_launch_metadata(metadata, jit_function, grid,
/// compiled, args), which adds a kernel's own launch_metadata callback to the metadata.
/// `plain_check(type) -> bool` (or None): whether LazyDict(data) is object.__new__ followed by
/// `self.data = data; self.extras = []`; while it says so, launches build the metadata that way
/// without the __init__ call. It is asked again whenever the type's version tag changes.
void set_launch_hook_support(PyObject* lazy_dict_type, PyObject* add_launch_metadata,
                             PyObject* plain_check);

/// `add_run_options(jit_function, kwargs)` (or None): adds to a call's keywords (a dict) the
/// compile options JITFunction.run adds before its pre-run hooks see them (set at import).
void set_pre_run_options(PyObject* add_run_options);

/// Sets the Python exception for the C++ exception in flight (call inside a catch block).
void set_python_error_from_current_exception(KernelObject* kernel);

/// Launches nested in one thread through Python a launch calls (a grid function launching a
/// kernel, and so on): each holds a BoundCall of several KiB on the C stack (about 6.5 KiB a
/// level measured with a recursing grid), so this many take about 1.3 MiB of it.
constexpr int kMaxLaunchNesting = 200;

/// Launches of this thread now inside a call_from_launch.
extern thread_local int t_launch_nesting;

/// Makes `call()` (a call into Python from a launch: a grid function, hooks, the miss handler)
/// counted against the interpreter's recursion limit and against kMaxLaunchNesting, so launches
/// nested without bound raise RecursionError before they exhaust the C stack, whatever limit
/// sys.setrecursionlimit set. Returns what `call()` returns, or nullptr with RecursionError set.
/// Deliberately no RAII: a thread that CPython ends inside `call()` at exit (pthread_exit, a
/// forced unwind) must not touch its thread state again, which a destructor would.
template <typename Call>
PyObject* call_from_launch(Call&& call) {
  // The thread-local's address, looked up once (each access from a shared library otherwise
  // calls __tls_get_addr); `call()` runs on this thread, so it stays this thread's counter.
  int& nesting = t_launch_nesting;
  if (nesting >= kMaxLaunchNesting) {
    PyErr_Format(PyExc_RecursionError,
                 "kernel launches nested more than %d deep (each through a grid function, "
                 "launch hook or compile of the launch outside it)",
                 kMaxLaunchNesting);
    return nullptr;
  }
  if (Py_EnterRecursiveCall(" in a kernel launch") != 0) {
    return nullptr;
  }
  ++nesting;
  PyObject* result = call();
  --nesting;
  Py_LeaveRecursiveCall();
  return result;
}

}  // namespace fastkernel
