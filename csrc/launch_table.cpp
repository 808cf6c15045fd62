// The launch table's open-addressing hash map: linear probing over a power-of-two array, rehashed
// at 50% load (tombstones included) so probe sequences stay short on the hit path; a bounded
// table evicts its least recently launched record.
#include "fastkernel/launch_table.h"

namespace fastkernel {

LaunchTable::LaunchTable() : slots_(16), recent_(slots_.data()) {}

LaunchTable::~LaunchTable() {
  clear();
  for (const std::unique_ptr<LaunchRecord>& record : retired_) {
    unload_launch_record(*record);  // nothing is in flight once the table is destroyed
  }
}

LaunchTable::Slot* LaunchTable::find_slot(const SpecializationKey& key, uint64_t hash) noexcept {
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    Slot& slot = slots_[i];
    if (slot.size == kEmpty) {
      return nullptr;
    }
    if (slot.hash == hash && key.equals(slot.words.get(), slot.size)) {
      return &slot;
    }
  }
}

const LaunchRecord* LaunchTable::find(const SpecializationKey& key, uint64_t hash) noexcept {
  Slot* slot = find_slot(key, hash);
  if (slot == nullptr) {
    return nullptr;
  }
  slot->last_used = ++tick_;  // a counter and a store: the LRU order costs nothing more
  recent_ = slot;
  return slot->record.get();
}

const LaunchRecord* LaunchTable::lookup(const SpecializationKey& key) noexcept {
  Slot& slot = *recent_;
  if (key.equals(slot.words.get(), slot.size)) {  // empty and deleted slots have size < 0
    slot.last_used = ++tick_;
    return slot.record.get();
  }
  return find(key, key.hash());
}

const LaunchRecord* LaunchTable::insert(const SpecializationKey& key,
                                        std::unique_ptr<LaunchRecord> record) {
  const uint64_t hash = key.hash();
  if (const LaunchRecord* existing = find(key, hash)) {
    // Another registration won the race: keep its record, which launches may already be
    // using (its module can be executing), and drop the new, never-launched one (pinning the
    // kept one while the dropped one's destructor runs, as below).
    unload_launch_record(*record);
    const RecordPin pin(existing);
    record.reset();
    return existing;
  }
  Dropped dropped;
  sweep_retired(&dropped);
  while (capacity_ != 0 && count_ >= capacity_ && evict_least_recently_used(&dropped)) {
  }
  if ((count_ + tombstones_ + 1) * 2 > slots_.size()) {
    // Grow when the live records need it; otherwise rehashing at the same size clears the
    // tombstones that evictions left.
    rehash((count_ + 1) * 2 > slots_.size() ? slots_.size() * 2 : slots_.size());
  }
  const size_t mask = slots_.size() - 1;
  size_t i = hash & mask;
  while (slots_[i].size >= 0) {
    i = (i + 1) & mask;
  }
  Slot& slot = slots_[i];
  if (slot.size == kDeleted) {
    --tombstones_;
  }
  slot.hash = hash;
  slot.size = key.size;
  slot.last_used = ++tick_;
  slot.words.reset(new uint64_t[key.size > 0 ? key.size : 1]);
  std::copy(key.words, key.words + key.size, slot.words.get());
  slot.record = std::move(record);
  recent_ = &slot;
  ++count_;
  const LaunchRecord* placed = slot.record.get();
  if (!dropped.empty()) {
    // The evicted records' destructors may run Python that launches (and so evicts): the new
    // record, not yet pinned by its caller, stays while they run.
    const RecordPin pin(placed);
    dropped.clear();
  }
  return placed;
}

bool LaunchTable::evict_least_recently_used(Dropped* dropped) {
  Slot* victim = nullptr;
  for (Slot& slot : slots_) {
    if (slot.size >= 0 && slot.record->pins == 0 &&
        (victim == nullptr || slot.last_used < victim->last_used)) {
      victim = &slot;
    }
  }
  if (victim == nullptr) {
    return false;
  }
  unload_launch_record(*victim->record);
  dropped->push_back(take(victim));
  ++evictions_;
  return true;
}

void LaunchTable::set_capacity(size_t capacity) {
  capacity_ = capacity;
  Dropped dropped;
  while (capacity_ != 0 && count_ > capacity_ && evict_least_recently_used(&dropped)) {
  }
}

void LaunchTable::rehash(size_t capacity) {
  std::vector<Slot> old(capacity);
  old.swap(slots_);
  recent_ = slots_.data();
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
  tombstones_ = 0;
}

void LaunchTable::clear() {
  Dropped dropped;
  sweep_retired(&dropped);
  for (Slot& slot : slots_) {
    if (slot.size < 0) {
      continue;
    }
    if (slot.record->pins != 0) {
      // A launch in flight uses it: destroyed once it is done.
      make_room_for_retired();
      retired_.push_back(take(&slot));
      continue;
    }
    unload_launch_record(*slot.record);
    dropped.push_back(take(&slot));
  }
}

void LaunchTable::invalidate() {
  ++invalidations_;
  clear();
}

void LaunchTable::retire(const SpecializationKey& key) {
  if (Slot* slot = find_slot(key, key.hash())) {
    make_room_for_retired();
    retired_.push_back(take(slot));
  }
}

void LaunchTable::make_room_for_retired() {
  // Allocated before a record is taken out: a push_back that threw after take() would destroy
  // a record a launch in flight still uses.
  if (retired_.size() == retired_.capacity()) {
    retired_.reserve(2 * retired_.size() + 4);
  }
}

std::unique_ptr<LaunchRecord> LaunchTable::take(Slot* slot) {
  std::unique_ptr<LaunchRecord> record = std::move(slot->record);
  slot->words.reset();
  slot->size = kDeleted;
  --count_;
  ++tombstones_;
  return record;
}

void LaunchTable::sweep_retired(Dropped* dropped) {
  for (auto it = retired_.begin(); it != retired_.end();) {
    if ((*it)->pins == 0) {
      unload_launch_record(**it);
      dropped->push_back(std::move(*it));
      it = retired_.erase(it);
    } else {
      ++it;
    }
  }
}

namespace {

// Heap bytes of a std::string beyond the object itself (none while it fits the inline buffer).
size_t string_heap(const std::string& s) noexcept {
  return s.capacity() > std::string().capacity() ? s.capacity() + 1 : 0;
}

}  // namespace

size_t LaunchTable::bytes_held() const noexcept {
  size_t bytes = slots_.capacity() * sizeof(Slot);
  for (const Slot& slot : slots_) {
    if (slot.size < 0) {
      continue;
    }
    bytes += size_t(slot.size) * sizeof(uint64_t);
    const LaunchRecord& r = *slot.record;
    bytes += sizeof(LaunchRecord) + r.plan.capacity() * sizeof(PackSlot) +
             r.tensor_maps.capacity() * sizeof(TensorMapSpec) + string_heap(r.kernel_name) +
             string_heap(r.profile_name);
  }
  return bytes;
}

}  // namespace fastkernel
