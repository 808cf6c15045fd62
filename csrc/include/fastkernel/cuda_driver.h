// The CUDA driver API as fastkernel uses it: the few types and entry points, resolved at run
// time with dlopen so that the package imports and its CPU tests run with no driver installed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fastkernel {

// Types declared here rather than taken from cuda.h: building fastkernel needs no CUDA toolkit,
// and the layouts below are the driver's stable ABI (checked against cuda.h 12.x and 13.0).
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;

/// One launch attribute of cuLaunchKernelEx (CUlaunchAttribute in cuda.h: 8-byte id slot, 64-byte
/// value).
struct CUlaunchAttribute {
  unsigned int id;
  char pad[4];
  union {
    char raw[64];
    struct {
      unsigned int x, y, z;
    } cluster_dim;
    int int_value;
  } value;
};
static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute must match cuda.h");

/// The launch configuration of cuLaunchKernelEx (CUlaunchConfig in cuda.h).
struct CUlaunchConfig {
  unsigned int grid_x, grid_y, grid_z;
  unsigned int block_x, block_y, block_z;
  unsigned int shared_mem_bytes;
  CUstream stream;
  CUlaunchAttribute* attrs;
  unsigned int num_attrs;
};
static_assert(sizeof(CUlaunchConfig) == 56, "CUlaunchConfig must match cuda.h");

/// Enum values from cuda.h that fastkernel passes to the driver.
namespace cu {
constexpr CUresult SUCCESS = 0;
constexpr CUresult ERROR_INVALID_VALUE = 1;
constexpr CUresult ERROR_NOT_INITIALIZED = 3;
constexpr CUresult ERROR_INVALID_CONTEXT = 201;
constexpr CUresult ERROR_LAUNCH_OUT_OF_RESOURCES = 701;
constexpr int DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
constexpr int FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0;
constexpr int FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1;
constexpr int FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3;
constexpr int FUNC_ATTRIBUTE_NUM_REGS = 4;
constexpr int FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
constexpr int FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14;
constexpr unsigned LAUNCH_ATTRIBUTE_COOPERATIVE = 2;
constexpr unsigned LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4;
constexpr unsigned LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5;
constexpr unsigned LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;
constexpr int CLUSTER_SCHEDULING_POLICY_SPREAD = 1;
constexpr int TENSOR_MAP_DATA_TYPE_TFLOAT32 = 11;
constexpr int TENSOR_MAP_INTERLEAVE_NONE = 0;
constexpr int TENSOR_MAP_L2_PROMOTION_L2_128B = 2;
constexpr int TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0;
constexpr int TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA = 1;
}  // namespace cu

/// Entry points resolved from the driver library; every pointer is non-null once loaded.
struct DriverApi {
  CUresult (*cuInit)(unsigned int flags);
  CUresult (*cuGetErrorName)(CUresult error, const char** name);
  CUresult (*cuGetErrorString)(CUresult error, const char** text);
  CUresult (*cuDeviceGet)(CUdevice* device, int ordinal);
  CUresult (*cuDeviceGetCount)(int* count);
  CUresult (*cuDeviceGetAttribute)(int* value, int attribute, CUdevice device);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* ctx, CUdevice device);
  CUresult (*cuCtxGetCurrent)(CUcontext* ctx);
  CUresult (*cuCtxSetCurrent)(CUcontext ctx);
  CUresult (*cuCtxPushCurrent)(CUcontext ctx);
  CUresult (*cuCtxPopCurrent)(CUcontext* ctx);
  CUresult (*cuModuleLoadData)(CUmodule* module, const void* image);
  CUresult (*cuModuleUnload)(CUmodule module);
  CUresult (*cuModuleGetFunction)(CUfunction* function, CUmodule module, const char* name);
  CUresult (*cuFuncGetAttribute)(int* value, int attribute, CUfunction function);
  CUresult (*cuFuncSetAttribute)(CUfunction function, int attribute, int value);
  CUresult (*cuLaunchKernel)(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                             unsigned block_x, unsigned block_y, unsigned block_z,
                             unsigned shared_mem_bytes, CUstream stream, void** params,
                             void** extra);
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig* config, CUfunction f, void** params,
                               void** extra);
  /// Null on drivers before CUDA 12.4; where present, a loaded function's parameter count is
  /// checked against its launch record's plan.
  CUresult (*cuFuncGetParamInfo)(CUfunction function, size_t index, size_t* offset, size_t* size);
  /// Null on drivers up to CUDA 13.1 (its cuda.h does not declare it); where present it answers
  /// the parameter-count check without probing one index past the last parameter.
  CUresult (*cuFuncGetParamCount)(CUfunction function, size_t* count);
  /// Null on drivers before CUDA 12.0; only kernels taking host tensor descriptors use it.
  CUresult (*cuTensorMapEncodeTiled)(void* tensor_map, int data_type, unsigned rank,
                                     void* global_address, const uint64_t* global_dim,
                                     const uint64_t* global_strides, const uint32_t* box_dim,
                                     const uint32_t* element_strides, int interleave, int swizzle,
                                     int l2_promotion, int oob_fill);
};

/// Thrown for every failed driver call; carries the CUDA error's number, name and message.
class CudaError : public std::exception {
 public:
  CudaError(CUresult code, std::string what) : code_(code), what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }
  CUresult code() const noexcept { return code_; }

 private:
  CUresult code_;
  std::string what_;
};

/// Thrown when no driver library can be opened or initialized (no GPU, no driver).
class DriverUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
/// The loaded driver's entry points, and whether a launch may use them without more checks:
/// set once, under a lock, by the first driver() that loads the library; cleared in a child
/// forked after that (which must refuse). Read through driver().
extern DriverApi g_driver_api;
extern std::atomic<bool> g_driver_ready;
/// driver()'s first-use and after-fork path.
const DriverApi& driver_slow();
}  // namespace detail

/// The driver, opened and cuInit'ed on first use (thread-safe). Throws DriverUnavailable, or
/// std::runtime_error in a child forked after it was loaded. The library is
/// `$FASTKERNEL_CUDA_DRIVER` when set (the tests' recording stand-in), else libcuda.so.1.
/// Inline: once loaded it is one load and a branch on every launch.
inline const DriverApi& driver() {
  if (__builtin_expect(detail::g_driver_ready.load(std::memory_order_acquire), 1)) {
    return detail::g_driver_api;
  }
  return detail::driver_slow();
}

/// True once driver() has succeeded in this process; never opens the library itself.
bool driver_loaded() noexcept;

/// True in a child process forked after the driver was loaded: the parent's contexts, modules
/// and functions are not valid there, so every launch and load refuses (CUDA does not support
/// fork after initialization; use the "spawn" start method).
bool forked_after_driver_load() noexcept;

/// Throws std::runtime_error if forked_after_driver_load().
void check_not_forked();

/// The path driver() opened, or the one it would open.
std::string driver_library_path();

/// "CUDA_ERROR_X (n): message" for a driver result code.
std::string describe_cuda_error(CUresult code);

/// Throws CudaError naming `what` if `code` is not CUDA_SUCCESS.
void check_cuda(CUresult code, const char* what);

}  // namespace fastkernel
