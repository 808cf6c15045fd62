// A C++ program that loads a kernel bundle exported from Python and launches it with no Python
// at run time. Against the recording stand-in driver it prints what the driver received, so the
// test can compare it with the Python launch of the same specialization.
//
// usage: launch_bundle BUNDLE_DIR X Y OUT N GRID
#include <fastkernel/fastkernel.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

// The stand-in driver's recording accessors (tests/stand_in_driver/recording_driver.c), found
// in the library fastkernel opened, which $FASTKERNEL_CUDA_DRIVER names.
template <typename Fn>
Fn stand_in(const char* name) {
  void* lib = dlopen(fastkernel::driver_library_path().c_str(), RTLD_NOW | RTLD_NOLOAD);
  return lib ? reinterpret_cast<Fn>(dlsym(lib, name)) : nullptr;
}

void print_last_launch() {
  auto count = stand_in<int (*)()>("fkstub_launch_count");
  auto dims = stand_in<int (*)(int, unsigned*, unsigned*)>("fkstub_launch_dims");
  auto stream = stand_in<int (*)(int, unsigned long long*)>("fkstub_launch_stream");
  auto raw = stand_in<int (*)(int, void*, int)>("fkstub_launch_raw");
  if (!count || !dims || !stream || !raw) {
    std::printf("error: not running against the recording stand-in driver\n");
    std::exit(3);
  }
  const int last = count() - 1;
  unsigned grid[3], block[3];
  unsigned long long s = 0;
  unsigned char bytes[4096];
  dims(last, grid, block);
  stream(last, &s);
  const int n = raw(last, bytes, sizeof(bytes));
  std::printf("grid %u %u %u block %u stream %llu params ", grid[0], grid[1], grid[2], block[0], s);
  for (int i = 0; i < n; ++i) {
    std::printf("%02x", bytes[i]);
  }
  std::printf("\n");
}

}  // namespace

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
    bundle.launch("add_kernel", {grid, 1, 1}, reinterpret_cast<fastkernel::CUstream>(0x5EED5),
                  args, 4);
    print_last_launch();
    // A call no entry matches: a clear exception listing what the bundle has.
    fastkernel::ArgValue wrong[4] = {fastkernel::int_arg(1), args[1], args[2], args[3]};
    try {
      bundle.launch("add_kernel", {grid, 1, 1}, nullptr, wrong, 4);
      std::printf("error: a mismatched call launched\n");
      return 1;
    } catch (const fastkernel::BundleError& e) {
      std::printf("mismatch: %s\n", e.what());
    }
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
  return 0;
}
