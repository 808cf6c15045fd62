// libFuzzer target: the argument checks of fastkernel::encode_tensor_map (a host tensor
// descriptor's leaves and its compiled metadata), with the recording stand-in driver's
// cuTensorMapEncodeTiled behind them (FASTKERNEL_CUDA_DRIVER, set by the build). Every input
// must either encode or raise ParamError / CudaError.
#include <cstdint>
#include <cstdlib>

#include "fastkernel/cuda_driver.h"
#include "fastkernel/param_error.h"
#include "fastkernel/tensor_map.h"
#include "fuzz_input.h"

namespace {

using fastkernel_fuzz::Input;

fastkernel::ArgValue leaf(Input& in) {
  fastkernel::ArgValue v{};
  const uint8_t kind = in.take<uint8_t>() % 6;
  v.kind = fastkernel::ArgKind(kind == 0 ? 5 : kind);  // Tensor..None
  v.u = in.take<uint64_t>();
  const uint8_t width = in.take<uint8_t>() % 3;
  v.width = fastkernel::IntWidth(width);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("FASTKERNEL_CUDA_DRIVER", FASTKERNEL_FUZZ_STAND_IN, 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  fastkernel::TensorMapSpec spec;
  spec.data_type = in.take<int8_t>();
  spec.elem_size = in.take<int8_t>();
  spec.swizzle = in.take<int8_t>();
  spec.rank = in.take<int8_t>();
  for (uint32_t& b : spec.block) {
    b = in.take<uint16_t>();
  }
  spec.fp4_padded = in.take<uint8_t>() & 1;
  spec.tf32_rounding = in.take<uint8_t>() & 1;
  fastkernel::ArgValue leaves[fastkernel::descriptor_leaves(fastkernel::kMaxTensorMapRank)];
  for (auto& v : leaves) {
    v = leaf(in);
  }
  alignas(64) unsigned char map[128];
  try {
    // Ranks outside 1..5 are refused before any leaf is read; the leaves array holds rank 5's.
    fastkernel::encode_tensor_map(spec, leaves, map);
  } catch (const fastkernel::ParamError&) {
  } catch (const fastkernel::CudaError&) {
  }
  return 0;
}
