// Host tensor descriptors as TMA tensor maps: the 128-byte CUtensorMap a kernel compiled with
// TMA lowering receives for each `triton.tools.tensor_descriptor.TensorDescriptor` argument,
// encoded as Triton's launcher encodes it (triton/backends/nvidia/driver.c,
// fillTMADescriptorTiled, Triton 3.5-3.9), and cached per thread so that a launch whose
// descriptor did not change does not call the driver's encoder again.
#pragma once

#include <cstdint>

#include "fastkernel/param_error.h"
#include "fastkernel/specialization.h"

namespace fastkernel {

constexpr int kTensorMapBytes = 128;  ///< sizeof(CUtensorMap)
constexpr int kTensorMapAlign = 64;   ///< alignof(CUtensorMap)
constexpr int kMaxTensorMapRank = 5;  ///< TensorDescriptor's limit (and the driver's)
constexpr int kMaxTensorMaps = 16;    ///< tensor-map parameters one launch can take

/// What the compiled kernel fixes for one descriptor parameter: Triton's `tensordesc_meta` entry
/// (swizzle, elem_size, elem_type mapped to the host enum, block_size, fp4_padded).
struct TensorMapSpec {
  int32_t data_type = 0;  ///< CUtensorMapDataType (host enum, after TMA_DTYPE_DEVICE_TO_HOST)
  int32_t elem_size = 0;  ///< bytes per element, as the metadata gives it
  int32_t swizzle = 0;    ///< CUtensorMapSwizzle
  int32_t rank = 0;       ///< 1..5
  uint32_t block[kMaxTensorMapRank] = {};  ///< box dims, outermost first (Triton's block_size)
  bool fp4_padded = false;     ///< the innermost global dim is doubled (padded fp4 packing)
  bool tf32_rounding = false;  ///< round_f32_to_tf32 selects TFLOAT32 (Triton >= 3.7)
};

/// The leaves a host descriptor argument occupies in a bound call, in this order: the base
/// tensor's pointer, shape[rank], strides[rank] (in elements), nan padding (bool), round to
/// tf32 (bool). Triton's decomposed form (no TMA lowering) reads the same leaves.
constexpr int descriptor_leaves(int rank) { return 2 * rank + 3; }

/// Writes the CUtensorMap for one descriptor argument into `out` (kTensorMapBytes, aligned to
/// kTensorMapAlign), from its leaves. Throws ParamError (arg_index -1) for field values Triton's
/// launcher rejects (innermost stride not 1, a negative size), CudaError when the driver's
/// encoder refuses the descriptor or is missing. Thread-safe.
void encode_tensor_map(const TensorMapSpec& spec, const ArgValue* leaves, void* out);

/// Forgets this thread's cached encodings (tests use it to count encoder calls from cold).
void clear_tensor_map_cache() noexcept;

}  // namespace fastkernel
