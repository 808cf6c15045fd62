// Reads a kernel bundle (manifest.txt plus cubins, written by fastkernel.export), matches a
// C++ call's arguments against each entry's specialization with Triton's rules, and launches
// the matching entry through the trampoline.
#include "fastkernel/bundle.h"

#include "sha256.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace fastkernel {
namespace {

constexpr std::string_view kMagic = "fastkernel-bundle";
// Bounds on what a manifest may ask for: a bundle is read as untrusted input.
constexpr size_t kMaxManifestBytes = size_t(16) << 20;
constexpr size_t kMaxCubinBytes = size_t(256) << 20;
// How many manifests Bundle::load reads of a bundle re-exported while it loads.
constexpr int kMaxLoadAttempts = 8;
constexpr size_t kMaxBundleCubinBytes = size_t(1) << 30;
constexpr uint64_t kMaxArgs = 4096;
constexpr uint64_t kMaxScratchPerCta = uint64_t(1) << 32;
constexpr uint64_t kMaxScratchAlign = uint64_t(1) << 20;

// Closes a file descriptor on scope exit.
struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

// Thrown by read_regular_file for a file that does not exist.
class MissingFile : public BundleError {
 public:
  MissingFile(const std::string& message, std::string path)
      : BundleError(message), path(std::move(path)) {}
  std::string path;  ///< the file missing
};

// The whole of `path`, which must be a regular file (not a symbolic link, FIFO or device) of at
// most `limit` bytes. Plain POSIX reads: nothing here depends on the C++ stream library, whose
// locale state is per copy of libstdc++ and breaks when a toolchain links a private copy in.
// Throws MissingFile when there is no such file, BundleError for the rest.
std::string read_regular_file(const std::string& path, size_t limit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    std::string message =
        "fastkernel: cannot read '" + path +
        "': " + (err == ELOOP ? std::string("it is a symbolic link") : std::strerror(err));
    if (err == ENOENT) {
      throw MissingFile(message, path);
    }
    throw BundleError(message);
  }
  FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    throw BundleError("fastkernel: cannot read '" + path + "': not a regular file");
  }
  if (st.st_size < 0 || uint64_t(st.st_size) > limit) {
    throw BundleError("fastkernel: '" + path + "' is " + std::to_string(st.st_size) +
                      " bytes, over the limit of " + std::to_string(limit));
  }
  std::string data(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd, &data[got], data.size() - got);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      break;
    }
    got += size_t(n);
  }
  char extra = 0;
  if (got != data.size() || ::read(fd, &extra, 1) != 0) {
    throw BundleError("fastkernel: '" + path + "' changed size while it was read");
  }
  return data;
}

// A file name inside the bundle directory: no directory part, not "." or "..".
bool safe_file_name(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == std::string::npos;
}

// The whitespace-separated fields of one manifest line, parsed without locales or streams.
class Fields {
 public:
  explicit Fields(std::string_view line) : rest_(line) {}

  std::string_view next() {
    skip_space();
    size_t n = 0;
    while (n < rest_.size() && !is_space(rest_[n])) {
      ++n;
    }
    const std::string_view field = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return field;
  }

  bool done() {
    skip_space();
    return rest_.empty();
  }

  /// The rest of the line, without surrounding whitespace.
  std::string_view rest() {
    skip_space();
    while (!rest_.empty() && is_space(rest_.back())) {
      rest_.remove_suffix(1);
    }
    const std::string_view all = rest_;
    rest_ = {};
    return all;
  }

  template <typename Fail>
  std::string name(const Fail& fail, const char* what) {
    const std::string_view field = next();
    if (field.empty()) {
      fail(std::string("missing ") + what);
    }
    return std::string(field);
  }

  /// A decimal integer in [lo, hi]; anything else (signs, hex, overflow, junk) fails.
  template <typename Fail>
  uint64_t number(const Fail& fail, const char* what, uint64_t lo, uint64_t hi) {
    const std::string_view field = next();
    uint64_t value = 0;
    const char* end = field.data() + field.size();
    const auto [ptr, ec] = std::from_chars(field.data(), end, value);
    if (field.empty() || ec != std::errc() || ptr != end) {
      fail(std::string(what) + " '" + std::string(field) + "' is not a non-negative integer");
    }
    if (value < lo || value > hi) {
      fail(std::string(what) + " " + std::to_string(value) + " is outside [" + std::to_string(lo) +
           ", " + std::to_string(hi) + "]");
    }
    return value;
  }

  template <typename Fail>
  uint64_t power_of_two(const Fail& fail, const char* what) {
    const uint64_t value = number(fail, what, 1, kMaxScratchAlign);
    if ((value & (value - 1)) != 0) {
      fail(std::string(what) + " " + std::to_string(value) + " is not a power of two");
    }
    return value;
  }

 private:
  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }
  void skip_space() {
    while (!rest_.empty() && is_space(rest_.front())) {
      rest_.remove_prefix(1);
    }
  }
  std::string_view rest_;
};

bool plan_type_fits(ArgKind kind, ParamType t) {
  switch (kind) {
    case ArgKind::Tensor:
      return t == ParamType::Pointer;
    case ArgKind::Int:
      return t == ParamType::I8 || t == ParamType::I16 || t == ParamType::I32 ||
             t == ParamType::I64 || t == ParamType::U8 || t == ParamType::U16 ||
             t == ParamType::U32 || t == ParamType::U64;
    case ArgKind::Float:
      return t == ParamType::FP16 || t == ParamType::BF16 || t == ParamType::FP32 ||
             t == ParamType::FP64;
    case ArgKind::Bool:
      return t == ParamType::I1 || t == ParamType::U1;
    default:
      return false;
  }
}

// The parameter plan must be exactly Triton's for the entry's argument patterns: every runtime
// argument that is not specialized away (None, an int == 1), once, in declared order, with a
// type of its kind. So a launch never reads an argument past the call's, and never packs fewer
// or other parameters than the patterns describe.
template <typename Fail>
void check_plan(const BundleEntry& entry, const Fail& fail) {
  const std::vector<PackSlot>& plan = entry.prototype.plan;
  size_t slot = 0;
  for (size_t i = 0; i < entry.patterns.size(); ++i) {
    const ArgPattern& p = entry.patterns[i];
    if (p.kind == ArgKind::None ||
        (p.kind == ArgKind::Int && p.value_class == ValueClass::EqualsOne)) {
      continue;
    }
    if (slot >= plan.size() || plan[slot].arg_index != i) {
      fail("the parameter plan does not pass argument " + std::to_string(i) +
           " where the argument patterns need it");
    }
    if (!plan_type_fits(p.kind, plan[slot].type)) {
      fail("the parameter plan's type for argument " + std::to_string(i) +
           " does not fit its pattern '" + p.type + "'");
    }
    ++slot;
  }
  if (slot != plan.size()) {
    fail("the parameter plan has " + std::to_string(plan.size()) +
         " parameters; the argument patterns make " + std::to_string(slot));
  }
  if (plan.size() + 2 > size_t(kMaxLaunchParams)) {
    fail("the parameter plan has " + std::to_string(plan.size()) + " parameters; a launch packs " +
         "at most " + std::to_string(kMaxLaunchParams - 2) + " besides the scratch pointers");
  }
}

bool parse_type(const std::string& type, ParamType* out) { return parse_param_type(type, out); }

// The runtime value a pattern check needs: kind, width and class of one argument.
bool arg_matches(const ArgPattern& p, const ArgValue& v) {
  if (p.kind != v.kind) {
    // A parameter annotated with a float type takes an int or a bool too: the launch converts
    // it, as Triton's launcher does (the annotation fixes the type; floats are never keyed).
    return p.kind == ArgKind::Float && p.any_width &&
           (v.kind == ArgKind::Int || v.kind == ArgKind::Bool);
  }
  switch (v.kind) {
    case ArgKind::Tensor:
      return pointer_class(v.u, p.specialize, p.align) == p.value_class;
    case ArgKind::Int: {
      const uint64_t bits = v.u;
      // Triton never makes an annotated int equal to 1 a constant (its type is the annotation's).
      const bool is_one = !p.any_width && v.width != IntWidth::U64 && v.i == 1;
      if (!p.any_width && v.width != p.width &&
          int_class(bits, is_one, p.specialize, p.align) != ValueClass::EqualsOne) {
        return false;
      }
      return int_class(bits, is_one, p.specialize, p.align) == p.value_class;
    }
    default:
      return true;
  }
}

// Triton's names of torch dtypes (triton/runtime/jit.py, mangle_type / the dtype map) and
// c10::ScalarType's enum values (c10/core/ScalarType.h; stable, checked in fastkernel/torch.h).
struct PointeeType {
  const char* triton;
  int scalar_type;
};
constexpr PointeeType kPointeeTypes[] = {
    {"u8", 0},        {"i8", 1},       {"i16", 2},  {"i32", 3},   {"i64", 4},    {"fp16", 5},
    {"fp32", 6},      {"fp64", 7},     {"i1", 11},  {"bf16", 15}, {"fp8e5", 23}, {"fp8e4nv", 24},
    {"fp8e5b16", 25}, {"fp8e4b8", 26}, {"u16", 27}, {"u32", 28},  {"u64", 29},
};

const char* kind_name(ArgKind kind) {
  switch (kind) {
    case ArgKind::Tensor:
      return "pointer";
    case ArgKind::Int:
      return "int";
    case ArgKind::Float:
      return "float";
    case ArgKind::Bool:
      return "bool";
    default:
      return "None";
  }
}

}  // namespace

ArgValue pointer_arg(uint64_t device_pointer) {
  ArgValue v{};
  v.kind = ArgKind::Tensor;
  v.u = device_pointer;
  return v;
}

ArgValue int_arg(int64_t value) {
  ArgValue v{};
  v.kind = ArgKind::Int;
  v.i = value;
  v.width = signed_width(value);
  return v;
}

ArgValue uint_arg(uint64_t value) {
  if (value <= uint64_t(INT64_MAX)) {
    return int_arg(int64_t(value));
  }
  ArgValue v{};
  v.kind = ArgKind::Int;
  v.u = value;
  v.width = IntWidth::U64;
  return v;
}

ArgValue float_arg(double value) {
  ArgValue v{};
  v.kind = ArgKind::Float;
  v.d = value;
  return v;
}

ArgValue bool_arg(bool value) {
  ArgValue v{};
  v.kind = ArgKind::Bool;
  v.i = value ? 1 : 0;
  return v;
}

ArgValue none_arg() {
  ArgValue v{};
  v.kind = ArgKind::None;
  return v;
}

std::string BundleEntry::describe() const {
  std::string text = kernel + "[";
  for (size_t i = 0; i < patterns.size(); ++i) {
    text += (i ? ", " : "") + patterns[i].type;
    if (patterns[i].value_class == ValueClass::Divisible16) {
      text += " %16";
    } else if (patterns[i].value_class == ValueClass::EqualsOne) {
      text += " ==1";
    }
  }
  return text + "] {" + constexprs + "} sm_" + std::to_string(arch);
}

namespace {

// The descriptions of `entries`, of those of `kernel` only when it is not null.
std::vector<std::string> describe_each(const std::vector<std::unique_ptr<BundleEntry>>& entries,
                                       const std::string* kernel) {
  std::vector<std::string> described;
  for (const auto& e : entries) {
    if (kernel == nullptr || e->kernel == *kernel) {
      described.push_back(e->describe());
    }
  }
  return described;
}

}  // namespace

std::vector<std::string> Bundle::describe_entries() const {
  return describe_each(entries_, nullptr);
}

std::vector<std::string> Bundle::describe_entries(const std::string& kernel) const {
  return describe_each(entries_, &kernel);
}

Bundle Bundle::load(const std::string& directory) {
  if (directory.empty()) {
    throw BundleError("fastkernel: Bundle::load: the bundle directory is empty");
  }
  const std::string manifest_path = directory + "/manifest.txt";
  const auto read_cubin = [&directory](const std::string& file_name) {
    return read_regular_file(directory + "/" + file_name, kMaxCubinBytes);
  };
  std::string manifest = read_regular_file(manifest_path, kMaxManifestBytes);
  for (int attempt = 1;; ++attempt) {
    try {
      return parse(manifest, manifest_path, read_cubin);
    } catch (const MissingFile& missing) {
      // fastkernel.export writes a bundle's new cubins, then replaces its manifest atomically,
      // then removes the cubins of the manifest it replaced: a cubin named by a manifest that
      // has since been replaced can be gone. The new manifest's cubins were written before it.
      // A manifest read again unchanged, its cubin still absent, means the cubin is missing
      // (present again, the bundle went back to that manifest meanwhile), and so does a
      // manifest that keeps changing past kMaxLoadAttempts.
      if (attempt == kMaxLoadAttempts) {
        throw;
      }
      std::string again = read_regular_file(manifest_path, kMaxManifestBytes);
      struct stat st {};
      if (again == manifest && ::lstat(missing.path.c_str(), &st) != 0) {
        throw;
      }
      manifest = std::move(again);
    }
  }
}

Bundle Bundle::parse(std::string_view text, const std::string& manifest_path,
                     const CubinReader& read_cubin) {
  if (text.size() > kMaxManifestBytes) {
    throw BundleError("fastkernel: " + manifest_path + " is " + std::to_string(text.size()) +
                      " bytes, over the limit of " + std::to_string(kMaxManifestBytes));
  }
  Bundle bundle;
  BundleEntry* entry = nullptr;  // the entry being read, until its "end" line
  size_t line_number = 0;
  size_t begin = 0;
  size_t cubin_bytes = 0;
  std::string entry_text;    // the current entry's lines up to its digest line
  bool digest_seen = false;  // the current entry's digest line was read and verified
  while (begin < text.size()) {
    size_t stop = text.find('\n', begin);
    if (stop == std::string::npos) {
      stop = text.size();
    }
    const std::string_view line(text.data() + begin, stop - begin);
    begin = stop + 1;
    ++line_number;
    auto fail = [&](const std::string& why) -> void {
      throw BundleError("fastkernel: " + manifest_path + " line " + std::to_string(line_number) +
                        ": " + why);
    };
    if (line.find('\0') != std::string_view::npos) {
      fail("contains a NUL byte");
    }
    Fields fields(line);
    if (line_number == 1) {
      const std::string_view magic = fields.next();
      const std::string_view version = fields.next();
      if (magic == kMagic && version == "1") {
        throw BundleError("fastkernel: '" + manifest_path +
                          "' is a version-1 kernel bundle, whose "
                          "entries carry no digest: export it again (fastkernel.export)");
      }
      if (magic != kMagic || version != std::to_string(kBundleFormatVersion) || !fields.done()) {
        throw BundleError("fastkernel: '" + manifest_path + "' is not a version-2 kernel bundle");
      }
      continue;
    }

    const std::string_view tag = fields.next();
    if (tag.empty()) {
      continue;
    }
    if (digest_seen && tag != "end") {
      fail("'" + std::string(tag) + "' after the entry's digest (only 'end' may follow it)");
    }
    if (entry != nullptr && tag != "digest" && tag != "end") {
      entry_text.append(line);  // what the entry's digest covers, byte for byte
      entry_text.push_back('\n');
    }
    if (tag == "entry") {
      if (entry != nullptr) {
        fail("'entry' before the previous entry's 'end'");
      }
      auto e = std::make_unique<BundleEntry>();
      LaunchFacts& r = e->facts;
      e->kernel = fields.name(fail, "kernel");
      e->cubin_file = fields.name(fail, "cubin file");
      r.kernel_name = fields.name(fail, "kernel symbol");
      e->arch = int(fields.number(fail, "arch", 1, 10000));
      r.block_x = unsigned(fields.number(fail, "block_x", 1, 1024));
      r.shared_mem = unsigned(fields.number(fail, "shared_mem", 0, UINT32_MAX));
      r.num_ctas = unsigned(fields.number(fail, "num_ctas", 1, 16));
      r.cooperative_grid = fields.number(fail, "cooperative_grid", 0, 1) != 0;
      r.pdl = fields.number(fail, "pdl", 0, 1) != 0;
      r.num_scratch_params = int(fields.number(fail, "num_scratch_params", 0, 2));
      r.global_scratch_size = fields.number(fail, "global_scratch_size", 0, kMaxScratchPerCta);
      r.global_scratch_align = fields.power_of_two(fail, "global_scratch_align");
      r.profile_scratch_size = fields.number(fail, "profile_scratch_size", 0, kMaxScratchPerCta);
      r.profile_scratch_align = fields.power_of_two(fail, "profile_scratch_align");
      if (!fields.done()) {
        fail("malformed entry line: extra fields");
      }
      if (!safe_file_name(e->cubin_file)) {
        fail("cubin file '" + e->cubin_file + "' is not a plain file name in the bundle directory");
      }
      e->cubin = read_cubin(e->cubin_file);
      if (e->cubin.size() > kMaxCubinBytes) {
        fail("cubin '" + e->cubin_file + "' is over the limit of " +
             std::to_string(kMaxCubinBytes) + " bytes");
      }
      cubin_bytes += e->cubin.size();
      if (cubin_bytes > kMaxBundleCubinBytes) {
        fail("the bundle's cubins exceed " + std::to_string(kMaxBundleCubinBytes) + " bytes");
      }
      const std::string problem = cubin_image_problem(e->cubin.data(), e->cubin.size());
      if (!problem.empty()) {
        fail("cubin '" + e->cubin_file + "' " + problem);
      }
      entry = e.get();
      bundle.entries_.push_back(std::move(e));
      entry_text.assign(line);
      entry_text.push_back('\n');
    } else if (entry == nullptr) {
      fail("'" + std::string(tag) + "' outside an entry");
    } else if (tag == "constexprs") {
      entry->constexprs = std::string(fields.rest());
    } else if (tag == "arg") {
      if (entry->patterns.size() >= kMaxArgs) {
        fail("more than " + std::to_string(kMaxArgs) + " arguments");
      }
      ArgPattern p;
      p.kind =
          ArgKind(fields.number(fail, "kind", uint64_t(ArgKind::Tensor), uint64_t(ArgKind::None)));
      p.width = IntWidth(fields.number(fail, "width", 0, uint64_t(IntWidth::U64)));
      p.value_class = ValueClass(fields.number(fail, "class", 0, uint64_t(ValueClass::EqualsOne)));
      p.specialize = fields.number(fail, "specialize", 0, 1) != 0;
      p.align = fields.number(fail, "align", 0, 1) != 0;
      p.any_width = fields.number(fail, "any_width", 0, 1) != 0;
      p.type = fields.name(fail, "type");
      if (!fields.done()) {
        fail("malformed arg line: extra fields");
      }
      entry->patterns.push_back(std::move(p));
    } else if (tag == "plan") {
      const uint64_t index = fields.number(fail, "plan index", 0, kMaxArgs - 1);
      const std::string type = fields.name(fail, "plan type");
      ParamType pt;
      if (!parse_type(type, &pt) || pt == ParamType::TensorMap || !fields.done()) {
        fail("malformed plan line");
      }
      entry->facts.plan.push_back({int(index), type});
    } else if (tag == "digest") {
      const std::string_view recorded = fields.next();
      if (recorded.size() != 64 || !fields.done()) {
        fail("malformed digest line");
      }
      Sha256 digest;
      digest.update(entry_text);
      digest.update(entry->cubin);
      if (digest.hex_digest() != recorded) {
        fail("entry '" + entry->kernel + "' (cubin '" + entry->cubin_file +
             "') does not match "
             "its digest: the manifest lines or the cubin were changed after export");
      }
      digest_seen = true;
    } else if (tag == "end") {
      if (!fields.done()) {
        fail("malformed end line");
      }
      if (!digest_seen) {
        fail("entry '" + entry->kernel + "' has no digest line");
      }
      // The same checks as a Python registration's (make_launch_record), with the entry's
      // arguments as the bound-argument array every plan index must fall in.
      try {
        fill_launch_record(entry->facts, int(entry->patterns.size()), &entry->prototype);
      } catch (const std::invalid_argument& e) {
        const std::string_view what = e.what();
        fail(std::string(what.substr(what.rfind("fastkernel: ", 0) == 0 ? 12 : 0)));
      }
      check_plan(*entry, fail);
      entry = nullptr;
      digest_seen = false;
    } else {
      fail("unknown line '" + std::string(tag) + "'");
    }
  }
  if (line_number == 0) {
    throw BundleError("fastkernel: '" + manifest_path + "' is not a version-2 kernel bundle");
  }
  if (entry != nullptr) {
    throw BundleError("fastkernel: " + manifest_path +
                      ": the last entry has no 'end' line "
                      "(the manifest is truncated)");
  }
  return bundle;
}

int pointee_scalar_type(const std::string& triton_type) {
  if (triton_type.empty() || triton_type[0] != '*') {
    return -1;
  }
  for (const PointeeType& t : kPointeeTypes) {
    if (triton_type.compare(1, std::string::npos, t.triton) == 0) {
      return t.scalar_type;
    }
  }
  return -1;
}

namespace {

// The index of the first of `num_args` arguments (as many as the entry's patterns) that the
// entry's patterns (and `scalar_types`, when given) do not accept, or num_args when all fit.
size_t first_mismatch(const BundleEntry& entry, const ArgValue* args, size_t num_args,
                      const int* scalar_types) {
  for (size_t i = 0; i < num_args; ++i) {
    if (!arg_matches(entry.patterns[i], args[i])) {
      return i;
    }
    if (scalar_types != nullptr && scalar_types[i] >= 0 && args[i].kind == ArgKind::Tensor) {
      const int expected = pointee_scalar_type(entry.patterns[i].type);
      if (expected >= 0 && expected != scalar_types[i]) {
        return i;
      }
    }
  }
  return num_args;
}

}  // namespace

bool Bundle::matches(const BundleEntry& entry, const ArgValue* args, size_t num_args,
                     const int* scalar_types) {
  return entry.patterns.size() == num_args &&
         first_mismatch(entry, args, num_args, scalar_types) == num_args;
}

BundleEntry& Bundle::select(const std::string& kernel, const ArgValue* args, size_t num_args,
                            const int* scalar_types) {
  BundleEntry* chosen = nullptr;
  int found = 0;
  for (auto& e : entries_) {
    if (e->kernel == kernel && matches(*e, args, num_args, scalar_types)) {
      chosen = e.get();
      ++found;
    }
  }
  if (found == 1) {
    return *chosen;
  }
  std::string listing;
  for (const std::string& entry : describe_entries(kernel)) {
    listing += "\n  " + entry;
  }
  std::string call = kernel + "(";
  for (size_t i = 0; i < num_args; ++i) {
    call += (i ? ", " : "") + std::string(kind_name(args[i].kind));
  }
  throw BundleError(
      "fastkernel: " + std::string(found ? "several entries match " : "no entry matches ") + call +
      ")" + (listing.empty() ? " (the bundle has no such kernel)" : "; the bundle has:" + listing));
}

namespace {

// Loads `entry` on `device` once (under `mutex`) and returns its record.
const LaunchRecord* load_entry(BundleEntry& entry, int device, std::mutex& mutex) {
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<LaunchRecord>& record = entry.loaded[device];
  if (!record) {
    LaunchFacts facts = entry.facts;
    facts.device = device;
    std::unique_ptr<LaunchRecord> r;
    try {
      r = make_launch_record(facts, int(entry.patterns.size()));
    } catch (const std::invalid_argument& e) {
      throw BundleError(e.what());
    }
    load_launch_record(*r, entry.cubin.data(), entry.cubin.size());
    record = std::move(r);
    if (device >= 0 && size_t(device) < entry.ready.size()) {
      entry.ready[size_t(device)].store(record.get(), std::memory_order_release);
    }
  }
  return record.get();  // never dropped while the bundle lives
}

}  // namespace

void Bundle::launch(const std::string& kernel, const LaunchGrid& grid, CUstream stream,
                    const ArgValue* args, size_t num_args, int device, const int* scalar_types,
                    CUdeviceptr global_scratch, CUdeviceptr profile_scratch) {
  launch_entry(select(kernel, args, num_args, scalar_types), grid, stream, args, num_args, device,
               global_scratch, profile_scratch);
}

void Bundle::launch_entry(BundleEntry& entry, const LaunchGrid& grid, CUstream stream,
                          const ArgValue* args, size_t num_args, int device,
                          CUdeviceptr global_scratch, CUdeviceptr profile_scratch) {
  if (!load_mutex_) {
    throw BundleError("fastkernel: launch_entry on a moved-from Bundle");
  }
  // The plan reads args[i] for i < patterns.size() (checked at load): the call must hold them.
  if (num_args != entry.patterns.size()) {
    throw BundleError("fastkernel: " + entry.describe() + " takes " +
                      std::to_string(entry.patterns.size()) + " arguments, got " +
                      std::to_string(num_args));
  }
  // The binary assumes its specialization (pointer alignment, ints divisible by 16 or equal
  // to 1): arguments without it would run it on values it was not compiled for.
  if (const size_t i = first_mismatch(entry, args, num_args, nullptr); i < num_args) {
    throw BundleError("fastkernel: argument " + std::to_string(i) + " (a " +
                      kind_name(args[i].kind) + ") does not have the specialization of " +
                      entry.describe());
  }
  const LaunchRecord& p = entry.prototype;
  if (p.needs_scratch() && grid.x != 0 && grid.y != 0 && grid.z != 0) {
    const auto check = [&](const char* which, CUdeviceptr buffer, uint64_t size, uint64_t align) {
      if (size == 0) {
        return;
      }
      if (buffer == 0 || buffer % align != 0) {
        throw BundleError("fastkernel: " + entry.describe() + " needs a " + which +
                          " scratch buffer of " + std::to_string(size) +
                          " bytes per CTA (aligned to " + std::to_string(align) + "), got " +
                          (buffer == 0 ? std::string("none") : "a misaligned one") +
                          ": pass one, or launch through fastkernel/torch.h, which allocates it");
      }
    };
    check("global", global_scratch, p.global_scratch_size, p.global_scratch_align);
    check("profile", profile_scratch, p.profile_scratch_size, p.profile_scratch_align);
  }
  const LaunchRecord* record = nullptr;
  if (device >= 0 && size_t(device) < entry.ready.size()) {
    record = entry.ready[size_t(device)].load(std::memory_order_acquire);
  }
  if (record == nullptr) {
    record = load_entry(entry, device, *load_mutex_);
  }
  // The record's module lives in `device`'s primary context: launch there, whatever context
  // the calling thread has current (restored after).
  const DeviceContextScope scope(device);
  try {
    fastkernel::launch(*record, grid, stream, args, global_scratch, profile_scratch);
  } catch (const ParamError& e) {
    throw ParamError(e.arg_index, e.overflow,
                     "fastkernel: " + entry.describe() + ", argument " +
                         std::to_string(e.arg_index) + ": " + e.what());
  }
}

BundleEntry::~BundleEntry() {
  for (auto& [device, record] : loaded) {
    if (record) {
      unload_launch_record(*record);
    }
  }
}

}  // namespace fastkernel
