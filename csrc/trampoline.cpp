// The trampoline: packs parameters from the launch record's plan into a stack buffer and calls
// the driver. Nothing here allocates, takes a lock or calls into Python.
#include "fastkernel/trampoline.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "parameter slots are written little-endian, as the CUDA driver reads them on x86-64 "
              "and aarch64");

namespace fastkernel {
namespace {

// Tensor maps of host descriptor arguments, per thread rather than on the stack so that a launch
// without descriptors keeps a small frame. Nothing between packing and the driver call runs
// other code on this thread, so one buffer per thread is enough.
alignas(kTensorMapAlign) thread_local unsigned char t_tensor_maps[kMaxTensorMaps][kTensorMapBytes];

// IEEE-754 binary16 from a double, round-to-nearest-even (what CPython's PyFloat_Pack2 gives,
// which Triton's launcher uses for fp16 scalars).
uint16_t to_fp16(double value) {
  const float f = static_cast<float>(value);
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or nan
    return uint16_t(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  }
  // Work from the double to avoid double rounding through float.
  double a = std::fabs(value);
  if (a >= 65520.0) {  // rounds to infinity
    return uint16_t(sign | 0x7C00u);
  }
  if (a < 6.103515625e-05) {  // subnormal: units of 2**-24
    double scaled = a * 16777216.0;
    double r = std::nearbyint(scaled);  // default rounding mode: to nearest even
    return uint16_t(sign | uint32_t(r));
  }
  int exp;
  double mant = std::frexp(a, &exp);     // a = mant * 2**exp, mant in [0.5, 1)
  double scaled = std::ldexp(mant, 11);  // 11 significant bits
  double r = std::nearbyint(scaled);
  if (r >= 2048.0) {
    r /= 2.0;
    ++exp;
  }
  if (exp + 14 >= 31) {
    return uint16_t(sign | 0x7C00u);
  }
  return uint16_t(sign | (uint32_t(exp + 14) << 10) | (uint32_t(r) & 0x3FFu));
}

[[noreturn]] void bad_kind(const char* expected, ArgKind got) {
  const char* name = got == ArgKind::Tensor  ? "a tensor"
                     : got == ArgKind::Float ? "a float"
                     : got == ArgKind::Bool  ? "a bool"
                     : got == ArgKind::Int   ? "an int"
                                             : "None";
  throw ParamError(-1, false, std::string("expected ") + expected + ", got " + name);
}

// The value of an integer-kind argument as a wide signed/unsigned pair for range checks.
void integer_value(const ArgValue& v, const char* expected, bool* negative, uint64_t* magnitude,
                   int64_t* as_signed) {
  if (v.kind != ArgKind::Int && v.kind != ArgKind::Bool) {
    bad_kind(expected, v.kind);
  }
  if (v.kind == ArgKind::Int && v.width == IntWidth::U64) {
    *negative = false;
    *magnitude = v.u;
    *as_signed = 0;
    return;
  }
  *negative = v.i < 0;
  *as_signed = v.i;
  *magnitude = uint64_t(v.i);
}

template <typename T>
void store(void* slot, T value) {
  std::memcpy(slot, &value, sizeof(T));
}

template <typename T>
void pack_signed(const ArgValue& v, void* slot, const char* type_name) {
  bool negative;
  uint64_t magnitude;
  int64_t s;
  integer_value(v, type_name, &negative, &magnitude, &s);
  if (v.kind == ArgKind::Int && v.width == IntWidth::U64) {
    throw ParamError(
        -1, true,
        std::string("value ") + std::to_string(magnitude) + " is out of range for " + type_name);
  }
  if (s < int64_t(std::numeric_limits<T>::min()) || s > int64_t(std::numeric_limits<T>::max())) {
    throw ParamError(
        -1, true, std::string("value ") + std::to_string(s) + " is out of range for " + type_name);
  }
  store<T>(slot, T(s));
}

template <typename T>
void pack_unsigned(const ArgValue& v, void* slot, const char* type_name) {
  bool negative;
  uint64_t magnitude;
  int64_t s;
  integer_value(v, type_name, &negative, &magnitude, &s);
  if (negative || magnitude > uint64_t(std::numeric_limits<T>::max())) {
    throw ParamError(-1, true,
                     std::string("value ") +
                         (negative ? std::to_string(s) : std::to_string(magnitude)) +
                         " is out of range for " + type_name);
  }
  store<T>(slot, T(magnitude));
}

double float_value(const ArgValue& v, const char* type_name) {
  switch (v.kind) {
    case ArgKind::Float:
      return v.d;
    case ArgKind::Int:
      return v.width == IntWidth::U64 ? double(v.u) : double(v.i);
    case ArgKind::Bool:
      return double(v.i);
    default:
      bad_kind(type_name, v.kind);
  }
}

}  // namespace

[[gnu::noinline]] static CUresult launch_with_attributes(const DriverApi& api,
                                                         const LaunchRecord& record,
                                                         const LaunchGrid& grid, CUstream stream,
                                                         void** params);

// cuLaunchKernel for a plain record (inline: every launch takes it); cuLaunchKernelEx with
// the record's launch attributes otherwise.
static inline CUresult launch_packed(const DriverApi& api, const LaunchRecord& record,
                                     const LaunchGrid& grid, CUstream stream, void** params) {
  if (!record.needs_attributes()) {
    return api.cuLaunchKernel(record.function, grid.x, grid.y, grid.z, record.block_x, 1, 1,
                              record.shared_mem, stream, params, nullptr);
  }
  return launch_with_attributes(api, record, grid, stream, params);
}

void pack_param(ParamType type, const ArgValue& v, void* slot) {
  std::memset(slot, 0, 8);
  switch (type) {
    case ParamType::Pointer:
      if (v.kind == ArgKind::Tensor || v.kind == ArgKind::None) {
        store<uint64_t>(slot, v.kind == ArgKind::None ? 0 : v.u);
      } else if (v.kind == ArgKind::Int && v.width != IntWidth::U64 && v.i >= 0) {
        store<uint64_t>(slot, uint64_t(v.i));  // Triton accepts a raw address as an int
      } else if (v.kind == ArgKind::Int && v.width == IntWidth::U64) {
        store<uint64_t>(slot, v.u);
      } else {
        bad_kind("a tensor (pointer parameter)", v.kind);
      }
      return;
    case ParamType::I1:
      pack_signed<int32_t>(v, slot, "i1");  // driver.c packs i1 in a 4-byte int32 slot
      return;
    case ParamType::I8:
      pack_signed<int8_t>(v, slot, "i8");
      return;
    case ParamType::I16:
      pack_signed<int16_t>(v, slot, "i16");
      return;
    case ParamType::I32:
      pack_signed<int32_t>(v, slot, "i32");
      return;
    case ParamType::I64:
      pack_signed<int64_t>(v, slot, "i64");
      return;
    case ParamType::U1:
      pack_unsigned<uint32_t>(v, slot, "u1");  // 4-byte uint32 slot, as driver.c
      return;
    case ParamType::U8:
      pack_unsigned<uint8_t>(v, slot, "u8");
      return;
    case ParamType::U16:
      pack_unsigned<uint16_t>(v, slot, "u16");
      return;
    case ParamType::U32:
      pack_unsigned<uint32_t>(v, slot, "u32");
      return;
    case ParamType::U64:
      pack_unsigned<uint64_t>(v, slot, "u64");
      return;
    case ParamType::FP16: {
      // Triton's launcher packs fp16 with CPython's PyFloat_Pack2 (struct's 'e' format), which
      // refuses a finite value that rounds past the largest half, 65504 (OverflowError).
      const double d = float_value(v, "fp16");
      if (std::isfinite(d) && std::fabs(d) >= 65520.0) {
        char text[32];
        std::snprintf(text, sizeof(text), "%.17g", d);
        throw ParamError(-1, true, std::string("value ") + text + " is out of range for fp16");
      }
      store<uint16_t>(slot, to_fp16(d));
      return;
    }
    case ParamType::BF16: {
      // The top 16 bits of the fp32 value (truncation), exactly as driver.c's extractBF16.
      const float f = static_cast<float>(float_value(v, "bf16"));
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      store<uint16_t>(slot, uint16_t(bits >> 16));
      return;
    }
    case ParamType::FP32:
      store<float>(slot, static_cast<float>(float_value(v, "fp32")));
      return;
    case ParamType::FP64:
      store<double>(slot, float_value(v, "fp64"));
      return;
    case ParamType::TensorMap:
      break;  // 128 bytes, not a slot: launch() encodes it from the descriptor's leaves
  }
  throw ParamError(-1, false, "unknown parameter type");
}

// Every parameter the launch loop does not pack inline: tensor maps, conversions, range checks
// and errors (out of line, so the loop stays free of exception edges).
[[gnu::noinline]] static void pack_other(const LaunchRecord& record, PackSlot slot,
                                         const ArgValue& v, uint64_t* storage, void** param,
                                         size_t* num_tensor_maps) {
  try {
    if (slot.type == ParamType::TensorMap) {
      if (*num_tensor_maps >= record.tensor_maps.size() ||
          *num_tensor_maps >= size_t(kMaxTensorMaps)) {
        throw ParamError(-1, false, "the launch record has no tensor map for this parameter");
      }
      unsigned char* map = t_tensor_maps[(*num_tensor_maps)++];
      encode_tensor_map(record.tensor_maps[*num_tensor_maps - 1], &v, map);
      *param = map;
      return;
    }
    pack_param(slot.type, v, storage);
  } catch (ParamError& e) {
    throw ParamError(slot.arg_index, e.overflow, e.what());
  }
}

void launch(const LaunchRecord& record, const LaunchGrid& grid, CUstream stream,
            const ArgValue* args, CUdeviceptr global_scratch, CUdeviceptr profile_scratch) {
  const size_t n = record.plan.size();
  if (n + 2 > size_t(kMaxLaunchParams)) {
    throw ParamError(-1, false, "too many kernel parameters");
  }
  alignas(16) uint64_t storage[kMaxLaunchParams];
  void* params[kMaxLaunchParams];
  size_t num_tensor_maps = 0;
  const PackSlot* plan = record.plan.data();
  for (size_t i = 0; i < n; ++i) {
    const PackSlot slot = plan[i];
    const ArgValue& v = args[slot.arg_index];
    // The common exact matches point the driver at the argument's own value, which lives until
    // the call returns (the driver copies the parameters before cuLaunchKernel returns): a
    // tensor's address, an i64 or u64 as is, an i32 as the low 4 bytes of its i64 value
    // (little-endian). Every other combination (conversions, range checks, errors) is packed
    // into `storage` by pack_other.
    if ((slot.type == ParamType::Pointer && v.kind == ArgKind::Tensor) ||
        (v.kind == ArgKind::Int && ((slot.type == ParamType::I32 && v.width == IntWidth::I32) ||
                                    (slot.type == ParamType::I64 && v.width != IntWidth::U64) ||
                                    (slot.type == ParamType::U64 && v.width == IntWidth::U64)))) {
      params[i] = const_cast<uint64_t*>(&v.u);
      continue;
    }
    params[i] = &storage[i];
    pack_other(record, slot, v, &storage[i], &params[i], &num_tensor_maps);
  }
  // Triton's launcher converts every argument, then launches nothing for an empty grid: a bad
  // argument raises either way.
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
    return;
  }
  // Scratch pointers: as many as the installed Triton's calling convention appends.
  size_t count = n;
  if (record.num_scratch_params >= 1) {
    storage[count] = global_scratch;
    params[count] = &storage[count];
    ++count;
  }
  if (record.num_scratch_params >= 2) {
    storage[count] = profile_scratch;
    params[count] = &storage[count];
    ++count;
  }
  const DriverApi& api = driver();
  CUresult result = launch_packed(api, record, grid, stream, params);
  if (result == cu::ERROR_INVALID_CONTEXT) {
    // No context current on this thread (it never used the CUDA runtime): bind the record's
    // device's primary context, which is the one torch uses, and launch again.
    make_primary_context_current(record.device);
    result = launch_packed(api, record, grid, stream, params);
  }
  if (result != cu::SUCCESS) {
    throw CudaError(result, "fastkernel: launching '" + record.kernel_name +
                                "' failed: " + describe_cuda_error(result));
  }
}

static CUresult launch_with_attributes(const DriverApi& api, const LaunchRecord& record,
                                       const LaunchGrid& grid, CUstream stream, void** params) {
  if (api.cuLaunchKernelEx == nullptr) {
    throw CudaError(cu::ERROR_NOT_INITIALIZED,
                    "fastkernel: '" + record.kernel_name +
                        "' needs cuLaunchKernelEx (clusters, cooperative grid or PDL), which "
                        "this CUDA driver lacks");
  }
  CUlaunchAttribute attrs[4];
  std::memset(attrs, 0, sizeof(attrs));
  unsigned num_attrs = 0;
  if (record.pdl) {
    attrs[num_attrs].id = cu::LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[num_attrs++].value.int_value = 1;
  }
  if (record.cooperative_grid) {
    attrs[num_attrs].id = cu::LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[num_attrs++].value.int_value = 1;
  }
  if (record.num_ctas != 1) {
    attrs[num_attrs].id = cu::LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[num_attrs].value.cluster_dim.x = record.num_ctas;
    attrs[num_attrs].value.cluster_dim.y = 1;
    attrs[num_attrs++].value.cluster_dim.z = 1;
    attrs[num_attrs].id = cu::LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    attrs[num_attrs++].value.int_value = cu::CLUSTER_SCHEDULING_POLICY_SPREAD;
  }
  // The driver checks grid_x, not the product that makes it: a wrapped product would launch a
  // few clusters where the grid asked for 2**32 CTAs more.
  if (uint64_t(grid.x) * record.num_ctas > kMaxGridX) {
    throw CudaError(cu::ERROR_INVALID_VALUE, "fastkernel: '" + record.kernel_name + "': grid[0] " +
                                                 std::to_string(grid.x) + " * num_ctas " +
                                                 std::to_string(record.num_ctas) + " exceeds " +
                                                 std::to_string(kMaxGridX));
  }
  CUlaunchConfig config{};
  config.grid_x = grid.x * record.num_ctas;
  config.grid_y = grid.y;
  config.grid_z = grid.z;
  config.block_x = record.block_x;
  config.block_y = 1;
  config.block_z = 1;
  config.shared_mem_bytes = record.shared_mem;
  config.stream = stream;
  config.attrs = attrs;
  config.num_attrs = num_attrs;
  return api.cuLaunchKernelEx(&config, record.function, params, nullptr);
}

}  // namespace fastkernel
