// Encodes host tensor descriptors into TMA tensor maps (see fastkernel/tensor_map.h), with a
// small per-thread cache in front of the driver's encoder.
#include "fastkernel/tensor_map.h"

#include <cstring>
#include <string>

#include "fastkernel/cuda_driver.h"
#include "fastkernel/param_error.h"

namespace fastkernel {
namespace {

// Everything the encoder's output depends on, zero-padded so that equal requests compare
// equal byte for byte.
struct EncodeRequest {
  uint64_t address;
  uint64_t global_dim[kMaxTensorMapRank];      // innermost first, as the driver takes them
  uint64_t global_strides[kMaxTensorMapRank];  // bytes, dims 1..rank-1, then Triton's extra entry
  uint32_t box_dim[kMaxTensorMapRank];
  int32_t data_type;
  int32_t swizzle;
  int32_t rank;
  int32_t oob_fill;
};

struct CacheEntry {
  alignas(kTensorMapAlign) unsigned char map[kTensorMapBytes];
  EncodeRequest request;
  bool valid;
};

// Eight recent encodings per thread, replaced round-robin: a loop over a few descriptors
// (the usual case: a kernel's A, B and C descriptors, called again and again) always hits.
constexpr int kCacheEntries = 8;
struct ThreadCache {
  CacheEntry entries[kCacheEntries];
  int next = 0;
};
thread_local ThreadCache t_cache;

int64_t int_leaf(const ArgValue& v, const char* field) {
  if (v.kind == ArgKind::Int && v.width != IntWidth::U64) {
    return v.i;
  }
  throw ParamError(-1, v.kind == ArgKind::Int,
                   std::string("tensor descriptor: ") + field + " must be an int64 value");
}

[[noreturn]] void bad_field(const std::string& what) {
  throw ParamError(-1, false, "tensor descriptor: " + what);
}

}  // namespace

void encode_tensor_map(const TensorMapSpec& spec, const ArgValue* leaves, void* out) {
  const int rank = spec.rank;
  if (rank < 1 || rank > kMaxTensorMapRank) {
    bad_field("rank " + std::to_string(rank) + " is outside 1..5");
  }
  const ArgValue& base = leaves[0];
  if (base.kind != ArgKind::Tensor) {
    bad_field("its base must be a tensor");
  }
  const ArgValue* shape = leaves + 1;
  const ArgValue* strides = leaves + 1 + rank;
  const bool nan_padding = leaves[1 + 2 * rank].i != 0;
  const bool tf32 = leaves[2 + 2 * rank].i != 0;

  // driver.c fillTMADescriptorTiled: dimensions innermost first, strides in bytes without the
  // innermost one (which must be 1), every element stride 1, L2 promotion 128B, NaN fill for
  // padding="nan", and the padded-fp4 innermost dimension doubled (make_tensordesc_arg).
  EncodeRequest req;
  std::memset(&req, 0, sizeof(req));
  req.address = base.u;
  req.rank = rank;
  req.swizzle = spec.swizzle;
  req.data_type = (tf32 && spec.tf32_rounding) ? cu::TENSOR_MAP_DATA_TYPE_TFLOAT32 : spec.data_type;
  req.oob_fill = nan_padding ? cu::TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA
                             : cu::TENSOR_MAP_FLOAT_OOB_FILL_NONE;
  if (int_leaf(strides[rank - 1], "the innermost stride") != 1) {
    bad_field("the innermost stride must be 1 (TMA needs a contiguous last dimension), got " +
              std::to_string(strides[rank - 1].i));
  }
  for (int i = 0; i < rank; ++i) {
    const int64_t dim = int_leaf(shape[i], "a shape entry");
    if (dim <= 0) {
      bad_field("shape entries must be positive, got " + std::to_string(dim));
    }
    // In uint64 (a positive int64 doubled fits): the driver refuses what exceeds its limits.
    req.global_dim[rank - 1 - i] = uint64_t(dim) * (i == rank - 1 && spec.fp4_padded ? 2 : 1);
    req.box_dim[rank - 1 - i] = spec.block[i];
  }
  for (int i = 0; i + 1 < rank; ++i) {
    const int64_t stride = int_leaf(strides[i], "a stride");
    if (stride < 0) {
      bad_field("strides must not be negative, got " + std::to_string(stride));
    }
    req.global_strides[rank - 2 - i] = uint64_t(stride) * uint64_t(spec.elem_size);
  }
  req.global_strides[rank - 1] =
      req.global_dim[rank - 1] *
      (rank == 1 ? uint64_t(spec.elem_size) : req.global_strides[rank - 2]);

  ThreadCache& cache = t_cache;
  for (CacheEntry& e : cache.entries) {
    if (e.valid && e.request.address == req.address &&
        std::memcmp(&e.request, &req, sizeof(req)) == 0) {
      std::memcpy(out, e.map, kTensorMapBytes);
      return;
    }
  }
  const DriverApi& api = driver();
  if (api.cuTensorMapEncodeTiled == nullptr) {
    throw CudaError(cu::ERROR_NOT_INITIALIZED,
                    "fastkernel: this CUDA driver lacks cuTensorMapEncodeTiled, which tensor "
                    "descriptor arguments need (CUDA 12.0 or newer)");
  }
  CacheEntry& slot = cache.entries[cache.next];
  const uint32_t element_strides[kMaxTensorMapRank] = {1, 1, 1, 1, 1};
  slot.valid = false;
  const CUresult result = api.cuTensorMapEncodeTiled(
      slot.map, req.data_type, unsigned(rank), reinterpret_cast<void*>(req.address), req.global_dim,
      req.global_strides, req.box_dim, element_strides, cu::TENSOR_MAP_INTERLEAVE_NONE, req.swizzle,
      cu::TENSOR_MAP_L2_PROMOTION_L2_128B, req.oob_fill);
  if (result != cu::SUCCESS) {
    std::string dims, strides_text;
    for (int i = 0; i < rank; ++i) {
      dims += (i ? ", " : "") + std::to_string(req.global_dim[i]);
      if (i + 1 < rank) {
        strides_text += (i ? ", " : "") + std::to_string(req.global_strides[i]);
      }
    }
    throw CudaError(result, "fastkernel: failed to create the tensor map of a tensor descriptor: " +
                                describe_cuda_error(result) + " (data type " +
                                std::to_string(req.data_type) + ", rank " + std::to_string(rank) +
                                ", dims innermost first [" + dims + "], byte strides [" +
                                strides_text + "], swizzle " + std::to_string(req.swizzle) + ")");
  }
  slot.request = req;
  slot.valid = true;
  cache.next = (cache.next + 1) % kCacheEntries;
  std::memcpy(out, slot.map, kTensorMapBytes);
}

void clear_tensor_map_cache() noexcept {
  for (CacheEntry& e : t_cache.entries) {
    e.valid = false;
  }
  t_cache.next = 0;
}

}  // namespace fastkernel
