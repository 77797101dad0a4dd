// The completion rule, checked (docs/design/core.md, "Completion context"):
// this program is built with TFS_LOCK_CHECKS on (fs/checked/CMakeLists.txt),
// so every Mutex, RwLock, CondVar or Latch wait, platform::Alloc and queue
// submission inside a completion or under a SpinLock traps. The tests run the
// paths whose completions matter -- the I/O queue (inline and deferred
// dispatch), journal commits, a slow member's background table write, and a
// whole format, mount, write and read -- and show that a violation is caught.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dev/device_set.h"
#include "dev/io_queue.h"
#include "mount/instance.h"
#include "mount/testing.h"
#include "platform/sync.h"
#include "platform/work.h"
#include "userspace/platform/io_testing.h"
#include "userspace/platform/mem_device.h"

static_assert(TFS_LOCK_CHECKS, "fs/checked builds everything with the lock checks on");

namespace tfs {
namespace {

using userspace::ManualDevice;
using userspace::MemDevice;
using userspace::MemDeviceOptions;

std::unique_ptr<MemDevice> Mem(const char* name, u64 size, bool may_submit, bool threaded = true) {
  MemDeviceOptions o;
  o.name = name;
  o.size = size;
  o.threaded = threaded;
  o.completions_may_submit = may_submit;
  o.volatile_cache = true;
  return std::make_unique<MemDevice>(o);
}

// Many I/Os through a device set's queues: one member whose completions may
// submit (dispatch from the completion), one whose may not (deferred work).
// The second completes only when this test's completer thread says so, so its
// queue is full whenever a completion comes -- every completion makes an I/O
// runnable, whatever the machine's load (a threaded MemDevice could complete
// each I/O before the next was submitted, and then nothing was ever deferred).
TEST(CompletionChecksTest, QueueCompletionsInlineAndDeferred) {
  auto a = Mem("a", 1 << 20, true);
  auto b = std::make_unique<ManualDevice>(1 << 20, /*supports_fua=*/true, /*completions_may_submit=*/false);
  dev::QueueConfig qc;
  qc.max_in_flight = 4;
  qc.reserved = 1;
  dev::DeviceSet devs;
  ASSERT_TRUE(devs.Add(a.get(), "ssd.a", qc).ok());
  ASSERT_TRUE(devs.Add(b.get(), "hdd.b", qc).ok());
  constexpr u32 kIos = 200;
  struct Slot {
    dev::Io io;
    char buf[512];
  };
  std::vector<Slot> slots(2 * kIos);
  dev::IoBatch batch(2 * kIos);
  for (u32 i = 0; i < 2 * kIos; i++) {
    Slot& s = slots[i];
    std::memset(s.buf, int(i & 0xff), sizeof(s.buf));
    s.io.req.op = IoOp::kWrite;
    s.io.req.origin = i % 2 ? IoOrigin::kReconcile : IoOrigin::kForegroundWrite;
    s.io.req.offset = u64(i % kIos) * 512;
    s.io.req.length = 512;
    s.io.req.buf = s.buf;
    s.io.cls = dev::DefaultClass(s.io.req.origin);
    s.io.done = dev::IoBatch::Done;
    s.io.caller_data = &batch;
    devs.member(i < kIos ? 0 : 1)->queue().Submit(&s.io);
  }
  std::atomic<bool> stop{false};
  std::thread completer([&] {
    while (!stop.load()) {
      if (!b->CompleteNext()) std::this_thread::yield();
    }
  });
  ASSERT_TRUE(batch.Wait().ok());
  for (u32 m = 0; m < 2; m++) {
    EXPECT_TRUE(dev::QueueSyncIo(devs.member(m)->queue(), IoOp::kFlush, 0, nullptr, 0, 0, IoOrigin::kJournal).ok());
    EXPECT_TRUE(dev::QueueSyncIo(devs.member(m)->queue(), IoOp::kWrite, 0, slots[0].buf, 512, IoRequest::kFua,
                                 IoOrigin::kJournal)
                    .ok());
  }
  stop = true;
  completer.join();
  EXPECT_EQ(b->submits_in_completion(), 0u);
  EXPECT_EQ(devs.member(0)->queue().State().deferred_dispatches, 0u);
  // (Sent by the member's own dispatch worker: every one of them.)
  EXPECT_GE(devs.member(1)->queue().State().deferred_dispatches, kIos - qc.max_in_flight);
  EXPECT_FALSE(platform::InNoSleep());
}

struct RoundTripCase {
  bool may_submit;
  bool threaded;
};

class CompletionRoundTripTest : public ::testing::TestWithParam<RoundTripCase> {};

// Format, mount, write (buffered and direct), fsync (journal commits), read,
// unmount, mount again and read: every completion on the way under the checks.
// One slot a queue, so that completions often find I/O waiting and a device
// that may not submit from them defers it. How often is the scheduler's: a
// completion that comes before the next submission finds nothing waiting, so
// the count is recorded (deferred_dispatches), not asserted;
// QueueCompletionsInlineAndDeferred holds completions back and proves the
// deferral itself.
TEST_P(CompletionRoundTripTest, FormatMountWriteRead) {
  auto dev = Mem("ssd0", testing::kMemberBytes, GetParam().may_submit, GetParam().threaded);
  testing::FormatOne(dev.get());
  BlockDevice* b = dev.get();
  Diag diag;
  std::string data(3 << 20, '\0');
  for (size_t i = 0; i < data.size(); i++) data[i] = char('a' + (i * 7 + i / 4096) % 26);
  u64 ino = 0;
  mount::Options mo;
  mo.store.queue.max_in_flight = 1;  // any second I/O waits for a completion
  mo.store.queue.reserved = 0;
  {
    auto inst = std::make_unique<mount::Instance>();
    ASSERT_TRUE(inst->Open(&b, 1, mo, &diag).ok()) << diag.text;
    auto f = inst->fs().Mknod(posix::kRootIno, "f", 1, posix::kModeReg | 0644, 0, posix::Caller{});
    ASSERT_TRUE(f.ok());
    ino = f.value().ino;
    ASSERT_TRUE(inst->fs().Open(ino, 0).ok());
    const u32 half = u32(data.size() / 2);
    ASSERT_TRUE(inst->fs().Write(ino, 0, data.data(), half).ok());
    ASSERT_TRUE(inst->fs().Write(ino, half, data.data() + half, half, posix::Filesystem::kWriteDirect).ok());
    ASSERT_TRUE(inst->fs().Fsync(ino).ok());
    std::string got(data.size(), '\0');
    auto r = inst->fs().Read(ino, 0, got.data(), u32(got.size()));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.value(), data.size());
    EXPECT_TRUE(got == data);
    ASSERT_TRUE(inst->fs().Release(ino).ok());
    const u64 deferred = inst->store().devs().member(0)->queue().State().deferred_dispatches;
    RecordProperty("deferred_dispatches", std::to_string(deferred));
    if (GetParam().may_submit) {
      EXPECT_EQ(deferred, 0u);
    }
    ASSERT_TRUE(inst->Close().ok());
  }
  auto inst = std::make_unique<mount::Instance>();
  ASSERT_TRUE(inst->Open(&b, 1, mo, &diag).ok()) << diag.text;
  std::string got(data.size(), '\0');
  auto r = inst->fs().Read(ino, 0, got.data(), u32(got.size()));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(got == data);
  const dev::QueueState q = inst->store().devs().member(0)->queue().State();
  if (GetParam().may_submit) {
    EXPECT_EQ(q.deferred_dispatches, 0u);
  }
  ASSERT_TRUE(inst->Close().ok());
  EXPECT_FALSE(platform::InNoSleep());
}

INSTANTIATE_TEST_SUITE_P(Devices, CompletionRoundTripTest,
                         ::testing::Values(RoundTripCase{true, true}, RoundTripCase{true, false},
                                           RoundTripCase{false, true}, RoundTripCase{false, false}),
                         [](const ::testing::TestParamInfo<RoundTripCase>& i) {
                           return std::string(i.param.may_submit ? "MaySubmit" : "Deferred") +
                                  (i.param.threaded ? "Threaded" : "Inline");
                         });

// A slow member (no journal ring: the "HDD", whose completions may not
// submit) with data written to it: its buckets' allocation records go to the
// SSD's journal and btree (never to the HDD, so nothing of it runs in the
// HDD's completion context), while journal commits go on on the SSD; the
// state survives a remount. (Until format version 3 the HDD's allocation
// table was written in the background -- write, flush, head, each step
// continued by deferred work -- and this test checked that path.)
TEST(CompletionChecksTest, SlowMemberAllocationChangesAndJournalCommits) {
  auto ssd = Mem("ssd0", 128ull << 20, true);
  auto hdd = Mem("hdd0", 256ull << 20, false);
  store::FormatMember m[2] = {{ssd.get(), "ssd.a", 1}, {hdd.get(), "hdd.b", 1}};
  store::FormatOptions fo = testing::SmallFormat();
  fo.foreground_target = "hdd";
  fo.metadata_target = "ssd";
  fo.background_target = "hdd";
  Diag diag;
  ASSERT_TRUE(store::Format(m, 2, fo, &diag).ok()) << diag.text;
  BlockDevice* b[2] = {ssd.get(), hdd.get()};
  std::string data(1 << 20, 'h');
  u64 ino = 0;
  {
    auto inst = std::make_unique<mount::Instance>();
    ASSERT_TRUE(inst->Open(b, 2, mount::Options{}, &diag).ok()) << diag.text;
    posix::Filesystem& fs = inst->fs();
    auto f = fs.Mknod(posix::kRootIno, "h", 1, posix::kModeReg | 0644, 0, posix::Caller{});
    ASSERT_TRUE(f.ok());
    ino = f.value().ino;
    ASSERT_TRUE(fs.Write(ino, 0, data.data(), u32(data.size()), posix::Filesystem::kWriteDirect).ok());
    ASSERT_TRUE(fs.Fsync(ino).ok());
    alloc::Allocator& al = inst->store().alloc();
    ASSERT_GT(al.Usage(1).by_state[u8(alloc::BucketState::kUser)], 0u);
    for (int i = 0; i < 20; i++) {  // commits meanwhile
      const std::string name = "m" + std::to_string(i);
      ASSERT_TRUE(fs.Mknod(posix::kRootIno, name.data(), u32(name.size()), posix::kModeReg | 0644, 0, posix::Caller{}).ok());
      ASSERT_TRUE(fs.FsyncDir(posix::kRootIno).ok());
    }
    const alloc::AllocStats a1 = al.Stats();
    // The HDD's buckets were taken unrecorded (step 3b-3) and recorded by
    // the extents' commits, on the SSD: records the extent transactions
    // carried.
    EXPECT_GT(a1.unrecorded_allocs, 0u);
    EXPECT_GT(a1.count_records, 0u);
    EXPECT_EQ(a1.record_errors, 0u);
    ASSERT_TRUE(inst->store().btrees().Checkpoint().ok());
    ASSERT_TRUE(inst->Close().ok());
  }
  auto inst = std::make_unique<mount::Instance>();
  ASSERT_TRUE(inst->Open(b, 2, mount::Options{}, &diag).ok()) << diag.text;
  std::string got(data.size(), '\0');
  auto r = inst->fs().Read(ino, 0, got.data(), u32(got.size()));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(got == data);
  ASSERT_TRUE(inst->Close().ok());
}

// Violations: each runs in a child process that must die with the check's
// message. The Io's done callback is the completion.
struct Violation {
  ManualDevice dev;
  dev::IoQueue q;
  dev::Io io;
  char buf[512] = {};

  explicit Violation(void (*done)(dev::Io*, Status)) {
    TFS_BUG_ON(!q.Init(&dev, dev::QueueConfig{}).ok());
    io.req.op = IoOp::kRead;
    io.req.origin = IoOrigin::kForegroundRead;
    io.req.length = 512;
    io.req.buf = buf;
    io.done = done;
    q.Submit(&io);
    dev.CompleteNext();  // the completion, in this thread
  }
};

Mutex g_mutex;

class CompletionChecksDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// The fast path: an uncontended Mutex, taken in one CAS -- caught all the same.
TEST_F(CompletionChecksDeathTest, AMutexTakenInACompletionIsCaught) {
  EXPECT_DEATH(Violation([](dev::Io*, Status) { MutexLock l(g_mutex); }),
               "Mutex::Lock in a completion or under a SpinLock");
}

TEST_F(CompletionChecksDeathTest, AMutexTryLockInACompletionIsCaught) {
  EXPECT_DEATH(Violation([](dev::Io*, Status) {
                 if (g_mutex.TryLock()) g_mutex.Unlock();
               }),
               "Mutex::TryLock in a completion");
}

TEST_F(CompletionChecksDeathTest, AnAllocationInACompletionIsCaught) {
  EXPECT_DEATH(Violation([](dev::Io*, Status) { platform::Free(platform::Alloc(64)); }),
               "platform::Alloc in a completion");
}

TEST_F(CompletionChecksDeathTest, ALatchWaitInACompletionIsCaught) {
  EXPECT_DEATH(Violation([](dev::Io*, Status) {
                 Latch l(0);
                 l.Wait();
               }),
               "Latch::Wait in a completion");
}

TEST_F(CompletionChecksDeathTest, ARwLockInACompletionIsCaught) {
  EXPECT_DEATH(Violation([](dev::Io*, Status) {
                 static RwLock rw;
                 ReadGuard g(rw);
               }),
               "RwLock::ReadLock in a completion");
}

// What the allocator's table write did before deferred work: submit its next
// step from the completion.
TEST_F(CompletionChecksDeathTest, ASubmissionFromACompletionIsCaught) {
  EXPECT_DEATH(Violation([](dev::Io* io, Status) { io->queue->Submit(io); }),
               "IoQueue::Submit in a completion");
}

TEST_F(CompletionChecksDeathTest, AMutexTakenUnderASpinLockIsCaught) {
  EXPECT_DEATH(
      {
        SpinLock s;
        SpinGuard g(s);
        MutexLock l(g_mutex);
      },
      "Mutex::Lock in a completion or under a SpinLock");
}

// And outside a completion the same calls are fine; the mark is cleared.
TEST(CompletionChecksTest, TheMarkCoversTheCompletionOnly) {
  static bool inside = false;
  Violation v([](dev::Io*, Status) { inside = platform::InNoSleep(); });
  EXPECT_TRUE(inside);
  EXPECT_FALSE(platform::InNoSleep());
  MutexLock l(g_mutex);
  platform::Free(platform::Alloc(64));
}

}  // namespace
}  // namespace tfs
