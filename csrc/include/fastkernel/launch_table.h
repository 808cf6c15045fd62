// The launch table: an open-addressing hash map from specialization key to launch record.
// Lookups compare the full key (never the hash alone) and never allocate.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fastkernel/launch_record.h"
#include "fastkernel/specialization.h"

namespace fastkernel {

/// Maps specialization keys to launch records for one kernel. Not internally locked: callers
/// serialize access (the Python layer holds the GIL for every lookup and insert).
class LaunchTable {
 public:
  LaunchTable();
  ~LaunchTable();
  LaunchTable(const LaunchTable&) = delete;
  LaunchTable& operator=(const LaunchTable&) = delete;

  /// The record registered under `key`, or nullptr.
  const LaunchRecord* find(const SpecializationKey& key, uint64_t hash) const noexcept;

  /// Registers `record` under `key`; if `key` is already registered, the existing record is kept
  /// (it may be in use) and `record` is unloaded. Returns the record now registered.
  const LaunchRecord* insert(const SpecializationKey& key, std::unique_ptr<LaunchRecord> record);

  /// Drops every record (modules unloaded).
  void clear() noexcept;

  /// Number of registered specializations.
  size_t size() const noexcept { return count_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    std::unique_ptr<uint64_t[]> words;
    int size = -1;  ///< -1: empty slot
    std::unique_ptr<LaunchRecord> record;
  };
  void grow();
  std::vector<Slot> slots_;
  size_t count_ = 0;
};

}  // namespace fastkernel
