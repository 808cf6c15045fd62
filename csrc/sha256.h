// SHA-256 (FIPS 180-4) of a byte string, as lowercase hex: the digest a bundle manifest records
// per entry (Python writes it with hashlib.sha256). Internal to the core, which depends on no
// library beyond the C++ standard library and the dynamic loader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fastkernel {

/// Incremental SHA-256: update() any number of times, then hex_digest() once.
class Sha256 {
 public:
  Sha256();
  void update(std::string_view data);
  /// The 64-character lowercase hex digest of everything passed to update().
  std::string hex_digest();

 private:
  void compress(const unsigned char* block);
  uint32_t state_[8];
  unsigned char buffer_[64];
  size_t buffered_ = 0;
  uint64_t length_ = 0;  // bytes
};

}  // namespace fastkernel
