// data::DataPath with IoContexts: each (target, class) has its own write
// point -- one per set of members a target names -- every request carries
// its context's origin and class, the targets place new data, and a full
// write point table sends a write to the foreground target's.
#include "data/data.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data/testing.h"
#include "mount/testing.h"
#include "userspace/platform/mem_device.h"

namespace tfs::data {
namespace {

// Two members: "ssd.a" (foreground and metadata target) and "hdd.b"
// (background target), with the store and the data path open on them. The
// SSD is seen through a gate holding back promote reads.
struct TwoMembers {
  std::unique_ptr<userspace::MemDevice> ssd_mem = testing::MemMember();
  std::unique_ptr<testing::GateDevice> ssd =
      std::make_unique<testing::GateDevice>(ssd_mem.get(), IoOp::kRead, IoOrigin::kPromote);
  std::unique_ptr<userspace::MemDevice> hdd = testing::MemMember();
  store::Store store;
  DataPath data;

  explicit TwoMembers(const store::OpenOptions& oo = store::OpenOptions{}) {
    if (!testing::FormatTwoTier(ssd.get(), hdd.get()).ok()) return;
    if (!testing::OpenStore(&store, {ssd.get(), hdd.get()}, oo).ok()) return;
    EXPECT_TRUE(data.Open(&store).ok());
  }
  ~TwoMembers() {
    data.Close();
    EXPECT_TRUE(store.Close().ok());
  }
  u32 Member(const char* label) const {
    for (u32 i = 0; i < store.sb().nr_members; i++)
      if (std::string(store.sb().members[i].label) == label) return i;
    ADD_FAILURE() << "no member " << label;
    return 0;
  }
  // Writes `nblocks` blocks of `fill` at block `first` of `ino` for ctx and commits them.
  void Write(const IoContext& ctx, u64 ino, u64 first, u32 nblocks, char fill) {
    std::vector<u8> buf(u64(nblocks) * kBlockSize, u8(fill));
    btree::Transaction tx(&store.btrees());
    Delta delta;
    ASSERT_TRUE(data.QueueWrite(ctx, &tx, ino, first, buf.data(), nblocks, &delta).ok());
    ASSERT_TRUE(data.Commit(ctx, &tx, delta).ok());
  }
  // Punches blocks [first, end) of `ino` and commits it.
  void Punch(u64 ino, u64 first, u64 end) {
    btree::Transaction tx(&store.btrees());
    Delta delta;
    ASSERT_TRUE(data.QueuePunch(&tx, ino, first, end, &delta).ok());
    ASSERT_TRUE(data.Commit(kForegroundWrite, &tx, delta).ok());
  }
  u64 Ops(u32 member, IoOrigin origin, IoOp op) {
    dev::OriginStats s;
    store.devs().member(member)->queue().ReadStats(origin, &s);
    return s.ops[int(op)];
  }
};

constexpr IoContext kBackgroundWrite = {IoOrigin::kReconcile, dev::IoClass::kBackground,
                                        alloc::Watermark::kBackground, Target{TargetKind::kBackground, 0}};

TEST(DataPathTest, EachTargetAndClassHasItsOwnWritePoint) {
  TwoMembers t;
  const u32 ssd = t.Member("ssd.a");
  const u32 hdd = t.Member("hdd.b");
  t.Write(kForegroundWrite, 100, 0, 4, 'f');
  t.Write(kBackgroundWrite, 101, 0, 4, 'b');
  alloc::BucketRef fg, bg;
  ASSERT_TRUE(t.data.WritePointBucket(kForegroundWrite, &fg));
  ASSERT_TRUE(t.data.WritePointBucket(kBackgroundWrite, &bg));
  // Each on its target's member, never one bucket for both.
  EXPECT_EQ(fg.dev, ssd);
  EXPECT_EQ(bg.dev, hdd);
  // The same target in another class is another write point (another bucket).
  IoContext fg_async = kForegroundWrite;
  fg_async.io_class = dev::IoClass::kForegroundAsync;
  t.Write(fg_async, 102, 0, 1, 'a');
  alloc::BucketRef fa;
  ASSERT_TRUE(t.data.WritePointBucket(fg_async, &fa));
  EXPECT_EQ(fa.dev, ssd);
  EXPECT_NE(fa.bucket, fg.bucket);
  EXPECT_EQ(t.data.GetStats().write_points, 3u);
  // Interleaved writes keep appending to their own buckets.
  t.Write(kForegroundWrite, 100, 4, 4, 'g');
  t.Write(kBackgroundWrite, 101, 4, 4, 'c');
  alloc::BucketRef fg2, bg2;
  ASSERT_TRUE(t.data.WritePointBucket(kForegroundWrite, &fg2));
  ASSERT_TRUE(t.data.WritePointBucket(kBackgroundWrite, &bg2));
  EXPECT_EQ(fg2.bucket, fg.bucket);
  EXPECT_EQ(bg2.bucket, bg.bucket);
  // A member target places data on that member, whatever the groups say.
  IoContext on_hdd = kForegroundWrite;
  on_hdd.target = Target{TargetKind::kMember, u8(hdd)};
  t.Write(on_hdd, 103, 0, 1, 'm');
  alloc::BucketRef m;
  ASSERT_TRUE(t.data.WritePointBucket(on_hdd, &m));
  EXPECT_EQ(m.dev, hdd);
  EXPECT_NE(m.bucket, bg.bucket);
  // Everything reads back.
  std::vector<u8> buf(8 * kBlockSize);
  ASSERT_TRUE(t.data.ReadBlocks(kForegroundRead, 101, 0, 8, buf.data()).ok());
  EXPECT_EQ(buf[0], 'b');
  EXPECT_EQ(buf[4 * kBlockSize], 'c');
  ASSERT_TRUE(t.data.ReadBlocks(kForegroundRead, 100, 0, 8, buf.data()).ok());
  EXPECT_EQ(buf[0], 'f');
  EXPECT_EQ(buf[4 * kBlockSize], 'g');
}

TEST(DataPathTest, RequestsCarryTheirContextsOrigin) {
  TwoMembers t;
  const u32 hdd = t.Member("hdd.b");
  const u32 ssd = t.Member("ssd.a");
  const u64 fg0 = t.Ops(hdd, IoOrigin::kForegroundWrite, IoOp::kWrite);
  t.Write(kBackgroundWrite, 7, 0, 2, 'x');
  // The data write on the HDD is the reconcile's, not the foreground's ...
  EXPECT_EQ(t.Ops(hdd, IoOrigin::kReconcile, IoOp::kWrite), 1u);
  EXPECT_EQ(t.Ops(hdd, IoOrigin::kForegroundWrite, IoOp::kWrite), fg0);
  // ... and so is the flush its commit needs first (the HDD holds no journal).
  EXPECT_EQ(t.Ops(hdd, IoOrigin::kReconcile, IoOp::kFlush), 1u);
  // A read tagged as a promote's.
  IoContext promote = kForegroundRead;
  promote.origin = IoOrigin::kPromote;
  promote.io_class = dev::IoClass::kBackground;
  std::vector<u8> buf(2 * kBlockSize);
  ASSERT_TRUE(t.data.ReadBlocks(promote, 7, 0, 2, buf.data()).ok());
  EXPECT_EQ(buf[kBlockSize], 'x');
  EXPECT_EQ(t.Ops(hdd, IoOrigin::kPromote, IoOp::kRead), 1u);
  EXPECT_EQ(t.Ops(hdd, IoOrigin::kForegroundRead, IoOp::kRead), 0u);
  EXPECT_EQ(t.Ops(ssd, IoOrigin::kPromote, IoOp::kRead), 0u);
}

// A write point's bucket is not freed while it is open, even when every
// block written into it has been overwritten; once the write point moves
// on, the emptied bucket is freed.
TEST(DataPathTest, AnEmptiedBucketIsFreedOnlyWhenItsWritePointLeavesIt) {
  TwoMembers t;
  t.Write(kForegroundWrite, 9, 0, 1, 'a');
  alloc::BucketRef first;
  ASSERT_TRUE(t.data.WritePointBucket(kForegroundWrite, &first));
  const u64 freed0 = t.data.GetStats().buckets_freed;
  // Overwrite the block from another write point: the first bucket holds nothing live.
  t.Write(kBackgroundWrite, 9, 0, 1, 'b');
  EXPECT_EQ(t.data.GetStats().buckets_freed, freed0);
  EXPECT_EQ(t.store.alloc().Get(first.dev, first.bucket).state, alloc::BucketState::kUser);
  // Fill the foreground write point's bucket and go past it.
  const u32 per_bucket = u32(t.store.sb().bucket_size / kBlockSize);
  for (u32 i = 1; i < per_bucket + 1; i += 32) t.Write(kForegroundWrite, 10, i, 32, 'c');
  alloc::BucketRef now;
  ASSERT_TRUE(t.data.WritePointBucket(kForegroundWrite, &now));
  ASSERT_NE(now.bucket, first.bucket);
  // The first bucket still holds inode 10's blocks: only its own emptying frees it.
  EXPECT_EQ(t.store.alloc().Get(first.dev, first.bucket).state, alloc::BucketState::kUser);
  for (u32 i = 1; i < per_bucket + 1; i += 32) t.Write(kBackgroundWrite, 10, i, 32, 'd');
  EXPECT_NE(t.store.alloc().Get(first.dev, first.bucket).state, alloc::BucketState::kUser);
  EXPECT_GT(t.data.GetStats().buckets_freed, freed0);
}

// A read holds the bucket it reads from: a write point that moves on from a
// bucket emptied under a read in flight leaves it to the read, which frees
// it when it is done (before, the write point freed it under the read).
TEST(DataPathTest, ARetiredWritePointsBucketWaitsForItsReads) {
  TwoMembers t;
  const u32 per_bucket = u32(t.store.sb().bucket_size / kBlockSize);
  // Fill the foreground write point's bucket with inode 5, one extent per 32 blocks.
  for (u32 i = 0; i < per_bucket; i += 32) t.Write(kForegroundWrite, 5, i, 32, 'r');
  alloc::BucketRef b;
  ASSERT_TRUE(t.data.WritePointBucket(kForegroundWrite, &b));
  // A read of it, held in flight at the device.
  IoContext promote = kForegroundRead;
  promote.origin = IoOrigin::kPromote;
  t.ssd->Close();
  std::vector<u8> buf(4 * kBlockSize);
  std::atomic<int> read_code{-1};
  std::thread reader([&] { read_code = int(t.data.ReadBlocks(promote, 5, 0, 4, buf.data()).code()); });
  while (t.ssd->parked() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Everything in the bucket overwritten elsewhere, then the write point moves on.
  for (u32 i = 0; i < per_bucket; i += 32) t.Write(kBackgroundWrite, 5, i, 32, 'o');
  t.Write(kForegroundWrite, 6, 0, 1, 'n');
  alloc::BucketRef now;
  ASSERT_TRUE(t.data.WritePointBucket(kForegroundWrite, &now));
  EXPECT_NE(now.bucket, b.bucket);
  const u64 freed = t.data.GetStats().buckets_freed;
  EXPECT_EQ(t.store.alloc().Get(b.dev, b.bucket).state, alloc::BucketState::kUser);  // the read's
  t.ssd->Open();
  reader.join();
  EXPECT_EQ(read_code.load(), int(Err::kOk));
  EXPECT_EQ(buf[0], 'r');
  EXPECT_EQ(buf[4 * kBlockSize - 1], 'r');
  // The read's Unpin freed it.
  EXPECT_NE(t.store.alloc().Get(b.dev, b.bucket).state, alloc::BucketState::kUser);
  EXPECT_EQ(t.data.GetStats().buckets_freed, freed + 1);
}

// A read that looked its extent up before a punch pins the bucket only if
// the punch's free of it is not decided yet (review 3b F10): between the
// decision (ReleaseLocked, under acct_mu_) and the Free (which bumps the
// generation, after acct_mu_ is dropped) Pin used to succeed, and the
// bucket was then freed under the read -- reusable and rewritable while the
// read waits at its device, which would then fail as corrupt. Now the
// decision marks the bucket being freed: the pin fails as stale, and the
// read looks again and finds the hole.
TEST(DataPathTest, APinBetweenAFreesDecisionAndTheFreeIsRefused) {
  TwoMembers t;
  const u32 per_bucket = u32(t.store.sb().bucket_size / kBlockSize);
  for (u32 i = 0; i < per_bucket; i += 32) t.Write(kForegroundWrite, 5, i, 32, 'r');
  alloc::BucketRef b;
  ASSERT_TRUE(t.data.WritePointBucket(kForegroundWrite, &b));
  t.Write(kForegroundWrite, 6, 0, 1, 'n');  // the write point moves on: inode 5's blocks alone hold b
  alloc::BucketRef now;
  ASSERT_TRUE(t.data.WritePointBucket(kForegroundWrite, &now));
  ASSERT_NE(now.bucket, b.bucket);
  struct Race {
    std::mutex mu;
    std::condition_variable cv;
    int lookups = 0;
    bool decided = false;
    std::thread::id puncher;
    testing::GateDevice* gate = nullptr;
  } race;
  race.puncher = std::this_thread::get_id();
  race.gate = t.ssd.get();
  // The read's first lookup waits for the free's decision.
  t.data.SetLookupHookForTest([](void* ctx) {
    auto* r = static_cast<Race*>(ctx);
    std::unique_lock<std::mutex> l(r->mu);
    r->lookups++;
    r->cv.notify_all();
    if (r->lookups == 1) r->cv.wait(l, [&] { return r->decided; });
  }, &race);
  // The decision waits for the read to pin (its device read parked) or to
  // look again (its pin refused).
  t.data.SetTestPointForTest([](void* ctx, const char* point) {
    auto* r = static_cast<Race*>(ctx);
    if (std::this_thread::get_id() != r->puncher || strcmp(point, "free.decided") != 0) return;
    std::unique_lock<std::mutex> l(r->mu);
    r->decided = true;
    r->cv.notify_all();
    while (r->lookups < 2 && r->gate->parked() == 0) r->cv.wait_for(l, std::chrono::milliseconds(1));
  }, &race);
  IoContext promote = kForegroundRead;
  promote.origin = IoOrigin::kPromote;
  t.ssd->Close();
  std::vector<u8> buf(4 * kBlockSize, 'x');
  std::atomic<int> read_code{-1};
  std::thread reader([&] { read_code = int(t.data.ReadBlocks(promote, 5, 0, 4, buf.data()).code()); });
  {
    std::unique_lock<std::mutex> l(race.mu);
    race.cv.wait(l, [&] { return race.lookups >= 1; });
  }
  const u64 stale0 = t.data.GetStats().stale_lookups;
  t.Punch(5, 0, per_bucket);  // empties b: its Apply decides the free
  // Freed, and no read holds it.
  EXPECT_NE(t.store.alloc().Get(b.dev, b.bucket).state, alloc::BucketState::kUser);
  EXPECT_EQ(t.ssd->parked(), 0u) << "a read pinned the bucket being freed, and reads it freed";
  t.ssd->Open();
  reader.join();
  t.data.SetLookupHookForTest(nullptr, nullptr);
  t.data.SetTestPointForTest(nullptr, nullptr);
  EXPECT_EQ(read_code.load(), int(Err::kOk));
  EXPECT_EQ(buf[0], 0);  // the hole the second lookup found
  EXPECT_EQ(buf[4 * kBlockSize - 1], 0);
  EXPECT_EQ(t.data.GetStats().stale_lookups, stale0 + 1);
}

// A write point is keyed by the members its target places data on: a
// member and the group it is alone in share one, as do two members' names
// for one group of two; a member of that group alone is another (its own
// mask). Before, each spelling had a write point of its own, and the table
// could fill.
TEST(DataPathTest, TargetsWithTheSameMembersShareAWritePoint) {
  auto ssd = testing::MemMember();
  auto hdd_b = testing::MemMember();
  auto hdd_c = testing::MemMember();
  ASSERT_TRUE(testing::FormatMembers({ssd.get(), hdd_b.get(), hdd_c.get()}, testing::TwoTierFormat(),
                                     {"ssd.a", "hdd.b", "hdd.c"})
                  .ok());
  store::Store store;
  ASSERT_TRUE(testing::OpenStore(&store, {ssd.get(), hdd_b.get(), hdd_c.get()}).ok());
  DataPath data;
  ASSERT_TRUE(data.Open(&store).ok());
  u32 idx[3] = {};
  for (u32 i = 0; i < store.sb().nr_members; i++) {
    const std::string label = store.sb().members[i].label;
    idx[label == "ssd.a" ? 0 : label == "hdd.b" ? 1 : 2] = i;
  }
  auto ctx = [](TargetKind kind, u32 member) {
    IoContext c = kForegroundWrite;
    c.target = Target{kind, u8(member)};
    return c;
  };
  auto write = [&](const IoContext& c, u64 ino) {
    std::vector<u8> buf(4 * kBlockSize, u8('a' + ino));
    btree::Transaction tx(&store.btrees());
    Delta delta;
    ASSERT_TRUE(data.QueueWrite(c, &tx, ino, 0, buf.data(), 4, &delta).ok());
    ASSERT_TRUE(data.Commit(c, &tx, delta).ok());
  };
  const IoContext group_b = ctx(TargetKind::kGroup, idx[1]);
  const IoContext group_c = ctx(TargetKind::kGroup, idx[2]);
  const IoContext member_ssd = ctx(TargetKind::kMember, idx[0]);
  const IoContext group_ssd = ctx(TargetKind::kGroup, idx[0]);
  const IoContext member_b = ctx(TargetKind::kMember, idx[1]);
  write(group_b, 20);
  write(group_c, 21);
  write(member_ssd, 22);
  write(group_ssd, 23);
  write(member_b, 24);
  EXPECT_EQ(data.GetStats().write_points, 3u);
  alloc::BucketRef gb, gc, ms, gs, mb;
  ASSERT_TRUE(data.WritePointBucket(group_b, &gb));
  ASSERT_TRUE(data.WritePointBucket(group_c, &gc));
  ASSERT_TRUE(data.WritePointBucket(member_ssd, &ms));
  ASSERT_TRUE(data.WritePointBucket(group_ssd, &gs));
  ASSERT_TRUE(data.WritePointBucket(member_b, &mb));
  EXPECT_TRUE(gb.dev == gc.dev && gb.bucket == gc.bucket);
  EXPECT_TRUE(gb.dev == idx[1] || gb.dev == idx[2]) << gb.dev;
  EXPECT_TRUE(ms.dev == gs.dev && ms.bucket == gs.bucket);
  EXPECT_EQ(ms.dev, idx[0]);
  EXPECT_EQ(mb.dev, idx[1]);
  EXPECT_FALSE(mb.dev == gb.dev && mb.bucket == gb.bucket);
  std::vector<u8> buf(4 * kBlockSize);
  for (u64 ino = 20; ino <= 24; ino++) {
    ASSERT_TRUE(data.ReadBlocks(kForegroundRead, ino, 0, 4, buf.data()).ok());
    EXPECT_EQ(buf[0], u8('a' + ino));
  }
  data.Close();
  EXPECT_TRUE(store.Close().ok());
}

// A full write point table (reached here by lowering the limit: the real
// one holds every key) sends a write to the foreground target's write point
// and counts it, instead of failing it (before: EINVAL to the user).
TEST(DataPathTest, AFullWritePointTableFallsBackToTheForegroundTarget) {
  TwoMembers t;
  const u32 ssd = t.Member("ssd.a");
  const u32 hdd = t.Member("hdd.b");
  t.data.LimitWritePointsForTest(1);
  t.Write(kBackgroundWrite, 30, 0, 2, 'b');  // the one entry a non-foreground target may take
  IoContext on_hdd = kForegroundWrite;
  on_hdd.target = Target{TargetKind::kMember, u8(hdd)};
  t.Write(on_hdd, 31, 0, 2, 'h');
  t.Write(on_hdd, 31, 2, 2, 'i');
  EXPECT_EQ(t.data.GetStats().write_point_fallbacks, 2u);
  EXPECT_EQ(t.data.GetStats().write_points, 2u);
  alloc::BucketRef fg, none;
  ASSERT_TRUE(t.data.WritePointBucket(kForegroundWrite, &fg));
  EXPECT_EQ(fg.dev, ssd);  // the filesystem's foreground target
  EXPECT_FALSE(t.data.WritePointBucket(on_hdd, &none));
  // The foreground target itself never falls back; the data reads back.
  t.Write(kForegroundWrite, 32, 0, 1, 'f');
  EXPECT_EQ(t.data.GetStats().write_point_fallbacks, 2u);
  std::vector<u8> buf(4 * kBlockSize);
  ASSERT_TRUE(t.data.ReadBlocks(kForegroundRead, 31, 0, 4, buf.data()).ok());
  EXPECT_EQ(buf[0], 'h');
  EXPECT_EQ(buf[2 * kBlockSize], 'i');
}

// The free space reservations (fallocate) and further copies may not eat
// into is the free buckets above the foreground floor, those whose free is
// still pending counted once: a freed bucket is kFree at once, pending or
// not (before: by_state[kFree] + pending_free counted the pending ones
// twice, and a fallocate reserved space that was not there).
TEST(DataPathTest, PendingFreesCountOnceInTheSpaceReservationsMayTake) {
  store::OpenOptions oo;
  oo.btree.writer_thread = false;  // no checkpoint takes or frees a bucket meanwhile
  TwoMembers t(oo);
  const u32 per_bucket = u32(t.store.sb().bucket_size / kBlockSize);
  // Five buckets' worth, then all of it punched: the four buckets the write
  // point left are freed -- pending: no allocation has looked since -- and
  // the fifth, full, stays the write point's (no room left in it).
  t.Write(kForegroundWrite, 40, 0, 5 * per_bucket, 'p');
  t.Punch(40, 0, 5 * per_bucket);
  alloc::Allocator& a = t.store.alloc();
  u64 pending = 0, free_blocks = 0;
  for (u32 d = 0; d < a.members(); d++) {
    const alloc::DeviceUsage u = a.Usage(d);
    pending += u.pending_free;
    const u64 free = u.by_state[u32(alloc::BucketState::kFree)];
    const u64 floor = a.FreeFloor(d, alloc::Watermark::kForeground);
    if (free > floor) free_blocks += (free - floor) * per_bucket;
  }
  ASSERT_EQ(pending, 4u);
  auto reserve = [&](u64 blocks) {
    btree::Transaction tx(&t.store.btrees());
    Delta delta;
    u64 next = 0;
    Status st = t.data.QueueReserve(&tx, 41, 0, blocks, &delta, ~0u, &next);
    t.data.Abort(delta);  // (never committed)
    return st;
  };
  EXPECT_EQ(reserve(free_blocks + 1).code(), Err::kNoSpace);
  EXPECT_TRUE(reserve(free_blocks).ok());
  EXPECT_EQ(t.data.GetStats().blocks_reserved, 0u);
}

// Close frees the buckets its write points leave with one record commit
// (before: one commit a bucket), and counts them.
TEST(DataPathTest, CloseFreesTheWritePointsBucketsWithOneCommit) {
  testing::SinkTap tap;  // (outlives the store)
  TwoMembers t;
  tap.Attach(&t.store.alloc());
  IoContext fg_async = kForegroundWrite;
  fg_async.io_class = dev::IoClass::kForegroundAsync;
  // Three write points (two on the SSD, one on the HDD), each holding a
  // bucket whose blocks are all punched since.
  const IoContext ctxs[3] = {kForegroundWrite, fg_async, kBackgroundWrite};
  alloc::BucketRef held[3];
  for (u32 i = 0; i < 3; i++) {
    t.Write(ctxs[i], 50 + i, 0, 4, char('a' + i));
    ASSERT_TRUE(t.data.WritePointBucket(ctxs[i], &held[i]));
    t.Punch(50 + i, 0, 4);
  }
  EXPECT_EQ(tap.free_commits.load(), 0u);  // the write points hold them
  const u64 freed = t.data.GetStats().buckets_freed;
  t.data.Close();
  EXPECT_EQ(tap.free_commits.load(), 1u);
  EXPECT_EQ(tap.frees.load(), 3u);
  EXPECT_EQ(t.data.GetStats().buckets_freed, freed + 3);
  for (const alloc::BucketRef& r : held)
    EXPECT_EQ(t.store.alloc().Get(r.dev, r.bucket).state, alloc::BucketState::kFree);
}

// A bucket an unordered flush group fills and frees before its flush entry
// (the newest entry on disk at a cut) is on the free list once replay has
// applied the free: the mount's checkpoint allocates node buckets from that
// list before its superblock moves the journal past the group. A second cut
// in between left the group's data check reading nodes in that bucket, and
// the next mount dropped the whole (acknowledged) group. The mount holds
// such buckets off the free list until its superblock is written.
TEST(DataPathTest, TheMountKeepsTheNewestGroupsCheckedBucketsUntilItsSuperblock) {
  auto mem = testing::FormattedMember();
  const u64 bytes = mem->Info().size;
  store::OpenOptions oo;
  oo.journal.flush_delay_ns = 3600ull * 1000 * 1000 * 1000;  // no timed flush splits the group
  alloc::BucketRef b{};
  u64 at = 0, bucket_bytes = 0;
  std::vector<u8> cut(bytes);
  {
    store::Store s;
    DataPath d;
    ASSERT_TRUE(testing::OpenStore(&s, {mem.get()}, oo).ok());
    ASSERT_TRUE(d.Open(&s).ok());
    auto write = [&](u64 ino, u64 first, u32 n, char fill, journal::CommitMode mode) {
      std::vector<u8> buf(u64(n) * kBlockSize, u8(fill));
      btree::Transaction tx(&s.btrees());
      Delta delta;
      ASSERT_TRUE(d.QueueWrite(kForegroundWrite, &tx, ino, first, buf.data(), n, &delta).ok());
      ASSERT_TRUE(d.Commit(kForegroundWrite, &tx, delta, mode).ok());
    };
    ASSERT_TRUE(s.journal().Flush().ok());  // the group starts here
    // Inode 9 fills one bucket (the write point's first after the mount),
    // inode 10 moves the write point on, a punch of inode 9 empties the
    // bucket (freed: the write point left it), and inode 11's flush commit
    // ends the group -- unordered: every commit in it checks its data.
    const u32 per_bucket = u32(s.sb().bucket_size / kBlockSize);
    write(9, 0, 1, 'a', journal::CommitMode::kNoFlush);
    ASSERT_TRUE(d.WritePointBucket(kForegroundWrite, &b));
    at = s.sb().BucketOffset(b.bucket);
    bucket_bytes = s.sb().bucket_size;
    for (u32 i = 1; i < per_bucket; i += 16) write(9, i, Min(16u, per_bucket - i), 'a', journal::CommitMode::kNoFlush);
    write(10, 0, 1, 'b', journal::CommitMode::kNoFlush);
    alloc::BucketRef now;
    ASSERT_TRUE(d.WritePointBucket(kForegroundWrite, &now));
    ASSERT_NE(now.bucket, b.bucket);
    {
      btree::Transaction tx(&s.btrees());
      Delta delta;
      ASSERT_TRUE(d.QueuePunch(&tx, 9, 0, per_bucket, &delta).ok());
      ASSERT_TRUE(d.Commit(kForegroundWrite, &tx, delta).ok());
    }
    EXPECT_EQ(s.alloc().Get(b.dev, b.bucket).state, alloc::BucketState::kFree);
    write(11, 0, 1, 'c', journal::CommitMode::kFlush);
    mem->ReadRaw(0, cut.data(), bytes);  // the cut (no volatile cache: what is written is durable)
    d.Close();
    EXPECT_TRUE(s.Close().ok());
  }
  mem->WriteRaw(0, cut.data(), bytes);
  {
    // The mount replays the group and checkpoints, and the power goes
    // before its superblock is written.
    testing::GateDevice gate(mem.get(), IoOp::kWrite, IoOrigin::kSuperblock);
    gate.Fail(true);
    BlockDevice* devs[1] = {&gate};
    store::Store s;
    Diag diag;
    store::OpenReport rep;
    EXPECT_FALSE(s.Open(devs, 1, oo, &diag, &rep).ok());
    EXPECT_GT(gate.failed(), 0u);
    EXPECT_EQ(rep.replay.unverified_seq, 0u);
    EXPECT_GE(rep.replay.checked_bytes, bucket_bytes);  // the group checked the bucket's data
    EXPECT_GE(rep.held_buckets, 1u);
    EXPECT_EQ(rep.held_taken, 0u);
    std::vector<u8> now(bucket_bytes);
    mem->ReadRaw(at, now.data(), now.size());
    EXPECT_TRUE(memcmp(now.data(), cut.data() + at, now.size()) == 0) << "the mount wrote into the checked bucket";
  }
  // The next mount checks the group again: the data is what it was, so the
  // group (inodes 10 and 11, acknowledged by the flush) is replayed.
  store::Store s;
  store::OpenReport rep;
  ASSERT_TRUE(testing::OpenStore(&s, {mem.get()}, oo, &rep).ok());
  EXPECT_EQ(rep.replay.unverified_seq, 0u);
  EXPECT_GE(rep.held_buckets, 1u);  // (again: until this open's superblock)
  EXPECT_EQ(s.alloc().Usage(b.dev).pending_free, 0u);  // released once it was written
  DataPath d;
  ASSERT_TRUE(d.Open(&s).ok());
  for (u64 ino : {10, 11}) {
    u8 got[kBlockSize];
    ASSERT_TRUE(d.ReadBlocks(kForegroundRead, ino, 0, 1, got).ok());
    EXPECT_EQ(got[0], ino == 10 ? 'b' : 'c') << "inode " << ino;
  }
  d.Close();
  EXPECT_TRUE(s.Close().ok());
}

TEST(DataPathTest, OpenNeedsAnOpenStore) {
  store::Store closed;
  DataPath d;
  EXPECT_EQ(d.Open(&closed).code(), Err::kInvalidArgument);
  EXPECT_EQ(d.Open(nullptr).code(), Err::kInvalidArgument);
  EXPECT_FALSE(d.open());
}

}  // namespace
}  // namespace tfs::data
