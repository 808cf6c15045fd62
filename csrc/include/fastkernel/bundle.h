// Kernel bundles for C++ callers: compiled specializations exported from Python
// (fastkernel.export) loaded and launched with no Python at run time. Each launch picks the
// entry whose specialization matches the arguments, by Triton's rules.
//
// \code
//   #include <fastkernel/bundle.h>
//   fastkernel::Bundle bundle = fastkernel::Bundle::load("add_bundle");
//   fastkernel::ArgValue args[4] = {fastkernel::pointer_arg(x), fastkernel::pointer_arg(y),
//                                   fastkernel::pointer_arg(out), fastkernel::int_arg(n)};
//   bundle.launch("add_kernel", {blocks, 1, 1}, stream, args, 4);
// \endcode
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "fastkernel/launch_record.h"
#include "fastkernel/specialization.h"
#include "fastkernel/trampoline.h"

namespace fastkernel {

/// The manifest format version Bundle::load reads (its first line: "fastkernel-bundle 2").
inline constexpr int kBundleFormatVersion = 2;

/// The launch facts a manifest "entry" line carries after its kernel name, cubin file, kernel
/// symbol and arch, in this order (LaunchFacts member names; bools written 0 or 1). Exported to
/// the Python writer (fastkernel.export) as `_C.BUNDLE_ENTRY_FACTS`.
inline constexpr std::array<const char*, 10> kBundleEntryFacts = {"block_x",
                                                                  "shared_mem",
                                                                  "num_ctas",
                                                                  "cooperative_grid",
                                                                  "pdl",
                                                                  "num_scratch_params",
                                                                  "global_scratch_size",
                                                                  "global_scratch_align",
                                                                  "profile_scratch_size",
                                                                  "profile_scratch_align"};

/// A device pointer argument (a tensor's data pointer).
ArgValue pointer_arg(uint64_t device_pointer);
/// An integer argument (classified i32 / i64 as Triton does).
ArgValue int_arg(int64_t value);
/// An unsigned integer argument (u64 when >= 2**63, as Triton does).
ArgValue uint_arg(uint64_t value);
/// A floating-point argument.
ArgValue float_arg(double value);
/// A bool argument.
ArgValue bool_arg(bool value);
/// A None argument (an optional pointer left out).
ArgValue none_arg();

/// Thrown when a bundle cannot be read, or a launch matches none (or several) of its entries.
class BundleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// How one runtime argument must look for an entry to apply (Triton's specialization).
struct ArgPattern {
  ArgKind kind = ArgKind::None;                         ///< Tensor, Int, Float, Bool, None
  IntWidth width = IntWidth::I32;                       ///< for Int (unless any_width)
  ValueClass value_class = ValueClass::NotSpecialized;  ///< for Tensor and Int
  bool specialize = true;                               ///< false under do_not_specialize
  bool align = true;  ///< false under do_not_specialize_on_alignment
  /// The parameter's type is annotated: any int fits an int type (and is never "== 1"); an
  /// int or a bool fits a float type, converted as it is packed.
  bool any_width = false;
  std::string type;  ///< Triton's type ("*fp32", "i32", "constexpr"), for messages
};

/// The c10::ScalarType code (its enum value) of the elements a Triton pointer type points to
/// ("*fp32" -> 6, Float), or -1 for a type with no torch dtype (or not a pointer).
int pointee_scalar_type(const std::string& triton_type);

/// One compiled specialization in a bundle, loaded per device on first use.
struct BundleEntry {
  std::string kernel;                ///< the kernel's name
  std::vector<ArgPattern> patterns;  ///< one per runtime (non-constexpr) parameter
  std::string constexprs;            ///< the constexpr values it was compiled with (text)
  std::string cubin_file;
  std::string cubin;       ///< the image
  int arch = 0;            ///< compute capability, e.g. 90
  LaunchFacts facts;       ///< what its records are made from (make_launch_record), device 0
  LaunchRecord prototype;  ///< the record of `facts`, not loaded
  std::map<int, std::unique_ptr<LaunchRecord>> loaded;  ///< by device; written under the lock
  /// loaded[device].get() for devices below 16, published once loaded: a launch reads it
  /// without taking the lock.
  std::array<std::atomic<const LaunchRecord*>, 16> ready{};

  BundleEntry() = default;
  BundleEntry(const BundleEntry&) = delete;
  BundleEntry& operator=(const BundleEntry&) = delete;
  /// Unloads its loaded modules (best effort, as a dropped launch record's).
  ~BundleEntry();

  /// "kernel[arg patterns] {constexprs}" for messages.
  std::string describe() const;
};

/// The kernels of a bundle directory and their entries.
class Bundle {
 public:
  /// Reads `directory`/manifest.txt and the cubins it names (regular files only, no symbolic
  /// links, size-capped) and checks them as `parse` does. A bundle re-exported while it loads
  /// (fastkernel.export removes the replaced manifest's cubins after writing the new manifest)
  /// is loaded from the new manifest when a cubin of the one it read is gone: one export or
  /// the other, whole. Throws BundleError.
  static Bundle load(const std::string& directory);

  /// Returns the bytes of the cubin a manifest names (a plain file name, never a path).
  using CubinReader = std::function<std::string(const std::string& file_name)>;

  /// Parses manifest text (at most 16 MiB) with the cubins `read_cubin` gives, for a bundle
  /// held in memory (embedded in a binary, say). `manifest_path` names the bundle in messages.
  /// Every count, index and number is range-checked, each entry's parameter plan must be
  /// Triton's for its argument patterns, each cubin's ELF headers must lie within it, and each
  /// entry's SHA-256 digest must match its lines and cubin. Throws BundleError; whatever
  /// `read_cubin` throws propagates.
  static Bundle parse(std::string_view manifest, const std::string& manifest_path,
                      const CubinReader& read_cubin);

  /// Launches `kernel` with `args` (its runtime parameters in declared order, constexprs
  /// excluded) on `device` (default 0) and `stream`. Picks the entry matching the arguments;
  /// throws BundleError listing the entries when none or several match. Throws CudaError.
  /// `scalar_types` (optional, one per argument, -1 = unknown): the c10::ScalarType code of
  /// each tensor argument, checked against the entry's pointer types (see fastkernel/torch.h).
  /// An entry that needs scratch buffers (BundleEntry::prototype.needs_scratch()) takes them as
  /// `global_scratch` / `profile_scratch`: grid CTAs x num_ctas x the per-CTA size, aligned as
  /// the prototype says (fastkernel/torch.h allocates them); BundleError if one is missing.
  /// Safe to call from several threads.
  void launch(const std::string& kernel, const LaunchGrid& grid, CUstream stream,
              const ArgValue* args, size_t num_args, int device = 0,
              const int* scalar_types = nullptr, CUdeviceptr global_scratch = 0,
              CUdeviceptr profile_scratch = 0);

  /// Launches an entry chosen by select() with the same `num_args` arguments (as launch()
  /// does after choosing it), in `device`'s primary context (made current for the launch when
  /// the thread has another; DeviceContextScope). Throws BundleError for another count of
  /// arguments than the entry's, an argument without the entry's specialization (`matches`),
  /// a missing or misaligned scratch buffer, or a moved-from bundle; ParamError (its message
  /// naming the entry and the argument's index) for a value its parameter type cannot hold.
  void launch_entry(BundleEntry& entry, const LaunchGrid& grid, CUstream stream,
                    const ArgValue* args, size_t num_args, int device = 0,
                    CUdeviceptr global_scratch = 0, CUdeviceptr profile_scratch = 0);

  /// The one entry of `kernel` matching `args`; throws BundleError listing the entries when
  /// none or several match.
  BundleEntry& select(const std::string& kernel, const ArgValue* args, size_t num_args,
                      const int* scalar_types = nullptr);

  /// Whether an entry's patterns accept `args` (and `scalar_types`, when given).
  static bool matches(const BundleEntry& entry, const ArgValue* args, size_t num_args,
                      const int* scalar_types = nullptr);

  /// The entries, for listing.
  const std::vector<std::unique_ptr<BundleEntry>>& entries() const { return entries_; }

  /// Every entry, or those of `kernel`, each as BundleEntry::describe() gives it, in manifest
  /// order: what a mismatch error lists.
  std::vector<std::string> describe_entries() const;
  std::vector<std::string> describe_entries(const std::string& kernel) const;

 private:
  std::vector<std::unique_ptr<BundleEntry>> entries_;
  std::unique_ptr<std::mutex> load_mutex_ = std::make_unique<std::mutex>();  ///< guards `loaded`
};

}  // namespace fastkernel
