// libFuzzer target: a bundle manifest (fastkernel::Bundle::parse), with the cubins it may name
// held in memory. Before parsing, each entry's "digest" line is recomputed over the mutated
// entry lines (as fastkernel.export writes it), so that the checks after the digest (the
// parameter plan against the argument patterns, the entry's end) are reached too; every
// accepted entry is then matched against arguments built from its own patterns.
//
// FASTKERNEL_FUZZ_CUBINS: a directory of *.cubin files served under their file names (the seed
// bundles' cubins); without it one minimal ELF image is served as "a.cubin".
#include <dirent.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../csrc/sha256.h"
#include "fastkernel/bundle.h"

namespace {

std::map<std::string, std::string>* g_cubins;

// A little-endian ELF64 image for EM_CUDA with one empty section header table entry: the
// smallest image fastkernel::cubin_image_problem accepts (the driver would reject it).
std::string minimal_elf() {
  std::string image(128, '\0');
  const unsigned char ident[] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
  image.replace(0, sizeof(ident), reinterpret_cast<const char*>(ident), sizeof(ident));
  image[0x12] = char(190);  // EM_CUDA
  image[0x28] = 64;         // e_shoff
  image[0x3a] = 64;         // e_shentsize
  image[0x3c] = 1;          // e_shnum
  return image;
}

// The first three whitespace-separated fields of a line (the tag, the kernel, the cubin).
std::vector<std::string> fields(const std::string& line) {
  std::vector<std::string> out;
  size_t i = 0;
  while (out.size() < 3) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) {
      ++i;
    }
    if (i == line.size()) {
      break;
    }
    const size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') {
      ++i;
    }
    out.push_back(line.substr(start, i - start));
  }
  return out;
}

// The manifest with each entry's digest line recomputed as the loader computes it.
std::string redigest(const std::string& text) {
  std::string out, entry_text, cubin;
  bool in_entry = false;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t stop = text.find('\n', begin);
    const bool last = stop == std::string::npos;
    if (last) {
      stop = text.size();
    }
    std::string line = text.substr(begin, stop - begin);
    const std::vector<std::string> f = fields(line);
    const std::string tag = f.empty() ? "" : f[0];
    if (tag == "entry") {
      in_entry = true;
      entry_text = line + "\n";
      const auto it = f.size() > 2 ? g_cubins->find(f[2]) : g_cubins->end();
      cubin = it == g_cubins->end() ? std::string() : it->second;
    } else if (in_entry && tag == "digest") {
      fastkernel::Sha256 digest;
      digest.update(entry_text);
      digest.update(cubin);
      line = "digest " + digest.hex_digest();
    } else if (in_entry && tag == "end") {
      in_entry = false;
    } else if (in_entry && !tag.empty()) {
      entry_text += line + "\n";
    }
    out += line;
    if (!last) {
      out += "\n";
    }
    begin = stop + 1;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_cubins = new std::map<std::string, std::string>();
  (*g_cubins)["a.cubin"] = minimal_elf();
  if (const char* dir = std::getenv("FASTKERNEL_FUZZ_CUBINS")) {
    if (DIR* d = opendir(dir)) {
      while (const dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (name.size() > 6 && name.compare(name.size() - 6, 6, ".cubin") == 0) {
          std::ifstream in(std::string(dir) + "/" + name, std::ios::binary);
          std::ostringstream data;
          data << in.rdbuf();
          (*g_cubins)[name] = data.str();
        }
      }
      closedir(d);
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = redigest(std::string(reinterpret_cast<const char*>(data), size));
  const auto read = [](const std::string& name) {
    const auto it = g_cubins->find(name);
    if (it == g_cubins->end()) {
      throw fastkernel::BundleError("no such cubin: " + name);
    }
    return it->second;
  };
  try {
    fastkernel::Bundle bundle = fastkernel::Bundle::parse(text, "fuzz/manifest.txt", read);
    for (const auto& entry : bundle.entries()) {
      // Arguments of the kinds the patterns ask for: every entry must accept or refuse them
      // without reading out of bounds.
      std::vector<fastkernel::ArgValue> args;
      for (const auto& p : entry->patterns) {
        switch (p.kind) {
          case fastkernel::ArgKind::Tensor:
            args.push_back(fastkernel::pointer_arg(4096));
            break;
          case fastkernel::ArgKind::Int:
            args.push_back(fastkernel::int_arg(16));
            break;
          case fastkernel::ArgKind::Float:
            args.push_back(fastkernel::float_arg(1.5));
            break;
          case fastkernel::ArgKind::Bool:
            args.push_back(fastkernel::bool_arg(true));
            break;
          default:
            args.push_back(fastkernel::none_arg());
            break;
        }
      }
      (void)fastkernel::Bundle::matches(*entry, args.data(), args.size());
      (void)entry->describe();
    }
  } catch (const fastkernel::BundleError&) {
  }
  return 0;
}
