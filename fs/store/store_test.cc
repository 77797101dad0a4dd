// Store and allocator tests: format/open/close round trips, replay after power
// cuts, watermark reserves under concurrent allocation, bad device sets.
#include "store/store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mount/testing.h"
#include "userspace/platform/mem_device.h"

namespace tfs::store {
namespace {

using alloc::BucketState;
using alloc::Watermark;
using userspace::MemDevice;
using userspace::MemDeviceOptions;

constexpr u64 kSsdSize = 48ull << 20;
constexpr u64 kHddSize = 64ull << 20;

std::unique_ptr<MemDevice> Dev(const char* name, u64 size, std::vector<uint8_t> image = {}) {
  MemDeviceOptions o;
  o.name = name;
  o.size = size;
  o.volatile_cache = true;
  o.initial_image = std::move(image);
  return std::make_unique<MemDevice>(o);
}

struct Disks {
  std::unique_ptr<MemDevice> ssd = Dev("ssd0", kSsdSize);
  std::unique_ptr<MemDevice> hdd = Dev("hdd0", kHddSize);

  Status Format(const FormatOptions& o = testing::TwoTierFormat()) {
    return testing::FormatTwoTier(ssd.get(), hdd.get(), o);
  }
  std::vector<BlockDevice*> List(bool reversed = false) {
    if (reversed) return {hdd.get(), ssd.get()};
    return {ssd.get(), hdd.get()};
  }
  // What a power cut now leaves.
  Disks AfterPowerCut() const {
    Disks d;
    auto images = MemDevice::SnapshotDurable({ssd.get(), hdd.get()});  // one instant for both
    d.ssd = Dev("ssd0", kSsdSize, std::move(images[0]));
    d.hdd = Dev("hdd0", kHddSize, std::move(images[1]));
    return d;
  }
};

// The store's tests change user buckets' counts by hand (SetLiveSectors,
// Allocate without a data path): no accounting keys beside them, so their
// opens neither cross-check the accounting nor free user buckets counting
// nothing (OpenOptions::data_counts); FormatOpenCloseRoundTrip shows both.
OpenOptions Raw() {
  OpenOptions o;
  o.data_counts = false;
  return o;
}

TEST(StoreTest, FormatOpenCloseRoundTrip) {
  Disks d;
  ASSERT_TRUE(d.Format().ok());
  std::vector<u64> allocated;
  {
    Store e;
    OpenReport rep;
    ASSERT_TRUE(testing::OpenStore(&e, d.List(true), OpenOptions{}, &rep).ok());
    EXPECT_TRUE(rep.was_clean);
    EXPECT_EQ(e.sb().nr_members, 2u);
    EXPECT_STREQ(e.devs().member(0)->label(), "ssd.a");  // member order, not argument order
    EXPECT_EQ(e.devs().member(0)->bdev(), d.ssd.get());
    EXPECT_GT(e.sb().members[0].journal_nbuckets, 0u);
    EXPECT_EQ(e.sb().members[1].journal_nbuckets, 0u);
    dev::DevMask ssd = *e.devs().ResolveTarget("ssd");
    for (int i = 0; i < 10; i++) {
      Result<alloc::BucketRef> r = e.alloc().Allocate(ssd, 0, BucketState::kUser, Watermark::kForeground);
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(r->dev, 0u);
      allocated.push_back(r->bucket);
    }
    ASSERT_TRUE(e.Close().ok());
  }
  // Clean reopen: no replay, the allocations are records of the alloc
  // tree (read-only: a read-write open frees user buckets counting nothing).
  {
    Store e;
    OpenReport rep;
    OpenOptions ro;
    ro.read_only = true;
    ASSERT_TRUE(testing::OpenStore(&e, d.List(), ro, &rep).ok());
    EXPECT_TRUE(rep.was_clean);
    EXPECT_EQ(rep.replayed_keys, 0u);
    for (u64 b : allocated) EXPECT_EQ(e.alloc().Get(0, b).state, BucketState::kUser);
    alloc::DeviceUsage u = e.alloc().Usage(0);
    EXPECT_EQ(u.by_state[u8(BucketState::kUser)], 10u);
    EXPECT_EQ(u.by_state[u8(BucketState::kJournal)], e.sb().members[0].journal_nbuckets);
    EXPECT_EQ(u.by_state[u8(BucketState::kSb)], 0u);
    EXPECT_GE(e.alloc().Stats().records_loaded, 10u);
    EXPECT_EQ(rep.empty_freed, 0u);
  }
  // Read-write: the ten hold no data (no extent counted in them): freed,
  // and the checkpoint of the open wrote that.
  {
    Store e;
    OpenReport rep;
    ASSERT_TRUE(testing::OpenStore(&e, d.List(), OpenOptions{}, &rep).ok());
    EXPECT_EQ(rep.empty_freed, 10u);
    EXPECT_EQ(e.alloc().Stats().empty_freed_at_mount, 10u);
    for (u64 b : allocated) EXPECT_EQ(e.alloc().Get(0, b).state, BucketState::kFree);
    ASSERT_TRUE(e.Close().ok());
  }
  Store e;
  OpenReport rep;
  ASSERT_TRUE(testing::OpenStore(&e, d.List(), OpenOptions{}, &rep).ok());
  EXPECT_EQ(rep.empty_freed, 0u);
  EXPECT_EQ(e.alloc().Usage(0).by_state[u8(BucketState::kUser)], 0u);
}

// Incompatible feature flags (sb::kSbFeatureFlags): format sets none; a
// read-write open records those its caller asks for in the superblock before
// anything else is written (on disk while it is open), a read-only open and
// a read-write one that asks for none leave them as they are; the report
// says what the superblock had; SetFeatures (fsck's downgrade) takes them
// away at the close.
TEST(StoreTest, ReadWriteOpensRecordTheFeaturesTheirCallersAsk) {
  Disks d;
  Diag diag;
  ASSERT_TRUE(d.Format().ok());
  auto on_disk = [&] {
    sb::Superblock s;
    EXPECT_TRUE(sb::Read(*d.ssd, &s, &diag).ok()) << diag.text;
    return u16(s.flags & sb::kSbFeatureFlags);
  };
  EXPECT_EQ(on_disk(), 0u);
  auto open = [&](bool read_only, u16 features, OpenReport* rep, u16 set_at_close = 0xffff) {
    Store e;
    OpenOptions oo = Raw();
    oo.read_only = read_only;
    oo.features = features;
    ASSERT_TRUE(testing::OpenStore(&e, d.List(), oo, rep).ok());
    EXPECT_EQ(on_disk(), read_only ? rep->features : u16(rep->features | features)) << "while open";
    if (set_at_close != 0xffff) e.SetFeatures(set_at_close);
    ASSERT_TRUE(e.Close().ok());
  };
  OpenReport rep;
  open(true, sb::kSbXattrChunks, &rep);
  EXPECT_EQ(rep.features, 0u);
  EXPECT_EQ(on_disk(), 0u);
  open(false, 0, &rep);
  EXPECT_EQ(on_disk(), 0u);
  open(false, sb::kSbXattrChunks, &rep);
  EXPECT_EQ(rep.features, 0u);
  EXPECT_EQ(on_disk(), sb::kSbXattrChunks);
  open(false, 0, &rep);  // kept by an opener that does not ask
  EXPECT_EQ(rep.features, sb::kSbXattrChunks);
  EXPECT_EQ(on_disk(), sb::kSbXattrChunks);
  open(false, sb::kSbXattrChunks, &rep, 0);  // fsck -y: nothing needs it
  EXPECT_EQ(on_disk(), 0u);
}

TEST(StoreTest, ReplayAfterPowerCutKeepsDurableAllocations) {
  Disks d;
  ASSERT_TRUE(d.Format().ok());
  Store e;
  ASSERT_TRUE(testing::OpenStore(&e, d.List(), Raw()).ok());
  std::vector<alloc::BucketRef> durable;
  for (int i = 0; i < 20; i++) {
    Result<alloc::BucketRef> r = e.alloc().Allocate(0b11, 0, BucketState::kUser, Watermark::kForeground);
    ASSERT_TRUE(r.ok());
    durable.push_back(*r);
  }
  ASSERT_TRUE(e.alloc().Free(durable[0]).ok());
  ASSERT_TRUE(e.alloc().SetLiveSectors(durable[1], 100).ok());
  ASSERT_TRUE(e.journal().Flush().ok());
  Disks cut = d.AfterPowerCut();  // the store was never closed

  Store e2;
  OpenReport rep;
  ASSERT_TRUE(testing::OpenStore(&e2, cut.List(), Raw(), &rep).ok());
  EXPECT_FALSE(rep.was_clean);
  EXPECT_EQ(rep.replayed_keys, 22u);
  EXPECT_EQ(e2.alloc().Get(durable[0].dev, durable[0].bucket).state, BucketState::kFree);
  EXPECT_EQ(e2.alloc().Get(durable[0].dev, durable[0].bucket).gen, u8(durable[0].gen + 1));
  EXPECT_EQ(e2.alloc().Get(durable[1].dev, durable[1].bucket).live_sectors, 100u);
  for (int i = 1; i < 20; i++) {
    EXPECT_EQ(e2.alloc().Get(durable[i].dev, durable[i].bucket).state, BucketState::kUser) << i;
  }
  ASSERT_TRUE(e2.Close().ok());
  ASSERT_TRUE(e.Close().ok());  // the original store still closes on its own disks

  // The replayed state was checkpointed at open: a later crash does not need it.
  Disks cut2 = cut.AfterPowerCut();
  Store e3;
  ASSERT_TRUE(testing::OpenStore(&e3, cut2.List(), Raw(), &rep).ok());
  EXPECT_EQ(e3.alloc().Get(durable[1].dev, durable[1].bucket).live_sectors, 100u);
}

// The allocator is loaded from the alloc btree (docs/format/alloc.md, "Mount
// order"): every bucket a run of allocations, frees and live-count changes
// touched comes back as it was -- state, generation, live sectors, version --
// across a clean remount (the records in the checkpointed tree, nothing
// replayed) and across a power cut (the tree as last checkpointed, then the
// journal's records replayed over it, newer versions winning). On the HDD
// member, which holds no node bucket: the checkpoints change nothing there.
TEST(StoreTest, AllocationStateComesBackFromTheAllocTree) {
  Disks d;
  ASSERT_TRUE(d.Format().ok());
  std::mt19937 rng(5);
  std::map<std::pair<u32, u64>, alloc::Bucket> touched;
  auto run = [&](Store& e, int n) {
    std::vector<alloc::BucketRef> held;
    for (int i = 0; i < n; i++) {
      const int op = int(rng() % 4);
      if (op < 2 || held.empty()) {
        Result<alloc::BucketRef> r = e.alloc().Allocate(0b10, 0, BucketState::kUser, Watermark::kForeground);
        ASSERT_TRUE(r.ok());
        held.push_back(*r);
      } else if (op == 2) {
        const size_t k = rng() % held.size();
        ASSERT_TRUE(e.alloc().Free(held[k]).ok());
        touched[{held[k].dev, held[k].bucket}] = {};  // (a free too)
        held.erase(held.begin() + long(k));
      } else {
        ASSERT_TRUE(e.alloc().SetLiveSectors(held[rng() % held.size()], u32(rng() % 512)).ok());
      }
    }
    for (const auto& b : held) touched[{b.dev, b.bucket}] = {};
  };
  auto note = [&](Store& e) {
    for (auto& [k, b] : touched) b = e.alloc().Get(k.first, k.second);
  };
  auto expect = [&](Store& e, const char* when) {
    for (const auto& [k, want] : touched) {
      const alloc::Bucket got = e.alloc().Get(k.first, k.second);
      EXPECT_TRUE(got.state == want.state && got.gen == want.gen && got.live_sectors == want.live_sectors &&
                  got.version == want.version)
          << when << ": member " << k.first << " bucket " << k.second << ": state " << int(got.state) << " gen "
          << int(got.gen) << " live " << got.live_sectors << " v" << got.version << ", want " << int(want.state)
          << "/" << int(want.gen) << "/" << want.live_sectors << " v" << want.version;
    }
  };
  {
    Store e;
    ASSERT_TRUE(testing::OpenStore(&e, d.List(), Raw()).ok());
    ASSERT_NO_FATAL_FAILURE(run(e, 300));
    note(e);
    EXPECT_GE(e.alloc().Stats().record_commits, 300u);
    ASSERT_TRUE(e.Close().ok());
  }
  {
    Store e;
    OpenReport rep;
    ASSERT_TRUE(testing::OpenStore(&e, d.List(), Raw(), &rep).ok());
    EXPECT_TRUE(rep.was_clean);
    EXPECT_EQ(rep.replayed_keys, 0u);
    EXPECT_GE(rep.alloc_records, touched.size());
    EXPECT_EQ(rep.bad_alloc_records, 0u);
    expect(e, "clean remount");
    // More changes, one checkpoint in the middle, then a power cut.
    ASSERT_NO_FATAL_FAILURE(run(e, 150));
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
    ASSERT_NO_FATAL_FAILURE(run(e, 150));
    ASSERT_TRUE(e.journal().Flush().ok());
    note(e);
    Disks cut = d.AfterPowerCut();
    Store e2;
    ASSERT_TRUE(testing::OpenStore(&e2, cut.List(), Raw(), &rep).ok());
    EXPECT_FALSE(rep.was_clean);
    EXPECT_GT(rep.replayed_keys, 0u);
    expect(e2, "after a power cut");
    ASSERT_TRUE(e2.Close().ok());
    ASSERT_TRUE(e.Close().ok());
  }
}

// Allocation records are btree keys: a small ring fills with them, and the
// btree's checkpoints reclaim it (the btree writer checkpoints once its pin
// holds half the ring; there is no allocator checkpoint any more).
TEST(StoreTest, JournalReclaimCheckpointsAllocationRecords) {
  Disks d;
  FormatOptions o = testing::TwoTierFormat();
  o.journal_buckets = 4;  // 4 x 256 KiB: fills quickly
  ASSERT_TRUE(d.Format(o).ok());
  Store e;
  OpenOptions oo = Raw();
  oo.journal.write_delay_ns = 0;
  ASSERT_TRUE(testing::OpenStore(&e, d.List(), oo).ok());
  // Each allocate/free pair is two journaled changes; flush often so entries are
  // many and small.
  for (int i = 0; i < 600; i++) {
    Result<alloc::BucketRef> r = e.alloc().Allocate(0b10, 0, BucketState::kUser, Watermark::kForeground);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(e.alloc().Free(*r).ok());
    ASSERT_TRUE(e.journal().Flush().ok());
  }
  EXPECT_GE(e.btrees().GetStats().checkpoints, 1u);
  EXPECT_GE(e.alloc().Stats().record_commits, 1200u);
  Disks cut = d.AfterPowerCut();
  Store e2;
  ASSERT_TRUE(testing::OpenStore(&e2, cut.List(), Raw()).ok());
  alloc::DeviceUsage u = e2.alloc().Usage(1);
  EXPECT_EQ(u.by_state[u8(BucketState::kUser)], 0u);  // every pair ended freed
}

// Random allocate/free/live-count changes with periodic durable flushes and a
// small journal (so reclaim checkpoints happen mid-run), power cuts at random
// moments from another thread. After each cut the reopened allocator must hold, for
// every bucket, the state it had at the newest flush acknowledged before the cut or
// a state it reached later -- never an older or an invented one.
TEST(StoreTest, PowerCutsDuringAllocationKeepEveryAcknowledgedChange) {
  Disks d;
  FormatOptions o = testing::TwoTierFormat();
  o.journal_buckets = 4;
  ASSERT_TRUE(d.Format(o).ok());
  Store e;
  OpenOptions oo = Raw();
  oo.journal.write_delay_ns = 100 * 1000;
  ASSERT_TRUE(testing::OpenStore(&e, d.List(), oo).ok());

  struct Key {
    u32 dev;
    u64 bucket;
    bool operator<(const Key& k) const { return dev != k.dev ? dev < k.dev : bucket < k.bucket; }
  };
  struct Version {
    BucketState state;
    u32 live;
  };
  // history[key] = every (state, live) the bucket went through, in order.
  std::map<Key, std::vector<Version>> history;
  std::mutex mu;
  // At each acknowledged flush: for each bucket, the index in its history.
  std::map<Key, size_t> flushed;
  struct Cut {
    std::map<Key, size_t> flushed;
    std::vector<uint8_t> ssd, hdd;
  };
  std::vector<Cut> cuts;
  std::atomic<bool> done{false};
  std::thread cutter([&] {
    std::mt19937 rng(3);
    while ((!done.load() || cuts.size() < 3) && cuts.size() < 12) {
      platform::SleepNs((2 + rng() % 10) * platform::kNsPerMs);
      Cut c;
      {
        std::lock_guard<std::mutex> lock(mu);
        c.flushed = flushed;
      }
      auto images = MemDevice::SnapshotDurable({d.ssd.get(), d.hdd.get()});
      c.ssd = std::move(images[0]);
      c.hdd = std::move(images[1]);
      cuts.push_back(std::move(c));
    }
  });
  std::mt19937 rng(11);
  std::vector<alloc::BucketRef> live;
  for (int i = 0; i < 3000; i++) {
    int action = int(rng() % 10);
    if (action < 5 || live.empty()) {
      Result<alloc::BucketRef> r = e.alloc().Allocate(0b11, 0, BucketState::kUser, Watermark::kBackground);
      if (r.ok()) {
        live.push_back(*r);
        std::lock_guard<std::mutex> lock(mu);
        history[{r->dev, r->bucket}].push_back({BucketState::kUser, 0});
      }
    } else if (action < 8) {
      size_t k = rng() % live.size();
      alloc::BucketRef ref = live[k];
      live.erase(live.begin() + ptrdiff_t(k));
      ASSERT_TRUE(e.alloc().Free(ref).ok());
      std::lock_guard<std::mutex> lock(mu);
      history[{ref.dev, ref.bucket}].push_back({BucketState::kFree, 0});
    } else {
      alloc::BucketRef ref = live[rng() % live.size()];
      u32 sectors = u32(rng() % 512);
      ASSERT_TRUE(e.alloc().SetLiveSectors(ref, sectors).ok());
      std::lock_guard<std::mutex> lock(mu);
      history[{ref.dev, ref.bucket}].push_back({BucketState::kUser, sectors});
    }
    if (i % 10 == 9) {
      std::map<Key, size_t> now;
      {
        std::lock_guard<std::mutex> lock(mu);
        for (auto& [k, h] : history) now[k] = h.size() - 1;
      }
      ASSERT_TRUE(e.journal().Flush().ok());
      std::lock_guard<std::mutex> lock(mu);
      flushed = std::move(now);
    }
  }
  done = true;
  cutter.join();
  EXPECT_GE(e.btrees().GetStats().checkpoints, 1u);
  ASSERT_GE(cuts.size(), 3u);
  for (Cut& c : cuts) {
    Disks cd;
    cd.ssd = Dev("ssd0", kSsdSize, std::move(c.ssd));
    cd.hdd = Dev("hdd0", kHddSize, std::move(c.hdd));
    Store e2;
    OpenOptions ro = Raw();
    ro.read_only = true;
    ASSERT_TRUE(testing::OpenStore(&e2, cd.List(), ro).ok());
    for (auto& [k, h] : history) {
      alloc::Bucket b = e2.alloc().Get(k.dev, k.bucket);
      auto f = c.flushed.find(k);
      size_t from = f == c.flushed.end() ? 0 : f->second;
      bool ok = false;
      // Never-flushed buckets may also still be free (their allocation was lost).
      if (f == c.flushed.end() && b.state == BucketState::kFree) ok = true;
      for (size_t v = from; v < h.size() && !ok; v++) {
        ok = h[v].state == b.state && h[v].live == b.live_sectors;
        // A bucket freed here may since hold nodes of the alloc btree (the
        // allocation records are btree keys: its checkpoints take buckets
        // on the SSD, which this history does not see).
        ok = ok || (h[v].state == BucketState::kFree && b.state == BucketState::kBtree);
      }
      ASSERT_TRUE(ok) << "dev " << k.dev << " bucket " << k.bucket << " is " << alloc::BucketStateName(b.state)
                      << "/" << b.live_sectors << "; acknowledged version " << from << " of " << h.size();
    }
  }
}

TEST(StoreTest, WatermarksHoldUnderConcurrentForegroundAndBackground) {
  Disks d;
  ASSERT_TRUE(d.Format().ok());
  Store e;
  ASSERT_TRUE(testing::OpenStore(&e, d.List(), Raw()).ok());
  const u32 ssd = 0;
  u64 fg_floor = e.alloc().FreeFloor(ssd, Watermark::kForeground);
  u64 bg_floor = e.alloc().FreeFloor(ssd, Watermark::kBackground);
  ASSERT_GT(bg_floor, fg_floor);
  std::atomic<u64> bg_got{0}, fg_got{0};
  // Background keeps allocating on the SSD (no fallback) until refused; so does a
  // foreground thread, at the same time.
  std::thread bg([&] {
    while (e.alloc().Allocate(1u << ssd, 0, BucketState::kUser, Watermark::kBackground).ok()) bg_got++;
  });
  std::thread fg([&] {
    while (e.alloc().Allocate(1u << ssd, 0, BucketState::kUser, Watermark::kForeground).ok()) fg_got++;
  });
  bg.join();
  fg.join();
  // (The floors follow the btree's declared need, which the allocations'
  // records -- alloc btree keys -- raise as they dirty alloc leaves: as they
  // are now.)
  fg_floor = e.alloc().FreeFloor(ssd, Watermark::kForeground);
  bg_floor = e.alloc().FreeFloor(ssd, Watermark::kBackground);
  alloc::DeviceUsage u = e.alloc().Usage(ssd);
  u64 free_left = u.by_state[u8(BucketState::kFree)];
  EXPECT_EQ(free_left, fg_floor);  // foreground stopped at its floor
  EXPECT_GT(fg_got.load(), 0u);
  // Background never went below its floor: whatever it took, foreground still had
  // bg_floor - fg_floor buckets to itself.
  EXPECT_GE(fg_got.load(), bg_floor - fg_floor);
  // Now background is refused, foreground too; copygc and btree still get theirs.
  EXPECT_FALSE(e.alloc().Allocate(1u << ssd, 0, BucketState::kUser, Watermark::kBackground).ok());
  EXPECT_FALSE(e.alloc().Allocate(1u << ssd, 0, BucketState::kUser, Watermark::kForeground).ok());
  EXPECT_TRUE(e.alloc().Allocate(1u << ssd, 0, BucketState::kUser, Watermark::kCopygc).ok());
  EXPECT_TRUE(e.alloc().Allocate(1u << ssd, 0, BucketState::kBtree, Watermark::kBtree).ok());
  // A full fast tier makes foreground fall back to the fallback mask (the HDD).
  Result<alloc::BucketRef> r =
      e.alloc().Allocate(1u << ssd, 0b10, BucketState::kUser, Watermark::kForeground);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->dev, 1u);
  EXPECT_GE(e.alloc().Stats().fallbacks, 1u);
}

TEST(StoreTest, FreedBucketsAreReusedOnlyOnceTheFreeIsDurable) {
  Disks d;
  ASSERT_TRUE(d.Format().ok());
  Store e;
  OpenOptions oo = Raw();
  oo.journal.write_delay_ns = 60 * platform::kNsPerSec;  // nothing durable on its own
  oo.journal.flush_delay_ns = 60 * platform::kNsPerSec;
  ASSERT_TRUE(testing::OpenStore(&e, d.List(), oo).ok());
  const dev::DevMask hdd = 0b10;
  alloc::BucketRef a = *e.alloc().Allocate(hdd, 0, BucketState::kUser, Watermark::kForeground);
  ASSERT_TRUE(e.alloc().Free(a).ok());
  EXPECT_EQ(e.alloc().Usage(1).pending_free, 1u);
  alloc::BucketRef b = *e.alloc().Allocate(hdd, 0, BucketState::kUser, Watermark::kForeground);
  EXPECT_NE(b.bucket, a.bucket) << "reused a bucket whose free is not durable";
  ASSERT_TRUE(e.journal().Flush().ok());
  alloc::BucketRef c = *e.alloc().Allocate(hdd, 0, BucketState::kUser, Watermark::kForeground);
  EXPECT_EQ(c.bucket, a.bucket);  // durable now: the most recently freed goes first
  EXPECT_EQ(c.gen, u8(a.gen + 1));
  EXPECT_EQ(e.alloc().Usage(1).pending_free, 0u);

  // Exhaust the HDD; a free then makes the next allocation flush the journal.
  while (e.alloc().Allocate(hdd, 0, BucketState::kUser, Watermark::kBtree).ok()) {
  }
  ASSERT_TRUE(e.alloc().Free(b).ok());
  u64 durable = e.journal().durable_seq();
  Result<alloc::BucketRef> r = e.alloc().Allocate(hdd, 0, BucketState::kUser, Watermark::kBtree);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->bucket, b.bucket);
  EXPECT_GT(e.journal().durable_seq(), durable);
  EXPECT_EQ(e.alloc().Stats().flush_waits, 1u);
}

TEST(StoreTest, AllocatorRefusesWrongPurposeAndStaleRefs) {
  Disks d;
  ASSERT_TRUE(d.Format().ok());
  Store e;
  ASSERT_TRUE(testing::OpenStore(&e, d.List(), Raw()).ok());
  // The HDD accepts only user data.
  EXPECT_EQ(e.alloc().Allocate(0b10, 0, BucketState::kBtree, Watermark::kBtree).status(),
            Status(Err::kNoSpace));
  Result<alloc::BucketRef> r = e.alloc().Allocate(0b10, 0, BucketState::kUser, Watermark::kForeground);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(e.alloc().Free(*r).ok());
  EXPECT_EQ(e.alloc().Free(*r), Status(Err::kInvalidArgument));  // stale generation
  alloc::BucketRef journal_bucket{0, e.sb().members[0].journal_first_bucket, 0};
  EXPECT_EQ(e.alloc().Free(journal_bucket), Status(Err::kInvalidArgument));
}

// An unmount whose checkpoint fails leaves the superblock unclean, and the
// journal must still hold every commit since the last roots block: the
// trees' pin stays until the journal has stopped (Btrees::DetachJournal).
// Dropped at Close, the entry Journal::Stop writes (here: the failed
// checkpoint's record of the one bucket it got, before it ran out of room at
// the btree watermark) records a last_seq of its own, and the next mount
// replays nothing before it -- the acknowledged allocations were lost.
TEST(StoreTest, AFailedUnmountCheckpointLosesNoFlushedCommit) {
  Disks d;
  FormatOptions o = testing::TwoTierFormat();
  o.btree_node_size = o.bucket_size;  // one slot per bucket: a checkpoint takes a bucket per node
  ASSERT_TRUE(d.Format(o).ok());
  std::vector<alloc::BucketRef> held;
  {
    Store e;
    OpenOptions oo = Raw();
    oo.btree.writer_thread = false;  // no checkpoint but the unmount's
    ASSERT_TRUE(testing::OpenStore(&e, d.List(), oo).ok());
    for (int i = 0; i < 12; i++) {
      Result<alloc::BucketRef> r = e.alloc().Allocate(0b11, 0, BucketState::kUser, Watermark::kForeground);
      ASSERT_TRUE(r.ok());
      held.push_back(*r);
    }
    ASSERT_TRUE(e.alloc().SetLiveSectors(held[0], 77).ok());
    ASSERT_TRUE(e.journal().Flush().ok());  // acknowledged
    // The SSD full but for one bucket: the unmount's checkpoint gets it, and
    // no second one.
    alloc::BucketRef last{};
    for (;;) {
      Result<alloc::BucketRef> r = e.alloc().Allocate(0b01, 0, BucketState::kUser, Watermark::kBtree);
      if (!r.ok()) break;
      last = *r;
    }
    ASSERT_TRUE(e.alloc().Free(last).ok());
    EXPECT_EQ(e.Close().code(), Err::kNoSpace);
  }
  // Read-only: what replay brings back, without the post-replay checkpoint
  // (which the SSD, filled past the btree's reserve, has no room for either).
  Store e;
  OpenReport rep;
  OpenOptions ro = Raw();
  ro.read_only = true;
  ASSERT_TRUE(testing::OpenStore(&e, d.List(), ro, &rep).ok());
  EXPECT_FALSE(rep.was_clean);
  for (const alloc::BucketRef& b : held) {
    const alloc::Bucket got = e.alloc().Get(b.dev, b.bucket);
    EXPECT_EQ(got.state, BucketState::kUser) << b.dev << "/" << b.bucket;
    EXPECT_EQ(got.gen, b.gen);
  }
  EXPECT_EQ(e.alloc().Get(held[0].dev, held[0].bucket).live_sectors, 77u);
  ASSERT_TRUE(e.Close().ok());
}

// Versions near the validity limit (alloc/format.h): a valid record one
// below it is started again at version 1 by the read-write mount that loads
// it, so a later change is valid at the next mount (before: the change made
// it 2^63, implausible, and the next mount refused it as out of range).
TEST(StoreTest, AVersionJustBelowTheLimitStaysMountable) {
  Disks d;
  ASSERT_TRUE(d.Format().ok());
  const u64 bucket = 40;  // an HDD bucket nothing else touches
  for (u64 version : {alloc::kRecordVersionLimit - 1, alloc::kRecordVersionRebase}) {
    SCOPED_TRACE(version);
    {
      Store e;
      ASSERT_TRUE(testing::OpenStore(&e, d.List(), Raw()).ok());
      alloc::Bucket b = e.alloc().Get(1, bucket);
      ASSERT_EQ(b.state, BucketState::kFree);
      b.state = BucketState::kUser;
      b.version = version;
      alloc::AllocRecord rec;
      alloc::EncodeRecord(b, &rec);
      btree::Transaction tx(&e.btrees());
      ASSERT_TRUE(tx.Set(btree::Pos{btree::kBtreeAlloc, 1, bucket}, &rec, sizeof(rec)).ok());
      ASSERT_TRUE(tx.Commit().ok());
      ASSERT_TRUE(e.Close().ok());
    }
    u8 gen;
    {
      Store e;
      ASSERT_TRUE(testing::OpenStore(&e, d.List(), Raw()).ok());
      const alloc::Bucket b = e.alloc().Get(1, bucket);
      ASSERT_EQ(b.state, BucketState::kUser);
      EXPECT_LT(b.version, alloc::kRecordVersionRebase);
      EXPECT_GE(e.alloc().Stats().rebased_records, 1u);
      gen = b.gen;
      ASSERT_TRUE(e.alloc().Free(alloc::BucketRef{1, bucket, gen}).ok());  // a live change
      ASSERT_TRUE(e.Close().ok());
    }
    {
      Store e;
      OpenReport rep;
      ASSERT_TRUE(testing::OpenStore(&e, d.List(), Raw(), &rep).ok());
      EXPECT_EQ(rep.bad_alloc_records, 0u);
      EXPECT_EQ(e.alloc().Get(1, bucket).state, BucketState::kFree);
      EXPECT_EQ(e.alloc().Get(1, bucket).gen, u8(gen + 1));
      EXPECT_EQ(e.alloc().Stats().rebased_records, 0u);
      ASSERT_TRUE(e.Close().ok());
    }
  }
}

TEST(StoreTest, FormatRejectsBadInput) {
  Diag diag;
  Disks d;
  FormatMember two[2] = {{d.ssd.get(), "ssd.a", 1}, {d.hdd.get(), "hdd.b", 1}};
  FormatOptions o = testing::TwoTierFormat();
  o.bucket_size = 3000;
  EXPECT_TRUE(Format(two, 2, o, &diag).Is(ErrorClass::kInvalid));
  EXPECT_NE(std::string(diag.text).find("bucket size"), std::string::npos) << diag.text;
  o = testing::TwoTierFormat();
  o.background_target = "tape";
  EXPECT_TRUE(Format(two, 2, o, &diag).Is(ErrorClass::kNotFound));
  EXPECT_NE(std::string(diag.text).find("tape"), std::string::npos) << diag.text;
  o = testing::TwoTierFormat();
  o.journal_buckets = journal::kMinRingBuckets - 1;  // no room for reserve and slack
  EXPECT_TRUE(Format(two, 2, o, &diag).Is(ErrorClass::kInvalid));
  EXPECT_NE(std::string(diag.text).find("at least 4 buckets"), std::string::npos) << diag.text;
  auto tiny = Dev("tiny", 2 << 20);
  FormatMember m[1] = {{tiny.get(), "ssd", 1}};
  FormatOptions plain;
  plain.bucket_size = 256 * 1024;
  EXPECT_TRUE(Format(m, 1, plain, &diag).Is(ErrorClass::kNoSpace));
  EXPECT_NE(std::string(diag.text).find("too small"), std::string::npos) << diag.text;
  FormatMember bad[1] = {{d.ssd.get(), "Bad Label", 1}};
  EXPECT_TRUE(Format(bad, 1, FormatOptions{}, &diag).Is(ErrorClass::kInvalid));
}

TEST(StoreTest, OpenRefusesIncompleteOrMixedSetsAndUsesBackupSuperblock) {
  Disks a, b;
  ASSERT_TRUE(a.Format().ok());
  ASSERT_TRUE(b.Format().ok());
  Diag diag;
  {
    Store e;
    BlockDevice* only_ssd[1] = {a.ssd.get()};
    EXPECT_EQ(e.Open(only_ssd, 1, Raw(), &diag), Status(Err::kNotFound));
    EXPECT_NE(std::string(diag.text).find("hdd.b"), std::string::npos) << diag.text;
  }
  {
    Store e;
    BlockDevice* mixed[2] = {a.ssd.get(), b.hdd.get()};
    EXPECT_TRUE(e.Open(mixed, 2, Raw(), &diag).Is(ErrorClass::kInvalid));
    EXPECT_NE(std::string(diag.text).find("different filesystems"), std::string::npos) << diag.text;
  }
  {
    auto blank = Dev("blank", kHddSize);
    Store e;
    BlockDevice* with_blank[2] = {a.ssd.get(), blank.get()};
    EXPECT_EQ(e.Open(with_blank, 2, Raw(), &diag), Status(Err::kBadMagic));
    EXPECT_NE(std::string(diag.text).find("not a tierfs device"), std::string::npos) << diag.text;
  }
  // Corrupt the SSD's primary superblock: open uses the backup, and rewrites both.
  u8 junk[16];
  memset(junk, 0x5a, sizeof(junk));
  a.ssd->WriteRaw(sb::kSbPrimaryOffset + 64, junk, sizeof(junk));
  Store e;
  OpenReport rep;
  ASSERT_TRUE(testing::OpenStore(&e, a.List(), Raw(), &rep).ok());
  EXPECT_EQ(rep.used_backup_sb, 1u);
  ASSERT_TRUE(e.Close().ok());
  sb::Superblock s;
  Result<sb::ReadResult> rr = sb::Read(*a.ssd, &s);
  ASSERT_TRUE(rr.ok());
  EXPECT_FALSE(rr->used_backup);
}

}  // namespace
}  // namespace tfs::store
