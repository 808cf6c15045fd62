// The launch table when an allocation fails: retire() and clear() take a pinned record (one a
// launch in flight holds) out of the index into the table's retired list, which may need to
// grow. Where growing it throws std::bad_alloc, the operation must leave the pinned record
// registered and alive (never destroyed under the launch that holds it), and the table usable.
// Allocation failure is injected by replacing the global operator new. Each check prints one
// line, "ok NAME" or "FAILED NAME: what"; the program exits 1 when one failed. Run under
// valgrind by the test, so a record destroyed too early is also an invalid read there.
#include <fastkernel/launch_table.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace {

// Allocations left before the next one fails (-1: none fails).
int g_allocations_before_failure = -1;

void* allocate(std::size_t size) {
  if (g_allocations_before_failure == 0) {
    g_allocations_before_failure = -1;
    throw std::bad_alloc();
  }
  if (g_allocations_before_failure > 0) {
    --g_allocations_before_failure;
  }
  if (void* p = std::malloc(size != 0 ? size : 1)) {
    return p;
  }
  throw std::bad_alloc();
}

}  // namespace

void* operator new(std::size_t size) { return allocate(size); }
void* operator new[](std::size_t size) { return allocate(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

using fastkernel::LaunchRecord;
using fastkernel::LaunchTable;
using fastkernel::RecordPin;
using fastkernel::SpecializationKey;

int g_failures = 0;
// The markers of the records destroyed so far (each record's user_data is its marker).
std::vector<int>* g_destroyed = nullptr;

void record_destroyed(void* marker) { g_destroyed->push_back(*static_cast<int*>(marker)); }

void check(bool ok, const char* name, const char* what) {
  if (ok) {
    std::printf("ok %s\n", name);
  } else {
    std::printf("FAILED %s: %s\n", name, what);
    ++g_failures;
  }
}

SpecializationKey key_of(int n) {
  SpecializationKey key;
  key.push(0x1000 + uint64_t(n));
  key.push_tail(0, 0);
  return key;
}

int g_markers[8] = {0, 1, 2, 3, 4, 5, 6, 7};

std::unique_ptr<LaunchRecord> record_of(int n) {
  auto record = std::make_unique<LaunchRecord>();
  record->kernel_name = "kernel_with_a_name_longer_than_the_inline_buffer_" + std::to_string(n);
  record->block_x = 32;
  record->user_data = &g_markers[n];
  record->release_user_data = record_destroyed;
  return record;
}

bool destroyed(int n) {
  for (const int marker : *g_destroyed) {
    if (marker == n) {
      return true;
    }
  }
  return false;
}

// Calls `op`, reporting whether it threw std::bad_alloc.
template <class Op>
bool throws_bad_alloc(Op&& op) {
  try {
    op();
  } catch (const std::bad_alloc&) {
    return true;
  }
  return false;
}

void retire_under_failure() {
  LaunchTable table;
  const LaunchRecord* pinned = table.insert(key_of(1), record_of(1));
  table.insert(key_of(2), record_of(2));
  const RecordPin pin(pinned);
  g_allocations_before_failure = 0;  // the retired list's first growth fails
  const bool threw = throws_bad_alloc([&] { table.retire(key_of(1)); });
  g_allocations_before_failure = -1;
  check(threw, "retire_throws", "retire() did not report the failed allocation");
  check(table.find(key_of(1), key_of(1).hash()) == pinned && table.size() == 2,
        "retire_leaves_the_record_registered", "the pinned record left the index");
  check(!destroyed(1) && pinned->kernel_name.back() == '1', "retire_keeps_the_record_alive",
        "the pinned record was destroyed");
  table.retire(key_of(1));  // allocations succeed now
  check(table.find(key_of(1), key_of(1).hash()) == nullptr && table.size() == 1 && !destroyed(1),
        "retire_then_retires", "retire() with memory did not retire the pinned record");
}

void clear_under_failure() {
  LaunchTable table;
  const LaunchRecord* pinned = table.insert(key_of(3), record_of(3));
  table.insert(key_of(4), record_of(4));
  table.insert(key_of(5), record_of(5));
  {
    const RecordPin pin(pinned);
    g_allocations_before_failure = 0;
    const bool threw = throws_bad_alloc([&] { table.clear(); });
    g_allocations_before_failure = -1;
    check(threw, "clear_throws", "clear() did not report the failed allocation");
    check(table.find(key_of(3), key_of(3).hash()) == pinned && !destroyed(3),
          "clear_keeps_the_pinned_record", "the pinned record was dropped or destroyed");
    table.clear();
    check(table.size() == 0 && destroyed(4) && destroyed(5) && !destroyed(3), "clear_then_clears",
          "clear() with memory did not drop the unpinned records only");
    check(pinned->kernel_name.back() == '3', "clear_keeps_the_retired_record_alive",
          "the retired record's contents changed");
  }
  table.insert(key_of(6), record_of(6));  // sweeps the retired list: the record is unpinned
  check(destroyed(3) && table.size() == 1, "unpinned_retired_record_is_destroyed",
        "the retired record outlived its pin and the next insert");
}

}  // namespace

int main() {
  std::vector<int> destroyed_markers;
  destroyed_markers.reserve(64);  // no allocation of the checks' own while failure is armed
  g_destroyed = &destroyed_markers;
  retire_under_failure();
  clear_under_failure();
  return g_failures == 0 ? 0 : 1;
}
