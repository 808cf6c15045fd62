// The error an argument value raises when it cannot be written as its kernel parameter, shared
// by the trampoline (scalars and pointers) and the tensor-map encoder (descriptor leaves).
#pragma once

#include <stdexcept>
#include <string>

namespace fastkernel {

/// Thrown when an argument's value cannot be written as its parameter type.
/// `overflow` distinguishes a value out of range (OverflowError) from a wrong kind (TypeError);
/// `arg_index` is the bound argument's index, or -1 where the thrower does not know it.
class ParamError : public std::runtime_error {
 public:
  ParamError(int arg_index, bool overflow, const std::string& what)
      : std::runtime_error(what), arg_index(arg_index), overflow(overflow) {}
  int arg_index;
  bool overflow;
};

}  // namespace fastkernel
