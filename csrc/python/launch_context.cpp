// Reads torch's current device and stream without Python and without linking c10_cuda:
// c10::impl::getDeviceGuardImpl(CUDA) is registered by libtorch_cuda when torch has CUDA.
#include "launch_context.h"

#include <c10/core/Device.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <stdexcept>

namespace fastkernel {
namespace {

#if FASTKERNEL_TESTING
int g_test_device = 0;
uint64_t g_test_stream = 0;
#endif

const c10::impl::DeviceGuardImplInterface* cuda_guard_impl() {
  // The registry entry is written once when libtorch_cuda loads (at `import torch`) and never
  // changes afterwards, so it is looked up once.
  static const c10::impl::DeviceGuardImplInterface* impl =
      c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)
          ? c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
          : nullptr;
  return impl;
}

}  // namespace

LaunchContext current_launch_context() {
#if FASTKERNEL_TESTING
  if (detail::g_host_testing) {
    return {g_test_device, reinterpret_cast<CUstream>(g_test_stream)};
  }
#endif
  const auto* impl = cuda_guard_impl();
  if (impl == nullptr) {
    throw std::runtime_error(
        "fastkernel: this torch build has no CUDA support, so there is no CUDA device to launch "
        "on");
  }
  const c10::Device device = impl->getDevice();
  const c10::Stream stream = impl->getStream(device);
  return {device.index(), static_cast<CUstream>(impl->getStreamNativeHandle(stream))};
}

#if FASTKERNEL_TESTING
bool detail::g_host_testing = false;

void set_host_testing(bool enabled, int device, uint64_t stream) {
  detail::g_host_testing = enabled;
  g_test_device = device;
  g_test_stream = stream;
}
#endif

}  // namespace fastkernel
