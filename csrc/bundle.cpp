// Reads a kernel bundle (manifest.txt plus cubins, written by fastkernel.export), matches a
// C++ call's arguments against each entry's specialization with Triton's rules, and launches
// the matching entry through the trampoline.
#include "fastkernel/bundle.h"

#include <fstream>
#include <sstream>

namespace fastkernel {
namespace {

constexpr const char* kMagic = "fastkernel-bundle";
constexpr int kVersion = 1;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw BundleError("fastkernel: cannot read '" + path + "'");
  }
  std::ostringstream data;
  data << in.rdbuf();
  return data.str();
}

bool parse_type(const std::string& type, ParamType* out) { return parse_param_type(type, out); }

// The runtime value a pattern check needs: kind, width and class of one argument.
bool arg_matches(const ArgPattern& p, const ArgValue& v) {
  if (p.kind != v.kind) {
    return false;
  }
  switch (v.kind) {
    case ArgKind::Tensor:
      return pointer_class(v.u, p.specialize, p.align) == p.value_class;
    case ArgKind::Int: {
      const uint64_t bits = v.u;
      const bool is_one = v.width != IntWidth::U64 && v.i == 1;
      if (!p.any_width && v.width != p.width && int_class(bits, is_one, p.specialize, p.align) !=
                                                    ValueClass::EqualsOne) {
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
    {"u8", 0},       {"i8", 1},        {"i16", 2},      {"i32", 3},         {"i64", 4},
    {"fp16", 5},     {"fp32", 6},      {"fp64", 7},     {"i1", 11},         {"bf16", 15},
    {"fp8e5", 23},   {"fp8e4nv", 24},  {"fp8e5b16", 25}, {"fp8e4b8", 26},   {"u16", 27},
    {"u32", 28},     {"u64", 29},
};

const char* kind_name(ArgKind kind) {
  switch (kind) {
    case ArgKind::Tensor: return "pointer";
    case ArgKind::Int: return "int";
    case ArgKind::Float: return "float";
    case ArgKind::Bool: return "bool";
    default: return "None";
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

Bundle Bundle::load(const std::string& directory) {
  std::istringstream manifest(read_file(directory + "/manifest.txt"));
  Bundle bundle;
  std::string line, magic;
  int version = 0;
  if (!std::getline(manifest, line) || !(std::istringstream(line) >> magic >> version) ||
      magic != kMagic || version != kVersion) {
    throw BundleError("fastkernel: '" + directory + "' is not a version-1 kernel bundle");
  }
  BundleEntry* entry = nullptr;
  int line_number = 1;
  while (std::getline(manifest, line)) {
    ++line_number;
    std::istringstream in(line);
    std::string tag;
    if (!(in >> tag)) {
      continue;
    }
    auto fail = [&](const std::string& why) {
      throw BundleError("fastkernel: " + directory + "/manifest.txt line " +
                        std::to_string(line_number) + ": " + why);
    };
    if (tag == "entry") {
      auto e = std::make_unique<BundleEntry>();
      LaunchRecord& r = e->prototype;
      unsigned coop = 0, pdl = 0;
      if (!(in >> e->kernel >> e->cubin_file >> r.kernel_name >> e->arch >> r.block_x >>
            r.shared_mem >> r.num_ctas >> coop >> pdl >> r.num_scratch_params >>
            r.global_scratch_size >> r.global_scratch_align >> r.profile_scratch_size >>
            r.profile_scratch_align)) {
        fail("malformed entry line");
      }
      const auto power_of_two = [](uint64_t a) { return a != 0 && (a & (a - 1)) == 0; };
      if (!power_of_two(r.global_scratch_align) || !power_of_two(r.profile_scratch_align)) {
        fail("scratch alignments must be powers of two");
      }
      r.cooperative_grid = coop != 0;
      r.pdl = pdl != 0;
      e->cubin = read_file(directory + "/" + e->cubin_file);
      entry = e.get();
      bundle.entries_.push_back(std::move(e));
    } else if (entry == nullptr) {
      fail("'" + tag + "' before any entry");
    } else if (tag == "constexprs") {
      std::getline(in >> std::ws, entry->constexprs);
    } else if (tag == "arg") {
      ArgPattern p;
      int kind = 0, width = 0, cls = 0, specialize = 1, align = 1, any_width = 0;
      if (!(in >> kind >> width >> cls >> specialize >> align >> any_width >> p.type)) {
        fail("malformed arg line");
      }
      p.kind = ArgKind(kind);
      p.width = IntWidth(width);
      p.value_class = ValueClass(cls);
      p.specialize = specialize != 0;
      p.align = align != 0;
      p.any_width = any_width != 0;
      entry->patterns.push_back(p);
    } else if (tag == "plan") {
      int index = 0;
      std::string type;
      ParamType pt;
      if (!(in >> index >> type) || !parse_type(type, &pt) || index < 0) {
        fail("malformed plan line");
      }
      entry->prototype.plan.push_back({uint16_t(index), pt});
    } else if (tag != "end") {
      fail("unknown line '" + tag + "'");
    }
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

bool Bundle::matches(const BundleEntry& entry, const ArgValue* args, size_t num_args,
                     const int* scalar_types) {
  if (entry.patterns.size() != num_args) {
    return false;
  }
  for (size_t i = 0; i < num_args; ++i) {
    if (!arg_matches(entry.patterns[i], args[i])) {
      return false;
    }
    if (scalar_types != nullptr && scalar_types[i] >= 0 && args[i].kind == ArgKind::Tensor) {
      const int expected = pointee_scalar_type(entry.patterns[i].type);
      if (expected >= 0 && expected != scalar_types[i]) {
        return false;
      }
    }
  }
  return true;
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
  for (auto& e : entries_) {
    if (e->kernel == kernel) {
      listing += "\n  " + e->describe();
    }
  }
  std::string call = kernel + "(";
  for (size_t i = 0; i < num_args; ++i) {
    call += (i ? ", " : "") + std::string(kind_name(args[i].kind));
  }
  throw BundleError("fastkernel: " + std::string(found ? "several entries match " : "no entry matches ") +
                    call + ")" + (listing.empty() ? " (the bundle has no such kernel)"
                                                  : "; the bundle has:" + listing));
}

namespace {

// Loads `entry` on `device` once (under `mutex`) and returns its record.
const LaunchRecord* load_entry(BundleEntry& entry, int device, std::mutex& mutex) {
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<LaunchRecord>& record = entry.loaded[device];
  if (!record) {
    auto r = std::make_unique<LaunchRecord>();
    const LaunchRecord& p = entry.prototype;
    r->kernel_name = p.kernel_name;
    r->profile_name = "fastkernel::" + p.kernel_name;
    r->device = device;
    r->block_x = p.block_x;
    r->shared_mem = p.shared_mem;
    r->num_ctas = p.num_ctas;
    r->cooperative_grid = p.cooperative_grid;
    r->pdl = p.pdl;
    r->plan = p.plan;
    r->num_scratch_params = p.num_scratch_params;
    r->global_scratch_size = p.global_scratch_size;
    r->global_scratch_align = p.global_scratch_align;
    r->profile_scratch_size = p.profile_scratch_size;
    r->profile_scratch_align = p.profile_scratch_align;
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
  launch_entry(select(kernel, args, num_args, scalar_types), grid, stream, args, device,
               global_scratch, profile_scratch);
}

void Bundle::launch_entry(BundleEntry& entry, const LaunchGrid& grid, CUstream stream,
                          const ArgValue* args, int device, CUdeviceptr global_scratch,
                          CUdeviceptr profile_scratch) {
  const LaunchRecord& p = entry.prototype;
  if (p.needs_scratch() && grid.x != 0 && grid.y != 0 && grid.z != 0) {
    const auto missing = [&](const char* which, uint64_t size, uint64_t align) {
      throw BundleError("fastkernel: " + entry.describe() + " needs a " + which +
                        " scratch buffer of " + std::to_string(size) + " bytes per CTA (aligned to " +
                        std::to_string(align) + "): pass one, or launch through "
                        "fastkernel/torch.h, which allocates it");
    };
    if (p.global_scratch_size > 0 && global_scratch == 0) {
      missing("global", p.global_scratch_size, p.global_scratch_align);
    }
    if (p.profile_scratch_size > 0 && profile_scratch == 0) {
      missing("profile", p.profile_scratch_size, p.profile_scratch_align);
    }
  }
  const LaunchRecord* record = nullptr;
  if (device >= 0 && size_t(device) < entry.ready.size()) {
    record = entry.ready[size_t(device)].load(std::memory_order_acquire);
  }
  if (record == nullptr) {
    record = load_entry(entry, device, *load_mutex_);
  }
  fastkernel::launch(*record, grid, stream, args, global_scratch, profile_scratch);
}

}  // namespace fastkernel
