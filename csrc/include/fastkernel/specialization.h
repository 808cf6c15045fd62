// The specialization key: what distinguishes one compiled binary of a kernel from another,
// written as 64-bit words into a fixed buffer so that building and hashing it never allocates.
#pragma once

#include <climits>
#include <cstdint>
#include <cstring>

namespace fastkernel {

/// The most words one key may hold; a call whose key would be longer takes the fallback path.
/// Room for every parameter of a kernel at the native argument limit (kernel_object.h,
/// kMaxArgs = 128) as a keyed constexpr int (two words each): vLLM's unified attention kernel
/// (triton_unified_attention.py: 77 parameters, 34 of them constexpr) needs about 100. The
/// buffer lives in the call's stack frame, uninitialised, so its size costs a hit nothing.
constexpr int kMaxKeyWords = 256;

/// The kinds of value an argument can carry into a launch (word tag, low 8 bits of a key word).
enum class ArgKind : uint8_t {
  Tensor = 1,          ///< a torch.Tensor: pointer parameter
  Int = 2,             ///< a Python int: i32 / i64 / u64 parameter, or dropped when == 1
  Float = 3,           ///< a Python float: fp32 parameter (or the annotated float type)
  Bool = 4,            ///< a Python bool: u1 parameter (4-byte slot)
  None = 5,            ///< None: specialized to a constexpr, dropped
  ConstexprInt = 6,    ///< an int constexpr; the next word is its value
  ConstexprFloat = 7,  ///< a float constexpr; the next word is its IEEE-754 bits
  ConstexprBool = 8,   ///< a bool constexpr (value in bit 8)
  ConstexprNone = 9,   ///< a None constexpr
  ConstexprStr = 10,   ///< a str constexpr; bits 8..39 are its byte length, the bytes follow
  Option = 11,  ///< a compile option set by keyword; bits 8..15 its index, a value word follows
  Device = 12,  ///< the device the launch runs on (bits 8..39)
  ConstexprObject = 13,   ///< an immutable object keyed by identity (tl.dtype, jit function);
                          ///< the next word is its address, kept alive by the registrant
  ConstexprWrapped = 14,  ///< a tl.constexpr object; its unwrapped value's words follow
  // Autotuning (fastkernel.autotune): what picks a tuned config joins the key, so a tuned call
  // is one native hit.
  TunedAbsent = 15,     ///< a parameter a tuned config provides, not passed by the call
  TuneValue = 16,       ///< the exact value of a scalar named in the autotune key; a word follows
  TuneLayout = 17,      ///< a tensor's stride classes: bits 8..15 its dim, then 2 bits per dim
  TuneSizes = 18,       ///< a named tensor's sizes: bits 8..15 its dim, one word per size follows
  Tuple = 19,           ///< a tuple argument (flattened by Triton): bits 8..39 its length, its
                        ///< elements' words follow
  ConstexprTuple = 20,  ///< a tuple constexpr: bits 8..39 its length, its elements' words follow
  TensorDesc = 21,      ///< a host tensor descriptor: bits 8..15 its rank, 16..23 the base's dtype,
                        ///< 24..31 its device type, 32..47 its device index; one word per block
                        ///< dim follows (Triton's "tensordesc<dtype[block]>")
  ConstexprTyped = 22,  ///< a constexpr number of another type than int / float (numpy scalars,
                        ///< float subclasses): bit 8 set for a float; its type's address, then
                        ///< its value (int64, or IEEE-754 bits) follow
  OptionInt = 23,       ///< a compile option set by keyword to an int of magnitude below 2**30 (the
                        ///< common num_warps=, num_stages=): bits 8..15 its index, bits 16..63 its
                        ///< value (two's complement); other values are Option words
  OptionIntPair = 24,   ///< two compile options (in index order) set to ints in [0, 2**20), one
                        ///< word: bits 8..15 and 36..43 their indices, 16..35 and 44..63 their
                        ///< values. Options pair greedily in index order, so a set of options
                        ///< and values makes one sequence of words.
  TuneDefaulted = 25,   ///< a kTuneValue parameter the call left out (its default is keyed after
                        ///< this word): Triton's autotune key and heuristics see only the
                        ///< arguments passed, so a default passed explicitly is another key
  TuneStrides = 26,     ///< a tensor's exact strides: bits 8..15 its dim, one word per stride
                        ///< follows
};

/// Tuning flags of a parameter (ParamSpec::tune), set for kernels under fastkernel.autotune.
enum TuneFlag : uint8_t {
  kTuneConfigProvided = 1,  ///< a config sets it; absent from the call
  kTuneValue = 2,           ///< named in the autotune key: the value itself is keyed, and
                            ///< whether the call passed it
  kTuneLayout = 4,          ///< a tensor's stride pattern is keyed (every tensor of a tuned kernel)
  kTuneSizes = 8,           ///< named in the autotune key: a tensor's sizes are keyed
  kTuneStrides = 16,        ///< a tensor's exact strides are keyed (a keyed heuristic's tensor)
  /// Required, and no config sets it: a call leaving it out goes to the miss path (a pruned
  /// config can set it, where Triton's autotuner passes the config's values) rather than
  /// raising the missing-argument TypeError.
  kTuneMayBeProvided = 32,
};

/// The autotune class of a stride: 0, 1 or anything else (fastkernel.autotune's key).
constexpr uint64_t stride_class(int64_t stride) { return stride == 0 ? 0 : stride == 1 ? 1 : 2; }

/// Triton's integer widths (triton/_C specialize.cc: i32 when it fits, u64 when >= 2**63, else
/// i64).
enum class IntWidth : uint8_t { I32 = 0, I64 = 1, U64 = 2 };

/// Triton's value classes for ints and pointers: divisible by 16 ("D"), not (""), == 1, or not
/// specialized (do_not_specialize).
enum class ValueClass : uint8_t { NotSpecialized = 0, Divisible16 = 1, Other = 2, EqualsOne = 3 };

/// The word of a tensor argument: dtype (c10::ScalarType), device type and 16-byte alignment class.
constexpr uint64_t tensor_word(int scalar_type, int device_type, ValueClass alignment) {
  return uint64_t(ArgKind::Tensor) | (uint64_t(uint8_t(scalar_type)) << 8) |
         (uint64_t(uint8_t(device_type)) << 16) | (uint64_t(alignment) << 24);
}

/// The word of an int argument: its width and value class.
constexpr uint64_t int_word(IntWidth width, ValueClass value_class) {
  return uint64_t(ArgKind::Int) | (uint64_t(width) << 8) | (uint64_t(value_class) << 16);
}

/// Triton's class for a pointer argument (specialize.cc handle_tensor): 16-byte aligned or not,
/// or not specialized under do_not_specialize.
constexpr ValueClass pointer_class(uint64_t address, bool specialize, bool align) {
  return !specialize
             ? ValueClass::NotSpecialized
             : ((align && (address & 15) == 0) ? ValueClass::Divisible16 : ValueClass::Other);
}

/// Triton's width of a signed integer argument: i32 when it fits, else i64.
constexpr IntWidth signed_width(int64_t value) {
  return (value >= INT32_MIN && value <= INT32_MAX) ? IntWidth::I32 : IntWidth::I64;
}

/// Triton's class for an integer argument (specialize.cc handle_long_type): == 1 (then it
/// becomes a constexpr), divisible by 16, other, or not specialized. `bits` is the value's
/// two's-complement bits (the u64 value for IntWidth::U64).
constexpr ValueClass int_class(uint64_t bits, bool is_one, bool specialize, bool align) {
  return !specialize ? ValueClass::NotSpecialized
         : is_one    ? ValueClass::EqualsOne
                     : ((align && (bits & 15) == 0) ? ValueClass::Divisible16 : ValueClass::Other);
}

/// A key under construction and, once built, the one looked up.
struct SpecializationKey {
  /// Words every built key ends with: finish_key's launch device and knob state.
  static constexpr int kTailWords = 2;
  uint64_t words[kMaxKeyWords];
  int size = 0;
  bool overflowed = false;

  /// Appends a word, or marks the key overflowed when only the tail's room is left.
  void push(uint64_t word) noexcept {
    if (size < kMaxKeyWords - kTailWords) {
      words[size++] = word;
    } else {
      overflowed = true;
    }
  }

  /// Appends the kTailWords words that end a built key (the launch device, the knob state).
  /// push() always leaves room for them, so they are never the words an overflow drops.
  void push_tail(uint64_t device_word, uint64_t knob_word) noexcept {
    words[size] = device_word;
    words[size + 1] = knob_word;
    size += kTailWords;
  }

  /// Appends `length` bytes, zero-padded to whole words.
  void push_bytes(const char* data, size_t length) noexcept {
    for (size_t at = 0; at < length; at += 8) {
      uint64_t word = 0;
      std::memcpy(&word, data + at, length - at < 8 ? length - at : 8);
      push(word);
    }
  }

  /// A 64-bit mix of every word: one odd multiply per word (a bijection of the running value,
  /// so no word is lost; a multiply carries bits only upward), then a fold of the high half
  /// down, a multiply and a fold again, so the high bits reach the low bits the launch table
  /// indexes by. Held only in memory: never persisted.
  uint64_t hash() const noexcept {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ uint64_t(size);
#pragma GCC unroll 4
    for (int i = 0; i < size; ++i) {
      h = (h ^ words[i]) * 0xBF58476D1CE4E5B9ull;
    }
    h ^= h >> 32;
    h *= 0x94D049BB133111EBull;
    return h ^ (h >> 29);
  }

  bool equals(const uint64_t* other, int other_size) const noexcept {
    return size == other_size && std::memcmp(words, other, sizeof(uint64_t) * size) == 0;
  }
};

/// The value an argument contributes to the parameter buffer, captured while its key word is built.
struct ArgValue {
  union {
    uint64_t u;
    int64_t i;
    double d;
  };
  ArgKind kind;
  IntWidth width;  ///< for ArgKind::Int: whether `u` or `i` holds the value; the key builder
                   ///< gives Float and Bool values I32, so a tuned value's key word reads it
                   ///< whatever the kind
};

}  // namespace fastkernel
