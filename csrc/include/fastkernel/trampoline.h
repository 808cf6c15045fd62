// The trampoline: writes a launch record's parameters onto the stack from the captured argument
// values and calls cuLaunchKernel, or cuLaunchKernelEx when a launch attribute needs it.
#pragma once

#include <cstdint>

#include "fastkernel/launch_record.h"
#include "fastkernel/param_error.h"
#include "fastkernel/specialization.h"

namespace fastkernel {

/// A grid in CTAs (before the num_ctas scaling of x).
struct LaunchGrid {
  uint32_t x = 1, y = 1, z = 1;
};

/// CUDA's limit on grid dimension x, in CTAs: with clusters it bounds grid x times num_ctas (CUDA
/// C Programming Guide, "Compute Capabilities"; cuLaunchKernelEx's gridDimX).
constexpr uint64_t kMaxGridX = 2147483647ull;

/// The most parameters one launch packs, the two scratch pointers included (the trampoline's
/// on-stack parameter buffers). Triton's launcher has no such bound; a Triton kernel near it
/// has far more arguments than fastkernel's Python path takes.
constexpr int kMaxLaunchParams = 256;

/// Bytes of one scratch buffer for a launch on `grid`: every CTA of the grid, times num_ctas,
/// times `per_cta` bytes (Triton's sizing: third_party/nvidia/backends/driver.py, the launcher's
/// global and profile scratch allocation). Saturates at UINT64_MAX, a size no allocator gives,
/// where the product does not fit 64 bits (Triton computes it with Python ints).
inline uint64_t scratch_bytes(const LaunchGrid& grid, unsigned num_ctas, uint64_t per_cta) {
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(uint64_t(grid.x), uint64_t(grid.y), &bytes) ||
      __builtin_mul_overflow(bytes, uint64_t(grid.z), &bytes) ||
      __builtin_mul_overflow(bytes, uint64_t(num_ctas), &bytes) ||
      __builtin_mul_overflow(bytes, per_cta, &bytes)) {
    return UINT64_MAX;
  }
  return bytes;
}

/// Writes one parameter of type `type` from `value` into `slot` (8 bytes, zeroed first).
/// Throws ParamError (with arg_index = -1; the caller knows which argument) on a bad value.
void pack_param(ParamType type, const ArgValue& value, void* slot);

/// Launches `record` with `grid` on `stream`. `args` are the bound arguments in declared order;
/// `global_scratch` / `profile_scratch` are device pointers (0 for none). A grid with a zero
/// dimension launches nothing, as in Triton. Throws ParamError or CudaError.
void launch(const LaunchRecord& record, const LaunchGrid& grid, CUstream stream,
            const ArgValue* args, CUdeviceptr global_scratch, CUdeviceptr profile_scratch);

}  // namespace fastkernel
