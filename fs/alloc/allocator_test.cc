// The allocation record (alloc/format.h, docs/format/alloc.md): encode and
// parse round trips, every rule of "Validity" against hostile bytes (each a
// kCorrupt with a one-line Diag naming member, bucket and rule), the
// plausibility check the btree's merge rule uses, and the allocator's load
// (newer versions win, absent keys are the layout's state); the per-member
// sums Usage returns, kept by every change (equal to a walk of the buckets
// after every kind of change), and the commit hook's side (StageCounts
// counts nothing and logs nothing; PublishCounts counts what a journaled
// commit met; LogCountNote logs it, rate-limited). The allocator against a
// store is tested in fs/store/store_test.cc.
#include "alloc/allocator.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "userspace/platform/log.h"

namespace tfs::alloc {
namespace {

sb::Superblock TwoMembers() {
  sb::Superblock s;
  memset(&s, 0, sizeof(s));
  s.nr_members = 2;
  s.bucket_size = 256 * 1024;
  s.btree_node_size = 64 * 1024;
  s.block_size = 4096;
  strcpy(s.members[0].label, "ssd.a");
  s.members[0].nbuckets = 100;
  s.members[0].journal_first_bucket = 0;
  s.members[0].journal_nbuckets = 8;
  s.members[0].data_allowed = sb::kDataAll;
  strcpy(s.members[1].label, "hdd.b");
  s.members[1].nbuckets = 300;
  s.members[1].data_allowed = sb::kDataUser;
  return s;
}

AllocRecord Good(BucketState state = BucketState::kUser) {
  Bucket b;
  b.gen = 7;
  b.oldest_gen = 7;
  b.state = state;
  b.live_sectors = state == BucketState::kFree ? 0 : 100;
  b.version = 42;
  AllocRecord r;
  EncodeRecord(b, &r);
  return r;
}

TEST(AllocRecordTest, EncodeParseRoundTrip) {
  const sb::Superblock s = TwoMembers();
  for (BucketState st : {BucketState::kFree, BucketState::kBtree, BucketState::kUser, BucketState::kCached}) {
    const AllocRecord r = Good(st);
    Bucket out;
    Diag d;
    const u32 dev = st == BucketState::kBtree ? 0 : 1;  // (the HDD member allows user data only)
    ASSERT_TRUE(ParseRecord(s, dev, dev == 0 ? 99 : 299, &r, sizeof(r), &out, &d).ok()) << d.text;
    EXPECT_EQ(out.state, st);
    EXPECT_EQ(out.gen, 7);
    EXPECT_EQ(out.oldest_gen, 7);
    EXPECT_EQ(out.version, 42u);
    EXPECT_TRUE(out.recorded);
    AllocRecord again;
    EncodeRecord(out, &again);
    EXPECT_EQ(memcmp(&again, &r, sizeof(r)), 0);
  }
  // A journal bucket's record says journal.
  AllocRecord j = Good(BucketState::kJournal);
  j.live_sectors.set(0);  // (a journal bucket holds no data)
  Bucket out;
  EXPECT_TRUE(ParseRecord(s, 0, 3, &j, sizeof(j), &out, nullptr).ok());
}

TEST(AllocRecordTest, HostileBytesAreCorruptWithOneLine) {
  const sb::Superblock s = TwoMembers();
  struct Case {
    const char* name;
    u64 dev, bucket;
    std::vector<u8> bytes;
    const char* needle;
  };
  auto bytes = [](AllocRecord r) {
    std::vector<u8> v(sizeof(r));
    memcpy(v.data(), &r, sizeof(r));
    return v;
  };
  std::vector<Case> cases;
  {
    std::vector<u8> v = bytes(Good());
    v.push_back(0);
    cases.push_back({"long", 0, 20, v, "record of bad size 25"});
    v.resize(23);
    cases.push_back({"short", 0, 20, v, "record of bad size 23"});
    cases.push_back({"empty", 0, 20, {}, "record of bad size 0"});
  }
  AllocRecord r = Good();
  r.state = 6;
  cases.push_back({"state", 0, 20, bytes(r), "unknown state 6"});
  r = Good();
  r.state = 0xff;
  cases.push_back({"state ff", 0, 20, bytes(r), "unknown state 255"});
  r = Good();
  r.reserved0 = 1;
  cases.push_back({"reserved0", 0, 20, bytes(r), "nonzero reserved field"});
  r = Good();
  r.reserved1.set(0x100);
  cases.push_back({"reserved1", 0, 20, bytes(r), "nonzero reserved field"});
  cases.push_back({"member", 2, 20, bytes(Good()), "member 2 bucket 20: no such member"});
  cases.push_back({"member huge", ~u64(0), 20, bytes(Good()), "no such member"});
  cases.push_back({"bucket", 0, 100, bytes(Good()), "outside the member's 100 buckets"});
  cases.push_back({"bucket huge", 1, ~u64(0), bytes(Good()), "outside the member's 300 buckets"});
  r = Good();
  r.live_sectors.set(16 * 512 + 1);  // a 256 KiB bucket has 512, and counts 16 times that at most
  cases.push_back({"live", 0, 20, bytes(r), "live sectors beyond what the bucket can count: 8193"});
  r = Good();
  r.cached_sectors.set(~u32(0));
  cases.push_back({"cached", 0, 20, bytes(r), "cached sectors beyond what the bucket can count"});
  r = Good(BucketState::kBtree);
  r.live_sectors.set(513);  // not a user bucket: its own sectors at most
  cases.push_back({"btree live", 0, 20, bytes(r), "live sectors beyond what the bucket can count: 513"});
  r = Good(BucketState::kFree);
  r.live_sectors.set(8);
  cases.push_back({"free with data", 0, 20, bytes(r), "free, yet with live or cached sectors"});
  cases.push_back({"journal outside the ring", 0, 20, bytes(Good(BucketState::kJournal)), "state journal where the layout has free"});
  cases.push_back({"ring bucket not journal", 0, 2, bytes(Good(BucketState::kUser)), "state user where the layout has journal"});
  cases.push_back({"superblock", 1, 20, bytes(Good(BucketState::kSb)), "state superblock"});
  r = Good();
  r.version.set(kRecordVersionLimit);
  cases.push_back({"version", 0, 20, bytes(r), "version out of range"});
  r = Good();
  r.oldest_gen = u8(7 - kGenGuard - 1);  // one generation past the guard
  cases.push_back({"oldest_gen", 0, 20, bytes(r), "oldest_gen further behind gen than the generation guard allows: 166"});
  r.oldest_gen = 8;  // newer than gen: 255 generations behind
  cases.push_back({"oldest_gen ahead", 0, 20, bytes(r), "generation guard allows: 8"});
  cases.push_back({"btree on a user-only member", 1, 20, bytes(Good(BucketState::kBtree)),
                   "state btree on a member that does not allow it"});
  cases.push_back({"journal with data", 0, 2, bytes(Good(BucketState::kJournal)),
                   "journal, yet with live or cached sectors: 100"});
  for (const Case& c : cases) {
    Bucket out;
    out.version = 99;
    Diag d;
    Status st = ParseRecord(s, c.dev, c.bucket, c.bytes.data(), u32(c.bytes.size()), &out, &d);
    EXPECT_EQ(st.code(), Err::kCorrupt) << c.name;
    const std::string line(d.text);
    EXPECT_NE(line.find(c.needle), std::string::npos) << c.name << ": " << line;
    EXPECT_EQ(line.rfind("alloc: ", 0), 0u) << c.name << ": " << line;
    EXPECT_EQ(line.find('\n'), std::string::npos) << c.name;
    EXPECT_EQ(out.version, 99u) << c.name << ": a bad record changed the output";
  }
}

// A user (or cached) bucket counts logical sectors (data::PtrSectors): a
// bucket of compressed blobs counts up to 16 times its own sectors, live and
// cached alike; other states count their own at most.
TEST(AllocRecordTest, AUserBucketCountsUpToSixteenTimesItsSectors) {
  const sb::Superblock s = TwoMembers();
  for (BucketState st : {BucketState::kUser, BucketState::kCached}) {
    AllocRecord r = Good(st);
    r.live_sectors.set(16 * 512);
    r.cached_sectors.set(16 * 512);
    Bucket out;
    Diag d;
    ASSERT_TRUE(ParseRecord(s, 1, 5, &r, sizeof(r), &out, &d).ok()) << d.text;
    EXPECT_EQ(out.live_sectors, 16u * 512);
    EXPECT_EQ(out.cached_sectors, 16u * 512);
  }
  EXPECT_EQ(MaxCountSectors(s, BucketState::kUser), 16u * 512);
  EXPECT_EQ(MaxCountSectors(s, BucketState::kBtree), 512u);
}

// Every bit of a record flipped in turn: valid exactly when the field it
// lands in allows the new value (gen, oldest_gen: gen at most kGenGuard
// (96) generations past oldest_gen, mod 256;
// state: a known one the HDD member may hold, not free with data; reserved:
// never; sectors: within 16 times the bucket's, the most a user bucket of
// compressed blobs counts; version: below the limit) -- and then
// the parse gives back exactly those bytes; kCorrupt otherwise (never
// another error, never a crash). Valid implies plausible.
TEST(AllocRecordTest, EveryFlippedByteParsesOrIsCorrupt) {
  const sb::Superblock s = TwoMembers();
  const AllocRecord good = Good();
  const u64 sectors = s.bucket_size / 512;
  u32 valid = 0;
  for (u32 i = 0; i < sizeof(good); i++) {
    for (u8 bit = 0; bit < 8; bit++) {
      AllocRecord r = good;
      reinterpret_cast<u8*>(&r)[i] ^= u8(1 << bit);
      bool want;
      if (i <= 1) {
        want = GenGap(r.gen, r.oldest_gen) <= kGenGuard;  // (7 ^ 1 << bit against 7)
      } else if (i == 2) {
        want = r.state == u8(BucketState::kCached);  // user 4 ^ 1; 0 is free with data, 6.. unknown
      } else if (i == 3 || (i >= 12 && i < 16)) {
        want = false;  // reserved
      } else if (i < 8) {
        want = r.live_sectors.get() <= kCountFactor * sectors;  // (user: logical sectors)
      } else if (i < 12) {
        want = r.cached_sectors.get() <= kCountFactor * sectors;
      } else {
        want = r.version.get() < kRecordVersionLimit;
      }
      Bucket out;
      Status st = ParseRecord(s, 1, 5, &r, sizeof(r), &out, nullptr);
      EXPECT_EQ(st.ok(), want) << "byte " << i << " bit " << int(bit) << ": " << st.Message();
      if (!st.ok()) {
        EXPECT_EQ(st.code(), Err::kCorrupt) << i << "/" << int(bit);
        continue;
      }
      valid++;
      AllocRecord again;
      EncodeRecord(out, &again);
      EXPECT_EQ(memcmp(&again, &r, sizeof(r)), 0) << "byte " << i << " bit " << int(bit);
      u64 v = 0;
      EXPECT_TRUE(RecordPlausible(&r, sizeof(r), &v)) << "plausible is weaker than valid";
      EXPECT_EQ(v, r.version.get());
    }
  }
  EXPECT_GT(valid, 50u);  // (sectors and versions: most of their bits)
}

// Validity stays far below plausibility: a change of a valid record (version
// + 1) or fsck's rebuild past a plausible bad one is never implausible.
TEST(AllocRecordTest, AnIncrementOfAValidOrPlausibleVersionStaysPlausible) {
  const sb::Superblock s = TwoMembers();
  AllocRecord r = Good();
  Bucket out;
  u64 v;
  r.version.set(kRecordVersionLimit - 1);
  ASSERT_TRUE(ParseRecord(s, 1, 5, &r, sizeof(r), &out, nullptr).ok());
  r.version.set(kRecordVersionLimit);
  EXPECT_EQ(ParseRecord(s, 1, 5, &r, sizeof(r), &out, nullptr).code(), Err::kCorrupt);
  EXPECT_TRUE(RecordPlausible(&r, sizeof(r), &v));
  r.version.set(kRecordVersionPlausible - 1);
  EXPECT_TRUE(RecordPlausible(&r, sizeof(r), &v));
  EXPECT_LT(kRecordVersionRebase, kRecordVersionLimit);
  EXPECT_LT(kRecordVersionLimit, kRecordVersionPlausible);
}

// A sink that fails: the first `ok_changes` changes of a call are committed
// (at seq 0), the call fails (a journal error, or a later piece of a split
// batch).
struct FailingSink {
  u32 ok_changes = 0;
  u32 calls = 0;
  static Result<u64> Persist(void* ctx, const RecordChange*, u32 n, BucketState, PersistProgress* p) {
    auto* f = static_cast<FailingSink*>(ctx);
    f->calls++;
    p->committed = f->ok_changes < n ? f->ok_changes : n;
    p->seq = 0;
    p->transactions = p->committed != 0 ? 1 : 0;
    if (f->ok_changes >= n) return u64(0);
    return Err::kIo;
  }
};

// An allocator of TwoMembers() whose records go to a FailingSink that takes
// every change (ok_changes: all).
struct SinkedAllocator {
  const sb::Superblock s = TwoMembers();
  Allocator a;
  FailingSink sink;
  SinkedAllocator() {
    EXPECT_TRUE(a.Init(s).ok());
    sink.ok_changes = ~0u;
    a.SetPersist(FailingSink::Persist, &sink);
  }
};

// An allocation whose record fails to commit hands the bucket back to the
// free list (before: allocated in memory, off the free list, handed to no
// one -- lost until the next mount).
TEST(AllocatorTest, AnAllocationWhoseRecordFailsLosesNoBucket) {
  const sb::Superblock s = TwoMembers();
  Allocator a;
  ASSERT_TRUE(a.Init(s).ok());
  FailingSink sink;
  a.SetPersist(FailingSink::Persist, &sink);
  const u64 free_before = a.Usage(0).by_state[u8(BucketState::kFree)];
  for (int i = 0; i < 5; i++)
    EXPECT_EQ(a.Allocate(0b01, 0, BucketState::kBtree, Watermark::kBtree).status().code(), Err::kIo);
  EXPECT_EQ(sink.calls, 5u);
  EXPECT_EQ(a.Usage(0).by_state[u8(BucketState::kFree)], free_before);
  EXPECT_EQ(a.Stats().record_errors, 5u);
  sink.ok_changes = ~0u;
  u64 n = 0;
  while (a.Allocate(0b01, 0, BucketState::kBtree, Watermark::kBtree).ok()) n++;
  EXPECT_EQ(n, free_before);
}

// The mount's hold (HoldFree): held buckets leave the free list, no
// allocation takes one while anything else is free (nor does the release of
// pending frees, which before the journal releases everything), the last
// ones are taken back and counted rather than fail, and ReleaseHeld puts
// back what is still held.
TEST(AllocatorTest, HeldBucketsAreTakenOnlyWhenNothingElseIsFree) {
  SinkedAllocator t;
  auto reusable = [](const Allocator& a) {
    const DeviceUsage u = a.Usage(0);
    return u.by_state[u8(BucketState::kFree)] - u.pending_free;
  };
  const u64 free_before = reusable(t.a);
  std::vector<u64> ten;
  for (u64 b = 10; b < 20; b++) ten.push_back(b);
  EXPECT_EQ(t.a.HoldFree(0, ten.data(), ten.size()), 10u);
  EXPECT_EQ(t.a.HoldFree(0, ten.data(), 1), 0u);  // (already held)
  const u64 journal_bucket = 0;
  EXPECT_EQ(t.a.HoldFree(0, &journal_bucket, 1), 0u);  // (not free)
  EXPECT_EQ(t.a.HoldFree(5, &journal_bucket, 1), 0u);  // (no such member)
  EXPECT_EQ(t.a.Stats().replay_held, 10u);
  EXPECT_EQ(reusable(t.a), free_before - 10);
  EXPECT_EQ(t.a.Usage(0).pending_free, 10u);
  for (u64 n = 0; n < free_before - 10; n++) {
    auto r = t.a.Allocate(0b01, 0, BucketState::kBtree, Watermark::kBtree);
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->bucket < 10 || r->bucket >= 20) << r->bucket;
  }
  EXPECT_EQ(t.a.Stats().replay_held_taken, 0u);
  auto r = t.a.Allocate(0b01, 0, BucketState::kBtree, Watermark::kBtree);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->bucket >= 10 && r->bucket < 20);
  EXPECT_EQ(t.a.Stats().replay_held_taken, 10u);
  EXPECT_EQ(t.a.Usage(0).pending_free, 0u);
  EXPECT_EQ(t.a.ReleaseHeld(), 0u);

  SinkedAllocator u;
  const u64 two[2] = {50, 51};
  EXPECT_EQ(u.a.HoldFree(0, two, 2), 2u);
  ASSERT_TRUE(u.a.RepairState(0, 51, BucketState::kBtree).ok());  // (the mount's ReconcileBuckets: nodes there)
  EXPECT_EQ(u.a.Usage(0).pending_free, 1u);
  EXPECT_EQ(u.a.ReleaseHeld(), 1u);
  ASSERT_TRUE(u.a.RepairState(0, 51, BucketState::kFree).ok());
  EXPECT_EQ(u.a.Usage(0).pending_free, 0u);
  EXPECT_EQ(reusable(u.a), free_before);
  EXPECT_EQ(u.a.Stats().replay_held_taken, 0u);
}

// A batch of frees split in pieces, a later piece failing: the frees the
// earlier pieces committed become reusable once settled (before: every
// bucket of the batch stayed pending for good); the others stay pending.
TEST(AllocatorTest, APartlyCommittedBatchOfFreesReleasesWhatWasCommitted) {
  SinkedAllocator t;
  Allocator& a = t.a;
  FailingSink& sink = t.sink;
  std::vector<BucketRef> refs;
  for (int i = 0; i < 4; i++) {
    Result<BucketRef> r = a.Allocate(0b10, 0, BucketState::kUser, Watermark::kBtree);
    ASSERT_TRUE(r.ok());
    refs.push_back(*r);
  }
  journal::Journal journal;  // never started: settled_seq 0 settles what was committed at 0
  a.SetJournal(&journal);
  sink.ok_changes = 2;
  u32 freed = 0;
  EXPECT_EQ(a.FreeBuckets(refs.data(), 4, &freed).code(), Err::kIo);
  EXPECT_EQ(freed, 2u);  // what the data path counts freed (buckets_freed)
  EXPECT_EQ(a.Usage(1).pending_free, 4u);
  // Allocating releases the settled ones: the two committed frees only.
  u64 n = 0;
  sink.ok_changes = ~0u;
  const u64 free_now = a.Usage(1).by_state[u8(BucketState::kFree)] - 4;
  while (a.Allocate(0b10, 0, BucketState::kUser, Watermark::kBtree).ok()) n++;
  EXPECT_EQ(n, free_now + 2);
  EXPECT_EQ(a.Usage(1).pending_free, 2u);
  a.SetJournal(nullptr);
}

// Step 3b-3 at the allocator: AllocateUnrecorded commits nothing and
// keeps the version; the first stage of the bucket records it (state user,
// version + 1) even when it counts nothing, and its publishing clears the
// flag; a batch of frees commits only the recorded bucket's, and the
// unrecorded one is free at once with its generation kept.
TEST(AllocatorTest, AnUnrecordedBucketCommitsNothingUntilItsFirstStage) {
  SinkedAllocator t;
  Allocator& a = t.a;
  FailingSink& sink = t.sink;
  const sb::Superblock& s = t.s;
  journal::Journal journal;  // never started: a recorded free goes pending
  a.SetJournal(&journal);
  BucketRef ref[3];
  for (BucketRef& r : ref) {
    Result<BucketRef> got = a.AllocateUnrecorded(0b10, 0, Watermark::kBtree);
    ASSERT_TRUE(got.ok());
    r = *got;
    const Bucket b = a.Get(r.dev, r.bucket);
    EXPECT_TRUE(b.unrecorded);
    EXPECT_EQ(b.state, BucketState::kUser);
    EXPECT_EQ(b.version, 0u);
  }
  EXPECT_EQ(sink.calls, 0u);
  EXPECT_EQ(a.Stats().unrecorded_allocs, 3u);
  // Stages: a gain in ref[1], nothing at all in ref[2] -- both recorded.
  CountStage st[2];
  st[0].dev = ref[1].dev;
  st[0].bucket = ref[1].bucket;
  st[0].live = 8;
  st[1].dev = ref[2].dev;
  st[1].bucket = ref[2].bucket;
  CountNote note;
  ASSERT_TRUE(a.StageCounts(st, 2, &note).ok());
  for (const CountStage& c : st) {
    EXPECT_TRUE(c.changed);
    EXPECT_EQ(c.b.version, 1u);
    Bucket parsed;
    Diag diag;
    ASSERT_TRUE(ParseRecord(s, c.dev, c.bucket, &c.rec, sizeof(c.rec), &parsed, &diag).ok()) << diag.text;
    EXPECT_EQ(parsed.state, BucketState::kUser);
  }
  EXPECT_TRUE(a.Get(ref[1].dev, ref[1].bucket).unrecorded) << "staged, not yet published";
  a.PublishCounts(st, 2, &note);
  EXPECT_FALSE(a.Get(ref[1].dev, ref[1].bucket).unrecorded);
  EXPECT_EQ(a.Get(ref[1].dev, ref[1].bucket).live_sectors, 8u);
  EXPECT_EQ(sink.calls, 0u);
  // The frees: ref[0] never recorded, ref[1] recorded.
  const u64 pending = a.Usage(1).pending_free;
  u32 freed = 0;
  BucketRef both[2] = {ref[0], ref[1]};
  ASSERT_TRUE(a.FreeBuckets(both, 2, &freed).ok());
  EXPECT_EQ(freed, 2u);
  EXPECT_EQ(sink.calls, 1u) << "one commit, the recorded bucket's";
  EXPECT_EQ(a.Stats().unrecorded_frees, 1u);
  EXPECT_EQ(a.Usage(1).pending_free, pending + 1) << "the recorded one waits for its settle";
  EXPECT_EQ(a.Get(ref[0].dev, ref[0].bucket).gen, ref[0].gen);
  EXPECT_EQ(a.Get(ref[0].dev, ref[0].bucket).state, BucketState::kFree);
  EXPECT_EQ(a.Get(ref[1].dev, ref[1].bucket).gen, u8(ref[1].gen + 1));
  BucketSums scan;
  EXPECT_TRUE(a.SumsMatchScan(1, &scan));
  a.SetJournal(nullptr);
}

// The generation guard (format.h, kGenGuard; docs/format/alloc.md,
// "Generations"): a bucket freed with cached sectors counted leaves its
// cached pointers behind, stale, and keeps its oldest_gen; reused and freed
// again and again (300 times here -- more than the 256 generations a u8
// has) its gen never comes back to the stale pointers' while oldest_gen is
// not raised: at kGenGuard generations past it the bucket stays off the
// free list (counted), and the allocator hands out other buckets. A
// generation pass's raise (RaiseOldestGen) puts it back: never lowering
// oldest_gen, never past gen, never a user bucket's. Without the guard the
// 256th reuse would hand the bucket out at the stale pointers' generation.
TEST(AllocatorTest, TheGenerationGuardKeepsAStalePointersGenerationFromComingBack) {
  SinkedAllocator t;
  Allocator& a = t.a;
  // A user bucket of member 1 holding only a cached copy (8 sectors).
  Result<BucketRef> got = a.Allocate(0b10, 0, BucketState::kUser, Watermark::kForeground);
  ASSERT_TRUE(got.ok());
  const BucketRef b = *got;
  CountStage st;
  st.dev = b.dev;
  st.bucket = b.bucket;
  st.cached = 8;
  CountNote note;
  ASSERT_TRUE(a.StageCounts(&st, 1, &note).ok());
  a.PublishCounts(&st, 1, &note);
  const u8 stale_gen = b.gen;  // the cached pointer's
  // Its cache dropped: freed with the cached sectors counted.
  ASSERT_TRUE(a.Free(b).ok());
  Bucket k = a.Get(b.dev, b.bucket);
  EXPECT_EQ(k.gen, u8(stale_gen + 1));
  EXPECT_EQ(k.oldest_gen, stale_gen) << "the stale pointer's generation stays the oldest";
  // A bucket freed with nothing counted moves oldest_gen along.
  {
    Result<BucketRef> other = a.Allocate(0b01, 0, BucketState::kUser, Watermark::kForeground);
    ASSERT_TRUE(other.ok());
    ASSERT_TRUE(a.Free(*other).ok());
    const Bucket o = a.Get(other->dev, other->bucket);
    EXPECT_EQ(o.oldest_gen, o.gen);
  }
  // 300 allocations of member 1 (each freed at once, nothing counted: the
  // allocator reuses the last freed bucket first).
  u32 reused = 0;
  for (int i = 0; i < 300; i++) {
    got = a.Allocate(0b10, 0, BucketState::kUser, Watermark::kForeground);
    ASSERT_TRUE(got.ok());
    if (got->bucket == b.bucket) {
      reused++;
      EXPECT_NE(got->gen, stale_gen) << "reuse " << reused << ": the stale pointer looks current";
    }
    ASSERT_TRUE(a.Free(*got).ok());
  }
  EXPECT_EQ(reused, kGenGuard - 1u) << "reused until its gen is kGenGuard past the stale pointer's";
  k = a.Get(b.dev, b.bucket);
  EXPECT_EQ(k.state, BucketState::kFree);
  EXPECT_EQ(GenGap(k.gen, k.oldest_gen), kGenGuard);
  EXPECT_EQ(a.Usage(1).gen_blocked, 1u);
  EXPECT_EQ(a.FreeCount(1), a.Usage(1).by_state[u8(BucketState::kFree)] - 1) << "not allocatable space";
  AllocStats s = a.Stats();
  EXPECT_EQ(s.gen_guard_blocked, 1u);
  EXPECT_EQ(s.gen_guard_waiting, 1u);
  // Its record stays valid (at the guard, not past it).
  AllocRecord rec;
  EncodeRecord(k, &rec);
  Bucket parsed;
  Diag diag;
  ASSERT_TRUE(ParseRecord(t.s, b.dev, b.bucket, &rec, sizeof(rec), &parsed, &diag).ok()) << diag.text;
  EXPECT_EQ(parsed.oldest_gen, stale_gen);
  // A load of that record keeps it off the free list.
  {
    SinkedAllocator u;
    u.a.BeginLoad();
    ASSERT_TRUE(u.a.LoadRecord(b.dev, b.bucket, &rec, sizeof(rec)).ok());
    ASSERT_TRUE(u.a.Finish().ok());
    EXPECT_EQ(u.a.Usage(1).gen_blocked, 1u);
  }
  // Raises that do nothing: an older oldest_gen, one newer than gen, a
  // bucket outside the members (a user bucket's: below).
  OldestRaise lower{b.dev, b.bucket, u8(stale_gen - 1)};
  OldestRaise ahead{b.dev, b.bucket, u8(k.gen + 1)};
  u64 raised = 9;
  ASSERT_TRUE(a.RaiseOldestGen(&lower, 1, &raised).ok());
  EXPECT_EQ(raised, 0u);
  ASSERT_TRUE(a.RaiseOldestGen(&ahead, 1, &raised).ok());
  EXPECT_EQ(raised, 0u);
  EXPECT_EQ(a.Usage(1).gen_blocked, 1u);
  got = a.Allocate(0b10, 0, BucketState::kUser, Watermark::kForeground);
  ASSERT_TRUE(got.ok());
  ASSERT_NE(got->bucket, b.bucket);
  const u32 calls = t.sink.calls;
  OldestRaise outside{7, 0, 0};
  EXPECT_EQ(a.RaiseOldestGen(&outside, 1).code(), Err::kInvalidArgument);
  EXPECT_EQ(t.sink.calls, calls) << "nothing to persist";
  // The pass found no pointer left: oldest_gen = gen, back on the free list.
  OldestRaise pass{b.dev, b.bucket, k.gen};
  ASSERT_TRUE(a.RaiseOldestGen(&pass, 1, &raised).ok());
  EXPECT_EQ(raised, 1u);
  EXPECT_EQ(t.sink.calls, calls + 1);
  EXPECT_EQ(a.Get(b.dev, b.bucket).oldest_gen, k.gen);
  EXPECT_EQ(a.Get(b.dev, b.bucket).version, k.version + 1);
  s = a.Stats();
  EXPECT_EQ(s.gen_guard_released, 1u);
  EXPECT_EQ(s.gen_guard_waiting, 0u);
  EXPECT_EQ(s.oldest_raised, 1u);
  got = a.Allocate(0b10, 0, BucketState::kUser, Watermark::kForeground);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->bucket, b.bucket) << "reusable again";
  // A user bucket behind its gen (a cached copy dropped, then reused): a
  // mounted filesystem's pass leaves it, fsck's (user_too) raises it.
  ASSERT_TRUE(a.StageCounts(&st, 1, &note).ok());
  a.PublishCounts(&st, 1, &note);
  ASSERT_TRUE(a.Free(*got).ok());  // (cached sectors counted: oldest_gen stays)
  Result<BucketRef> user_ref = a.Allocate(0b10, 0, BucketState::kUser, Watermark::kForeground);
  ASSERT_TRUE(user_ref.ok());
  ASSERT_EQ(user_ref->bucket, b.bucket);
  ASSERT_EQ(GenGap(a.Get(b.dev, b.bucket).gen, a.Get(b.dev, b.bucket).oldest_gen), 1u);
  OldestRaise user{b.dev, b.bucket, user_ref->gen};
  ASSERT_TRUE(a.RaiseOldestGen(&user, 1, &raised).ok());
  EXPECT_EQ(raised, 0u) << "a user bucket is left to the pass after its free";
  ASSERT_TRUE(a.RaiseOldestGen(&user, 1, &raised, true).ok());
  EXPECT_EQ(raised, 1u);
  EXPECT_EQ(a.Get(b.dev, b.bucket).oldest_gen, user_ref->gen);
  BucketSums scan;
  EXPECT_TRUE(a.SumsMatchScan(1, &scan));
}

// Every way a bucket takes a state other than free keeps it below the
// guard, so that its next free writes a valid record (review of 3c-1: the
// mount's reconciliation at the guard's last generation, then a free, made
// a record the next mount refused); a record in use at the guard is itself
// corrupt; and a load that finds a bucket at the guard holds it back
// without counting a new block.
TEST(AllocatorTest, ABucketInUseStaysBelowTheGuardSoItsFreeWritesAValidRecord) {
  const u64 bucket = 40;
  auto record_valid = [](SinkedAllocator& t, u64 b) {
    AllocRecord rec;
    EncodeRecord(t.a.Get(1, b), &rec);
    Bucket out;
    Diag d;
    const Status st = ParseRecord(t.s, 1, b, &rec, sizeof(rec), &out, &d);
    EXPECT_TRUE(st.ok()) << d.text;
    return st.ok();
  };
  // A free bucket's record at gap `gap` (member 1: user data only).
  auto free_at = [&](SinkedAllocator& t, u8 gap) {
    Bucket k;
    k.gen = 200;
    k.oldest_gen = u8(200 - gap);
    k.state = BucketState::kFree;
    k.version = 3;
    AllocRecord rec;
    EncodeRecord(k, &rec);
    t.a.BeginLoad();
    ASSERT_TRUE(t.a.LoadRecord(1, bucket, &rec, sizeof(rec)).ok());
    ASSERT_TRUE(t.a.Finish().ok());
  };
  for (u8 gap : {u8(kGenGuard - 1), kGenGuard}) {
    SCOPED_TRACE(int(gap));
    {  // RepairState from free (the mount's ReconcileBuckets, fsck), then a free.
      SinkedAllocator t;
      free_at(t, gap);
      ASSERT_TRUE(t.a.RepairState(1, bucket, BucketState::kUser).ok());
      EXPECT_LT(GenGap(t.a.Get(1, bucket).gen, t.a.Get(1, bucket).oldest_gen), kGenGuard);
      ASSERT_TRUE(record_valid(t, bucket));
      ASSERT_TRUE(t.a.Free(BucketRef{1, bucket, t.a.Get(1, bucket).gen}).ok());
      EXPECT_TRUE(record_valid(t, bucket));
    }
    {  // fsck's rebuild marking it user at a newer generation, then a free.
      SinkedAllocator t;
      free_at(t, u8(gap - 6));
      t.a.BeginRebuild();
      ASSERT_TRUE(t.a.RebuildMark(1, bucket, BucketState::kUser, u8(200 + 6)));
      ASSERT_TRUE(t.a.EndRebuild().ok());
      ASSERT_TRUE(record_valid(t, bucket));
      ASSERT_TRUE(t.a.Free(BucketRef{1, bucket, u8(200 + 6)}).ok());
      EXPECT_TRUE(record_valid(t, bucket));
    }
  }
  // In use at the guard: corrupt (free there is the blocked state).
  Bucket k;
  k.gen = 100;
  k.oldest_gen = u8(100 - kGenGuard);
  k.state = BucketState::kUser;
  AllocRecord rec;
  EncodeRecord(k, &rec);
  Bucket out;
  Diag d;
  EXPECT_EQ(ParseRecord(TwoMembers(), 1, 5, &rec, sizeof(rec), &out, &d).code(), Err::kCorrupt);
  EXPECT_NE(std::string(d.text).find("in use, yet at the generation guard"), std::string::npos) << d.text;
  SinkedAllocator t;
  free_at(t, kGenGuard);
  EXPECT_EQ(t.a.Usage(1).gen_blocked, 1u);
  EXPECT_EQ(t.a.Stats().gen_guard_waiting, 1u);
  EXPECT_EQ(t.a.Stats().gen_guard_blocked, 0u) << "a load blocks nothing new";
}

TEST(AllocRecordTest, PlausibleIsWhatTheMergeRuleChecks) {
  u64 v = 0;
  AllocRecord r = Good();
  EXPECT_TRUE(RecordPlausible(&r, sizeof(r), &v));
  EXPECT_EQ(v, 42u);
  EXPECT_FALSE(RecordPlausible(&r, sizeof(r) - 1, &v));
  r.state = 9;
  EXPECT_FALSE(RecordPlausible(&r, sizeof(r), &v));
  r = Good();
  r.reserved0 = 3;
  EXPECT_FALSE(RecordPlausible(&r, sizeof(r), &v));
  r = Good();
  r.version.set(~u64(0));
  EXPECT_FALSE(RecordPlausible(&r, sizeof(r), &v));
}

// The load: an absent record is the layout's state; a record replaces it; a
// second record of a bucket (the journal's keys over the tree's, for the node
// scan) wins only with a newer version; a bad one changes nothing.
TEST(AllocRecordTest, LoadKeepsTheNewerRecordAndTheLayoutForAbsentOnes) {
  const sb::Superblock s = TwoMembers();
  Allocator a;
  ASSERT_TRUE(a.Init(s).ok());
  EXPECT_EQ(a.Get(0, 3).state, BucketState::kJournal);
  EXPECT_EQ(a.Get(0, 50).state, BucketState::kFree);
  a.BeginLoad();
  AllocRecord r = Good();
  ASSERT_TRUE(a.LoadRecord(1, 10, &r, sizeof(r)).ok());
  r.version.set(40);
  r.state = u8(BucketState::kFree);
  r.live_sectors.set(0);
  ASSERT_TRUE(a.LoadRecord(1, 10, &r, sizeof(r)).ok());  // older: ignored
  EXPECT_EQ(a.Get(1, 10).state, BucketState::kUser);
  r.version.set(43);
  ASSERT_TRUE(a.LoadRecord(1, 10, &r, sizeof(r)).ok());  // newer: taken
  EXPECT_EQ(a.Get(1, 10).state, BucketState::kFree);
  EXPECT_EQ(a.Get(1, 10).version, 43u);
  r.state = 9;
  r.version.set(50);
  Diag d;
  EXPECT_EQ(a.LoadRecord(1, 10, &r, sizeof(r), &d).code(), Err::kCorrupt);
  EXPECT_EQ(a.Get(1, 10).version, 43u);  // (implausible: the merge rule replaces it whatever its version)
  // A plausible but invalid record (free with data): the bucket keeps its
  // state, and its version moves past the bad one's, so that a rebuild's
  // record replaces it under the merge rule.
  r.state = u8(BucketState::kFree);
  r.live_sectors.set(8);
  r.version.set(70);
  EXPECT_EQ(a.LoadRecord(1, 11, &r, sizeof(r), &d).code(), Err::kCorrupt);
  EXPECT_EQ(a.Get(1, 11).state, BucketState::kFree);
  EXPECT_EQ(a.Get(1, 11).version, 70u);
  EXPECT_TRUE(a.Get(1, 11).recorded);
  ASSERT_TRUE(a.Finish().ok());
  EXPECT_EQ(a.Stats().records_loaded, 1u);
  EXPECT_EQ(a.Usage(0).by_state[u8(BucketState::kJournal)], 8u);
  EXPECT_EQ(a.Usage(1).by_state[u8(BucketState::kFree)], 300u);
}


// The sums Usage returns (buckets by state, live and cached sectors) are
// kept by every change instead of walked (Usage held mu_ for a walk of every
// bucket, and the commit hook takes mu_ under commit_mu): after random
// allocations, frees (one and batched, with and without a journal),
// published and unpublished count stages (underflows and overflows among
// them), count repairs, state repairs, SetLiveSectors, a load and a rebuild,
// they are what a walk of the buckets finds -- and FreeCount is the free
// state's count.
TEST(AllocatorTest, TheKeptSumsAreTheBucketsSummedAfterEveryKindOfChange) {
  const sb::Superblock s = TwoMembers();
  Allocator a;
  ASSERT_TRUE(a.Init(s).ok());
  std::mt19937_64 rng(12);
  std::vector<BucketRef> held;  // allocated, not freed
  auto check = [&](const char* after) {
    for (u32 d = 0; d < 2; d++) {
      BucketSums scan;
      EXPECT_TRUE(a.SumsMatchScan(d, &scan)) << after << ", member " << d;
      const DeviceUsage u = a.Usage(d);
      for (u32 k = 0; k < kBucketStateCount; k++) EXPECT_EQ(u.by_state[k], scan.by_state[k]) << after << " state " << k;
      EXPECT_EQ(u.live_sectors, scan.live_sectors) << after;
      EXPECT_EQ(u.cached_sectors, scan.cached_sectors) << after;
      EXPECT_EQ(a.FreeCount(d), scan.by_state[u8(BucketState::kFree)]) << after;
      u64 buckets = 0;
      for (u32 k = 0; k < kBucketStateCount; k++) buckets += u.by_state[k];
      EXPECT_EQ(buckets, s.members[d].nbuckets) << after;
    }
  };
  check("init");
  journal::Journal journal;  // never started: frees go pending, settled at 0
  for (int op = 0; op < 3000 && !HasFailure(); op++) {
    if (op == 1500) a.SetJournal(&journal);
    const int kind = int(rng() % 10);
    if (kind < 3 || held.empty()) {
      const BucketState purpose = rng() % 4 == 0 ? BucketState::kBtree
                                  : rng() % 3 == 0 ? BucketState::kCached : BucketState::kUser;
      const dev::DevMask target = purpose == BucketState::kBtree ? 0b01 : dev::DevMask(1 + rng() % 3);
      Result<BucketRef> r = purpose == BucketState::kUser && rng() % 2 == 0
                                ? a.AllocateUnrecorded(target, 0, Watermark::kBtree)
                                : a.Allocate(target, 0, purpose, Watermark::kBtree);
      if (r.ok()) held.push_back(*r);
    } else if (kind < 5) {  // count changes of a few buckets, published or not
      std::vector<CountStage> st;
      for (int i = 0, n = 1 + int(rng() % 4); i < n; i++) {
        const BucketRef& b = held[rng() % held.size()];
        bool dup = false;
        for (const CountStage& c : st) dup |= c.dev == b.dev && c.bucket == b.bucket;
        if (dup) continue;
        CountStage c;
        c.dev = b.dev;
        c.bucket = b.bucket;
        c.live = i64(rng() % 600) - 200;
        c.cached = i64(rng() % 300) - 100;
        if (a.Get(b.dev, b.bucket).state != BucketState::kUser) {  // (a gain there is kCorrupt)
          c.live = -i64(rng() % 50) - 1;
          c.cached = 0;
        }
        st.push_back(c);
      }
      CountNote note;
      ASSERT_TRUE(a.StageCounts(st.data(), u32(st.size()), &note).ok());
      if (rng() % 4 != 0) a.PublishCounts(st.data(), u32(st.size()), &note);
    } else if (kind < 6) {
      const size_t i = rng() % held.size();
      a.Free(held[i]).IgnoreError();
      held.erase(held.begin() + long(i));
    } else if (kind < 7) {
      std::vector<BucketRef> refs;
      for (int i = 0, n = 1 + int(rng() % 5); i < n && !held.empty(); i++) {
        const size_t k = rng() % held.size();
        refs.push_back(held[k]);
        held.erase(held.begin() + long(k));
      }
      a.FreeBuckets(refs.data(), u32(refs.size())).IgnoreError();
    } else if (kind < 8) {
      const BucketRef& b = held[rng() % held.size()];
      CountFix f{b.dev, b.bucket, u32(rng() % 9000), u32(rng() % 9000)};  // (past the bound: clamped)
      a.RepairCounts(&f, 1).IgnoreError();  // (kInvalidArgument for a bucket that is not user)
    } else if (kind < 9) {
      const BucketRef& b = held[rng() % held.size()];
      if (a.Get(b.dev, b.bucket).state == BucketState::kBtree) {
        ASSERT_TRUE(a.SetLiveSectors(b, u32(rng() % 512)).ok());
      } else {
        // fsck's: forced to another state (free, btree on the member that
        // allows it, user).
        const u32 pick = u32(rng() % 3);
        const BucketState to = pick == 0 ? BucketState::kFree
                               : pick == 1 && b.dev == 0 ? BucketState::kBtree : BucketState::kUser;
        ASSERT_TRUE(a.RepairState(b.dev, b.bucket, to).ok());
        const Bucket k = a.Get(b.dev, b.bucket);
        for (BucketRef& r : held)
          if (r.dev == b.dev && r.bucket == b.bucket) r.gen = k.gen;
        if (to == BucketState::kFree) {
          for (size_t i = 0; i < held.size(); i++)
            if (held[i].dev == b.dev && held[i].bucket == b.bucket) held.erase(held.begin() + long(i--));
        }
      }
    } else {
      check("a stretch of changes");
    }
  }
  check("the random changes");
  a.SetJournal(nullptr);
  // A load over the state as it is: records of some buckets replaced (and
  // a bad record, which changes no state).
  a.BeginLoad();
  check("BeginLoad");
  AllocRecord r = Good();
  for (u64 b = 20; b < 60; b++) ASSERT_TRUE(a.LoadRecord(1, b, &r, sizeof(r)).ok());
  r.state = 9;
  EXPECT_EQ(a.LoadRecord(1, 70, &r, sizeof(r)).code(), Err::kCorrupt);
  ASSERT_TRUE(a.Finish().ok());
  check("a load");
  EXPECT_EQ(a.Usage(1).live_sectors, 40u * 100);
  // fsck's rebuild.
  a.BeginRebuild();
  check("BeginRebuild");
  for (u64 b = 30; b < 50; b++) {
    ASSERT_TRUE(a.RebuildMark(1, b, BucketState::kUser, 3));
    ASSERT_TRUE(a.RebuildCount(1, b, b % 2 == 0, 16));
  }
  ASSERT_TRUE(a.RebuildMark(0, 40, BucketState::kBtree, 0));
  ASSERT_TRUE(a.EndRebuild().ok());
  check("a rebuild");
  EXPECT_EQ(a.Usage(1).by_state[u8(BucketState::kUser)], 20u);
  EXPECT_EQ(a.Usage(1).live_sectors + a.Usage(1).cached_sectors, 20u * 16);
}

// Captures the log lines written while it lives (SetLogCopy to a file).
class LogLines {
 public:
  LogLines() {
    char name[] = "/tmp/tierfs-alloc-log-XXXXXX";
    fd_ = mkstemp(name);
    unlink(name);
    userspace::SetLogCopy(fd_);
  }
  ~LogLines() {
    userspace::SetLogCopy(-1);
    close(fd_);
  }
  // Lines written so far that contain `needle`.
  u32 Count(const char* needle) const {
    std::string all;
    char buf[4096];
    for (off_t off = 0;;) {
      const ssize_t n = pread(fd_, buf, sizeof(buf), off);
      if (n <= 0) break;
      all.append(buf, size_t(n));
      off += n;
    }
    u32 c = 0;
    for (size_t at = all.find(needle); at != std::string::npos; at = all.find(needle, at + 1)) c++;
    return c;
  }

 private:
  int fd_ = -1;
};

// The hook's side counts only what a journaled commit met and logs nothing
// itself (it runs under commit_mu): StageCounts marks a live underflow, an
// overflow, a cached underflow and a loss in a bucket that is not user in
// the stages and counts nothing (a commit the journal then refuses, and its
// retry, count nothing); PublishCounts counts each once -- the loss in a
// free bucket as foreign_losses, not as a live underflow. Neither writes a
// log line: LogCountNote does, after the commit, damage only when published
// and at most once per 10 s; a refused gain (a bug) likewise rate-limited.
TEST(AllocatorTest, CountStagesAreCountedWhenPublishedAndLoggedAfterTheCommit) {
  const sb::Superblock s = TwoMembers();
  Allocator a;
  ASSERT_TRUE(a.Init(s).ok());
  Result<BucketRef> u = a.Allocate(0b10, 0, BucketState::kUser, Watermark::kBtree);
  Result<BucketRef> v = a.Allocate(0b10, 0, BucketState::kUser, Watermark::kBtree);
  ASSERT_TRUE(u.ok() && v.ok());
  CountFix f{u->dev, u->bucket, 16, 0};
  ASSERT_TRUE(a.RepairCounts(&f, 1).ok());
  const u64 free_bucket = 299;  // (free: Allocate takes the lowest free bucket first)
  ASSERT_EQ(a.Get(1, free_bucket).state, BucketState::kFree);
  LogLines log;
  auto stages = [&] {
    std::vector<CountStage> st(3);
    st[0].dev = u->dev, st[0].bucket = u->bucket, st[0].live = -40, st[0].cached = -8;  // below 0, both
    st[1].dev = v->dev, st[1].bucket = v->bucket, st[1].live = 16 * 512 + 1;            // past the bound
    st[2].dev = 1, st[2].bucket = free_bucket, st[2].live = -8;                         // not user
    return st;
  };
  // Staged twice (a refused commit and its retry): nothing counted, nothing logged.
  for (int i = 0; i < 2; i++) {
    std::vector<CountStage> st = stages();
    CountNote note;
    ASSERT_TRUE(a.StageCounts(st.data(), u32(st.size()), &note).ok());
    EXPECT_TRUE(st[0].live_underflow && st[0].cached_underflow && st[1].overflow && st[2].foreign_loss);
    EXPECT_FALSE(st[2].changed);
    ASSERT_NE(note.what, nullptr);
    EXPECT_FALSE(note.error);
    const AllocStats stats = a.Stats();
    EXPECT_EQ(stats.count_underflows + stats.cached_underflows + stats.count_overflows + stats.foreign_losses, 0u);
    a.LogCountNote(note, false);  // (refused: damage is not logged)
  }
  EXPECT_EQ(log.Count("alloc:"), 0u);
  // Journaled: counted once each, logged once, after.
  std::vector<CountStage> st = stages();
  CountNote note;
  ASSERT_TRUE(a.StageCounts(st.data(), u32(st.size()), &note).ok());
  a.PublishCounts(st.data(), u32(st.size()), &note);
  EXPECT_EQ(log.Count("alloc:"), 0u);
  AllocStats stats = a.Stats();
  EXPECT_EQ(stats.count_underflows, 1u);
  EXPECT_EQ(stats.cached_underflows, 1u);
  EXPECT_EQ(stats.count_overflows, 1u);
  EXPECT_EQ(stats.foreign_losses, 1u);
  EXPECT_EQ(stats.count_records, 2u);
  EXPECT_EQ(a.Get(u->dev, u->bucket).live_sectors, 0u);
  EXPECT_EQ(a.Get(v->dev, v->bucket).live_sectors, 16u * 512);
  a.LogCountNote(note, true);
  EXPECT_EQ(log.Count("live count would go below 0"), 1u);
  // Damage repeats itself: the next lines within 10 s are dropped (the
  // counters count every one).
  for (int i = 0; i < 50; i++) a.LogCountNote(note, true);
  EXPECT_LT(log.Count("live count would go below 0"), 51u);
  // A gain in a bucket that is not user: kCorrupt, a bug; logged only by
  // LogCountNote, rate-limited too.
  for (int i = 0; i < 50; i++) {
    CountStage g;
    g.dev = 1, g.bucket = free_bucket, g.live = 8;
    CountNote n;
    EXPECT_EQ(a.StageCounts(&g, 1, &n).code(), Err::kCorrupt);
    EXPECT_TRUE(n.error);
    if (i == 0) {
      EXPECT_EQ(log.Count("is not a user bucket"), 0u);
    }
    a.LogCountNote(n, false);
    if (i == 0) {
      EXPECT_EQ(log.Count("gains sectors, but is not a user bucket"), 1u);
    }
  }
  EXPECT_LT(log.Count("gains sectors, but is not a user bucket"), 50u);
  EXPECT_EQ(a.Stats().foreign_losses, 1u);
}

}  // namespace
}  // namespace tfs::alloc
