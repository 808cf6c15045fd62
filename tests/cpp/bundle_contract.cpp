// What the bundle API promises a C++ caller beyond one launch, checked against the recording
// stand-in driver: which device's context a launch runs in, that a destroyed bundle unloads its
// modules, that launch_entry refuses arguments its entry was not compiled for, and that calls
// passing typed arguments launch what Python launched. Each check prints one line; the test
// reads them.
//
// usage: bundle_contract call DIR KERNEL DEVICE ARG...   (ARG: p:PTR i:INT f:FLOAT b:0|1 none)
//        bundle_contract devices DIR X Y OUT             (add_kernel, n = 4096)
//        bundle_contract lifetime DIR X Y OUT
#include <fastkernel/fastkernel.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "stand_in_recording.h"

namespace {

using fastkernel::ArgValue;
using fastkernel::Bundle;
using fastkernel::BundleError;

const auto kStream = reinterpret_cast<fastkernel::CUstream>(0x5EED5);

ArgValue parse_arg(const char* text) {
  if (std::strcmp(text, "none") == 0) {
    return fastkernel::none_arg();
  }
  const char* value = text + 2;
  switch (text[0]) {
    case 'p':
      return fastkernel::pointer_arg(std::strtoull(value, nullptr, 0));
    case 'i':
      return fastkernel::int_arg(std::strtoll(value, nullptr, 0));
    case 'f':
      return fastkernel::float_arg(std::strtod(value, nullptr));
    case 'b':
      return fastkernel::bool_arg(value[0] == '1');
    default:
      std::fprintf(stderr, "bad argument %s\n", text);
      std::exit(2);
  }
}

int last_launch_device() {
  auto count = stand_in::symbol<int (*)()>("fkstub_launch_count");
  auto device = stand_in::symbol<int (*)(int)>("fkstub_launch_device");
  return device(count() - 1);
}

// The stand-in's counters (the driver is loaded first: the accessors are found in it).
int counter(const char* name) {
  fastkernel::driver();
  return stand_in::symbol<int (*)()>(name)();
}

std::vector<ArgValue> add_args(char** argv) {
  return {fastkernel::pointer_arg(std::strtoull(argv[0], nullptr, 0)),
          fastkernel::pointer_arg(std::strtoull(argv[1], nullptr, 0)),
          fastkernel::pointer_arg(std::strtoull(argv[2], nullptr, 0)), fastkernel::int_arg(4096)};
}

int call(int argc, char** argv) {
  Bundle bundle = Bundle::load(argv[0]);
  const int device = std::atoi(argv[2]);
  std::vector<ArgValue> args;
  for (int i = 3; i < argc; ++i) {
    args.push_back(parse_arg(argv[i]));
  }
  try {
    bundle.launch(argv[1], {1, 1, 1}, kStream, args.data(), args.size(), device);
  } catch (const fastkernel::ParamError& e) {
    std::printf("ParamError %d: %s\n", e.arg_index, e.what());
    return 0;
  } catch (const BundleError& e) {
    std::printf("BundleError: %s\n", e.what());
    return 0;
  }
  stand_in::print_last_launch("");
  return 0;
}

int devices(char** argv) {
  Bundle bundle = Bundle::load(argv[0]);
  std::vector<ArgValue> args = add_args(argv + 1);
  for (int device : {1, 0, 1}) {
    bundle.launch("add_kernel", {1, 1, 1}, kStream, args.data(), args.size(), device);
    std::printf("device %d launched on %d\n", device, last_launch_device());
  }
  // A thread with device 1's context current launches on device 0 and keeps its context.
  using Ctx = void*;
  auto retain = stand_in::symbol<int (*)(Ctx*, int)>("cuDevicePrimaryCtxRetain");
  auto get = stand_in::symbol<int (*)(Ctx*)>("cuCtxGetCurrent");
  auto set = stand_in::symbol<int (*)(Ctx)>("cuCtxSetCurrent");
  Ctx device1 = nullptr;
  retain(&device1, 1);
  set(device1);
  bundle.launch("add_kernel", {1, 1, 1}, kStream, args.data(), args.size(), 0);
  Ctx after = nullptr;
  get(&after);
  std::printf("from device 1's context: launched on %d, context kept %d\n", last_launch_device(),
              int(after == device1));
  return 0;
}

int lifetime(char** argv) {
  std::vector<ArgValue> args = add_args(argv + 1);
  const int loads = counter("fkstub_module_load_count");
  const int unloads = counter("fkstub_module_unload_count");
  {
    Bundle bundle = Bundle::load(argv[0]);
    bundle.launch("add_kernel", {1, 1, 1}, kStream, args.data(), args.size(), 0);
    bundle.launch("add_kernel", {1, 1, 1}, kStream, args.data(), args.size(), 1);
  }
  std::printf("loaded %d unloaded %d\n", counter("fkstub_module_load_count") - loads,
              counter("fkstub_module_unload_count") - unloads);

  Bundle from = Bundle::load(argv[0]);
  fastkernel::BundleEntry& entry = from.select("add_kernel", args.data(), args.size());
  Bundle to = std::move(from);
  try {
    from.launch_entry(entry, {1, 1, 1}, kStream, args.data(), args.size());  // NOLINT: moved
    std::printf("moved-from: launched\n");
  } catch (const BundleError& e) {
    std::printf("moved-from: %s\n", e.what());
  }
  // The entry chosen for these (16-byte aligned) pointers, given a misaligned one.
  std::vector<ArgValue> misaligned = args;
  misaligned[2] = fastkernel::pointer_arg(std::strtoull(argv[3], nullptr, 0) + 4);
  const int launches = counter("fkstub_launch_count");
  try {
    to.launch_entry(entry, {1, 1, 1}, kStream, misaligned.data(), misaligned.size());
    std::printf("misaligned: launched\n");
  } catch (const BundleError& e) {
    std::printf("misaligned: %s\n", e.what());
  }
  std::printf("launches after the refusals %d\n", counter("fkstub_launch_count") - launches);
  try {
    Bundle::load("");
    std::printf("empty directory: loaded\n");
  } catch (const BundleError& e) {
    std::printf("empty directory: %s\n", e.what());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s call|devices|lifetime DIR ...\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  try {
    if (mode == "call" && argc >= 5) {
      return call(argc - 2, argv + 2);
    }
    if (mode == "devices" && argc == 6) {
      return devices(argv + 2);
    }
    if (mode == "lifetime" && argc == 6) {
      return lifetime(argv + 2);
    }
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "bad usage\n");
  return 2;
}
