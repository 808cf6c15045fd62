// libFuzzer target: the ELF extent check every cubin passes before the driver sees it
// (fastkernel::cubin_image_problem): it must never read outside the buffer it is given.
#include <cstdint>
#include <cstring>
#include <memory>

#include "fastkernel/launch_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exact-size copy, so that AddressSanitizer catches a read one byte past the image.
  std::unique_ptr<uint8_t[]> image(new uint8_t[size ? size : 1]);
  if (size) {
    std::memcpy(image.get(), data, size);
  }
  (void)fastkernel::cubin_image_problem(size ? image.get() : nullptr, size);
  return 0;
}
