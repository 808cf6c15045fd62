// Opens the CUDA driver library at run time (dlopen), resolves the entry points fastkernel
// calls and initializes it; importing fastkernel never touches the driver.
#include <dlfcn.h>
#include <pthread.h>

#include <cstdlib>
#include <mutex>

#include "fastkernel/cuda_driver.h"

namespace fastkernel {
namespace {

std::mutex g_load_mutex;
bool g_loaded = false;
bool g_forked = false;

void mark_forked_child() {
  g_forked = true;
  detail::g_driver_ready.store(false, std::memory_order_relaxed);  // launches take driver_slow()
}

template <typename Fn>
bool resolve(void* lib, const char* name, Fn* slot, bool required, std::string* missing) {
  *slot = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*slot == nullptr && required) {
    *missing = name;
    return false;
  }
  return true;
}

void load_locked() {
  const std::string path = driver_library_path();
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw DriverUnavailable("fastkernel: cannot open the CUDA driver library '" + path + "' (" +
                            (why ? why : "unknown error") +
                            "); a GPU launch needs an NVIDIA driver");
  }
  DriverApi api{};
  std::string missing;
  // The _v2 names are what cuda.h maps the plain names to; the driver exports both forms.
  bool ok =
      resolve(lib, "cuInit", &api.cuInit, true, &missing) &&
      resolve(lib, "cuGetErrorName", &api.cuGetErrorName, true, &missing) &&
      resolve(lib, "cuGetErrorString", &api.cuGetErrorString, true, &missing) &&
      resolve(lib, "cuDeviceGet", &api.cuDeviceGet, true, &missing) &&
      resolve(lib, "cuDeviceGetCount", &api.cuDeviceGetCount, true, &missing) &&
      resolve(lib, "cuDeviceGetAttribute", &api.cuDeviceGetAttribute, true, &missing) &&
      resolve(lib, "cuDevicePrimaryCtxRetain", &api.cuDevicePrimaryCtxRetain, true, &missing) &&
      resolve(lib, "cuCtxGetCurrent", &api.cuCtxGetCurrent, true, &missing) &&
      resolve(lib, "cuCtxSetCurrent", &api.cuCtxSetCurrent, true, &missing) &&
      resolve(lib, "cuCtxPushCurrent_v2", &api.cuCtxPushCurrent, true, &missing) &&
      resolve(lib, "cuCtxPopCurrent_v2", &api.cuCtxPopCurrent, true, &missing) &&
      resolve(lib, "cuModuleLoadData", &api.cuModuleLoadData, true, &missing) &&
      resolve(lib, "cuModuleUnload", &api.cuModuleUnload, true, &missing) &&
      resolve(lib, "cuModuleGetFunction", &api.cuModuleGetFunction, true, &missing) &&
      resolve(lib, "cuFuncGetAttribute", &api.cuFuncGetAttribute, true, &missing) &&
      resolve(lib, "cuFuncSetAttribute", &api.cuFuncSetAttribute, true, &missing) &&
      resolve(lib, "cuLaunchKernel", &api.cuLaunchKernel, true, &missing) &&
      // Older drivers lack cuLaunchKernelEx; only launches that need attributes use it.
      resolve(lib, "cuLaunchKernelEx", &api.cuLaunchKernelEx, false, &missing) &&
      resolve(lib, "cuFuncGetParamInfo", &api.cuFuncGetParamInfo, false, &missing) &&
      resolve(lib, "cuFuncGetParamCount", &api.cuFuncGetParamCount, false, &missing) &&
      resolve(lib, "cuTensorMapEncodeTiled", &api.cuTensorMapEncodeTiled, false, &missing);
  if (!ok) {
    dlclose(lib);
    throw DriverUnavailable("fastkernel: the CUDA driver library '" + path + "' lacks " + missing);
  }
  CUresult init = api.cuInit(0);
  if (init != cu::SUCCESS) {
    // The library stays open (a driver may not be dlclose-safe); a later call retries cuInit.
    const char* name = nullptr;
    api.cuGetErrorName(init, &name);
    throw DriverUnavailable("fastkernel: cuInit failed with " + std::string(name ? name : "?") +
                            " (" + std::to_string(init) + "); no usable GPU");
  }
  detail::g_driver_api = api;
  // From here on the process holds CUDA handles; a forked child must not use them.
  pthread_atfork(nullptr, nullptr, mark_forked_child);
  g_loaded = true;
  detail::g_driver_ready.store(true, std::memory_order_release);
}

}  // namespace

std::string driver_library_path() {
  const char* override_path = std::getenv("FASTKERNEL_CUDA_DRIVER");
  return (override_path && *override_path) ? override_path : "libcuda.so.1";
}

DriverApi detail::g_driver_api{};
std::atomic<bool> detail::g_driver_ready{false};

const DriverApi& detail::driver_slow() {
  if (g_loaded) {  // written once under the mutex, before any reader can see true
    check_not_forked();
    return detail::g_driver_api;
  }
  std::lock_guard<std::mutex> lock(g_load_mutex);
  if (!g_loaded) {
    load_locked();
  }
  return detail::g_driver_api;
}

bool driver_loaded() noexcept { return g_loaded; }

bool forked_after_driver_load() noexcept { return g_forked; }

void check_not_forked() {
  if (g_forked) {
    throw std::runtime_error(
        "fastkernel: this process was forked after CUDA was initialized in its parent; CUDA "
        "handles cannot be used after fork (use the 'spawn' multiprocessing start method)");
  }
}

std::string describe_cuda_error(CUresult code) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (g_loaded) {
    detail::g_driver_api.cuGetErrorName(code, &name);
    detail::g_driver_api.cuGetErrorString(code, &text);
  }
  return std::string(name ? name : "CUDA_ERROR_UNKNOWN") + " (" + std::to_string(code) +
         "): " + (text ? text : "unrecognized error code");
}

void check_cuda(CUresult code, const char* what) {
  if (code != cu::SUCCESS) {
    throw CudaError(code, std::string(what) + " failed: " + describe_cuda_error(code));
  }
}

}  // namespace fastkernel
