// The launch table: an open-addressing hash map from specialization key to launch record.
// Lookups compare the full key (never the hash alone) and never allocate.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fastkernel/launch_record.h"
#include "fastkernel/specialization.h"

namespace fastkernel {

/// Maps specialization keys to launch records for one kernel, holding at most `capacity`
/// records (least recently launched evicted first; 0 = unbounded). Pinned records (in use by a
/// call in flight) are never evicted or dropped: the table then exceeds its capacity until the
/// next insert finds unpinned records to evict. Not internally locked:
/// callers serialize access (the Python layer holds the GIL for every lookup and insert).
class LaunchTable {
 public:
  LaunchTable();
  ~LaunchTable();
  LaunchTable(const LaunchTable&) = delete;
  LaunchTable& operator=(const LaunchTable&) = delete;

  /// The record registered under `key`, or nullptr. Marks it as the most recently used.
  const LaunchRecord* find(const SpecializationKey& key, uint64_t hash) noexcept;

  /// find(key, key.hash()), first comparing `key` with the slot the last lookup or insert
  /// landed on: a kernel called again with the same specialization skips hashing and probing.
  /// The comparison is the full key, so a stale slot (evicted, reused) only costs that compare.
  const LaunchRecord* lookup(const SpecializationKey& key) noexcept;

  /// Registers `record` under `key`; if `key` is already registered, the existing record is kept
  /// (it may be in use) and `record` is unloaded. At capacity, the least recently used record
  /// is evicted first (its module unloaded). Returns the record now registered.
  const LaunchRecord* insert(const SpecializationKey& key, std::unique_ptr<LaunchRecord> record);

  /// Drops every record: unpinned ones now (modules unloaded), pinned ones (in use by a launch
  /// in flight) from the index now and destroyed once unpinned, at a later insert or clear.
  void clear();

  /// clear(), counted: a registration begun before (its compile running) that sees the count
  /// change takes its record out again with retire(), since what made the table stale (the
  /// kernel's `debug` changed) may also have made that record stale.
  void invalidate();

  /// How many times invalidate() was called.
  uint64_t invalidations() const noexcept { return invalidations_; }

  /// Takes the record registered under `key` (if any) out of the index, as clear() takes a
  /// pinned one: it stays alive for a caller about to pin it and is destroyed once unpinned.
  void retire(const SpecializationKey& key);

  /// Sets the most records kept (0 = unbounded), evicting down to it now.
  void set_capacity(size_t capacity);

  /// Calls `visit(record)` for each registered record, stopping at the first nonzero result,
  /// which it returns (0 when every call returned 0). `visit` must not change the table. The
  /// Python layer's garbage-collector traversal reads the records' references through it.
  template <class Visit>
  int visit_records(Visit&& visit) const {
    for (const Slot& slot : slots_) {
      if (slot.size >= 0) {
        if (const int result = visit(*slot.record)) {
          return result;
        }
      }
    }
    for (const std::unique_ptr<LaunchRecord>& record : retired_) {
      if (const int result = visit(*record)) {
        return result;
      }
    }
    return 0;
  }

  /// Number of registered specializations.
  size_t size() const noexcept { return count_; }

  /// Records evicted so far.
  uint64_t evictions() const noexcept { return evictions_; }

  /// Heap bytes the table holds, the loaded modules excepted: its slot array, each key's words,
  /// and each record with its plan, tensor maps and names (allocated capacities; the allocator's
  /// own per-block overhead not counted).
  size_t bytes_held() const noexcept;

 private:
  static constexpr int kEmpty = -1;
  static constexpr int kDeleted = -2;  ///< a tombstone: probing continues past it
  struct Slot {
    uint64_t hash = 0;
    uint64_t last_used = 0;  ///< tick of the last lookup that found it
    std::unique_ptr<uint64_t[]> words;
    int size = kEmpty;
    std::unique_ptr<LaunchRecord> record;
  };
  /// Records an operation took out of the table, destroyed once it is done with the table: a
  /// record's destructor can run Python (LaunchRecord::release_user_data), and Python can launch
  /// and so re-enter the table.
  using Dropped = std::vector<std::unique_ptr<LaunchRecord>>;
  void rehash(size_t capacity);
  /// Moves the least recently used unpinned record into `dropped`; false when every record is
  /// pinned.
  bool evict_least_recently_used(Dropped* dropped);
  /// The occupied slot holding `key` (whose hash is `hash`), or nullptr.
  Slot* find_slot(const SpecializationKey& key, uint64_t hash) noexcept;
  /// Takes the record of an occupied slot out of the index (the slot becomes a tombstone).
  std::unique_ptr<LaunchRecord> take(Slot* slot);
  /// Ensures `retired_` can take one more record without allocating.
  void make_room_for_retired();
  /// Moves the retired records no launch pins any more into `dropped` (modules unloaded).
  void sweep_retired(Dropped* dropped);
  std::vector<Slot> slots_;
  /// Records out of the index but pinned when they were taken out (clear, retire).
  std::vector<std::unique_ptr<LaunchRecord>> retired_;
  uint64_t invalidations_ = 0;
  Slot* recent_;  ///< the slot of the last hit or insert; into slots_, reset when it reallocates
  size_t count_ = 0;
  size_t tombstones_ = 0;
  size_t capacity_ = 0;
  uint64_t tick_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace fastkernel
