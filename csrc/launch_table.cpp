// The launch table's open-addressing hash map: linear probing over a power-of-two array,
// grown at 50% load so that probe sequences stay short on the hit path.
#include "fastkernel/launch_table.h"

namespace fastkernel {

LaunchTable::LaunchTable() : slots_(16) {}

LaunchTable::~LaunchTable() { clear(); }

const LaunchRecord* LaunchTable::find(const SpecializationKey& key, uint64_t hash) const noexcept {
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& slot = slots_[i];
    if (slot.size < 0) {
      return nullptr;
    }
    if (slot.hash == hash && key.equals(slot.words.get(), slot.size)) {
      return slot.record.get();
    }
  }
}

const LaunchRecord* LaunchTable::insert(const SpecializationKey& key,
                                        std::unique_ptr<LaunchRecord> record) {
  if ((count_ + 1) * 2 > slots_.size()) {
    grow();
  }
  const uint64_t hash = key.hash();
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    Slot& slot = slots_[i];
    if (slot.size < 0) {
      slot.hash = hash;
      slot.size = key.size;
      slot.words.reset(new uint64_t[key.size > 0 ? key.size : 1]);
      std::copy(key.words, key.words + key.size, slot.words.get());
      slot.record = std::move(record);
      ++count_;
      return slot.record.get();
    }
    if (slot.hash == hash && key.equals(slot.words.get(), slot.size)) {
      // Another registration won the race: keep its record, which launches may already be
      // using (its module can be executing), and drop the new, never-launched one.
      unload_launch_record(*record);
      return slot.record.get();
    }
  }
}

void LaunchTable::grow() {
  std::vector<Slot> old(slots_.size() * 2);
  old.swap(slots_);
  const size_t mask = slots_.size() - 1;
  for (Slot& slot : old) {
    if (slot.size < 0) {
      continue;
    }
    size_t i = slot.hash & mask;
    while (slots_[i].size >= 0) {
      i = (i + 1) & mask;
    }
    slots_[i] = std::move(slot);
  }
}

void LaunchTable::clear() noexcept {
  for (Slot& slot : slots_) {
    if (slot.record) {
      unload_launch_record(*slot.record);
    }
    slot = Slot();
  }
  count_ = 0;
}

}  // namespace fastkernel
