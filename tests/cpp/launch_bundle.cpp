// A C++ program that loads a kernel bundle exported from Python and launches it with no Python
// at run time. Against the recording stand-in driver it prints what the driver received, so the
// test can compare it with the Python launch of the same specialization.
//
// usage: launch_bundle BUNDLE_DIR X Y OUT N GRID
#include <fastkernel/fastkernel.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "stand_in_recording.h"

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s BUNDLE_DIR X Y OUT N GRID\n", argv[0]);
    return 2;
  }
  try {
    fastkernel::Bundle bundle = fastkernel::Bundle::load(argv[1]);
    const uint64_t x = std::strtoull(argv[2], nullptr, 0), y = std::strtoull(argv[3], nullptr, 0),
                   out = std::strtoull(argv[4], nullptr, 0);
    const int64_t n = std::strtoll(argv[5], nullptr, 0);
    const unsigned grid = unsigned(std::strtoul(argv[6], nullptr, 0));
    fastkernel::ArgValue args[4] = {fastkernel::pointer_arg(x), fastkernel::pointer_arg(y),
                                    fastkernel::pointer_arg(out), fastkernel::int_arg(n)};
    std::printf("entry %s\n", bundle.select("add_kernel", args, 4).cubin_file.c_str());
    bundle.launch("add_kernel", {grid, 1, 1}, reinterpret_cast<fastkernel::CUstream>(0x5EED5), args,
                  4);
    stand_in::print_last_launch("");
    // A call no entry matches: a clear exception listing what the bundle has.
    fastkernel::ArgValue wrong[4] = {fastkernel::int_arg(1), args[1], args[2], args[3]};
    try {
      bundle.launch("add_kernel", {grid, 1, 1}, nullptr, wrong, 4);
      std::printf("error: a mismatched call launched\n");
      return 1;
    } catch (const fastkernel::BundleError& e) {
      std::printf("mismatch: %s\n", e.what());
    }
    // The chosen entry with fewer arguments than it takes: refused before any is read.
    try {
      fastkernel::BundleEntry& entry = bundle.select("add_kernel", args, 4);
      bundle.launch_entry(entry, {grid, 1, 1}, nullptr, args, 3);
      std::printf("error: a launch with too few arguments launched\n");
      return 1;
    } catch (const fastkernel::BundleError& e) {
      std::printf("count: %s\n", e.what());
    }
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
  return 0;
}
