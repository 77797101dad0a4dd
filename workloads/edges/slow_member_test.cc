// Slow-member edges (issue 17): a mounted filesystem (store + posix) over an
// SSD member in memory and an HDD member behind an in-process FaultDevice that
// is stalled for an hour. Each test runs an operation on SSD-resident data and
// asserts that it completes while the HDD is still stalled -- never a timing
// bound on how fast: the deadline below is minutes, the stall an hour, and the
// old code does not finish at all (it waits for the stall). Where an edge has
// no HDD in it (a commit frozen in the journal), a btree test point freezes the
// commit instead.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "faultdevices/device.h"
#include "faultdevices/profile.h"
#include "mount/testing.h"
#include "posix/fs.h"
#include "store/store.h"
#include "userspace/platform/mem_device.h"

namespace tfs {
namespace {

using faultdev::FaultDevice;
using posix::Filesystem;
using userspace::MemDevice;
using userspace::MemDeviceOptions;

constexpr uint64_t kHour = 3600ull * 1000 * 1000 * 1000;
// How long a test waits for an SSD-only operation before it calls it stuck
// behind the stalled HDD. Generous (a loaded machine), far below the stall.
constexpr auto kDeadline = std::chrono::minutes(3);
const posix::Caller kUser{1000, 1000};

std::unique_ptr<MemDevice> Mem(const char* name, uint64_t size) {
  MemDeviceOptions o;
  o.name = name;
  o.size = size;
  o.volatile_cache = true;
  return std::make_unique<MemDevice>(o);
}

// The stripes that locks were shared by until issue 17 (posix: 64 inode
// stripes, 256 data-lock stripes, by hashing). The tests below pick a second
// file that shares the first one's old stripe, so they fail on the old code
// by construction, not by chance.
bool SameOldInodeStripe(uint64_t a, uint64_t b) {
  auto stripe = [](uint64_t ino) { return uint32_t((ino * 0x9e3779b97f4a7c15ull) >> 58) % 64; };
  return stripe(a) == stripe(b);
}
bool SameOldDataStripe(uint64_t a, uint64_t b) {
  auto stripe = [](uint64_t ino) { return uint32_t((ino * 0xc2b2ae3d27d4eb4full) >> 54) % 256; };
  return stripe(a) == stripe(b);
}

// Runs `fn` on a thread and waits for it up to kDeadline; true if it finished.
// If it did not, `release` (e.g. ending the stall) runs before the join.
bool FinishesInTime(const std::function<void()>& fn, const std::function<void()>& release) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread t([&] {
    fn();
    std::lock_guard<std::mutex> l(mu);
    done = true;
    cv.notify_all();
  });
  bool in_time;
  {
    std::unique_lock<std::mutex> l(mu);
    in_time = cv.wait_for(l, kDeadline, [&] { return done; });
  }
  if (!in_time) release();
  t.join();
  return in_time;
}

// ssd.a (memory) + hdd.b (a FaultDevice over memory, no delay until stalled);
// data and metadata on the SSD, the HDD the background target. Small buckets
// and a small journal ring so that checkpoints come often.
struct TwoTier : testing::MountedFs {
  std::unique_ptr<MemDevice> ssd;
  std::unique_ptr<FaultDevice> hdd;

  // `data_on`: the foreground (data) target, "ssd" or "hdd".
  explicit TwoTier(store::OpenOptions open = store::OpenOptions{}, const char* data_on = "ssd") {
    ssd = Mem("ssd0", 128ull << 20);
    std::string error;
    std::optional<faultdev::Profile> p = faultdev::ParseProfile("", "inline.toml", {}, &error);
    EXPECT_TRUE(p.has_value()) << error;
    if (!p) return;
    hdd = FaultDevice::Open(*p, Mem("hdd0", 256ull << 20), &error);
    EXPECT_TRUE(hdd != nullptr) << error;
    if (hdd == nullptr) return;
    store::FormatOptions fo = testing::TwoTierFormat(data_on);
    fo.journal_buckets = journal::kMinRingBuckets;
    if (!testing::FormatTwoTier(ssd.get(), hdd.get(), fo).ok()) return;
    devs = {ssd.get(), hdd.get()};
    store_options = open;
    Mount();
  }
  ~TwoTier() {
    if (hdd != nullptr) hdd->Unstall();
    Unmount();
  }
  // Writes the HDD was sent so far whose origin is not data (the
  // foreground's or a background engine's): metadata of any kind.
  uint64_t HddMetadataWrites(bool superblocks_too = true) const {
    const faultdev::DeviceStats s = hdd->Stats();
    uint64_t n = 0;
    for (int o = 0; o < kIoOriginCount; o++) {
      const IoOrigin origin = IoOrigin(o);
      if (origin == IoOrigin::kForegroundWrite || origin == IoOrigin::kReconcile || origin == IoOrigin::kPromote ||
          origin == IoOrigin::kCopygc || (!superblocks_too && origin == IoOrigin::kSuperblock))
        continue;
      n += s.by_origin[o][int(IoOp::kWrite)].ops;
    }
    return n;
  }
  uint64_t Create(const std::string& name) {
    Result<posix::Attr> a = fs.Mknod(posix::kRootIno, name.data(), uint32_t(name.size()), posix::kModeReg | 0644, 0, kUser);
    EXPECT_TRUE(a.ok()) << name << ": " << a.status().Message();
    return a.ok() ? a.value().ino : 0;
  }
  // Creates files until one's inode number satisfies `same` (with `of`).
  uint64_t CreateColliding(uint64_t of, bool (*same)(uint64_t, uint64_t)) {
    for (int i = 0; i < 100000; i++) {
      const uint64_t ino = Create("c" + std::to_string(i));
      if (ino == 0 || same(ino, of)) return ino;
    }
    ADD_FAILURE() << "no colliding inode in 100000 files";
    return 0;
  }
  // Requests the HDD was sent so far (reads, writes, flushes).
  uint64_t HddRequests() const {
    const faultdev::DeviceStats s = hdd->Stats();
    uint64_t n = 0;
    for (const faultdev::IoCount& c : s.by_op) n += c.ops;
    return n;
  }
};

// Edge 1: the allocator checkpoint (run by the btree writer when the journal
// ring fills, and waited for by the commit throttle) wrote every member's
// table, the idle HDD's too: with the HDD stalled, SSD-only commits froze.
// Since format version 3 no member's allocation state is on the member (the
// alloc btree is on the SSD): the checkpoints journal room needs send the
// idle HDD nothing.
TEST(SlowMember, IdleStalledMemberHoldsBackNoCheckpointOrCommit) {
  TwoTier t;
  ASSERT_TRUE(t.open());
  t.hdd->StallFor(kHour);
  const uint64_t hdd_before = t.HddRequests();
  const uint64_t ckpt_before = t.store->btrees().GetStats().checkpoints;
  std::atomic<int> failures{0};
  std::atomic<uint64_t> ops{0};
  // SSD-only creates, writes and fsyncs until the trees have checkpointed
  // three times (the journal ring is four buckets: that is thousands of commits).
  auto work = [&] {
    std::string block(16384, 'x');
    for (int i = 0; i < 200000 && failures == 0; i++) {
      if (t.store->btrees().GetStats().checkpoints >= ckpt_before + 3) return;
      const std::string name = "f" + std::to_string(i % 64);
      Result<posix::Attr> a = t.fs.Lookup(posix::kRootIno, name.data(), uint32_t(name.size()));
      if (!a.ok()) a = t.fs.Mknod(posix::kRootIno, name.data(), uint32_t(name.size()), posix::kModeReg | 0644, 0, kUser);
      if (!a.ok()) {
        ADD_FAILURE() << "create " << name << ": " << a.status().Message();
        failures++;
        return;
      }
      block[0] = char('a' + i % 26);
      Result<uint32_t> w = t.fs.Write(a.value().ino, uint64_t(i % 16) * block.size(), block.data(),
                                      uint32_t(block.size()), Filesystem::kWriteDirect);
      Status fs = i % 8 == 0 ? t.fs.Fsync(a.value().ino) : Status::Ok();
      if (!w.ok() || !fs.ok()) {
        ADD_FAILURE() << "write/fsync " << name << ": " << (w.ok() ? fs.Message() : w.status().Message());
        failures++;
        return;
      }
      ops++;
    }
    ADD_FAILURE() << "no three checkpoints in 200000 operations";
    failures++;
  };
  const bool in_time = FinishesInTime(work, [&] { t.hdd->Unstall(); });
  EXPECT_TRUE(in_time) << "SSD-only operations waited for the stalled HDD (" << ops.load() << " done, "
                       << t.store->btrees().GetStats().checkpoints - ckpt_before << " checkpoints)";
  EXPECT_EQ(failures.load(), 0);
  const uint64_t hdd_after = t.HddRequests();
  EXPECT_EQ(hdd_after, hdd_before) << "SSD-only work sent requests to the idle HDD";
}

// The stall property by construction (docs/format/alloc.md): a run of
// allocations and frees of the HDD's buckets -- files written to it,
// truncated, deleted, fsynced -- and of the SSD's node buckets sends the HDD
// its data and nothing else: its buckets' records go to the SSD's journal
// and btree. (Format version 2 wrote each changed member's table to it:
// writes of origin alloc.)
TEST(SlowMember, AllocationStateOfAnHddIsNeverWrittenToIt) {
  TwoTier t(store::OpenOptions{}, "hdd");
  ASSERT_TRUE(t.open());
  const uint64_t before = t.HddMetadataWrites();
  const alloc::AllocStats a0 = t.store->alloc().Stats();
  const uint64_t ckpt0 = t.store->btrees().GetStats().checkpoints;
  // The HDD's buckets (the allocator counts allocations of every member).
  auto hdd_buckets = [&] {
    std::vector<alloc::Bucket> v;
    for (uint64_t b = 0; b < t.store->alloc().nbuckets(1); b++) v.push_back(t.store->alloc().Get(1, b));
    return v;
  };
  const std::vector<alloc::Bucket> hdd0 = hdd_buckets();
  std::string data(300 << 10, 'd');
  for (int round = 0; round < 6; round++) {
    for (int f = 0; f < 4; f++) {
      const std::string name = "d" + std::to_string(round) + "_" + std::to_string(f);
      const uint64_t ino = t.Create(name);
      ASSERT_NE(ino, 0u);
      data[0] = char('a' + f);
      ASSERT_TRUE(t.fs.Write(ino, 0, data.data(), uint32_t(data.size()), Filesystem::kWriteDirect).ok());
      ASSERT_TRUE(t.fs.Fsync(ino).ok());
      if (f % 2 == 0) {
        posix::SetAttr set;
        set.valid = posix::kSetSize;
        set.size = 4096;
        ASSERT_TRUE(t.fs.SetAttrs(ino, set).ok());
      }
    }
    for (int f = 1; f < 4; f += 2) {
      const std::string name = "d" + std::to_string(round) + "_" + std::to_string(f);
      ASSERT_TRUE(t.fs.Unlink(posix::kRootIno, name.data(), uint32_t(name.size())).ok());
    }
    ASSERT_TRUE(t.store->btrees().Checkpoint().ok());
  }
  ASSERT_TRUE(t.store->journal().Flush().ok());
  const alloc::AllocStats a1 = t.store->alloc().Stats();
  // Allocations of HDD buckets: each free bumps the generation (by one: few
  // per bucket here), and the buckets still allocated were allocated once more.
  const std::vector<alloc::Bucket> hdd1 = hdd_buckets();
  int64_t hdd_allocs = 0;
  for (size_t b = 0; b < hdd1.size(); b++) {
    hdd_allocs += uint8_t(hdd1[b].gen - hdd0[b].gen);
    hdd_allocs += int(hdd1[b].state == alloc::BucketState::kUser) - int(hdd0[b].state == alloc::BucketState::kUser);
  }
  EXPECT_GE(hdd_allocs, 12) << "the run allocated few HDD buckets";
  EXPECT_GE(a1.frees - a0.frees, 6u) << "the run freed few buckets";
  EXPECT_GE(a1.records - a0.records, 18u);
  EXPECT_GE(t.store->btrees().GetStats().checkpoints, ckpt0 + 6);
  EXPECT_GT(t.store->alloc().Usage(1).by_state[uint8_t(alloc::BucketState::kUser)], 0u);
  EXPECT_EQ(t.HddMetadataWrites(), before) << "the HDD was sent writes that are not its data";
}

// Edge 3: a read spun while a commit of its stripe of inodes was in progress
// -- journal wait included -- and after 2,000 tries failed with kCorrupt
// (EUCLEAN) on healthy data. Now it waits only for a commit's in-memory apply.
// A test point holds a commit of the same file after its journal commit and
// before its apply: the read returns the old data at once.
// Holds the first commit of one thread at the btree test point
// "commit.journaled": journaled, none of its keys applied, its inode lock
// (and the btree's commit mutex (commit_mu)) held -- a commit frozen in the journal.
struct CommitGate {
  std::mutex mu;
  std::condition_variable cv;
  std::thread::id who;  // the thread to hold (default: none)
  bool parked = false, released = false, finished = false;

  store::OpenOptions Options() {
    store::OpenOptions open;
    open.btree.test_point_ctx = this;
    open.btree.test_point = [](void* ctx, const char* point) {
      auto* g = static_cast<CommitGate*>(ctx);
      if (std::strcmp(point, "commit.journaled") != 0) return;
      std::unique_lock<std::mutex> l(g->mu);
      if (g->who != std::this_thread::get_id() || g->parked) return;
      g->parked = true;
      g->cv.notify_all();
      g->cv.wait(l, [&] { return g->released; });
    };
    return open;
  }
  // Runs `fn` on a new thread whose first commit is held; returns once it
  // is (a test failure, released, if it never commits within kDeadline).
  std::thread Hold(std::function<void()> fn) {
    std::thread t([this, fn] {
      {
        std::lock_guard<std::mutex> l(mu);
        who = std::this_thread::get_id();
      }
      fn();
      std::lock_guard<std::mutex> l(mu);
      finished = true;
      cv.notify_all();
    });
    std::unique_lock<std::mutex> l(mu);
    if (!cv.wait_for(l, kDeadline, [&] { return parked || finished; }) || !parked) {
      ADD_FAILURE() << "the held thread made no commit";
      released = true;
      cv.notify_all();
    }
    return t;
  }
  void Release() {
    std::lock_guard<std::mutex> l(mu);
    released = true;
    cv.notify_all();
  }
};

TEST(SlowMember, ReadsDoNotWaitForACommitStuckInTheJournal) {
  CommitGate gate;
  TwoTier t(gate.Options());
  ASSERT_TRUE(t.open());
  const uint64_t ino = t.Create("f");
  std::string v1(8192, '1'), v2(8192, '2');
  ASSERT_TRUE(t.fs.Write(ino, 0, v1.data(), uint32_t(v1.size()), Filesystem::kWriteDirect).ok());
  Status wst;
  std::thread writer = gate.Hold([&] {
    wst = t.fs.Write(ino, 0, v2.data(), uint32_t(v2.size()), Filesystem::kWriteDirect).status();
  });
  std::string got(8192, '\0');
  Result<uint32_t> r = Err::kInvalidArgument;
  const bool in_time =
      FinishesInTime([&] { r = t.fs.Read(ino, 0, got.data(), uint32_t(got.size())); }, [&] { gate.Release(); });
  gate.Release();
  writer.join();
  EXPECT_TRUE(in_time);
  ASSERT_TRUE(r.ok()) << "a read of healthy data failed behind a commit held in the journal: "
                      << r.status().Message();
  EXPECT_EQ(got, v1) << "the held commit's keys were not applied yet";
  ASSERT_TRUE(wst.ok()) << wst.Message();
  ASSERT_TRUE(t.fs.Read(ino, 0, got.data(), uint32_t(got.size())).ok());
  EXPECT_EQ(got, v2);
}

// Edge 2: a commit held in the journal (the throttle, a full ring) held its
// inode's stripe, one of 64 shared by hashing: opens, attribute changes and
// creates of other files on that stripe waited for it. Now inode locks are per
// inode: another file's operations complete while the commit is held. (The
// held commit holds the btree's commit mutex (commit_mu) too, so the other file's
// operations here are the ones that commit nothing: open, stat, read, close.)
TEST(SlowMember, OtherFilesDoNotWaitForACommitHoldingAnInodeLock) {
  CommitGate gate;
  TwoTier t(gate.Options());
  ASSERT_TRUE(t.open());
  const uint64_t a = t.Create("a");
  const uint64_t b = t.CreateColliding(a, SameOldInodeStripe);
  ASSERT_NE(b, 0u);
  std::string data(8192, 'b');
  ASSERT_TRUE(t.fs.Write(b, 0, data.data(), uint32_t(data.size()), Filesystem::kWriteDirect).ok());
  std::thread writer = gate.Hold([&] {
    // A truncate: the inode lock is held across its commit.
    posix::SetAttr set;
    set.valid = posix::kSetSize;
    set.size = 4096;
    EXPECT_TRUE(t.fs.SetAttrs(a, set).ok());
  });
  Status st;
  const bool in_time = FinishesInTime(
      [&] {
        st = t.fs.OpenInode(b);
        std::string got(8192, '\0');
        if (st.ok()) st = t.fs.Read(b, 0, got.data(), uint32_t(got.size())).status();
        if (st.ok()) st = t.fs.GetAttr(b).status();
        if (st.ok()) st = t.fs.FlushBuffer(b);
        if (st.ok()) st = t.fs.Release(b);
      },
      [&] { gate.Release(); });
  gate.Release();
  writer.join();
  EXPECT_TRUE(in_time) << "another file's open/read/close waited for a commit holding inode " << a;
  EXPECT_TRUE(st.ok()) << st.Message();
}

// Edge 5: a data write to the stalled HDD held its file's data-lock stripe
// (one of 256 shared by hashing), and close() of any file on that stripe took
// it exclusively, with nothing buffered too: closes of other files froze for
// the whole stall. Now the data lock is per inode and a close with nothing
// buffered takes no lock. Data lives on the HDD here (the foreground target),
// metadata on the SSD.
TEST(SlowMember, CloseOfAFileDoesNotWaitForAnotherFilesStalledWrite) {
  TwoTier t(store::OpenOptions{}, "hdd");
  ASSERT_TRUE(t.open());
  const uint64_t a = t.Create("a");
  const uint64_t b = t.CreateColliding(a, SameOldDataStripe);
  ASSERT_NE(b, 0u);
  ASSERT_TRUE(t.fs.OpenInode(a).ok());
  ASSERT_TRUE(t.fs.OpenInode(b).ok());
  const uint64_t before = t.HddRequests();
  t.hdd->StallFor(kHour);
  std::string data(65536, 'a');
  Status wst;
  std::thread writer([&] {
    wst = t.fs.Write(a, 0, data.data(), uint32_t(data.size()), Filesystem::kWriteDirect).status();
  });
  // The write is in the HDD's hands (submitted, held by the stall).
  const auto give_up = std::chrono::steady_clock::now() + kDeadline;
  while (t.HddRequests() == before && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_GT(t.HddRequests(), before) << "the write never reached the HDD";
  Status st;
  const bool in_time = FinishesInTime(
      [&] {
        st = t.fs.FlushBuffer(b);  // close(2) of b, nothing buffered
        if (st.ok()) st = t.fs.GetAttr(b).status();
      },
      [&] { t.hdd->Unstall(); });
  t.hdd->Unstall();
  writer.join();
  EXPECT_TRUE(in_time) << "close of inode " << b << " waited for inode " << a << "'s write to the stalled HDD";
  EXPECT_TRUE(st.ok()) << st.Message();
  EXPECT_TRUE(wst.ok()) << wst.Message();
  EXPECT_TRUE(t.fs.Release(a).ok());
  EXPECT_TRUE(t.fs.Release(b).ok());
  EXPECT_GE(t.fs.GetStats().closes_unbuffered, 1u);
}

// Edge 4: a commit of data on the HDD named the HDD in its journal deps, so
// the next durable entry -- any fsync's, an SSD-only one's too -- flushed the
// HDD first (entries are ordered) and waited out the stall. Now a commit of
// HDD data flushes the HDD itself before it enters the journal and names only
// journal members. The journal's own flush timer is off (an hour) so that
// nothing but the fsync below makes an entry durable.
TEST(SlowMember, FsyncOfSsdOnlyChangesDoesNotFlushAnHddWrittenBefore) {
  store::OpenOptions open;
  open.journal.flush_delay_ns = kHour;
  TwoTier t(open, "hdd");
  ASSERT_TRUE(t.open());
  const uint64_t a = t.Create("a");
  std::string data(65536, 'a');
  ASSERT_TRUE(t.fs.Write(a, 0, data.data(), uint32_t(data.size()), Filesystem::kWriteDirect).ok());
  EXPECT_GE(t.data.GetStats().slow_member_flushes, 1u);
  t.hdd->StallFor(kHour);
  const uint64_t before = t.HddRequests();
  Status st;
  const bool in_time = FinishesInTime(
      [&] {
        // Metadata only (the SSD): a new empty file and its fsync.
        const uint64_t e = t.Create("e");
        st = e == 0 ? Status(Err::kIo) : t.fs.Fsync(e);
        // And a's data commit, already in the journal, is durable with it.
        if (st.ok()) st = t.fs.Fsync(a);
      },
      [&] { t.hdd->Unstall(); });
  const uint64_t after = t.HddRequests();
  t.hdd->Unstall();
  EXPECT_TRUE(in_time) << "an SSD-only fsync flushed the stalled HDD";
  EXPECT_TRUE(st.ok()) << st.Message();
  EXPECT_EQ(after, before) << "the SSD-only fsync sent requests to the stalled HDD";
}

// Edge 1, second half: an HDD whose buckets changed (data written to it) had
// a dirty table, and the checkpoint the journal ring needs wrote it
// synchronously: with the HDD stalled, the writer, the commit throttle and
// then every SSD-only commit waited (format version 2 then wrote it in the
// background and relogged its changes). Now the HDD's bucket records are
// keys of the alloc btree on the SSD: the ring is reclaimed by the btree's
// checkpoints, which never touch the HDD. Then a crash: the remount finds
// every HDD bucket as it was, the entries of the original changes long
// overwritten.
TEST(SlowMember, StalledHddWithChangedBucketsHoldsBackNoCommitAndItsStateSurvives) {
  TwoTier t(store::OpenOptions{}, "hdd");
  ASSERT_TRUE(t.open());
  const uint64_t a = t.Create("a");
  std::string data(1 << 20, 'a');
  ASSERT_TRUE(t.fs.Write(a, 0, data.data(), uint32_t(data.size()), Filesystem::kWriteDirect).ok());
  ASSERT_GT(t.store->alloc().Usage(1).by_state[uint8_t(alloc::BucketState::kUser)], 0u);
  const uint64_t ckpt0 = t.store->btrees().GetStats().checkpoints;
  const alloc::AllocStats a0 = t.store->alloc().Stats();
  const journal::Stats j0 = t.store->journal().GetStats();
  // The ring (kMinRingBuckets small buckets) is reused three times over.
  const uint64_t ring_bytes = uint64_t(journal::kMinRingBuckets) * t.store->sb().bucket_size;
  t.hdd->StallFor(kHour);
  const uint64_t hdd_before = t.HddRequests();
  // The HDD's buckets change while it stalls, with no HDD I/O: a truncate
  // frees them.
  {
    posix::SetAttr set;
    set.valid = posix::kSetSize;
    set.size = 0;
    ASSERT_TRUE(t.fs.SetAttrs(a, set).ok());
  }
  std::atomic<int> failures{0};
  std::atomic<uint64_t> ops{0};
  // Metadata only (the SSD): creates, mode changes, fsyncs, until the ring
  // has been reclaimed over several checkpoints.
  auto work = [&] {
    for (int i = 0; i < 400000 && failures == 0; i++) {
      if (t.store->btrees().GetStats().checkpoints >= ckpt0 + 4 &&
          t.store->journal().GetStats().bytes >= j0.bytes + 3 * ring_bytes)
        return;
      const std::string name = "m" + std::to_string(i % 512);
      Result<posix::Attr> r = t.fs.Lookup(posix::kRootIno, name.data(), uint32_t(name.size()));
      if (!r.ok()) r = t.fs.Mknod(posix::kRootIno, name.data(), uint32_t(name.size()), posix::kModeReg | 0644, 0, kUser);
      posix::SetAttr set;
      set.valid = posix::kSetMode;
      set.mode = 0600 | uint32_t(i % 2);
      Status st = r.ok() ? t.fs.SetAttrs(r.value().ino, set).status() : r.status();
      if (st.ok() && i % 16 == 0) st = t.fs.Fsync(r.value().ino);
      if (!st.ok()) {
        ADD_FAILURE() << name << ": " << st.Message();
        failures++;
        return;
      }
      ops++;
    }
    ADD_FAILURE() << "not enough checkpoints and reclaims in 400000 operations";
    failures++;
  };
  const bool in_time = FinishesInTime(work, [&] { t.hdd->Unstall(); });
  const alloc::AllocStats a1 = t.store->alloc().Stats();
  EXPECT_TRUE(in_time) << "SSD-only operations waited for the stalled HDD (" << ops.load() << " done, "
                       << t.store->btrees().GetStats().checkpoints - ckpt0 << " checkpoints)";
  EXPECT_EQ(failures.load(), 0);
  if (!in_time) return;
  EXPECT_GE(a1.frees, a0.frees + 1);
  EXPECT_EQ(a1.record_errors, 0u);
  EXPECT_EQ(t.HddRequests(), hdd_before) << "the stalled HDD was sent requests";

  // A crash now, the HDD still stalled: what is durable on both members,
  // remounted.
  ASSERT_TRUE(t.store->journal().Flush().ok());
  const uint64_t n = t.store->alloc().nbuckets(1);
  std::vector<alloc::Bucket> want(n);
  for (uint64_t b = 0; b < n; b++) want[b] = t.store->alloc().Get(1, b);
  auto copy = [](const std::vector<uint8_t>& image, const char* name) {
    MemDeviceOptions o;
    o.name = name;
    o.size = image.size();
    o.initial_image = image;
    return std::make_unique<MemDevice>(o);
  };
  auto ssd2 = copy(t.ssd->SnapshotDurable(), "ssd1");
  auto hdd2 = copy(static_cast<MemDevice&>(t.hdd->backing()).SnapshotDurable(), "hdd1");
  store::Store e2;
  store::OpenOptions ro;  // (a read-write open would free the user buckets that count nothing yet)
  ro.read_only = true;
  ASSERT_TRUE(testing::OpenStore(&e2, {ssd2.get(), hdd2.get()}, ro).ok());
  uint64_t differ = 0;
  for (uint64_t b = 0; b < n; b++) {
    const alloc::Bucket got = e2.alloc().Get(1, b);
    if (got.state != want[b].state || got.gen != want[b].gen || got.live_sectors != want[b].live_sectors) {
      if (differ++ < 5)
        ADD_FAILURE() << "hdd bucket " << b << ": state " << int(got.state) << " gen " << int(got.gen) << " live "
                      << got.live_sectors << " after the crash, want " << int(want[b].state) << "/"
                      << int(want[b].gen) << "/" << want[b].live_sectors;
    }
  }
  EXPECT_EQ(differ, 0u);
  EXPECT_TRUE(e2.Close().ok());
}

// Since format version 3 a bucket an overwrite frees is an ordinary commit
// of its allocation record (Store::PersistAlloc) made on the write path:
// the commit throttle, commit_mu, journal room -- and so was a bucket the
// foreground opens for new data until step 3b-3, which records it in the
// first extent transaction counting in it instead (no commit under the
// write point's mutex). None of those waits may reach the HDD. Here a
// write to a file placed on the HDD has taken an HDD bucket and is held by the stall, inside its own inode's lock, while
// SSD files open and free buckets by the dozen through several checkpoints
// (the throttle's and the ring's waits): they finish with the HDD write still
// held, and the HDD is sent nothing meanwhile.
TEST(SlowMember, StalledHddWriteHoldsBackNoAllocationRecordOfAnSsdBucket) {
  TwoTier t;  // data on the SSD
  ASSERT_TRUE(t.open());
  const uint64_t h = t.Create("h");
  ASSERT_NE(h, 0u);
  const std::string opt = "tierfs.foreground_target", where = "hdd.b";
  ASSERT_TRUE(t.fs.SetXattr(h, opt.data(), uint32_t(opt.size()), where.data(), uint32_t(where.size()), 0,
                            Filesystem::kFrontEndChecked)
                  .ok());
  const uint64_t s = t.Create("s");
  ASSERT_NE(s, 0u);
  const uint64_t hdd_user0 = t.store->alloc().Usage(1).by_state[uint8_t(alloc::BucketState::kUser)];
  const uint64_t before = t.HddRequests();
  t.hdd->StallFor(kHour);
  std::string hdata(65536, 'h');
  Status wst;
  std::atomic<bool> written{false};
  std::thread writer([&] {
    wst = t.fs.Write(h, 0, hdata.data(), uint32_t(hdata.size()), Filesystem::kWriteDirect).status();
    written = true;
  });
  const auto give_up = std::chrono::steady_clock::now() + kDeadline;
  while (t.HddRequests() == before && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_GT(t.HddRequests(), before) << "the write never reached the HDD";
  EXPECT_GT(t.store->alloc().Usage(1).by_state[uint8_t(alloc::BucketState::kUser)], hdd_user0)
      << "the HDD write took no HDD bucket";
  const uint64_t held = t.HddRequests();
  const alloc::AllocStats a0 = t.store->alloc().Stats();
  const uint64_t opened0 = t.data.GetStats().buckets_opened;
  const uint64_t freed0 = t.data.GetStats().buckets_freed;
  const uint64_t ckpt0 = t.store->btrees().GetStats().checkpoints;
  std::atomic<int> failures{0};
  std::atomic<uint64_t> rounds{0};
  // 1 MiB (four buckets) over s's first MiB, then its fsync: four buckets
  // opened and, once overwritten, the previous four freed, every round.
  auto work = [&] {
    std::string data(1 << 20, 's');
    for (int i = 0; i < 20000 && failures == 0; i++) {
      if (t.data.GetStats().buckets_opened >= opened0 + 64 &&
          t.store->btrees().GetStats().checkpoints >= ckpt0 + 3)
        return;
      data[0] = char('a' + i % 26);
      Status st = t.fs.Write(s, 0, data.data(), uint32_t(data.size()), Filesystem::kWriteDirect).status();
      if (st.ok()) st = t.fs.Fsync(s);
      if (!st.ok()) {
        ADD_FAILURE() << "round " << i << ": " << st.Message();
        failures++;
        return;
      }
      rounds++;
    }
    ADD_FAILURE() << "not enough buckets opened and checkpoints in 20000 rounds";
    failures++;
  };
  const bool in_time = FinishesInTime(work, [&] { t.hdd->Unstall(); });
  const bool still_held = !written.load();
  const uint64_t hdd_after = t.HddRequests();
  t.hdd->Unstall();
  writer.join();
  EXPECT_TRUE(in_time) << "SSD allocations waited for the stalled HDD (" << rounds.load() << " rounds, "
                       << t.data.GetStats().buckets_opened - opened0 << " buckets opened)";
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(wst.ok()) << wst.Message();
  if (!in_time) return;
  EXPECT_TRUE(still_held) << "the HDD write finished during the stall";
  EXPECT_EQ(hdd_after, held) << "SSD allocations sent requests to the stalled HDD";
  const alloc::AllocStats a1 = t.store->alloc().Stats();
  // Every bucket opened was taken without a commit (step 3b-3), and every
  // one freed was a record commit of its own.
  const uint64_t opened = t.data.GetStats().buckets_opened - opened0;
  const uint64_t freed = t.data.GetStats().buckets_freed - freed0;
  EXPECT_GE(opened + freed, 64u + 32u);
  EXPECT_GE(a1.unrecorded_allocs - a0.unrecorded_allocs, opened);
  EXPECT_GE(a1.record_commits - a0.record_commits, freed - (a1.unrecorded_frees - a0.unrecorded_frees));
  EXPECT_EQ(a1.record_errors, a0.record_errors);
  // And the HDD's data, written once the stall ended, reads back.
  std::string back(hdata.size(), '\0');
  Result<u32> r = t.fs.Read(h, 0, back.data(), uint32_t(back.size()));
  ASSERT_TRUE(r.ok()) << r.status().Message();
  EXPECT_EQ(r.value(), hdata.size());
  EXPECT_TRUE(back == hdata);
}

// A mount cycle writes an idle HDD nothing but its superblock (format
// version 2 rewrote its table's older slot once, and then nothing).
TEST(SlowMember, IdleMemberIsNotWrittenPerMountButItsSuperblock) {
  TwoTier t;
  ASSERT_TRUE(t.open());
  const uint64_t a = t.Create("a");
  std::string data(65536, 'a');
  ASSERT_TRUE(t.fs.Write(a, 0, data.data(), uint32_t(data.size()), Filesystem::kWriteDirect).ok());
  t.Remount();
  const uint64_t before = t.HddMetadataWrites(/*superblocks_too=*/false);
  t.Remount();
  t.Remount();
  EXPECT_EQ(t.HddMetadataWrites(false), before) << "an idle HDD was written metadata at mount or unmount";
}

}  // namespace
}  // namespace tfs
