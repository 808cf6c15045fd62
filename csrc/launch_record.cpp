// Loads a compiled specialization into a device's primary context and resolves its function,
// once, at registration: the per-call path only reads the resulting launch record.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "fastkernel/launch_record.h"

namespace fastkernel {
namespace {

std::mutex g_primary_mutex;
std::unordered_map<int, CUcontext> g_primary_contexts;

}  // namespace

PrimaryContextScope::PrimaryContextScope(int device) {
  check_cuda(driver().cuCtxPushCurrent(primary_context(device)), "cuCtxPushCurrent");
}

PrimaryContextScope::~PrimaryContextScope() {
  CUcontext popped = nullptr;
  driver().cuCtxPopCurrent(&popped);
}

CUcontext primary_context(int device) {
  std::lock_guard<std::mutex> lock(g_primary_mutex);
  auto it = g_primary_contexts.find(device);
  if (it != g_primary_contexts.end()) {
    return it->second;
  }
  const DriverApi& api = driver();
  CUdevice dev = 0;
  check_cuda(api.cuDeviceGet(&dev, device), "cuDeviceGet");
  CUcontext ctx = nullptr;
  check_cuda(api.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  g_primary_contexts.emplace(device, ctx);
  return ctx;
}

DeviceContextScope::DeviceContextScope(int device) {
  const DriverApi& api = driver();
  CUcontext current = nullptr;
  check_cuda(api.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  const CUcontext wanted = primary_context(device);
  if (current == wanted) {
    return;
  }
  if (current == nullptr) {
    check_cuda(api.cuCtxSetCurrent(wanted), "cuCtxSetCurrent");
    return;
  }
  check_cuda(api.cuCtxPushCurrent(wanted), "cuCtxPushCurrent");
  pushed_ = true;
}

DeviceContextScope::~DeviceContextScope() {
  if (pushed_) {
    CUcontext popped = nullptr;
    driver().cuCtxPopCurrent(&popped);
  }
}

void make_primary_context_current(int device) {
  check_cuda(driver().cuCtxSetCurrent(primary_context(device)), "cuCtxSetCurrent");
}

bool parse_param_type(const std::string& t, ParamType* out) {
  static const std::unordered_map<std::string, ParamType> kTypes = {
      {"i1", ParamType::I1},     {"i8", ParamType::I8},
      {"i16", ParamType::I16},   {"i32", ParamType::I32},
      {"i64", ParamType::I64},   {"u1", ParamType::U1},
      {"u8", ParamType::U8},     {"u16", ParamType::U16},
      {"u32", ParamType::U32},   {"u64", ParamType::U64},
      {"fp16", ParamType::FP16}, {"bf16", ParamType::BF16},
      {"fp32", ParamType::FP32}, {"f32", ParamType::FP32},
      {"fp64", ParamType::FP64}, {"nvTmaDesc", ParamType::TensorMap},
  };
  if (!t.empty() && t[0] == '*') {
    *out = ParamType::Pointer;
    return true;
  }
  auto it = kTypes.find(t);
  if (it == kTypes.end()) {
    return false;
  }
  *out = it->second;
  return true;
}

namespace {

uint64_t read_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) {
    v = (v << 8) | p[i];
  }
  return v;
}

}  // namespace

std::string cubin_image_problem(const void* cubin, size_t size) {
  // ELF64 layout (the System V gABI): the header is 64 bytes; e_phoff at 0x20, e_shoff at 0x28,
  // e_phentsize/e_phnum at 0x36/0x38, e_shentsize/e_shnum at 0x3a/0x3c; a section header holds
  // sh_type at 4, sh_offset at 0x18 and sh_size at 0x20. EM_CUDA is 190.
  const auto* img = static_cast<const unsigned char*>(cubin);
  if (img == nullptr || size < 64 ||
      std::memcmp(img,
                  ""
                  "ELF",
                  4) != 0) {
    return "is not an ELF image";
  }
  if (img[4] != 2 || img[5] != 1 || read_le(img + 0x12, 2) != 190) {
    return "is not a little-endian ELF64 image for CUDA (EM_CUDA)";
  }
  const uint64_t phoff = read_le(img + 0x20, 8), shoff = read_le(img + 0x28, 8);
  const uint64_t phentsize = read_le(img + 0x36, 2), phnum = read_le(img + 0x38, 2);
  const uint64_t shentsize = read_le(img + 0x3a, 2), shnum = read_le(img + 0x3c, 2);
  // Offsets are bounded by `size` before any sum, so no sum below can overflow.
  const auto table_fits = [size](uint64_t offset, uint64_t count, uint64_t entry) {
    return offset <= size && count * entry <= size - offset;
  };
  if (shnum == 0 || shentsize != 64 || shoff < 64 || !table_fits(shoff, shnum, shentsize)) {
    return "has a section header table outside its " + std::to_string(size) + " bytes";
  }
  if (phnum != 0 && (phentsize != 56 || !table_fits(phoff, phnum, phentsize))) {
    return "has a program header table outside its " + std::to_string(size) + " bytes";
  }
  constexpr uint32_t kNoBits = 8;  // SHT_NOBITS: no file contents
  for (uint64_t i = 0; i < shnum; ++i) {
    const unsigned char* sh = img + shoff + i * shentsize;
    if (read_le(sh + 4, 4) == kNoBits) {
      continue;
    }
    if (!table_fits(read_le(sh + 0x18, 8), 1, read_le(sh + 0x20, 8))) {
      return "has section " + std::to_string(i) + " outside its " + std::to_string(size) +
             " bytes (truncated)";
    }
  }
  return {};
}

std::unique_ptr<LaunchRecord> make_launch_record(const LaunchFacts& facts, int max_args) {
  auto rec = std::make_unique<LaunchRecord>();
  fill_launch_record(facts, max_args, rec.get());
  return rec;
}

void fill_launch_record(const LaunchFacts& facts, int max_args, LaunchRecord* rec) {
  const auto fail = [](const std::string& what) {
    throw std::invalid_argument("fastkernel: " + what);
  };
  const std::string& name = facts.kernel_name;
  if (name.empty() || name.find('\0') != std::string::npos) {
    fail("a kernel name must be non-empty and hold no NUL byte");
  }
  if (facts.device < 0) {
    fail("device must be >= 0");
  }
  if (facts.num_scratch_params < 0 || facts.num_scratch_params > 2) {
    fail("num_scratch_params must be 0, 1 or 2");
  }
  if (facts.block_x == 0 || facts.block_x > 1024 || facts.num_ctas == 0) {
    fail("block size must be in [1, 1024] and num_ctas >= 1");
  }
  rec->kernel_name = name;
  rec->profile_name = "fastkernel::" + name;
  rec->device = facts.device;
  rec->block_x = facts.block_x;
  rec->shared_mem = facts.shared_mem;
  rec->num_ctas = facts.num_ctas;
  rec->cooperative_grid = facts.cooperative_grid;
  rec->pdl = facts.pdl;
  rec->num_scratch_params = facts.num_scratch_params;
  rec->global_scratch_size = facts.global_scratch_size;
  rec->global_scratch_align = facts.global_scratch_align;
  rec->profile_scratch_size = facts.profile_scratch_size;
  rec->profile_scratch_align = facts.profile_scratch_align;
  rec->plan.reserve(facts.plan.size());
  for (const auto& [arg_index, type] : facts.plan) {
    ParamType pt;
    if (!parse_param_type(type, &pt)) {
      fail("unsupported parameter type '" + type + "' in " + name);
    }
    // Parameters index the bound arguments; tuple leaves the slots after them (BoundCall).
    if (arg_index < 0 || arg_index >= max_args || arg_index > UINT16_MAX) {
      fail("parameter plan index out of range");
    }
    rec->plan.push_back({uint16_t(arg_index), pt});
    rec->values_read = std::max(rec->values_read, arg_index + 1);
  }
  // Each "nvTmaDesc" parameter reads its descriptor's leaves from its plan index on.
  size_t map_slots = 0;
  for (const PackSlot& slot : rec->plan) {
    if (slot.type != ParamType::TensorMap) {
      continue;
    }
    if (map_slots >= facts.tensor_maps.size() || map_slots >= size_t(kMaxTensorMaps)) {
      fail(name + " has more tensor-map parameters than tensor map descriptions (or more than " +
           std::to_string(kMaxTensorMaps) + ")");
    }
    const TensorMapFacts& map = facts.tensor_maps[map_slots++];
    TensorMapSpec spec;
    spec.rank = int32_t(map.block.size() > size_t(kMaxTensorMapRank) ? 0 : map.block.size());
    if (spec.rank < 1) {
      fail("a tensor map must have 1 to 5 block dimensions");
    }
    if (slot.arg_index + descriptor_leaves(spec.rank) > max_args) {
      fail("a tensor map's descriptor leaves run past the " + std::to_string(max_args) +
           " bound arguments");
    }
    if (map.data_type < 0 || map.data_type > 15 || map.elem_size <= 0 || map.elem_size > 8 ||
        map.swizzle < 0 || map.swizzle > 3) {
      fail("malformed tensor map description for " + name);
    }
    rec->values_read = std::max(rec->values_read, slot.arg_index + descriptor_leaves(spec.rank));
    spec.data_type = map.data_type;
    spec.elem_size = map.elem_size;
    spec.swizzle = map.swizzle;
    for (int d = 0; d < spec.rank; ++d) {
      spec.block[d] = map.block[size_t(d)];
    }
    spec.fp4_padded = map.fp4_padded;
    spec.tf32_rounding = map.tf32_rounding;
    rec->tensor_maps.push_back(spec);
  }
  if (map_slots != facts.tensor_maps.size()) {
    fail("tensor map descriptions do not match the plan of " + name);
  }
}

FunctionAttributes load_launch_record(LaunchRecord& record, const void* cubin, size_t cubin_size,
                                      bool check_param_count) {
  // cuModuleLoadData takes no size: the image's own headers must lie within the buffer.
  const std::string problem = cubin_image_problem(cubin, cubin_size);
  if (!problem.empty()) {
    throw std::invalid_argument("fastkernel: the cubin for '" + record.kernel_name + "' " +
                                problem);
  }
  const DriverApi& api = driver();
  PrimaryContextScope scope(record.device);
  CUmodule module = nullptr;
  check_cuda(api.cuModuleLoadData(&module, cubin), "cuModuleLoadData");
  FunctionAttributes attrs;
  try {
    CUfunction function = nullptr;
    std::string what = "cuModuleGetFunction(" + record.kernel_name + ")";
    check_cuda(api.cuModuleGetFunction(&function, module, record.kernel_name.c_str()),
               what.c_str());
    // Above 48 KB of dynamic shared memory the function must opt in, as Triton's loadBinary does.
    if (record.shared_mem > 49152) {
      CUdevice dev = 0;
      check_cuda(api.cuDeviceGet(&dev, record.device), "cuDeviceGet");
      int optin = 0, static_shared = 0;
      check_cuda(api.cuDeviceGetAttribute(
                     &optin, cu::DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
                 "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)");
      check_cuda(
          api.cuFuncGetAttribute(&static_shared, cu::FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function),
          "cuFuncGetAttribute(SHARED_SIZE_BYTES)");
      if (record.shared_mem > unsigned(optin)) {
        throw CudaError(cu::ERROR_LAUNCH_OUT_OF_RESOURCES,
                        "fastkernel: '" + record.kernel_name + "' needs " +
                            std::to_string(record.shared_mem) + " bytes of shared memory; device " +
                            std::to_string(record.device) + " allows " + std::to_string(optin));
      }
      check_cuda(api.cuFuncSetAttribute(function, cu::FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        optin - static_shared),
                 "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    }
    // The function's own parameter count (from the cubin, through the driver) must be what a
    // launch packs: a record that packs fewer would let the driver read unset kernelParams.
    // cuFuncGetParamCount answers directly where the driver has it. Otherwise the driver is
    // asked for the last parameter the record packs and for the one after it, which a function
    // of the right arity answers with CUDA_ERROR_INVALID_VALUE (reported by compute-sanitizer
    // as an API error, expected here).
    if (check_param_count) {
      const size_t packs = record.plan.size() + size_t(record.num_scratch_params);
      size_t declared = 0, offset = 0, size = 0;
      int order = 0;  // the function declares fewer (-1), exactly (0) or more (1) parameters
      if (api.cuFuncGetParamCount != nullptr &&
          api.cuFuncGetParamCount(function, &declared) == cu::SUCCESS) {
        order = declared < packs ? -1 : declared > packs ? 1 : 0;
      } else if (api.cuFuncGetParamInfo != nullptr) {
        if (packs > 0 &&
            api.cuFuncGetParamInfo(function, packs - 1, &offset, &size) != cu::SUCCESS) {
          order = -1;
        } else if (api.cuFuncGetParamInfo(function, packs, &offset, &size) == cu::SUCCESS) {
          order = 1;
        }
      }
      if (order != 0) {
        throw std::invalid_argument("fastkernel: '" + record.kernel_name + "' declares " +
                                    (order > 0 ? "more" : "fewer") + " than the " +
                                    std::to_string(packs) + " parameters its launch record packs");
      }
    }
    check_cuda(api.cuFuncGetAttribute(&attrs.num_regs, cu::FUNC_ATTRIBUTE_NUM_REGS, function),
               "cuFuncGetAttribute(NUM_REGS)");
    check_cuda(api.cuFuncGetAttribute(&attrs.local_size_bytes, cu::FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                                      function),
               "cuFuncGetAttribute(LOCAL_SIZE_BYTES)");
    check_cuda(api.cuFuncGetAttribute(&attrs.max_threads_per_block,
                                      cu::FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function),
               "cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)");
    // A block larger than the function allows (its registers limit it) cannot launch; Triton's
    // _init_handles raises OutOfResources(..., "threads") before its first launch.
    if (attrs.max_threads_per_block < 0 || record.block_x > unsigned(attrs.max_threads_per_block)) {
      throw CudaError(cu::ERROR_LAUNCH_OUT_OF_RESOURCES,
                      "fastkernel: '" + record.kernel_name + "' needs " +
                          std::to_string(record.block_x) + " threads per block; its function " +
                          "allows " + std::to_string(attrs.max_threads_per_block));
    }
    // Clusters of 16 CTAs exceed the portable limit of 8 (Triton's driver.c sets this per launch).
    if (record.num_ctas > 8) {
      check_cuda(
          api.cuFuncSetAttribute(function, cu::FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
          "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)");
    }
    record.module = module;
    record.function = function;
  } catch (...) {
    api.cuModuleUnload(module);
    throw;
  }
  return attrs;
}

void unload_launch_record(LaunchRecord& record) noexcept {
  if (record.module != nullptr && driver_loaded()) {
    driver().cuModuleUnload(record.module);
  }
  record.module = nullptr;
  record.function = nullptr;
}

}  // namespace fastkernel
