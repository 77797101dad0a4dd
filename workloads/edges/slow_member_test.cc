// Slow-member edges (issue 17): a mounted filesystem (engine + posix) over an
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

#include "engine/engine.h"
#include "faultdevices/device.h"
#include "faultdevices/profile.h"
#include "posix/fs.h"
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
struct TwoTier {
  std::unique_ptr<MemDevice> ssd;
  std::unique_ptr<FaultDevice> hdd;
  std::unique_ptr<engine::Engine> eng;
  Filesystem fs;

  explicit TwoTier(engine::OpenOptions open = engine::OpenOptions{}) {
    ssd = Mem("ssd0", 128ull << 20);
    std::string error;
    std::optional<faultdev::Profile> p = faultdev::ParseProfile("", "inline.toml", {}, &error);
    EXPECT_TRUE(p.has_value()) << error;
    if (!p) return;
    hdd = FaultDevice::Open(*p, Mem("hdd0", 256ull << 20), &error);
    EXPECT_TRUE(hdd != nullptr) << error;
    if (hdd == nullptr) return;
    engine::FormatMember m[2] = {{ssd.get(), "ssd.a", 1}, {hdd.get(), "hdd.b", 1}};
    engine::FormatOptions fo;
    fo.foreground_target = "ssd";
    fo.metadata_target = "ssd";
    fo.background_target = "hdd";
    fo.bucket_size = 256 * 1024;
    fo.btree_node_size = 64 * 1024;
    fo.journal_buckets = journal::kMinRingBuckets;
    Diag diag;
    EXPECT_TRUE(engine::Format(m, 2, fo, &diag).ok()) << diag.text;
    BlockDevice* b[2] = {ssd.get(), hdd.get()};
    eng = std::make_unique<engine::Engine>();
    EXPECT_TRUE(eng->Open(b, 2, open, &diag).ok()) << diag.text;
    Status ms = fs.Mount(eng.get(), Filesystem::Options{});
    EXPECT_TRUE(ms.ok()) << ms.Message();
  }
  ~TwoTier() {
    if (hdd != nullptr) hdd->Unstall();
    if (eng != nullptr && eng->open()) {
      EXPECT_TRUE(fs.Unmount().ok());
      EXPECT_TRUE(eng->Close().ok());
    }
  }
  bool ok() const { return eng != nullptr && eng->open(); }
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
// Now a member nothing changed on is not written, and the HDD sees nothing.
TEST(SlowMember, IdleStalledMemberHoldsBackNoCheckpointOrCommit) {
  TwoTier t;
  ASSERT_TRUE(t.ok());
  t.hdd->StallFor(kHour);
  const uint64_t hdd_before = t.HddRequests();
  const uint64_t ckpt_before = t.eng->alloc().Stats().checkpoints;
  std::atomic<int> failures{0};
  std::atomic<uint64_t> ops{0};
  // SSD-only creates, writes and fsyncs until the allocator has checkpointed
  // three times (the journal ring is four buckets: that is thousands of commits).
  auto work = [&] {
    std::string block(16384, 'x');
    for (int i = 0; i < 200000 && failures == 0; i++) {
      if (t.eng->alloc().Stats().checkpoints >= ckpt_before + 3) return;
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
    ADD_FAILURE() << "no three allocator checkpoints in 200000 operations";
    failures++;
  };
  const bool in_time = FinishesInTime(work, [&] { t.hdd->Unstall(); });
  EXPECT_TRUE(in_time) << "SSD-only operations waited for the stalled HDD (" << ops.load() << " done, "
                       << t.eng->alloc().Stats().checkpoints - ckpt_before << " allocator checkpoints)";
  EXPECT_EQ(failures.load(), 0);
  const uint64_t hdd_after = t.HddRequests();
  EXPECT_EQ(hdd_after, hdd_before) << "SSD-only work sent requests to the idle HDD";
  const alloc::AllocStats a = t.eng->alloc().Stats();
  EXPECT_GE(a.tables_unchanged, 3u) << "the HDD's table was not skipped";
}

// Edge 3: a read spun while a commit of its stripe of inodes was in progress
// -- journal wait included -- and after 2,000 tries failed with kCorrupt
// (EUCLEAN) on healthy data. Now it waits only for a commit's in-memory apply.
// A test point holds a commit of the same file after its journal commit and
// before its apply: the read returns the old data at once.
TEST(SlowMember, ReadsDoNotWaitForACommitStuckInTheJournal) {
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    std::thread::id who;  // the thread to hold (default: none)
    bool parked = false, released = false;
  } gate;
  engine::OpenOptions open;
  open.btree.test_point_ctx = &gate;
  open.btree.test_point = [](void* ctx, const char* point) {
    auto* g = static_cast<Gate*>(ctx);
    if (std::strcmp(point, "commit.journaled") != 0) return;
    std::unique_lock<std::mutex> l(g->mu);
    if (g->who != std::this_thread::get_id() || g->parked) return;
    g->parked = true;
    g->cv.notify_all();
    g->cv.wait(l, [&] { return g->released; });
  };
  TwoTier t(open);
  ASSERT_TRUE(t.ok());
  const std::string name = "f";
  const uint64_t ino =
      t.fs.Mknod(posix::kRootIno, name.data(), uint32_t(name.size()), posix::kModeReg | 0644, 0, kUser).value().ino;
  std::string v1(8192, '1'), v2(8192, '2');
  ASSERT_TRUE(t.fs.Write(ino, 0, v1.data(), uint32_t(v1.size()), Filesystem::kWriteDirect).ok());
  Status wst;
  std::thread writer([&] {
    {
      std::lock_guard<std::mutex> l(gate.mu);
      gate.who = std::this_thread::get_id();
    }
    Result<uint32_t> w = t.fs.Write(ino, 0, v2.data(), uint32_t(v2.size()), Filesystem::kWriteDirect);
    wst = w.status();
  });
  {
    std::unique_lock<std::mutex> l(gate.mu);
    gate.cv.wait(l, [&] { return gate.parked; });
  }
  std::string got(8192, '\0');
  Result<uint32_t> r = Err::kInvalidArgument;
  const bool in_time = FinishesInTime([&] { r = t.fs.Read(ino, 0, got.data(), uint32_t(got.size())); }, [] {});
  {
    std::lock_guard<std::mutex> l(gate.mu);
    gate.released = true;
    gate.cv.notify_all();
  }
  writer.join();
  EXPECT_TRUE(in_time);
  ASSERT_TRUE(r.ok()) << "a read of healthy data failed behind a commit held in the journal: "
                      << r.status().Message();
  EXPECT_EQ(got, v1) << "the held commit's keys were not applied yet";
  ASSERT_TRUE(wst.ok()) << wst.Message();
  ASSERT_TRUE(t.fs.Read(ino, 0, got.data(), uint32_t(got.size())).ok());
  EXPECT_EQ(got, v2);
}

}  // namespace
}  // namespace tfs
