// libFuzzer target: the registration checks (fastkernel::make_launch_record), which stand
// between launch facts read from a disk-cache entry or Triton's metadata and the launch record
// the trampoline trusts. The property: every record the checks accept is safe to launch from a
// bound call of kArgs arguments (the Python layer's limit). For each accepted record, every
// parameter is packed from a heap array of exactly kArgs argument values, as the trampoline
// packs them, and every tensor-map parameter is encoded from its descriptor's leaves (the
// recording stand-in driver's cuTensorMapEncodeTiled behind it); AddressSanitizer reports any
// read past the array. Rejections must be std::invalid_argument; packing may raise only
// ParamError / CudaError (an argument value the parameter cannot take).
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fastkernel/cuda_driver.h"
#include "fastkernel/launch_record.h"
#include "fastkernel/tensor_map.h"
#include "fastkernel/trampoline.h"
#include "fuzz_input.h"

namespace {

constexpr int kArgs = 128;  // kMaxArgs of csrc/python/kernel_object.h

using fastkernel_fuzz::Input;

const char* const kTypes[] = {"*fp32", "*i8", "i1",   "i8",        "i16", "i32",      "i64",
                              "u1",    "u8",  "u16",  "u32",       "u64", "fp16",     "bf16",
                              "fp32",  "f32", "fp64", "nvTmaDesc", "*",   "constexpr"};

std::string type(Input& in) {
  const uint8_t pick = in.take<uint8_t>();
  if (pick < 240) {
    return kTypes[pick % (sizeof(kTypes) / sizeof(kTypes[0]))];
  }
  return in.bytes();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("FASTKERNEL_CUDA_DRIVER", FASTKERNEL_FUZZ_STAND_IN, 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  fastkernel::LaunchFacts facts;
  const uint8_t flags = in.take<uint8_t>();
  facts.kernel_name = (flags & 1) ? in.bytes() : std::string("kernel");
  facts.device = in.take<int8_t>();
  facts.block_x = in.take<uint16_t>();
  facts.shared_mem = in.take<uint32_t>();
  facts.num_ctas = in.take<uint8_t>();
  facts.cooperative_grid = flags & 2;
  facts.pdl = flags & 4;
  facts.num_scratch_params = in.take<int8_t>();
  facts.global_scratch_size = in.take<uint16_t>();
  facts.global_scratch_align = in.take<uint8_t>();
  facts.profile_scratch_size = in.take<uint16_t>();
  facts.profile_scratch_align = in.take<uint8_t>();
  const int num_params = in.take<uint8_t>() % 40;
  for (int i = 0; i < num_params; ++i) {
    // Mostly indices around the bound (0..159), sometimes any 16-bit value.
    const uint8_t pick = in.take<uint8_t>();
    const int index = pick < 240 ? pick % 160 : in.take<int16_t>();
    facts.plan.emplace_back(index, type(in));
  }
  const int num_maps = in.take<uint8_t>() % 20;
  for (int i = 0; i < num_maps; ++i) {
    fastkernel::TensorMapFacts map;
    map.data_type = in.take<int8_t>();
    map.elem_size = in.take<int8_t>();
    map.swizzle = in.take<int8_t>();
    map.block.resize(in.take<uint8_t>() % 8);
    for (uint32_t& b : map.block) {
      b = in.take<uint16_t>();
    }
    const uint8_t bits = in.take<uint8_t>();
    map.fp4_padded = bits & 1;
    map.tf32_rounding = bits & 2;
    facts.tensor_maps.push_back(std::move(map));
  }
  std::unique_ptr<fastkernel::LaunchRecord> record;
  try {
    record = fastkernel::make_launch_record(facts, kArgs);
  } catch (const std::invalid_argument&) {
    return 0;
  }
  if (record->plan.size() != facts.plan.size() ||
      record->tensor_maps.size() > size_t(fastkernel::kMaxTensorMaps)) {
    std::abort();  // an accepted record that is not what the facts describe
  }
  // The bound call: exactly kArgs values on the heap, filled from the rest of the input.
  auto args = std::make_unique<fastkernel::ArgValue[]>(kArgs);
  for (int i = 0; i < kArgs; ++i) {
    args[i].u = in.take<uint64_t>();
    args[i].kind = fastkernel::ArgKind(1 + in.take<uint8_t>() % 5);  // Tensor..None
    args[i].width = fastkernel::IntWidth(in.take<uint8_t>() % 3);
  }
  size_t map = 0;
  for (const fastkernel::PackSlot& slot : record->plan) {
    try {
      if (slot.type == fastkernel::ParamType::TensorMap) {
        alignas(fastkernel::kTensorMapAlign) unsigned char out[fastkernel::kTensorMapBytes];
        fastkernel::encode_tensor_map(record->tensor_maps.at(map++), &args[slot.arg_index], out);
      } else {
        alignas(8) unsigned char out[8];
        fastkernel::pack_param(slot.type, args[slot.arg_index], out);
      }
    } catch (const fastkernel::ParamError&) {
    } catch (const fastkernel::CudaError&) {
    }
  }
  return 0;
}
