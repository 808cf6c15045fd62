// Triton's runtime knobs as the native path sees them: the knobs that change the binary
// (debug, instrumentation mode, ...) folded into one key word, and whether launch hooks are
// set. Knob changes are noticed without a per-call lookup: the knobs objects' dicts are watched.
#pragma once

#include <Python.h>

#include <cstdint>

namespace fastkernel {

/// One of Triton's launch hook knobs: a HookChain (its live list of hooks, called in order, or
/// in reverse when the chain is reversed: triton/knobs.py HookChain.__call__) or a plain
/// callable assigned in its place.
struct LaunchHook {
  PyObject* calls = nullptr;     ///< the HookChain's `calls` list (owned), or nullptr
  bool reversed = false;         ///< the HookChain's `reversed`
  PyObject* callable = nullptr;  ///< a plain callable set as the hook (owned), or nullptr
};

namespace knob_watch_detail {
inline constexpr Py_ssize_t kNoHooks = 0;  ///< the list size read for a hook with no list
}

/// The knob state a launch uses.
struct KnobState {
  uint64_t key_word = 0;           ///< identifies the binary-changing knob values (0 until set)
  bool native_disabled = false;    ///< a knob the native path cannot honour is set: use Triton's
  LaunchHook enter;                ///< knobs.runtime.launch_enter_hook
  LaunchHook exit;                 ///< knobs.runtime.launch_exit_hook
  bool any_hook_callable = false;  ///< a plain callable is set as either hook
  /// The sizes of the enter and exit HookChains' live lists (hooks can be added to a chain
  /// without a knob changing), or kNoHooks: read on every launch without a branch per hook.
  const Py_ssize_t* hook_list_sizes[2] = {&knob_watch_detail::kNoHooks,
                                          &knob_watch_detail::kNoHooks};
};

/// Watches `dicts` (the knobs objects' __dict__s) and calls `refresh()` whenever one changed
/// since the last call; `refresh` returns (key_word, native_disabled, enter_calls_or_None,
/// enter_reversed, enter_callable_or_None, exit_calls_or_None, exit_reversed,
/// exit_callable_or_None). Returns false with a Python exception set.
bool configure_knob_watch(PyObject* dicts, PyObject* refresh);

/// Marks the knob state stale (called by the notifying __setattr__ installed on Triton's knob
/// classes, which catches attribute assignment where dict watchers do not fire).
void mark_knobs_dirty() noexcept;

/// A dict's version (PEP 509; the ma_version_tag of CPython 3.10-3.13, deprecated from 3.12):
/// globally unique, given anew to every dict made and on every change made through the dict,
/// never 0 once the dict holds something. A split-table dict (an instance __dict__) can change
/// without it on 3.13, through its object's inline values. 0 where unavailable (CPython 3.14
/// replaced it), which callers treat as "unknown".
inline uint64_t dict_version(PyObject* dict) {
#if PY_VERSION_HEX < 0x030E0000
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  return reinterpret_cast<PyDictObject*>(dict)->ma_version_tag;
#pragma GCC diagnostic pop
#else
  (void)dict;
  return 0;
#endif
}

namespace knob_watch_detail {
constexpr int kMaxWatched = 4;
extern KnobState state;
extern bool dirty;
extern int num_watched;
#if PY_VERSION_HEX < 0x030C0000
extern PyDictObject* watched[kMaxWatched];
extern uint64_t versions[kMaxWatched];
#endif
/// Recomputes the state through the Python refresh callback; nullptr with an exception set.
const KnobState* refresh();
}  // namespace knob_watch_detail

/// The current knob state, refreshed if a watched dict changed. nullptr with an exception set
/// if the refresh failed. Inline: on a hit with no change this is a flag test (and, on 3.11,
/// a version-tag compare per watched dict).
inline const KnobState* current_knobs() {
  using namespace knob_watch_detail;
  bool stale = dirty;
#if PY_VERSION_HEX < 0x030C0000
  for (int i = 0; i < num_watched; ++i) {
    stale |= dict_version(reinterpret_cast<PyObject*>(watched[i])) != versions[i];
  }
#endif
  return stale ? refresh() : &state;
}

/// Whether a launch hook would run now (a non-empty HookChain or a plain callable).
inline bool hooks_active(const KnobState& s) {
  return s.any_hook_callable || (*s.hook_list_sizes[0] | *s.hook_list_sizes[1]) != 0;
}

}  // namespace fastkernel
