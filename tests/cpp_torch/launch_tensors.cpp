// Launches a bundle kernel with at::Tensor arguments through fastkernel/torch.h, against the
// recording stand-in driver with CPU tensors standing in for CUDA tensors, and prints what the
// driver received and each error a bad call raises.
//
// usage: launch_tensors ADD_BUNDLE_DIR [SCRATCH_BUNDLE_DIR]
#include <fastkernel/fastkernel.h>
#include <fastkernel/torch.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "stand_in_recording.h"

namespace {

void expect_error(const char* what, const std::function<void()>& call) {
  try {
    call();
    std::printf("error: %s launched\n", what);
  } catch (const std::exception& e) {
    std::printf("%s: %s\n", what, e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: %s ADD_BUNDLE_DIR [SCRATCH_BUNDLE_DIR]\n", argv[0]);
    return 2;
  }
  try {
    fastkernel::Bundle bundle = fastkernel::Bundle::load(argv[1]);
    const auto stream = reinterpret_cast<fastkernel::CUstream>(0x5EED5);
    // Without the testing switch a CPU tensor is refused by name.
    at::Tensor x = at::arange(4096, at::kFloat), y = at::ones({4096}, at::kFloat);
    at::Tensor out = at::empty({4096}, at::kFloat);
    expect_error("cpu", [&] {
      fastkernel::launch(bundle, "add_kernel", {4, 1, 1}, {x, y, out, 4096}, stream);
    });
    // A missing argument is reported before the CPU tensors, as Python orders its errors.
    expect_error("arity-cpu",
                 [&] { fastkernel::launch(bundle, "add_kernel", {4, 1, 1}, {x, y, out}, stream); });
    fastkernel::testing::host_tensors() = true;
    std::printf("pointers %llx %llx %llx\n", (unsigned long long)(uintptr_t)x.data_ptr(),
                (unsigned long long)(uintptr_t)y.data_ptr(),
                (unsigned long long)(uintptr_t)out.data_ptr());
    fastkernel::launch(bundle, "add_kernel", {4, 1, 1}, {x, y, out, int64_t(4096)}, stream);
    stand_in::print_last_launch("launch ");
    at::Tensor shifted = out.slice(0, 1);  // 4 bytes past a 16-byte boundary: the other entry
    std::printf("shifted %llx\n", (unsigned long long)(uintptr_t)shifted.data_ptr());
    fastkernel::launch(bundle, "add_kernel", {4, 1, 1}, {x, y, shifted, 4095}, stream);
    stand_in::print_last_launch("launch ");
    at::Tensor xd = at::zeros({4096}, at::kDouble);
    expect_error("dtype", [&] {
      fastkernel::launch(bundle, "add_kernel", {4, 1, 1}, {xd, y, out, 4096}, stream);
    });
    expect_error("kind", [&] {
      fastkernel::launch(bundle, "add_kernel", {4, 1, 1}, {4096, y, out, 4096}, stream);
    });
    expect_error("undefined", [&] {
      fastkernel::launch(bundle, "add_kernel", {4, 1, 1}, {at::Tensor(), y, out, 4096}, stream);
    });
    expect_error("stream",
                 [&] { fastkernel::launch(bundle, "add_kernel", {4, 1, 1}, {x, y, out, 4096}); });
    if (argc == 3) {
      // device_descriptor_kernel(in, out, M, N): a per-CTA global scratch buffer, which
      // fastkernel/torch.h allocates and the raw API must be given.
      fastkernel::Bundle scratch = fastkernel::Bundle::load(argv[2]);
      at::Tensor src = at::zeros({64, 32}, at::kFloat), dst = at::zeros({64, 32}, at::kFloat);
      std::printf("scratch-pointers %llx %llx\n", (unsigned long long)(uintptr_t)src.data_ptr(),
                  (unsigned long long)(uintptr_t)dst.data_ptr());
      fastkernel::launch(scratch, "device_descriptor_kernel", {4, 1, 1}, {src, dst, 64, 32},
                         stream);
      stand_in::print_last_launch("launch ");
      fastkernel::ArgValue raw[4] = {fastkernel::pointer_arg(uint64_t(uintptr_t(src.data_ptr()))),
                                     fastkernel::pointer_arg(uint64_t(uintptr_t(dst.data_ptr()))),
                                     fastkernel::int_arg(64), fastkernel::int_arg(32)};
      expect_error("no-scratch",
                   [&] { scratch.launch("device_descriptor_kernel", {4, 1, 1}, stream, raw, 4); });
    }
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
  return 0;
}
