// The benchmark floor: a C++ loop of raw cuLaunchKernel calls on a cubin, built with the project
// so the dispatch benchmark compares fastkernel with the driver's own cost in the same process;
// and a native call loop that gives callgrind a function to collect around.
#include "bench_floor.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fastkernel/bundle.h"
#include "fastkernel/cuda_driver.h"
#include "fastkernel/launch_record.h"
#include "kernel_object.h"
#include "python_errors.h"

namespace py = pybind11;

namespace fastkernel {
namespace {

using Grid3 = std::tuple<unsigned, unsigned, unsigned>;

// One kernel's cubin loaded once, with its parameters packed once: `run` is nothing but the
// launch loop, so module loading stays out of the timed part.
class FloorLauncher {
 public:
  FloorLauncher(const std::string& cubin, const std::string& kernel_name, int device,
                unsigned block_x, unsigned shared_mem, const std::vector<std::string>& params) {
    if (block_x == 0 || block_x > 1024) {
      throw py::value_error("bench floor: block_x must be in [1, 1024], got " +
                            std::to_string(block_x));
    }
    storage_.reserve(params.size());
    pointers_.reserve(params.size() + 1);
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string& bytes = params[i];
      if (bytes.empty()) {
        throw py::value_error("bench floor: params[" + std::to_string(i) + "] is empty");
      }
      // 8-byte aligned copies; the driver reads each parameter's size from the cubin.
      storage_.push_back(std::make_unique<uint64_t[]>((bytes.size() + 7) / 8));
      std::memcpy(storage_.back().get(), bytes.data(), bytes.size());
      pointers_.push_back(storage_.back().get());
    }
    pointers_.push_back(nullptr);  // keeps data() valid for a kernel with no parameters
    record_.kernel_name = kernel_name;
    record_.device = device;
    record_.block_x = block_x;
    record_.shared_mem = shared_mem;
    // The floor packs raw parameter bytes, with no plan: the driver checks nothing here, so a
    // test can show it rejecting a launch with too few parameters.
    load_launch_record(record_, cubin.data(), cubin.size(), /*check_param_count=*/false);
  }
  ~FloorLauncher() { unload_launch_record(record_); }
  FloorLauncher(const FloorLauncher&) = delete;
  FloorLauncher& operator=(const FloorLauncher&) = delete;

  /// `iterations` launches on `grid` and `stream`; the caller releases the GIL around it.
  void run(const Grid3& grid, uint64_t stream, uint64_t iterations) {
    if (record_.function == nullptr) {
      throw std::runtime_error("bench floor: the launcher was closed");
    }
    const unsigned gx = std::get<0>(grid), gy = std::get<1>(grid), gz = std::get<2>(grid);
    if (gx == 0 || gy == 0 || gz == 0) {
      throw std::invalid_argument("bench floor: every grid dimension must be >= 1");
    }
    PrimaryContextScope context(record_.device);
    const DriverApi& api = driver();
    CUfunction function = record_.function;
    const unsigned block_x = record_.block_x, shared_mem = record_.shared_mem;
    CUstream cu_stream = reinterpret_cast<CUstream>(stream);
    void** params = pointers_.data();
    for (uint64_t i = 0; i < iterations; ++i) {
      const CUresult result = api.cuLaunchKernel(function, gx, gy, gz, block_x, 1, 1, shared_mem,
                                                 cu_stream, params, nullptr);
      if (result != cu::SUCCESS) {
        check_cuda(result, "cuLaunchKernel (benchmark floor)");
      }
    }
  }

  void close() noexcept { unload_launch_record(record_); }

 private:
  LaunchRecord record_;
  std::vector<std::unique_ptr<uint64_t[]>> storage_;
  std::vector<void*> pointers_;
};

// A bundle kernel launched by a C++ loop of Bundle::launch: the dispatch benchmark's row for
// C++ callers (entry selection by the call's arguments, then the trampoline).
class BundleLauncher {
 public:
  BundleLauncher(const std::string& directory, std::string kernel, int device,
                 const std::vector<std::pair<std::string, py::object>>& args)
      : bundle_(Bundle::load(directory)), kernel_(std::move(kernel)), device_(device) {
    for (const auto& [kind, value] : args) {
      if (kind == "pointer") {
        args_.push_back(pointer_arg(value.cast<uint64_t>()));
      } else if (kind == "int") {
        args_.push_back(int_arg(value.cast<int64_t>()));
      } else if (kind == "float") {
        args_.push_back(float_arg(value.cast<double>()));
      } else if (kind == "bool") {
        args_.push_back(bool_arg(value.cast<bool>()));
      } else if (kind == "none") {
        args_.push_back(none_arg());
      } else {
        throw py::value_error("bench bundle: unknown argument kind '" + kind + "'");
      }
    }
  }

  void run(const Grid3& grid, uint64_t stream, uint64_t iterations) {
    const LaunchGrid g{std::get<0>(grid), std::get<1>(grid), std::get<2>(grid)};
    PrimaryContextScope context(device_);
    CUstream cu_stream = reinterpret_cast<CUstream>(stream);
    for (uint64_t i = 0; i < iterations; ++i) {
      bundle_.launch(kernel_, g, cu_stream, args_.data(), args_.size(), device_);
    }
  }

 private:
  Bundle bundle_;
  std::string kernel_;
  int device_;
  std::vector<ArgValue> args_;
};

std::vector<std::string> to_strings(const std::vector<py::bytes>& params) {
  std::vector<std::string> out;
  out.reserve(params.size());
  for (const py::bytes& b : params) {
    out.emplace_back(b);
  }
  return out;
}

}  // namespace

/// `launcher[grid](*positional, **keywords)` repeated `iterations` times from C, where `args`
/// holds the positional values then the keyword values and `kwnames` (a tuple, or nullptr) names
/// the last ones (vectorcall's convention). Out of line, with a C name that does not depend on
/// demangling, so that callgrind's `--toggle-collect=fastkernel_bench_call_loop` and
/// `--dump-after=` collect exactly these calls and nothing of the interpreter around them.
extern "C" __attribute__((noinline)) void fastkernel_bench_call_loop(PyObject* launcher,
                                                                     PyObject* grid, PyObject* args,
                                                                     PyObject* kwnames,
                                                                     uint64_t iterations) {
  PyObject* const* items = &PyTuple_GET_ITEM(args, 0);
  const size_t nargs =
      size_t(PyTuple_GET_SIZE(args) - (kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0));
  for (uint64_t i = 0; i < iterations; ++i) {
    PyObject* bound = PyObject_GetItem(launcher, grid);
    if (bound == nullptr) {
      throw py::error_already_set();
    }
    PyObject* result = PyObject_Vectorcall(bound, items, nargs, kwnames);
    Py_DECREF(bound);
    if (result == nullptr) {
      throw py::error_already_set();
    }
    Py_DECREF(result);
  }
}

void register_bench_floor(py::module_& m) {
  py::class_<FloorLauncher>(m, "BenchFloor", R"doc(
A cubin's kernel loaded once, with its parameters packed once, launched by a C++ loop of raw
cuLaunchKernel: the dispatch benchmark's floor.

BenchFloor(cubin, kernel_name, device, block_x, shared_mem, params)

cubin (bytes) is loaded into `device`'s primary context and `kernel_name` resolved; block_x is
the threads per block (1-1024) and shared_mem the dynamic shared memory in bytes; params holds
one bytes object per kernel parameter, in order, including the scratch pointers the installed
Triton appends. The module is unloaded by close() or when the object is destroyed.

Raises ValueError for a malformed block or parameter, fastkernel.CudaError for a failed driver
call and fastkernel.DriverUnavailableError without a driver.)doc")
      .def(
          py::init([](const py::bytes& cubin, const std::string& kernel_name, int device,
                      unsigned block_x, unsigned shared_mem, const std::vector<py::bytes>& params) {
            const std::string image = cubin;
            const std::vector<std::string> packed = to_strings(params);
            return with_python_errors([&] {
              return std::make_unique<FloorLauncher>(image, kernel_name, device, block_x,
                                                     shared_mem, packed);
            });
          }),
          py::arg("cubin"), py::arg("kernel_name"), py::arg("device"), py::arg("block_x"),
          py::arg("shared_mem"), py::arg("params"))
      .def(
          "run",
          [](FloorLauncher& self, const Grid3& grid, uint64_t stream, uint64_t iterations) {
            with_python_errors([&] {
              py::gil_scoped_release nogil;
              self.run(grid, stream, iterations);
              return 0;
            });
          },
          py::arg("grid"), py::arg("stream"), py::arg("iterations"),
          R"doc(Launch `iterations` times on `grid` (3 ints, in CTAs) and `stream` (a CUstream as an
int), without the GIL. Launches are asynchronous: synchronize before reading a clock.)doc")
      .def("close", &FloorLauncher::close, "Unload the module (idempotent).");

  py::class_<BundleLauncher>(m, "BenchBundle", R"doc(
A kernel bundle (fastkernel.export) launched by a C++ loop of fastkernel::Bundle::launch, as a
C++ caller launches it: the dispatch benchmark's C++ row.

BenchBundle(directory, kernel, device, args)

args: one (kind, value) pair per runtime parameter, kind one of "pointer", "int", "float",
"bool", "none". Raises fastkernel.CudaError / RuntimeError (a BundleError's message) as a launch
does, ValueError for an unknown kind.)doc")
      .def(py::init([](const std::string& directory, const std::string& kernel, int device,
                       const std::vector<std::pair<std::string, py::object>>& args) {
             return with_python_errors(
                 [&] { return std::make_unique<BundleLauncher>(directory, kernel, device, args); });
           }),
           py::arg("directory"), py::arg("kernel"), py::arg("device"), py::arg("args"))
      .def(
          "run",
          [](BundleLauncher& self, const Grid3& grid, uint64_t stream, uint64_t iterations) {
            with_python_errors([&] {
              py::gil_scoped_release nogil;
              self.run(grid, stream, iterations);
              return 0;
            });
          },
          py::arg("grid"), py::arg("stream"), py::arg("iterations"),
          "Launch `iterations` times on `grid` and `stream` (a CUstream as an int), without the "
          "GIL.");

  m.def(
      "bench_floor",
      [](const py::bytes& cubin, const std::string& kernel_name, int device, const Grid3& grid,
         unsigned block_x, unsigned shared_mem, const std::vector<py::bytes>& params,
         uint64_t stream, uint64_t iterations) {
        const std::string image = cubin;
        const std::vector<std::string> packed = to_strings(params);
        with_python_errors([&] {
          FloorLauncher launcher(image, kernel_name, device, block_x, shared_mem, packed);
          py::gil_scoped_release nogil;
          launcher.run(grid, stream, iterations);
          return 0;
        });
      },
      py::arg("cubin"), py::arg("kernel_name"), py::arg("device"), py::arg("grid"),
      py::arg("block_x"), py::arg("shared_mem"), py::arg("params"), py::arg("stream"),
      py::arg("iterations"),
      R"doc(Load a cubin, launch its kernel `iterations` times with raw cuLaunchKernel, unload it.

The one-shot form of BenchFloor(cubin, kernel_name, device, block_x, shared_mem, params)
.run(grid, stream, iterations); the loaded-once BenchFloor keeps module loading out of a timed
loop. Raises as BenchFloor does, and ValueError for a grid dimension of 0.)doc");

  m.def(
      "bench_call_loop",
      [](py::handle launcher, py::handle grid, const py::tuple& args, uint64_t iterations,
         const py::dict& kwargs) {
        py::list values(args);
        py::tuple names(kwargs.size());
        size_t k = 0;
        for (auto item : kwargs) {
          names[k++] = item.first;
          values.append(item.second);
        }
        const py::tuple all(values);
        fastkernel_bench_call_loop(launcher.ptr(), grid.ptr(), all.ptr(),
                                   kwargs.empty() ? nullptr : names.ptr(), iterations);
      },
      py::arg("launcher"), py::arg("grid"), py::arg("args"), py::arg("iterations"),
      py::arg("kwargs") = py::dict(),
      R"doc(Call `launcher[grid](*args, **kwargs)` `iterations` times from a native loop (results
dropped; the keywords are passed by vectorcall's kwnames, as CPython passes them).

Used by `python benchmarks/dispatch.py --callgrind`, which collects instruction counts only while
fastkernel_bench_call_loop runs. An exception raised by a call propagates.)doc");
}

}  // namespace fastkernel
