// The `fastkernel._C` extension module: exposes the native kernel type and the cold-path
// functions the Python layer uses (configuration, registration after a compile, statistics).
// A build configured with -DFASTKERNEL_TESTING=ON adds the benchmark loops and the test-only
// `_testing` submodule (testing.cpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "bench_floor.h"
#include "fastkernel/fastkernel.h"
#include "grid_meta.h"
#include "grid_program.h"
#include "handle_launch.h"
#include "host_helpers.h"
#include "kernel_object.h"
#include "knob_watch.h"
#include "launch_context.h"
#include "patch_hook.h"
#include "python_errors.h"
#include "registration.h"
#if FASTKERNEL_TESTING
#include "testing.h"
#endif

namespace py = pybind11;
using namespace fastkernel;

namespace {

PyObject* interned(const std::string& s) {
  PyObject* o = PyUnicode_FromStringAndSize(s.data(), Py_ssize_t(s.size()));
  if (o == nullptr) {
    throw py::error_already_set();
  }
  PyUnicode_InternInPlace(&o);
  return o;
}

// Whether a hit has more to do than launch: config values to fill, or an owner to publish to.
void refresh_hit_extras(KernelObject* kernel) {
  kernel->state->hit_extras =
      !kernel->state->config_params.empty() || kernel->publish_owner != nullptr;
}

void configure(py::handle kernel_obj, const std::string& name, const py::list& params,
               const std::vector<std::string>& option_names, py::object miss_handler,
               py::object scratch_allocator, py::object pre_run_hooks) {
  KernelObject* kernel = as_kernel(kernel_obj);
  if (py::len(params) > size_t(kMaxArgs)) {
    throw py::value_error("fastkernel: kernels with more than " + std::to_string(kMaxArgs) +
                          " parameters are not supported on the native path");
  }
  if (option_names.size() > size_t(kMaxOptions)) {
    throw py::value_error("fastkernel: too many compile options");
  }
  KernelState& st = *kernel->state;
  // Records first, while the parameters they were keyed by are intact: a record's destructor
  // can run Python, which can launch this kernel.
  st.table.clear();
  std::vector<ParamSpec> old_params;
  old_params.swap(st.params);
  for (ParamSpec& p : old_params) {
    Py_XDECREF(p.name);
    Py_XDECREF(p.default_value);
  }
  st.param_names.clear();
  clear_grid_meta(&st);
  clear_grid_programs(&st);  // their ARG steps index the old parameters
  for (PyObject* o : st.option_names) {
    Py_XDECREF(o);
  }
  st.option_names.clear();
  Py_CLEAR(st.keywords.kwnames);  // its binding names the old parameters
  st.keywords.nargs = -1;
  clear_option_words(&st.keywords);  // and so do its option words
  // The config parameters index the old parameters too: none until the loop below completes
  // (a bad tuple throws from it and leaves the kernel with the parameters read so far).
  st.config_params.clear();
  refresh_hit_extras(kernel);
  for (py::handle item : params) {
    // (name, is_constexpr, specialize, align, tune flags (TuneFlag bits), has_default, default)
    py::tuple t = py::reinterpret_borrow<py::tuple>(item);
    ParamSpec p;
    p.name = interned(t[0].cast<std::string>());
    p.is_constexpr = t[1].cast<bool>();
    p.specialize = t[2].cast<bool>();
    p.align = t[3].cast<bool>();
    const int tune = t[4].cast<int>();
    if (tune < 0 || tune > 63) {
      throw py::value_error("fastkernel: tune flags must be TuneFlag bits");
    }
    p.tune = uint8_t(tune);
    if (t[5].cast<bool>()) {
      p.default_value = py::object(t[6]).release().ptr();
    }
    st.params.push_back(p);
    st.param_names.push_back(p.name);  // borrowed: owned by the ParamSpec
  }
  for (size_t i = 0; i < st.params.size(); ++i) {
    if (st.params[i].tune & kTuneConfigProvided) {
      st.config_params.push_back(int(i));
    }
  }
  refresh_hit_extras(kernel);
  for (const std::string& o : option_names) {
    st.option_names.push_back(interned(o));
  }
  PyObject* new_name = interned(name);
  Py_XSETREF(kernel->name, new_name);
  Py_XSETREF(kernel->miss_handler, miss_handler.inc_ref().ptr());
  Py_XSETREF(kernel->scratch_allocator, scratch_allocator.inc_ref().ptr());
  if (!pre_run_hooks.is_none() && !PyList_Check(pre_run_hooks.ptr())) {
    throw py::type_error("fastkernel: pre_run_hooks must be a list or None");
  }
  Py_XSETREF(kernel->pre_run_hooks,
             pre_run_hooks.is_none() ? nullptr : pre_run_hooks.inc_ref().ptr());
}

py::dict stats(py::handle kernel_obj) {
  KernelObject* kernel = as_kernel(kernel_obj);
  py::dict d;
  d["hits"] = kernel->state->hits;
  d["misses"] = kernel->state->misses;
  d["fallbacks"] = kernel->state->fallbacks;
  d["specializations"] = kernel->state->table.size();
  d["evictions"] = kernel->state->table.evictions();
  d["table_bytes"] = kernel->state->table.bytes_held();
  return d;
}

std::pair<int, int> device_capability(int device) {
  return with_python_errors([&] {
    const DriverApi& api = driver();
    CUdevice dev = 0;
    check_cuda(api.cuDeviceGet(&dev, device), "cuDeviceGet");
    int major = 0, minor = 0;
    check_cuda(api.cuDeviceGetAttribute(&major, cu::DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
               "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)");
    check_cuda(api.cuDeviceGetAttribute(&minor, cu::DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
               "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)");
    return std::make_pair(major, minor);
  });
}

// The kernel type's configuration and statistics methods (the Python subclasses call them on
// themselves; underscored so they never shadow a triton.JITFunction attribute).
void register_kernel_methods() {
  def_kernel_method("_configure", &configure, py::arg("name"), py::arg("params"),
                    py::arg("option_names"), py::arg("miss_handler"), py::arg("scratch_allocator"),
                    py::arg("pre_run_hooks") = py::none(),
                    "Describe the kernel's parameters and compile options to the native key\n"
                    "builder (drops every launch record). `params`: one (name, is_constexpr,\n"
                    "specialize, align, TUNE_FLAGS bits, has_default, default) tuple per\n"
                    "parameter; `miss_handler(kernel, grid, args, kwargs, key, device, reason)`\n"
                    "returns a LaunchRecord to insert and launch, or what Triton's launch\n"
                    "returned; `scratch_allocator(size, align, stream, kind)`; `pre_run_hooks`:\n"
                    "the JITFunction's list (shared), or None.");
  def_kernel_method(
      "_set_publish",
      [](py::handle self, py::handle owner, py::str name) {
        KernelObject* kernel = as_kernel(self);
        PyObject* interned = name.inc_ref().ptr();
        PyUnicode_InternInPlace(&interned);
        Py_XSETREF(kernel->publish_name, interned);
        Py_XSETREF(kernel->last_published, nullptr);
        kernel->published_dict = nullptr;
        Py_XSETREF(kernel->publish_owner, owner.is_none() ? nullptr : owner.inc_ref().ptr());
        refresh_hit_extras(kernel);
      },
      py::arg("owner"), py::arg("name"),
      "A hit sets `owner.<name>` to its record's `published` object when that differs from the\n"
      "one set last (owner None: nothing is published).");
  def_kernel_method(
      "_set_hooks_through_triton",
      [](py::handle self, bool on) { as_kernel(self)->state->hooks_through_triton = on; },
      py::arg("on"),
      "While the JITFunction has pre-run hooks, every call takes the kernel's miss handler\n"
      "with no key (Triton's path), the hooks not run natively: for a kernel whose records\n"
      "give values the call leaves out, which Triton's run passes the hooks.");
  def_kernel_method(
      "_set_under_types",
      [](py::handle self, const py::tuple& types) {
        if (types.size() > size_t(kMaxUnderTypes)) {
          throw py::value_error("_set_under_types: at most " + std::to_string(kMaxUnderTypes) +
                                " types, got " + std::to_string(types.size()));
        }
        for (const py::handle t : types) {
          if (!PyType_Check(t.ptr())) {
            throw py::type_error("_set_under_types: argument 'types' must hold types, not " +
                                 std::string(Py_TYPE(t.ptr())->tp_name));
          }
        }
        KernelObject* kernel = as_kernel(self);
        clear_under_types(kernel);
        int n = 0;
        for (const py::handle t : types) {
          kernel->under_types[n] = reinterpret_cast<PyTypeObject*>(t.inc_ref().ptr());
          kernel->under_tags[n] = ~0u;
          ++n;
        }
        kernel->num_under_types = n;
      },
      py::arg("types"),
      "Under fastkernel.patch(): the classes (a tuple of at most 4 types) of the kernel objects\n"
      "a launch goes through underneath, other than the served object's own class. A launch\n"
      "takes Triton's path while a `run` another library assigned is on one of them\n"
      "(install_patch's type_served says so); checked again whenever one changed.");
  def_kernel_method("_counters", &stats,
                    "{hits, misses, fallbacks, specializations, evictions, table_bytes}: ints.");
  def_kernel_method(
      "_grid_counts",
      [](py::handle self) {
        const KernelState& st = *as_kernel(self)->state;
        return std::make_pair(st.native_grids, st.called_grids);
      },
      "(native, called): callable grids this kernel computed by their native program, and\n"
      "those it called in Python.");
  def_kernel_method(
      "_set_capacity",
      [](py::handle self, size_t capacity) {
        as_kernel(self)->state->table.set_capacity(capacity);
      },
      py::arg("capacity"),
      "Keep at most `capacity` specializations (0 = unbounded), least recently launched evicted.");
  def_kernel_method(
      "_clear_records", [](py::handle self) { as_kernel(self)->state->table.clear(); },
      "Drop every launch record (modules unloaded; one a launch in flight holds once it is "
      "done).");
  def_kernel_method(
      "_invalidate_records", [](py::handle self) { as_kernel(self)->state->table.invalidate(); },
      "_clear_records, and a record whose compile began before is not kept either: what made "
      "the records stale (the kernel's debug) may have made it stale.");
}

}  // namespace

#ifndef FASTKERNEL_TORCH_VERSION
#error "FASTKERNEL_TORCH_VERSION must be defined by the build"
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() =
      "fastkernel's native core: specialization keys, launch table, cuLaunchKernel trampoline.";
  m.attr("TORCH_VERSION") = FASTKERNEL_TORCH_VERSION;

  if (PyType_Ready(&KernelType) < 0 || PyType_Ready(&BoundLaunchType) < 0 ||
      PyType_Ready(&GridMetaType) < 0 || PyType_Ready(&RunLauncherType) < 0 ||
      PyType_Ready(&DispatchInputType) < 0) {
    throw py::error_already_set();
  }
  m.add_object("DispatchInput",
               py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&DispatchInputType)));
  m.add_object("GridMeta",
               py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&GridMetaType)));
  m.add_object("Kernel",
               py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&KernelType)));
  m.add_object("BoundLaunch",
               py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&BoundLaunchType)));
  m.add_object("RunLauncher",
               py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&RunLauncherType)));

  g_cuda_error_type = PyErr_NewExceptionWithDoc(
      "fastkernel.CudaError",
      "A CUDA driver call failed. `code` is the CUresult; the message carries its name and text.",
      PyExc_RuntimeError, nullptr);
  g_driver_unavailable_type = PyErr_NewExceptionWithDoc(
      "fastkernel.DriverUnavailableError",
      "No CUDA driver could be opened or initialized (no GPU, or no NVIDIA driver installed).",
      PyExc_RuntimeError, nullptr);
  if (g_cuda_error_type == nullptr || g_driver_unavailable_type == nullptr) {
    throw py::error_already_set();
  }
  m.add_object("CudaError", py::reinterpret_borrow<py::object>(g_cuda_error_type));
  m.add_object("DriverUnavailableError",
               py::reinterpret_borrow<py::object>(g_driver_unavailable_type));

  m.def(
      "configure_knob_watch",
      [](py::list dicts, py::object refresh) {
        if (!configure_knob_watch(dicts.ptr(), refresh.ptr())) {
          throw py::error_already_set();
        }
      },
      py::arg("dicts"), py::arg("refresh"),
      "Watch Triton's knob dicts; `refresh()` recomputes the knob state after a change.");
  m.def("mark_knobs_dirty", &mark_knobs_dirty,
        "Note that a Triton knob was assigned (called by the knob classes' __setattr__).");
  m.def(
      "launch_hooks_active",
      [] {
        const KnobState* knobs = current_knobs();
        if (knobs == nullptr) {
          throw py::error_already_set();
        }
        return hooks_active(*knobs);
      },
      "Whether knobs.runtime.launch_enter_hook or launch_exit_hook holds a hook (a callable, "
      "or a HookChain holding one), from the watched knob state: what a native launch reads.");
  m.def(
      "set_grid_program_support",
      [](py::object compiler, py::object cdiv, py::object next_power_of_2, py::object max,
         py::object min) {
        set_grid_program_support(compiler.ptr(), cdiv.ptr(), next_power_of_2.ptr(), max.ptr(),
                                 min.ptr());
      },
      py::arg("compiler"), py::arg("cdiv"), py::arg("next_power_of_2"), py::arg("max"),
      py::arg("min"),
      "`compiler(code, param_names)` -> grid program steps or None, and the callees a program\n"
      "may call (by identity): Triton's cdiv and next_power_of_2, builtins max and min.");
  m.attr("GRID_PROGRAM_STEPS") = py::reinterpret_steal<py::object>(grid_program_step_names());
  m.def(
      "set_pre_run_options",
      [](py::object add_run_options) { set_pre_run_options(add_run_options.ptr()); },
      py::arg("add_run_options"),
      "`add_run_options(jit_function, kwargs)` adds to the keywords a kernel's pre-run hooks\n"
      "receive the compile options Triton's JITFunction.run adds first (None: none).");
  m.def(
      "set_launch_hook_support",
      [](py::object lazy_dict_type, py::object add_launch_metadata, py::object plain_check) {
        set_launch_hook_support(lazy_dict_type.ptr(), add_launch_metadata.ptr(), plain_check.ptr());
      },
      py::arg("lazy_dict_type"), py::arg("add_launch_metadata"),
      py::arg("plain_check") = py::none(),
      "Triton's LazyDict class and the helper adding a kernel's launch_metadata callback to\n"
      "it, for the launch hooks a native launch runs. plain_check(type) -> bool: whether\n"
      "LazyDict(data) is object.__new__ then `self.data = data; self.extras = []`; while it\n"
      "is (asked again after each change of the class), launches build it without calling\n"
      "__init__.");
  register_registration(m);
  register_kernel_methods();
  m.def(
      "set_tensor_descriptor_type",
      [](py::object type) { set_tensor_descriptor_type(type.is_none() ? nullptr : type.ptr()); },
      py::arg("type"),
      "Tell the key builder Triton's host TensorDescriptor class (None: descriptors fall back).");
  m.def(
      "set_constexpr_types",
      [](py::object constexpr_type, py::tuple identity_types) {
        set_constexpr_types(constexpr_type.ptr(), identity_types.ptr());
      },
      py::arg("constexpr_type"), py::arg("identity_types"),
      "Tell the key builder Triton's constexpr class and the types it may key by identity.");
  m.def(
      "install_patch",
      [](py::handle jit_type, py::object factory, py::object triton_getitem,
         py::object type_served) {
        if (!install_patch(jit_type.ptr(), factory.ptr(), triton_getitem.ptr(),
                           type_served.ptr())) {
          throw py::error_already_set();
        }
      },
      py::arg("jit_type"), py::arg("factory"), py::arg("triton_getitem"), py::arg("type_served"),
      "Serve `jit_type.__getitem__` natively: factory(jit) -> dispatch Kernel or None; "
      "type_served(type) -> whether that type's run is still the patch's (asked again after "
      "the type changes).");
  m.def(
      "install_host_helpers",
      [](py::handle constexpr_function_type, py::handle constexpr_type, py::handle triton_call,
         py::handle cdiv, py::handle next_power_of_2) {
        if (!install_host_helpers(constexpr_function_type.ptr(), constexpr_type.ptr(),
                                  triton_call.ptr(), cdiv.ptr(), next_power_of_2.ptr(),
                                  &BoundLaunchType)) {
          throw py::error_already_set();
        }
      },
      py::arg("constexpr_function_type"), py::arg("constexpr_type"), py::arg("triton_call"),
      py::arg("cdiv"), py::arg("next_power_of_2"),
      "Serve host calls of ConstexprFunction natively (the caller restores __call__ to undo).");
  m.def(
      "install_handle_subscript",
      [](py::handle type, py::object attr, py::object slow) {
        if (!install_handle_subscript(type.ptr(), attr.is_none() ? nullptr : attr.ptr(),
                                      slow.ptr())) {
          throw py::error_already_set();
        }
      },
      py::arg("type"), py::arg("attr"), py::arg("slow"),
      "Serve `type.__getitem__` natively for kept compiled-kernel handles: with attr None the\n"
      "instances are the handles (CompiledKernel), else the instance's attribute `attr` is.\n"
      "A handle with a remembered launcher, a grid of three dims and no launch hook set\n"
      "launches through the launcher's subscript; slow(self, grid) serves the rest. The caller\n"
      "restores the type's attribute to undo it.");
  m.def(
      "remember_handle_launch",
      [](py::handle compiled, py::handle launcher) {
        if (!remember_handle_launch(compiled.ptr(), launcher.ptr())) {
          throw py::error_already_set();
        }
      },
      py::arg("compiled"), py::arg("launcher"),
      "Launch `compiled[grid]` through `launcher` (a Kernel) from the native handle subscript\n"
      "while `compiled` lives. TypeError when launcher is not a Kernel or compiled cannot be\n"
      "weakly referenced.");
  m.def(
      "handle_launcher",
      [](py::handle compiled) {
        return py::reinterpret_steal<py::object>(handle_launcher(compiled.ptr()));
      },
      py::arg("compiled"), "The launcher remembered for `compiled`, or None.");
  m.def(
      "run_launcher",
      [](py::handle handle, py::handle launcher, py::handle triton_run, py::handle function,
         py::handle packed_metadata, py::handle hook_chain_type, py::handle on_fallback) {
        PyObject* r =
            new_run_launcher(handle.ptr(), launcher.ptr(), triton_run.ptr(), function.ptr(),
                             packed_metadata.ptr(), hook_chain_type.ptr(), on_fallback.ptr());
        if (r == nullptr) {
          throw py::error_already_set();
        }
        return py::reinterpret_steal<py::object>(r);
      },
      py::arg("handle"), py::arg("launcher"), py::arg("triton_run"), py::arg("function"),
      py::arg("packed_metadata"), py::arg("hook_chain_type"), py::arg("on_fallback"),
      "A kept handle's launcher object under the patch (`handle.run`): called as Triton's\n"
      "launcher is, it launches the handle's binary through `launcher` (its CompiledLaunch)\n"
      "when Triton's launcher would launch exactly that (the handle's function and packed\n"
      "metadata, no launch hook given or set, torch's current stream), else calls\n"
      "`triton_run` and counts the call through on_fallback(reason). It keeps `handle` alive.");
  m.def("forget_handle_launches", &forget_handle_launches,
        "Forget every launcher remember_handle_launch gave.");
  m.def("num_handle_launches", &num_handle_launches,
        "How many launchers remember_handle_launch gave are remembered.");
  m.def("uninstall_patch", &uninstall_patch,
        "Forget every patched dispatch (the caller restores the type's __getitem__).");
  m.def("forget_refused_types", &forget_refused_types,
        "Forget the types the patch factory refused as a whole: their objects ask it again.");
  m.def(
      "patched_dispatch",
      [](py::handle jit) {
        PyObject* d = patched_dispatch(jit.ptr());
        if (d == nullptr) {
          throw py::error_already_set();
        }
        return py::reinterpret_steal<py::object>(d);
      },
      py::arg("jit"), "The dispatch Kernel serving a JITFunction under the patch, or None.");
  m.def(
      "drop_patched_dispatch", [](py::handle jit) { drop_patched_dispatch(jit.ptr()); },
      py::arg("jit"),
      "Forget the dispatch serving a JITFunction under the patch: its next launch asks the "
      "patch factory again.");
  m.def(
      "patch_slot_is_native",
      [](py::handle type) {
        if (!PyType_Check(type.ptr())) {
          throw py::type_error("expected a type");
        }
        return patch_slot_is_native(reinterpret_cast<PyTypeObject*>(type.ptr()));
      },
      py::arg("type"), "Whether type's mp_subscript slot is the native patched subscript.");
  // The numbers the Python side writes into parameter specs and bundle manifests, spelled once
  // here from the C++ enums (csrc/include/fastkernel/specialization.h, bundle.h).
  m.attr("MAX_KEY_WORDS") = kMaxKeyWords;
  m.attr("ARG_KINDS") =
      py::dict(py::arg("tensor") = int(ArgKind::Tensor), py::arg("int") = int(ArgKind::Int),
               py::arg("float") = int(ArgKind::Float), py::arg("bool") = int(ArgKind::Bool),
               py::arg("none") = int(ArgKind::None), py::arg("device") = int(ArgKind::Device));
  m.attr("INT_WIDTHS") =
      py::dict(py::arg("i32") = int(IntWidth::I32), py::arg("i64") = int(IntWidth::I64),
               py::arg("u64") = int(IntWidth::U64));
  m.attr("VALUE_CLASSES") = py::dict(py::arg("not_specialized") = int(ValueClass::NotSpecialized),
                                     py::arg("divisible_16") = int(ValueClass::Divisible16),
                                     py::arg("other") = int(ValueClass::Other),
                                     py::arg("equals_one") = int(ValueClass::EqualsOne));
  m.attr("TUNE_FLAGS") = py::dict(
      py::arg("config_provided") = int(kTuneConfigProvided), py::arg("value") = int(kTuneValue),
      py::arg("layout") = int(kTuneLayout), py::arg("sizes") = int(kTuneSizes),
      py::arg("strides") = int(kTuneStrides), py::arg("may_be_provided") = int(kTuneMayBeProvided));
  // Bundle::load's checks from Python, for a bundle about to ship to C++ callers: nothing is
  // loaded on a device, so no driver or GPU is needed.
  PyObject* bundle_error = PyErr_NewExceptionWithDoc(
      "fastkernel.BundleError",
      "A kernel bundle refused by fastkernel::Bundle::load (csrc/bundle.cpp): a file unreadable, "
      "of the wrong kind or too large, a malformed or out-of-range manifest line, a plan other "
      "than Triton's, a cubin whose ELF extents or digest do not hold. The message is the "
      "loader's.",
      PyExc_ValueError, nullptr);
  if (bundle_error == nullptr) {
    throw py::error_already_set();
  }
  // One reference kept for good, as for CudaError: the function below raises it.
  m.add_object("BundleError", py::reinterpret_borrow<py::object>(bundle_error));
  m.def(
      "check_bundle",
      [bundle_error](const std::string& directory) {
        std::vector<std::string> entries;
        std::string refused;
        {
          py::gil_scoped_release release;  // reads and hashes up to the bundle's size limit
          try {
            entries = Bundle::load(directory).describe_entries();
          } catch (const BundleError& e) {
            refused = e.what();
          }
        }
        if (!refused.empty()) {
          PyErr_SetString(bundle_error, refused.c_str());
          throw py::error_already_set();
        }
        return entries;
      },
      py::arg("directory"),
      "Bundle::load(directory) without a device; each entry described as a mismatch lists it. "
      "Raises fastkernel.BundleError with the loader's message.");
  m.attr("BUNDLE_FORMAT_VERSION") = kBundleFormatVersion;
  m.attr("BUNDLE_ENTRY_FACTS") = py::tuple(
      py::cast(std::vector<std::string>(kBundleEntryFacts.begin(), kBundleEntryFacts.end())));

  m.def("driver_library_path", &driver_library_path,
        "The CUDA driver library fastkernel opens ($FASTKERNEL_CUDA_DRIVER or libcuda.so.1).");
  m.def("driver_loaded", &driver_loaded, "Whether the driver has been opened in this process.");
  m.def("device_capability", &device_capability, py::arg("device"),
        "(major, minor) compute capability of `device`, from the driver.");

#if FASTKERNEL_TESTING
  register_bench_floor(m);
  register_testing(m);
#endif
}
