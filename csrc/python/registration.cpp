// Registration of a compiled specialization: the Python layer describes it with one typed
// object, `_C.LaunchFacts` (the core's LaunchFacts, field for field, so the field list is the
// C++ struct's), and `_C.register` checks it (make_launch_record), loads the cubin and inserts
// the record under the call's key.
#include "registration.h"

#include <pybind11/stl.h>

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

void register_record(py::handle kernel_obj, const py::bytes& key_bytes, const LaunchFacts& facts,
                     const py::bytes& cubin, py::handle compiled, py::handle tuned_args,
                     py::handle published) {
  KernelObject* kernel = as_kernel(kernel_obj);
  const SpecializationKey key = key_from_bytes(key_bytes);
  std::unique_ptr<LaunchRecord> rec;
  try {
    rec = make_launch_record(facts, kMaxArgs);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  // The record owns a reference to what a launch returns; dropped with the record (eviction,
  // clear, kernel deallocation, or a check below failing), always under the GIL.
  rec->release_user_data = [](void* p) { Py_DECREF(static_cast<PyObject*>(p)); };
  rec->user_data = compiled.inc_ref().ptr();
  if (!tuned_args.is_none()) {
    const size_t num_args = kernel->state->params.size();
    if (!PyTuple_Check(tuned_args.ptr()) ||
        size_t(PyTuple_GET_SIZE(tuned_args.ptr())) != num_args) {
      throw py::value_error("fastkernel: tuned_args must be a tuple with one item per parameter");
    }
    rec->tuned_args = tuned_args.inc_ref().ptr();
  }
  if (!published.is_none()) {
    rec->published = published.inc_ref().ptr();
  }
  const std::string image = cubin;
  with_python_errors([&] {
    load_launch_record(*rec, image.data(), image.size());
    return 0;
  });
  kernel->state->table.insert(key, std::move(rec));
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

  m.def("register", &register_record, py::arg("kernel"), py::arg("key"), py::arg("facts"),
        py::arg("cubin"), py::arg("compiled"), py::arg("tuned_args") = py::none(),
        py::arg("published") = py::none(),
        "Check `facts`, load `cubin` on facts.device and register the launch record under `key`\n"
        "(ValueError naming the fact for facts a launch could not trust; CudaError when the\n"
        "driver refuses the cubin). `compiled` is what a launch returns. `tuned_args` (a tuple,\n"
        "one item per parameter, or None): what a tuned config gives the parameters a call\n"
        "leaves out, for the callable grid and the launch hooks. `published` (or None): set as\n"
        "the publish owner's attribute by a hit on this record (see set_publish).");
}

}  // namespace fastkernel
