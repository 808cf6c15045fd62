// Launching bundle kernels with torch tensors from C++: at::Tensor and scalar arguments, the
// device taken from the tensors, and torch's current stream on it by default. Header-only; a
// target that includes it links torch (find_package(Torch)) besides fastkernel::fastkernel.
//
// \code
//   #include <fastkernel/torch.h>
//   fastkernel::Bundle bundle = fastkernel::Bundle::load("add_bundle");
//   at::Tensor out = at::empty_like(x);
//   const int64_t n = x.numel();
//   fastkernel::launch(bundle, "add_kernel", {unsigned((n + 1023) / 1024), 1, 1},
//                      {x, y, out, n});   // on torch's current stream of x's device
// \endcode
#pragma once

#include <ATen/Functions.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fastkernel/bundle.h"

namespace fastkernel {

// bundle.cpp maps Triton's pointer types to these c10::ScalarType values.
static_assert(int(c10::ScalarType::Byte) == 0 && int(c10::ScalarType::Float) == 6 &&
                  int(c10::ScalarType::Bool) == 11 && int(c10::ScalarType::BFloat16) == 15 &&
                  int(c10::ScalarType::Float8_e5m2) == 23 &&
                  int(c10::ScalarType::Float8_e4m3fn) == 24 && int(c10::ScalarType::UInt64) == 29,
              "c10::ScalarType values differ from the ones fastkernel's bundle matching uses");

namespace testing {
/// Test-only: CPU tensors stand in for CUDA tensors on device 0 (the recording stand-in
/// driver's tests on machines with no GPU). Per shared library that includes this header.
inline bool& host_tensors() {
  static bool enabled = false;
  return enabled;
}
}  // namespace testing

/// One argument of a C++ launch: a tensor (its data pointer), an optional tensor (nullopt is
/// Triton's None), an integer, a floating-point value or a bool. Converts implicitly.
class Arg {
 public:
  Arg(const at::Tensor& tensor) : tensor_(&tensor) {}  // NOLINT(google-explicit-constructor)
  Arg(const std::optional<at::Tensor>& tensor)         // NOLINT(google-explicit-constructor)
      : tensor_(tensor ? &*tensor : nullptr), value_(none_arg()) {}
  Arg(std::nullopt_t) : value_(none_arg()) {}    // NOLINT(google-explicit-constructor)
  Arg(bool v) : value_(bool_arg(v)) {}           // NOLINT(google-explicit-constructor)
  Arg(int v) : value_(int_arg(v)) {}             // NOLINT(google-explicit-constructor)
  Arg(long v) : value_(int_arg(v)) {}            // NOLINT(google-explicit-constructor)
  Arg(long long v) : value_(int_arg(v)) {}       // NOLINT(google-explicit-constructor)
  Arg(unsigned v) : value_(uint_arg(v)) {}       // NOLINT(google-explicit-constructor)
  Arg(unsigned long v) : value_(uint_arg(v)) {}  // NOLINT(google-explicit-constructor)
  Arg(unsigned long long v)                      // NOLINT(google-explicit-constructor)
      : value_(uint_arg(v)) {}
  Arg(float v) : value_(float_arg(v)) {}   // NOLINT(google-explicit-constructor)
  Arg(double v) : value_(float_arg(v)) {}  // NOLINT(google-explicit-constructor)

  const at::Tensor* tensor() const { return tensor_; }
  const ArgValue& value() const { return value_; }

 private:
  const at::Tensor* tensor_ = nullptr;
  ArgValue value_{};
};

/// torch's current stream on CUDA device `device`, as a CUstream (what a launch from Python
/// uses), read through torch's device-generic guard interface: no link to c10_cuda.
/// Throws std::runtime_error when this torch has no CUDA support.
inline CUstream current_stream(int device) {
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
    throw std::runtime_error(
        "fastkernel: this torch build has no CUDA support: pass the stream to launch explicitly");
  }
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  const c10::Stream stream =
      impl->getStream(c10::Device(c10::DeviceType::CUDA, c10::DeviceIndex(device)));
  return static_cast<CUstream>(impl->getStreamNativeHandle(stream));
}

/// The argument values, tensor dtypes and device of a call (what `launch` passes on).
struct TensorCall {
  std::vector<ArgValue> values;
  std::vector<int> scalar_types;  ///< c10::ScalarType per argument, -1 for non-tensors
  int device = -1;                ///< the tensors' CUDA device; -1 when there is none
  /// The first value error (a tensor not on a CUDA device, not strided, or on another device
  /// than an earlier one), naming the argument; empty when there is none. `launch` raises it
  /// only after the call's arity and kinds matched an entry, in Python's order.
  std::string value_error;
};

/// Converts a call's arguments. Throws std::invalid_argument naming the argument (by position)
/// for an undefined tensor; records value errors in TensorCall::value_error.
inline TensorCall tensor_call(const std::string& kernel, std::initializer_list<Arg> args) {
  TensorCall call;
  call.values.reserve(args.size());
  call.scalar_types.reserve(args.size());
  size_t index = 0;
  for (const Arg& arg : args) {
    const at::Tensor* t = arg.tensor();
    if (t == nullptr) {
      call.values.push_back(arg.value());
      call.scalar_types.push_back(-1);
      ++index;
      continue;
    }
    const std::string where = kernel + ": argument " + std::to_string(index);
    if (!t->defined()) {
      throw std::invalid_argument(where + " is an undefined tensor (pass std::nullopt for None)");
    }
    const bool host = testing::host_tensors() && t->device().is_cpu();
    std::string problem;
    if (!t->device().is_cuda() && !host) {
      problem =
          where + " is a tensor on '" + t->device().str() + "'; a GPU launch needs CUDA tensors";
    } else if (t->layout() != c10::kStrided) {
      problem = where + " is not a strided tensor";
    } else {
      const int device = host ? 0 : t->device().index();
      if (call.device >= 0 && call.device != device) {
        problem = where + " is on cuda:" + std::to_string(device) +
                  " but an earlier tensor is on cuda:" + std::to_string(call.device);
      }
      call.device = device;
    }
    if (!problem.empty() && call.value_error.empty()) {
      call.value_error = problem;
    }
    // A non-strided tensor has no data pointer to read; it never launches (value_error is set).
    call.values.push_back(pointer_arg(problem.empty() || t->layout() == c10::kStrided
                                          ? reinterpret_cast<uint64_t>(t->data_ptr())
                                          : 0));
    call.scalar_types.push_back(int(t->scalar_type()));
    ++index;
  }
  return call;
}

/// A scratch buffer for `entry` on `device`: grid CTAs x num_ctas x `per_cta` bytes from torch's
/// allocator (as Triton's default allocator takes them), `align`-aligned. Returns the tensor
/// that owns it (keep it until the launch is issued) and sets `*pointer`.
inline at::Tensor allocate_scratch(const LaunchGrid& grid, unsigned num_ctas, uint64_t per_cta,
                                   uint64_t align, int device, CUdeviceptr* pointer) {
  const uint64_t bytes = scratch_bytes(grid, num_ctas, per_cta);
  if (bytes > uint64_t(INT64_MAX) - align) {
    throw std::invalid_argument("fastkernel: the grid's scratch buffer (" +
                                std::to_string(per_cta) + " bytes per CTA) exceeds 2**63 bytes");
  }
  const c10::Device where = testing::host_tensors()
                                ? c10::Device(c10::DeviceType::CPU)
                                : c10::Device(c10::DeviceType::CUDA, c10::DeviceIndex(device));
  at::Tensor buffer =
      at::empty({int64_t(bytes + align)}, at::TensorOptions().dtype(at::kByte).device(where));
  const uint64_t address = reinterpret_cast<uint64_t>(buffer.data_ptr());
  *pointer = CUdeviceptr((address + align - 1) & ~(align - 1));
  return buffer;
}

/// Launches `kernel` from `bundle` with torch arguments (runtime parameters in declared order,
/// constexprs excluded): on the tensors' device (else torch's current CUDA device) and on
/// `stream`, by default torch's current stream there. The entry is chosen by Triton's
/// specialization rules and the tensors' dtypes; scratch buffers it needs are allocated here.
///
/// Throws, in this order: fastkernel::BundleError (no entry matches the arguments' count and
/// kinds; the message lists the bundle's entries), std::invalid_argument (a bad tensor argument,
/// named by position, or a grid whose scratch buffer exceeds 2**63 bytes), std::runtime_error (no
/// stream given and torch has no CUDA support), fastkernel::CudaError (the driver failed).
inline void launch(Bundle& bundle, const std::string& kernel, const LaunchGrid& grid,
                   std::initializer_list<Arg> args, std::optional<CUstream> stream = std::nullopt) {
  TensorCall call = tensor_call(kernel, args);
  // Arity and kinds (an entry matching them) before values, as a Python call checks them.
  BundleEntry& entry =
      bundle.select(kernel, call.values.data(), call.values.size(), call.scalar_types.data());
  if (!call.value_error.empty()) {
    throw std::invalid_argument(call.value_error);
  }
  int device = call.device;
  if (device < 0) {
    if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
      throw std::runtime_error("fastkernel: " + kernel +
                               " has no tensor arguments and this torch has no CUDA device");
    }
    device = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index();
  }
  const CUstream s = stream ? *stream : current_stream(device);
  const LaunchRecord& p = entry.prototype;
  CUdeviceptr global_scratch = 0, profile_scratch = 0;
  at::Tensor global_buffer, profile_buffer;  // alive until the launch is issued
  if (p.needs_scratch() && grid.x != 0 && grid.y != 0 && grid.z != 0) {
    if (p.global_scratch_size > 0) {
      global_buffer = allocate_scratch(grid, p.num_ctas, p.global_scratch_size,
                                       p.global_scratch_align, device, &global_scratch);
    }
    if (p.profile_scratch_size > 0) {
      profile_buffer = allocate_scratch(grid, p.num_ctas, p.profile_scratch_size,
                                        p.profile_scratch_align, device, &profile_scratch);
    }
  }
  bundle.launch_entry(entry, grid, s, call.values.data(), call.values.size(), device,
                      global_scratch, profile_scratch);
}

}  // namespace fastkernel
