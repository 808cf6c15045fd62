// Where a launch runs: the current device and torch's current stream for it, read through
// torch's device-generic guard interface so one build serves CPU-only and CUDA torch.
#pragma once

#include <cstdint>

#include "fastkernel/cuda_driver.h"

namespace fastkernel {

/// The device a launch targets and torch's current stream on it.
struct LaunchContext {
  int device;
  CUstream stream;
};

/// The current CUDA device and torch's current stream for it. Throws std::runtime_error when
/// this torch has no CUDA support (unless the testing override is on).
LaunchContext current_launch_context();

#if FASTKERNEL_TESTING
/// Test-only override (testing builds): launches go to `device` on `stream` and CPU tensors
/// stand in for device tensors, so the recording stand-in driver can check launches on a
/// machine with no GPU.
void set_host_testing(bool enabled, int device, uint64_t stream);

namespace detail {
extern bool g_host_testing;  ///< set_host_testing's `enabled`
}

/// True while the testing override is on. Inline: a tensor argument's device check reads it
/// (only for a CPU tensor), so the testing build's launches cost what a production build's do
/// but for this load.
inline bool host_testing() noexcept { return detail::g_host_testing; }
#else
/// Without the testing build there is no override.
constexpr bool host_testing() noexcept { return false; }
#endif

}  // namespace fastkernel
