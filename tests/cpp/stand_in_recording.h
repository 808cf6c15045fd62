// What the recording stand-in driver received, for the C++ test programs: its accessors
// (tests/stand_in_driver/recording_driver.c) found in the library fastkernel opened, which
// $FASTKERNEL_CUDA_DRIVER names.
#pragma once

#include <fastkernel/fastkernel.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace stand_in {

template <typename Fn>
Fn symbol(const char* name) {
  void* lib = dlopen(fastkernel::driver_library_path().c_str(), RTLD_NOW | RTLD_NOLOAD);
  return lib ? reinterpret_cast<Fn>(dlsym(lib, name)) : nullptr;
}

/// Prints `prefix` then "grid X Y Z block B stream S params HEX" for the last launch.
inline void print_last_launch(const char* prefix) {
  auto count = symbol<int (*)()>("fkstub_launch_count");
  auto dims = symbol<int (*)(int, unsigned*, unsigned*)>("fkstub_launch_dims");
  auto stream = symbol<int (*)(int, unsigned long long*)>("fkstub_launch_stream");
  auto raw = symbol<int (*)(int, void*, int)>("fkstub_launch_raw");
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
  std::printf("%sgrid %u %u %u block %u stream %llu params ", prefix, grid[0], grid[1], grid[2],
              block[0], s);
  for (int i = 0; i < n; ++i) {
    std::printf("%02x", bytes[i]);
  }
  std::printf("\n");
}

}  // namespace stand_in
