// Journal replay (journal::ReadForReplay) over a hostile ring: the input is the
// ring's bytes (four 16 KiB buckets of a fixed filesystem, fuzz.h); the
// entries it returns must have consecutive sequence numbers (or, past a proven
// gap, increasing ones) and keys ForEachKey walks.
#include <cstring>

#include "dev/device_set.h"
#include "fuzz/fuzz.h"
#include "journal/journal.h"
#include "userspace/platform/mem_device.h"

using namespace tfs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Quiet();
  const u32 ring = fuzz::kJournalBucket * fuzz::kJournalRingBuckets;
  if (size > ring) return 0;
  static const sb::Superblock s = fuzz::JournalSuperblock();
  userspace::MemDeviceOptions o;
  o.name = "ssd.a";
  o.size = fuzz::kJournalDevSize;
  auto dev = std::make_unique<userspace::MemDevice>(o);
  dev->WriteRaw(s.BucketOffset(s.members[0].journal_first_bucket), data, size);
  dev::DeviceSet devs;
  if (!devs.Add(dev.get(), "ssd.a", dev::QueueConfig{}).ok()) fuzz::Fail("device set");
  for (bool past : {false, true}) {
    journal::ReplayResult rr;
    Diag diag;
    if (!journal::ReadForReplay(devs, s, &rr, &diag, past).ok()) continue;
    u64 prev = 0;
    for (const journal::ReplayedEntry& e : rr.entries) {
      if (prev != 0 && (past ? e.seq <= prev : e.seq != prev + 1)) fuzz::Fail("replayed entries out of order");
      prev = e.seq;
      u64 keys = 0;
      Status st = journal::ForEachKey(e, [](void* ctx, u64, const journal::Key&) -> Status {
        ++*static_cast<u64*>(ctx);
        return Status::Ok();
      }, &keys);
      if (!st.ok() || keys != e.nkeys) fuzz::Fail("a replayed entry's keys do not walk");
    }
    if (!past && rr.durable_end != 0 && rr.gap_at == 0) fuzz::Fail("damage without a gap");
  }
  return 0;
}
