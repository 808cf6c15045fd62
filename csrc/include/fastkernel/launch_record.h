// The launch record: everything the trampoline needs to launch one compiled specialization
// on one device, resolved at registration so that a launch reads plain fields.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fastkernel/cuda_driver.h"
#include "fastkernel/tensor_map.h"

namespace fastkernel {

/// How one kernel parameter is written into the parameter buffer (Triton's signature types,
/// triton/backends/nvidia/driver.c extractors: i1 and u1 take 4-byte slots, floats are
/// narrowed from the Python double, bf16 is the top half of the fp32 bits).
enum class ParamType : uint8_t {
  Pointer,
  I1,
  I8,
  I16,
  I32,
  I64,
  U1,
  U8,
  U16,
  U32,
  U64,
  FP16,
  BF16,
  FP32,
  FP64,
  /// A 128-byte CUtensorMap encoded from a host tensor descriptor's leaves ("nvTmaDesc"); the
  /// slot's arg_index is the descriptor's first leaf, and the k-th such parameter of a record
  /// is described by LaunchRecord::tensor_maps[k].
  TensorMap,
};

/// Parses a Triton signature type ("*fp32", "i32", "u1", "bf16", ...); false if unknown.
bool parse_param_type(const std::string& triton_type, ParamType* out);

/// One parameter of the compiled kernel: which bound argument feeds it, and as what type.
struct PackSlot {
  uint16_t arg_index;
  ParamType type;
};

/// What a compiled specialization needs to launch, per device. Immutable once registered.
struct LaunchRecord {
  std::string kernel_name;   ///< the cubin's entry point (Triton's metadata.name)
  std::string profile_name;  ///< the profiler range a launch is recorded under, when one is active
  int device = 0;            ///< the device whose primary context holds `module`
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  unsigned block_x = 0;     ///< 32 * num_warps threads
  unsigned shared_mem = 0;  ///< dynamic shared memory, bytes
  unsigned num_ctas = 1;    ///< cluster size along x; grid.x is multiplied by it
  bool cooperative_grid = false;
  bool pdl = false;                        ///< programmatic dependent launch
  std::vector<PackSlot> plan;              ///< declared non-constexpr parameters, in order
  std::vector<TensorMapSpec> tensor_maps;  ///< one per ParamType::TensorMap slot of `plan`
  /// Bound-argument slots a launch reads: one past the highest plan index or descriptor leaf.
  /// A caller whose bound call filled fewer slots must not launch the record.
  int values_read = 0;
  /// values_read less the declared parameters of the kernel whose table holds the record (the
  /// tuple and descriptor leaves it reads), set at insertion; the hit compares it to the call's.
  /// The Python layer sets it past any call's for a record with a hit_call, which that check
  /// then diverts.
  int leaves_read = 0;
  int num_scratch_params = 2;  ///< pointers the installed Triton appends: 0 (<=3.2), 1 (3.3-3.4), 2
  uint64_t global_scratch_size = 0;  ///< bytes per CTA; > 0 needs an allocation per launch
  uint64_t global_scratch_align = 1;
  uint64_t profile_scratch_size = 0;  ///< bytes per CTA
  uint64_t profile_scratch_align = 1;
  /// Calls in flight that hold this record (they may run Python, which may register other
  /// records); the launch table never evicts or drops a pinned record. Serialized by the caller.
  mutable uint32_t pins = 0;
  void* user_data =
      nullptr;  ///< opaque to fastkernel; the Python layer keeps its CompiledKernel here
  /// Opaque to fastkernel: the values a tuned config gives the parameters a call leaves out
  /// (the Python layer keeps a tuple, one item per parameter, for the callable grid and hooks).
  void* tuned_args = nullptr;
  /// Opaque to fastkernel: what a hit on this record publishes to the kernel's owner (the
  /// Python layer keeps the tuned config that Triton's Autotuner sets as `best_config`).
  void* published = nullptr;
  /// Opaque to fastkernel: when set, a hit of the Python entry calls it instead of launching,
  /// and the record holds no binary (the Python layer keeps a callable that runs a tuned
  /// config's pre_hook, then the launch underneath, as Triton's Autotuner.run does).
  void* hit_call = nullptr;
  /// Called with user_data, tuned_args, published and hit_call on drop.
  void (*release_user_data)(void*) = nullptr;

  LaunchRecord() = default;
  LaunchRecord(const LaunchRecord&) = delete;
  LaunchRecord& operator=(const LaunchRecord&) = delete;
  ~LaunchRecord() {
    if (release_user_data != nullptr) {
      if (user_data != nullptr) {
        release_user_data(user_data);
      }
      if (tuned_args != nullptr) {
        release_user_data(tuned_args);
      }
      if (published != nullptr) {
        release_user_data(published);
      }
      if (hit_call != nullptr) {
        release_user_data(hit_call);
      }
    }
  }

  bool needs_attributes() const { return num_ctas != 1 || cooperative_grid || pdl; }
  bool needs_scratch() const { return global_scratch_size > 0 || profile_scratch_size > 0; }
};

/// Holds a record pinned for a scope (see LaunchRecord::pins).
class RecordPin {
 public:
  explicit RecordPin(const LaunchRecord* record) : record_(record) { ++record_->pins; }
  ~RecordPin() { --record_->pins; }
  RecordPin(const RecordPin&) = delete;
  RecordPin& operator=(const RecordPin&) = delete;

 private:
  const LaunchRecord* record_;
};

/// One tensor-map parameter as a registration describes it (Triton's `tensordesc_meta` entry,
/// triton/backends/nvidia/driver.py `make_tensordesc_arg`): the host CUtensorMapDataType, the
/// element size in bytes, the CUtensorMapSwizzle, the block shape (outermost first), and the
/// padded-fp4 and tf32-rounding flags.
struct TensorMapFacts {
  int data_type = 0;
  int elem_size = 0;
  int swizzle = 0;
  std::vector<uint32_t> block;
  bool fp4_padded = false;
  bool tf32_rounding = false;
};

/// The launch facts of one compiled specialization, as a caller registers it (the Python layer
/// reads them from Triton's CompiledKernel metadata or from a disk-cache entry).
struct LaunchFacts {
  std::string kernel_name;  ///< the cubin's entry point
  int device = 0;
  unsigned block_x = 0;     ///< threads per CTA (32 * num_warps), 1..1024
  unsigned shared_mem = 0;  ///< dynamic shared memory, bytes
  unsigned num_ctas = 1;    ///< >= 1
  bool cooperative_grid = false;
  bool pdl = false;
  /// (bound-argument index, Triton signature type) per non-constexpr parameter, in order.
  std::vector<std::pair<int, std::string>> plan;
  int num_scratch_params = 2;  ///< 0, 1 or 2
  uint64_t global_scratch_size = 0;
  uint64_t global_scratch_align = 1;
  uint64_t profile_scratch_size = 0;
  uint64_t profile_scratch_align = 1;
  std::vector<TensorMapFacts> tensor_maps;  ///< one per "nvTmaDesc" plan entry, in order
};

/// Checks `facts` and builds the record they describe (not yet loaded: see load_launch_record).
/// Every index the record's launches read is checked here against `max_args`, the size of the
/// caller's bound-argument array: plan indices, and for each tensor map the descriptor's leaves
/// (descriptor_leaves(rank) slots from its plan index). Throws std::invalid_argument naming the
/// field: an empty or NUL-containing kernel name, a negative device, block_x outside 1..1024,
/// num_ctas 0, num_scratch_params outside 0..2, an unknown parameter type, an index outside
/// [0, max_args), a tensor map count that differs from the plan's, a rank outside 1..5, a data
/// type outside 0..15, an element size outside 1..8 or a swizzle outside 0..3.
std::unique_ptr<LaunchRecord> make_launch_record(const LaunchFacts& facts, int max_args);

/// make_launch_record into a fresh, default-constructed `record` (which is not copyable).
void fill_launch_record(const LaunchFacts& facts, int max_args, LaunchRecord* record);

/// Why `cubin` (`size` bytes) is not an image the driver may be given, or "" when it is one:
/// a little-endian ELF64 image for EM_CUDA whose header tables and sections with contents all
/// lie within `size` bytes (cuModuleLoadData takes no size and reads what the headers say).
std::string cubin_image_problem(const void* cubin, size_t size);

/// What Triton's loader reads of a loaded function (third_party/nvidia/backend/driver.c
/// loadBinary, returned as CompiledKernel.n_regs / n_spills / n_max_threads): the driver's
/// CU_FUNC_ATTRIBUTE_NUM_REGS, LOCAL_SIZE_BYTES and MAX_THREADS_PER_BLOCK.
struct FunctionAttributes {
  int num_regs = 0;               ///< registers per thread
  int local_size_bytes = 0;       ///< local memory per thread, bytes (Triton's n_spills is / 4)
  int max_threads_per_block = 0;  ///< the most threads a block of this function may have
};

/// Loads `cubin` into `device`'s primary context, resolves `record.kernel_name`, and raises the
/// dynamic shared memory limit when `record.shared_mem` exceeds 48 KB. Fills module/function
/// and returns the function's attributes. With `check_param_count`, and a driver that has
/// cuFuncGetParamCount or cuFuncGetParamInfo (CUDA >= 12.4), the function must declare exactly
/// the parameters the record packs (its plan, then its scratch pointers). Throws
/// std::invalid_argument (a malformed image, a parameter count that differs), CudaError (with code
/// ERROR_LAUNCH_OUT_OF_RESOURCES, the driver's answer to such a launch, for a sound binary
/// that needs more shared memory than the device allows or a larger block than the function
/// allows: Triton's CompiledKernel._init_handles raises OutOfResources for both) or
/// DriverUnavailable; leaves nothing loaded on failure.
FunctionAttributes load_launch_record(LaunchRecord& record, const void* cubin, size_t cubin_size,
                                      bool check_param_count = true);

/// Makes `device`'s primary context current for a scope and restores the previous context after
/// (module loading and the benchmark floor use it, leaving the caller's context as it was).
class PrimaryContextScope {
 public:
  explicit PrimaryContextScope(int device);
  ~PrimaryContextScope();
  PrimaryContextScope(const PrimaryContextScope&) = delete;
  PrimaryContextScope& operator=(const PrimaryContextScope&) = delete;
};

/// `device`'s primary context (the one torch uses), retained once per process.
/// Throws CudaError or DriverUnavailable.
CUcontext primary_context(int device);

/// Launches on `device` from a thread that may have another context current: for its scope,
/// makes `device`'s primary context current when another is (restored after), or for good when
/// none is (as the launch path does for a thread that never used the CUDA runtime); nothing
/// when it already is. Throws CudaError or DriverUnavailable.
class DeviceContextScope {
 public:
  explicit DeviceContextScope(int device);
  ~DeviceContextScope();
  DeviceContextScope(const DeviceContextScope&) = delete;
  DeviceContextScope& operator=(const DeviceContextScope&) = delete;

 private:
  bool pushed_ = false;
};

/// Makes `device`'s primary context current on this thread (retained once per device). The
/// launch path calls it only after the driver reports no current context, so a thread that
/// never touched the CUDA runtime still launches, at no cost to the common case.
void make_primary_context_current(int device);

/// Unloads the record's module (best effort; used when a record is dropped).
void unload_launch_record(LaunchRecord& record) noexcept;

}  // namespace fastkernel
