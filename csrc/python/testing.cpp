// The test-only `fastkernel._C._testing` submodule, built with -DFASTKERNEL_TESTING=ON: the
// host-testing switch that lets the recording stand-in driver check launches without a GPU,
// and direct access to the key builder, the packer, the bundle loader and the core's SHA-256.
#include "testing.h"

#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../sha256.h"
#include "fastkernel/fastkernel.h"
#include "kernel_object.h"
#include "knob_watch.h"
#include "launch_context.h"
#include "python_errors.h"

namespace py = pybind11;

namespace fastkernel {
namespace {

// Test-only: the key (bytes) a call would look up, or (None, reason) on the fallback path.
py::tuple testing_build_key(py::handle kernel_obj, py::tuple args, py::dict kwargs, int device) {
  KernelObject* kernel = as_kernel(kernel_obj);
  std::vector<PyObject*> vec;
  for (py::handle a : args) {
    vec.push_back(a.ptr());
  }
  py::tuple names(kwargs.size());
  size_t k = 0;
  for (auto item : kwargs) {
    names[k++] = item.first;
    vec.push_back(item.second.ptr());
  }
  auto call = std::make_unique<BoundCall>();
  KeyStatus status = with_python_errors([&] {
    return bind_and_build_key(kernel, vec.data(), Py_ssize_t(args.size()),
                              kwargs.size() ? names.ptr() : nullptr, call.get());
  });
  if (status == KeyStatus::Error) {
    throw py::error_already_set();
  }
  if (status == KeyStatus::Fallback) {
    return py::make_tuple(py::none(), py::str(call->fallback_reason));
  }
  const KnobState* knobs = current_knobs();
  if (knobs == nullptr) {
    throw py::error_already_set();
  }
  finish_key(&call->key, device, knobs->key_word);
  return py::make_tuple(
      py::bytes(reinterpret_cast<const char*>(call->key.words), call->key.size * sizeof(uint64_t)),
      py::none());
}

// Test-only: the 8-byte slot the packer writes for `value` as Triton type `type`.
py::bytes testing_pack_param(const std::string& type, py::handle value) {
  ParamType pt;
  if (!parse_param_type(type, &pt)) {
    throw py::value_error("unknown type " + type);
  }
  ArgValue v{};
  PyObject* o = value.ptr();
  if (PyBool_Check(o)) {
    v.kind = ArgKind::Bool;
    v.i = o == Py_True;
  } else if (PyLong_Check(o)) {
    v.kind = ArgKind::Int;
    int overflow = 0;
    long long s = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow > 0) {
      v.u = PyLong_AsUnsignedLongLong(o);
      if (PyErr_Occurred()) {
        throw py::error_already_set();
      }
      v.width = IntWidth::U64;
    } else if (overflow < 0) {
      throw std::overflow_error("int below -2**63");
    } else {
      v.i = s;
      v.width = (s >= INT32_MIN && s <= INT32_MAX) ? IntWidth::I32 : IntWidth::I64;
    }
  } else if (PyFloat_Check(o)) {
    v.kind = ArgKind::Float;
    v.d = PyFloat_AsDouble(o);
  } else if (o == Py_None) {
    v.kind = ArgKind::None;
  } else {
    throw py::type_error("unsupported value");
  }
  alignas(8) unsigned char slot[8];
  try {
    pack_param(pt, v, slot);
  } catch (const ParamError& e) {
    if (e.overflow) {
      throw std::overflow_error(e.what());
    }
    throw py::type_error(e.what());
  }
  return py::bytes(reinterpret_cast<const char*>(slot), 8);
}

}  // namespace

void register_testing(py::module_& m) {
  py::module_ t = m.def_submodule("_testing", "Test-only access to native internals.");
  t.def("clear_tensor_map_cache", &clear_tensor_map_cache,
        "Forget this thread's cached tensor-map encodings.");
  t.def("set_host_testing", &set_host_testing, py::arg("enabled"), py::arg("device") = 0,
        py::arg("stream") = 0,
        "Let CPU tensors stand in for device tensors and fix the device and stream (tests only).");
  t.def("build_key", &testing_build_key, py::arg("kernel"), py::arg("args"), py::arg("kwargs"),
        py::arg("device") = 0);
  t.def("pack_param", &testing_pack_param, py::arg("type"), py::arg("value"));
  t.def(
      "load_bundle",
      [](const std::string& directory) {
        // Bundle::load as a C++ caller runs it; a BundleError arrives as RuntimeError.
        return Bundle::load(directory).describe_entries();
      },
      py::arg("directory"), "Load a kernel bundle and describe its entries (tests only).");
  t.def(
      "bundle_facts",
      [](const std::string& directory) {
        const Bundle bundle = Bundle::load(directory);
        std::vector<LaunchFacts> facts;
        for (const auto& e : bundle.entries()) {
          facts.push_back(e->facts);
        }
        return facts;
      },
      py::arg("directory"),
      "The launch facts of a kernel bundle's entries, as parsed (tests only).");
  t.def(
      "sha256",
      [](const py::bytes& data) {
        Sha256 digest;
        digest.update(std::string_view(data));
        return digest.hex_digest();
      },
      py::arg("data"), "The core's SHA-256 of `data`, as hex (tests only).");
}

}  // namespace fastkernel
