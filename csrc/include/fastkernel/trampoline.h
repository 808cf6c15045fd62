// The trampoline: writes a launch record's parameters onto the stack from the captured argument
// values and calls cuLaunchKernel, or cuLaunchKernelEx when a launch attribute needs it.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "fastkernel/launch_record.h"
#include "fastkernel/specialization.h"

namespace fastkernel {

/// A grid in CTAs (before the num_ctas scaling of x).
struct LaunchGrid {
  uint32_t x = 1, y = 1, z = 1;
};

/// Thrown when an argument's value cannot be written as its parameter type.
/// `overflow` distinguishes a value out of range (OverflowError) from a wrong kind (TypeError).
class ParamError : public std::runtime_error {
 public:
  ParamError(int arg_index, bool overflow, const std::string& what)
      : std::runtime_error(what), arg_index(arg_index), overflow(overflow) {}
  int arg_index;
  bool overflow;
};

/// Writes one parameter of type `type` from `value` into `slot` (8 bytes, zeroed first).
/// Throws ParamError (with arg_index = -1; the caller knows which argument) on a bad value.
void pack_param(ParamType type, const ArgValue& value, void* slot);

/// Launches `record` with `grid` on `stream`. `args` are the bound arguments in declared order;
/// `global_scratch` / `profile_scratch` are device pointers (0 for none). A grid with a zero
/// dimension launches nothing, as in Triton. Throws ParamError or CudaError.
void launch(const LaunchRecord& record, const LaunchGrid& grid, CUstream stream,
            const ArgValue* args, CUdeviceptr global_scratch, CUdeviceptr profile_scratch);

}  // namespace fastkernel
