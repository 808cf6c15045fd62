// Registration of a compiled specialization: the Python layer describes it with one typed
// object, `_C.LaunchFacts` (the core's LaunchFacts, field for field, so the field list is the
// C++ struct's); `_C.LaunchRecord` checks the facts (make_launch_record) and loads the cubin;
// a compile-on-miss handler returns that record and the native entry inserts it under the
// call's key and launches it (`Kernel._insert` inserts one without launching).
#include "registration.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fastkernel/fastkernel.h"
#include "kernel_object.h"
#include "python_errors.h"

namespace py = pybind11;

namespace fastkernel {
namespace {

/// Binds each field of T as a read-write attribute and records its name, so the list a Python
/// caller sees (T.FIELDS) is spelled once.
template <typename T>
class FieldBinder {
 public:
  explicit FieldBinder(py::class_<T>& cls) : cls_(cls) {}
  template <typename V>
  FieldBinder& field(const char* name, V T::*member, const char* doc) {
    cls_.def_readwrite(name, member, doc);
    names_.emplace_back(name);
    return *this;
  }
  void finish() {
    cls_.attr("FIELDS") = py::tuple(py::cast(names_));
    cls_.def("__repr__", [names = names_](py::handle self) {
      std::string out = py::str(py::type::handle_of(self).attr("__name__"));
      out += "(";
      for (size_t i = 0; i < names.size(); ++i) {
        out +=
            (i ? ", " : "") + names[i] + "=" + std::string(py::repr(self.attr(names[i].c_str())));
      }
      return out + ")";
    });
  }

 private:
  py::class_<T>& cls_;
  std::vector<std::string> names_;
};

SpecializationKey key_from_bytes(const py::bytes& key_bytes) {
  const std::string data = key_bytes;
  if (data.size() % sizeof(uint64_t) != 0 ||
      data.size() / sizeof(uint64_t) > size_t(kMaxKeyWords)) {
    throw py::value_error("fastkernel: malformed specialization key");
  }
  SpecializationKey key;
  key.size = int(data.size() / sizeof(uint64_t));
  std::memcpy(key.words, data.data(), data.size());
  return key;
}

/// A loaded launch record not yet in a kernel's table: what a compile-on-miss handler returns
/// and what `Kernel._insert` takes (`_C.LaunchRecord`). Unloaded on drop unless inserted.
struct LoadedRecord {
  std::unique_ptr<LaunchRecord> record;  ///< nullptr once inserted
  py::object global_checks;              ///< tuple of (dict, name, value), or None
  std::string kernel_name;               ///< the record's, kept after it is inserted
  int device = 0;
  FunctionAttributes attributes;  ///< read by the driver when the cubin was loaded

  LoadedRecord() = default;
  LoadedRecord(const LoadedRecord&) = delete;
  LoadedRecord& operator=(const LoadedRecord&) = delete;
  ~LoadedRecord() {
    if (record) {
      unload_launch_record(*record);
    }
  }

  const LaunchRecord& loaded() const {
    if (!record) {
      throw py::value_error("fastkernel: this launch record has been inserted into a table");
    }
    return *record;
  }
};

}  // namespace

void release_python_reference(void* object) { Py_DECREF(static_cast<PyObject*>(object)); }

int visit_record_references(const LaunchRecord& rec, visitproc visit, void* arg) {
  if (rec.release_user_data != release_python_reference) {
    return 0;  // a record this module did not make holds no Python references
  }
  for (void* p : {rec.user_data, rec.tuned_args, rec.published, rec.hit_call}) {
    Py_VISIT(static_cast<PyObject*>(p));
  }
  return 0;
}

namespace {

std::unique_ptr<LoadedRecord> load_record(const LaunchFacts& facts, const py::bytes& cubin,
                                          py::handle compiled, py::handle tuned_args,
                                          py::handle published, py::handle global_checks) {
  if (!tuned_args.is_none() && !PyTuple_Check(tuned_args.ptr())) {
    throw py::type_error("fastkernel: tuned_args must be a tuple (one item per parameter)");
  }
  if (!global_checks.is_none()) {
    if (!PyTuple_Check(global_checks.ptr())) {
      throw py::type_error("fastkernel: global_checks must be a tuple");
    }
    for (py::handle c : global_checks) {
      if (!PyTuple_Check(c.ptr()) || PyTuple_GET_SIZE(c.ptr()) != 3 ||
          !PyDict_Check(PyTuple_GET_ITEM(c.ptr(), 0))) {
        throw py::type_error("fastkernel: global checks are (dict, name, value) tuples");
      }
    }
  }
  auto loaded = std::make_unique<LoadedRecord>();
  try {
    loaded->record = make_launch_record(facts, kMaxArgs);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  LaunchRecord& rec = *loaded->record;
  // The record owns a reference to what a launch returns; dropped with the record (eviction,
  // clear, kernel deallocation, or the load below failing), always under the GIL.
  rec.release_user_data = release_python_reference;
  rec.user_data = compiled.inc_ref().ptr();
  if (!tuned_args.is_none()) {
    rec.tuned_args = tuned_args.inc_ref().ptr();
  }
  if (!published.is_none()) {
    rec.published = published.inc_ref().ptr();
  }
  const std::string image = cubin;
  loaded->attributes =
      with_python_errors([&] { return load_launch_record(rec, image.data(), image.size()); });
  loaded->global_checks = py::reinterpret_borrow<py::object>(global_checks);
  loaded->kernel_name = rec.kernel_name;
  loaded->device = rec.device;
  return loaded;
}

const LaunchRecord* insert_loaded(KernelObject* kernel, const SpecializationKey& key,
                                  LoadedRecord& loaded) {
  const LaunchRecord& rec = loaded.loaded();
  const size_t num_params = kernel->state->params.size();
  if (rec.tuned_args != nullptr &&
      size_t(PyTuple_GET_SIZE(static_cast<PyObject*>(rec.tuned_args))) != num_params) {
    PyErr_Format(PyExc_ValueError,
                 "%U: the launch record's tuned_args must have one item per parameter (%zu)",
                 kernel->name, num_params);
    throw py::error_already_set();
  }
  if (!loaded.global_checks.is_none()) {
    PyObject* checks = loaded.global_checks.ptr();
    Py_XSETREF(kernel->global_checks, PyTuple_GET_SIZE(checks) ? Py_NewRef(checks) : nullptr);
  }
  // A record whose hits call Python instead of launching is diverted by the hit's bounds check.
  loaded.record->leaves_read =
      rec.hit_call != nullptr ? kHitCallLeaves : std::max(0, rec.values_read - int(num_params));
  return kernel->state->table.insert(key, std::move(loaded.record));
}

}  // namespace

void register_registration(py::module_& m) {
  py::class_<TensorMapFacts> tensor_map(
      m, "TensorMapFacts",
      "How a launch encodes one host tensor descriptor into a CUtensorMap (an \"nvTmaDesc\" "
      "plan entry): Triton's tensordesc_meta entry.");
  tensor_map.def(py::init([](int data_type, int elem_size, int swizzle, std::vector<uint32_t> block,
                             bool fp4_padded, bool tf32_rounding) {
                   return TensorMapFacts{data_type,        elem_size,  swizzle,
                                         std::move(block), fp4_padded, tf32_rounding};
                 }),
                 py::arg("data_type"), py::arg("elem_size"), py::arg("swizzle"), py::arg("block"),
                 py::arg("fp4_padded") = false, py::arg("tf32_rounding") = false);
  FieldBinder<TensorMapFacts>(tensor_map)
      .field("data_type", &TensorMapFacts::data_type, "CUtensorMapDataType value, 0..15")
      .field("elem_size", &TensorMapFacts::elem_size, "bytes per element, 1..8")
      .field("swizzle", &TensorMapFacts::swizzle, "CUtensorMapSwizzle value, 0..3")
      .field("block", &TensorMapFacts::block, "block shape, 1 to 5 dims (list of int)")
      .field("fp4_padded", &TensorMapFacts::fp4_padded, "packed fp4 padded to bytes")
      .field("tf32_rounding", &TensorMapFacts::tf32_rounding, "round fp32 to tf32 on load")
      .finish();

  py::class_<LaunchFacts> facts(
      m, "LaunchFacts",
      "The launch facts of one compiled specialization (csrc/include/fastkernel/launch_record.h"
      " LaunchFacts), checked by register(); keyword arguments only.");
  const LaunchFacts defaults;
  facts.def(py::init([](std::string kernel_name, int device, unsigned block_x, unsigned shared_mem,
                        unsigned num_ctas, bool cooperative_grid, bool pdl,
                        std::vector<std::pair<int, std::string>> plan, int num_scratch_params,
                        uint64_t global_scratch_size, uint64_t global_scratch_align,
                        uint64_t profile_scratch_size, uint64_t profile_scratch_align,
                        std::vector<TensorMapFacts> tensor_maps) {
              return LaunchFacts{std::move(kernel_name),
                                 device,
                                 block_x,
                                 shared_mem,
                                 num_ctas,
                                 cooperative_grid,
                                 pdl,
                                 std::move(plan),
                                 num_scratch_params,
                                 global_scratch_size,
                                 global_scratch_align,
                                 profile_scratch_size,
                                 profile_scratch_align,
                                 std::move(tensor_maps)};
            }),
            py::kw_only(), py::arg("kernel_name"), py::arg("device"), py::arg("block_x"),
            py::arg("shared_mem") = defaults.shared_mem, py::arg("num_ctas") = defaults.num_ctas,
            py::arg("cooperative_grid") = defaults.cooperative_grid, py::arg("pdl") = defaults.pdl,
            py::arg("plan"), py::arg("num_scratch_params") = defaults.num_scratch_params,
            py::arg("global_scratch_size") = defaults.global_scratch_size,
            py::arg("global_scratch_align") = defaults.global_scratch_align,
            py::arg("profile_scratch_size") = defaults.profile_scratch_size,
            py::arg("profile_scratch_align") = defaults.profile_scratch_align,
            py::arg("tensor_maps") = std::vector<TensorMapFacts>{});
  FieldBinder<LaunchFacts>(facts)
      .field("kernel_name", &LaunchFacts::kernel_name, "the cubin's entry point")
      .field("device", &LaunchFacts::device, "the CUDA device the cubin loads on")
      .field("block_x", &LaunchFacts::block_x, "threads per CTA (32 * num_warps), 1..1024")
      .field("shared_mem", &LaunchFacts::shared_mem, "dynamic shared memory, bytes")
      .field("num_ctas", &LaunchFacts::num_ctas, "CTAs per cluster, >= 1")
      .field("cooperative_grid", &LaunchFacts::cooperative_grid, "a cooperative launch")
      .field("pdl", &LaunchFacts::pdl, "programmatic dependent launch")
      .field("plan", &LaunchFacts::plan,
             "(bound-argument index, Triton signature type) per non-constexpr parameter")
      .field("num_scratch_params", &LaunchFacts::num_scratch_params,
             "scratch pointers appended after the parameters, 0..2")
      .field("global_scratch_size", &LaunchFacts::global_scratch_size, "bytes per CTA")
      .field("global_scratch_align", &LaunchFacts::global_scratch_align, "bytes")
      .field("profile_scratch_size", &LaunchFacts::profile_scratch_size, "bytes per CTA")
      .field("profile_scratch_align", &LaunchFacts::profile_scratch_align, "bytes")
      .field("tensor_maps", &LaunchFacts::tensor_maps,
             "one TensorMapFacts per \"nvTmaDesc\" plan entry, in order")
      .finish();

  py::class_<LoadedRecord>(
      m, "LaunchRecord",
      "A compiled specialization loaded on its device and ready to launch: the launch record\n"
      "a compile-on-miss handler returns (the native entry inserts it under the call's key and\n"
      "launches it) or that Kernel._insert registers. Unloaded when dropped uninserted.")
      .def(py::init(&load_record), py::arg("facts"), py::arg("cubin"), py::arg("compiled"),
           py::arg("tuned_args") = py::none(), py::arg("published") = py::none(),
           py::arg("global_checks") = py::none(),
           "Check `facts` and load `cubin` (bytes) on facts.device: ValueError naming the fact\n"
           "for facts a launch could not trust, CudaError when the driver refuses the cubin,\n"
           "DriverUnavailableError without a driver. `compiled`: what a launch returns.\n"
           "`tuned_args` (a tuple, one item per parameter, or None): what a tuned config gives\n"
           "the parameters a call leaves out, for the callable grid and the launch hooks.\n"
           "`published` (or None): set as the publish owner's attribute by a hit on this record\n"
           "(see Kernel._set_publish). `global_checks` (a tuple of (globals dict, name, value\n"
           "compiled with), or None to leave the kernel's as they are): the globals every hit\n"
           "of the kernel re-checks from then on (JITFunction.run's used_global_vals check).")
      .def_static(
          "for_hit_call",
          [](py::handle hit_call) {
            if (!PyCallable_Check(hit_call.ptr())) {
              throw py::type_error("fastkernel: hit_call must be callable");
            }
            auto loaded = std::make_unique<LoadedRecord>();
            loaded->record = std::make_unique<LaunchRecord>();
            LaunchRecord& rec = *loaded->record;
            rec.release_user_data = release_python_reference;
            rec.hit_call = hit_call.inc_ref().ptr();
            loaded->global_checks = py::none();
            return loaded;
          },
          py::arg("hit_call"),
          "A record with no binary, whose hits call `hit_call(grid, *args, **kwargs)` (the\n"
          "call's own arguments) and return its result instead of launching or publishing\n"
          "anything. TypeError if hit_call is not callable.")
      .def_property_readonly(
          "kernel_name", [](const LoadedRecord& r) { return r.kernel_name; },
          "the cubin's entry point")
      .def_property_readonly(
          "device", [](const LoadedRecord& r) { return r.device; },
          "the device the cubin is loaded on")
      .def_property_readonly(
          "inserted", [](const LoadedRecord& r) { return !r.record; },
          "whether a kernel's table holds it now")
      // As Triton's loader returns them (driver.c loadBinary), for CompiledKernel's attributes.
      .def_property_readonly(
          "n_regs", [](const LoadedRecord& r) { return r.attributes.num_regs; },
          "registers per thread (int; CU_FUNC_ATTRIBUTE_NUM_REGS)")
      .def_property_readonly(
          "n_spills", [](const LoadedRecord& r) { return r.attributes.local_size_bytes / 4; },
          "local memory per thread in 4-byte words (int; CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES / 4)")
      .def_property_readonly(
          "n_max_threads", [](const LoadedRecord& r) { return r.attributes.max_threads_per_block; },
          "the most threads a block may have (int; CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)");

  def_kernel_method(
      "_insert",
      [](py::handle self, const py::bytes& key, LoadedRecord& record) {
        insert_loaded(as_kernel(self), key_from_bytes(key), record);
      },
      py::arg("key"), py::arg("record"),
      "Insert a LaunchRecord under `key` (a specialization key's bytes) without launching;\n"
      "ValueError for a malformed key, a record already inserted, or tuned_args of another\n"
      "length than the kernel's parameters. A key already present keeps its record.");
}

const LaunchRecord* insert_returned_record(KernelObject* kernel, const SpecializationKey& key,
                                           PyObject* obj, bool* is_record) {
  const py::handle h(obj);
  *is_record = py::isinstance<LoadedRecord>(h);
  if (!*is_record) {
    return nullptr;
  }
  try {
    return insert_loaded(kernel, key, h.cast<LoadedRecord&>());
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (py::builtin_exception& e) {
    e.set_error();
  } catch (abi::__forced_unwind&) {
    throw;  // a thread ended by pthread_exit: see with_python_errors
  } catch (...) {
    set_python_error_from_current_exception(kernel);
  }
  return nullptr;
}

}  // namespace fastkernel
