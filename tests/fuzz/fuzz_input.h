// Reading a libFuzzer input as a stream of fixed-size values, shared by the native targets.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace fastkernel_fuzz {

/// The input as a stream of values; once it runs out, every value reads as zero.
struct Input {
  const uint8_t* data;
  size_t size;

  template <typename T>
  T take() {
    T value{};
    const size_t n = size < sizeof(T) ? size : sizeof(T);
    std::memcpy(&value, data, n);
    data += n;
    size -= n;
    return value;
  }

  /// A string of up to 11 raw bytes (its length is the next byte, modulo 12).
  std::string bytes() {
    const size_t n = std::min<size_t>(take<uint8_t>() % 12, size);
    std::string s(reinterpret_cast<const char*>(data), n);
    data += n;
    size -= n;
    return s;
  }
};

}  // namespace fastkernel_fuzz
