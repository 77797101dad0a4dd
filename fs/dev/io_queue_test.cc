#include "dev/io_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "dev/device_set.h"
#include "userspace/platform/io_testing.h"
#include "userspace/platform/mem_device.h"

namespace tfs::dev {
namespace {

using userspace::ManualDevice;

struct Tracker {
  std::vector<int> completed;  // tags in completion order
  std::vector<Status> status;
};

struct TestIo {
  Io io;
  int tag = 0;
  Tracker* tracker = nullptr;
  char buf[512] = {};
};

std::unique_ptr<TestIo> MakeIo(Tracker* t, int tag, IoOp op, IoOrigin origin, IoClass cls,
                               u8 flags = 0) {
  auto tio = std::make_unique<TestIo>();
  tio->tag = tag;
  tio->tracker = t;
  tio->io.req.op = op;
  tio->io.req.flags = flags;
  tio->io.req.origin = origin;
  tio->io.req.offset = 0;
  tio->io.req.length = op == IoOp::kFlush ? 0 : 512;
  tio->io.req.buf = op == IoOp::kFlush ? nullptr : tio->buf;
  tio->io.cls = cls;
  tio->io.caller_data = tio.get();
  tio->io.done = [](Io* io, Status st) {
    auto* t = static_cast<TestIo*>(io->caller_data);
    t->tracker->completed.push_back(t->tag);
    t->tracker->status.push_back(st);
  };
  return tio;
}

QueueConfig SmallConfig() {
  QueueConfig c;
  c.max_in_flight = 4;
  c.reserved = 1;
  c.readahead_max_in_flight = 2;
  c.stall_threshold_ns = 50 * platform::kNsPerMs;
  return c;
}

// Waits (up to 10 s) until `pred` holds.
template <typename Pred>
bool Eventually(Pred pred) {
  for (int i = 0; i < 10000; i++) {
    if (pred()) return true;
    platform::SleepNs(platform::kNsPerMs);
  }
  return pred();
}

int TagOf(const IoRequest& logged) {
  return static_cast<TestIo*>(static_cast<Io*>(logged.caller_data)->caller_data)->tag;
}

// A device whose completions may run in interrupt context is never submitted
// to from one: the I/Os a completion makes runnable take their slots there,
// in class priority order, and deferred work sends them. The completions here
// run on the test thread; the device counts submissions made inside them.
TEST(IoQueueTest, ACompletionThatMayNotSubmitLeavesTheDispatchToDeferredWork) {
  ManualDevice dev(1 << 20, /*supports_fua=*/true, /*completions_may_submit=*/false);
  {
    IoQueue no_work;
    EXPECT_TRUE(no_work.Init(&dev, SmallConfig()).Is(ErrorClass::kInvalid));  // nowhere to defer to
  }
  WorkQueue wq;
  ASSERT_TRUE(wq.Start("io-queue-test").ok());
  IoQueue q;
  QueueConfig c = SmallConfig();
  c.max_in_flight = 2;
  c.reserved = 0;
  ASSERT_TRUE(q.Init(&dev, c, &wq).ok());
  Tracker t;
  std::vector<std::unique_ptr<TestIo>> ios;
  auto submit = [&](int tag, IoOrigin o, IoClass cls) {
    ios.push_back(MakeIo(&t, tag, IoOp::kRead, o, cls));
    q.Submit(&ios.back()->io);
  };
  submit(90, IoOrigin::kOther, IoClass::kForegroundAsync);  // both slots, from this thread
  submit(91, IoOrigin::kOther, IoClass::kForegroundAsync);
  submit(5, IoOrigin::kCopygc, IoClass::kBackground);
  submit(4, IoOrigin::kBtree, IoClass::kBtree);
  submit(3, IoOrigin::kForegroundWrite, IoClass::kForegroundAsync);
  submit(2, IoOrigin::kJournal, IoClass::kJournal);
  submit(1, IoOrigin::kForegroundRead, IoClass::kForegroundSync);
  EXPECT_EQ(dev.pending(), 2u);
  EXPECT_EQ(q.State().queued, 5u);
  // One completion at a time, each followed by the deferred dispatch of the
  // I/O it made runnable (its slot is taken at once: in_flight counts it).
  while (dev.CompleteNext()) {
    ASSERT_TRUE(Eventually([&] { return dev.pending() == q.State().in_flight; }));
  }
  EXPECT_EQ(t.completed, (std::vector<int>{90, 91, 1, 2, 3, 4, 5}));
  std::vector<int> dispatched;
  for (const IoRequest& r : dev.log()) dispatched.push_back(TagOf(r));
  EXPECT_EQ(dispatched, (std::vector<int>{90, 91, 1, 2, 3, 4, 5}));
  EXPECT_EQ(dev.submits_in_completion(), 0u);
  EXPECT_EQ(q.State().deferred_dispatches, 5u);
  EXPECT_EQ(q.State().in_flight, 0u);
  EXPECT_GE(wq.Stats().ran, 1u);
}

// The same for an emulated FUA write: its flush part goes out from deferred
// work, under the slot the write part held.
TEST(IoQueueTest, AnEmulatedFuaWritesFlushIsDeferredToo) {
  ManualDevice dev(1 << 20, /*supports_fua=*/false, /*completions_may_submit=*/false);
  WorkQueue wq;
  ASSERT_TRUE(wq.Start("io-queue-test").ok());
  IoQueue q;
  ASSERT_TRUE(q.Init(&dev, SmallConfig(), &wq).ok());
  Tracker t;
  auto w = MakeIo(&t, 1, IoOp::kWrite, IoOrigin::kJournal, IoClass::kJournal, IoRequest::kFua);
  q.Submit(&w->io);
  ASSERT_TRUE(dev.CompleteNext());  // the write part
  ASSERT_TRUE(Eventually([&] { return dev.pending() == 1; }));
  EXPECT_EQ(q.State().in_flight, 1u);
  EXPECT_TRUE(t.completed.empty());
  ASSERT_TRUE(dev.CompleteNext());  // the flush part
  EXPECT_EQ(t.completed, (std::vector<int>{1}));
  const std::vector<IoRequest> log = dev.log();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[1].op, IoOp::kFlush);
  EXPECT_EQ(dev.submits_in_completion(), 0u);
  EXPECT_EQ(q.State().deferred_dispatches, 1u);
  EXPECT_FALSE(q.HasDurabilityDebt());
}

// A full queue over a device completing in random order on its own thread
// (played interrupt context: a submission from one of its completions
// traps): every I/O completes. The first completion's callback holds the
// device's completion thread until all I/Os are submitted, so the queue is
// surely full and what completions make runnable goes through deferred work
// (without the hold, a busy machine could let the device keep up with the
// submitter and nothing would ever queue).
TEST(IoQueueTest, EveryQueuedIoCompletesOnADeviceWhoseCompletionsMayNotSubmit) {
  userspace::MemDeviceOptions o;
  o.size = 1 << 20;
  o.completions_may_submit = false;
  userspace::MemDevice dev(o);
  WorkQueue wq;
  ASSERT_TRUE(wq.Start("io-queue-test").ok());
  IoQueue q;
  ASSERT_TRUE(q.Init(&dev, SmallConfig(), &wq).ok());
  constexpr int kIos = 300;
  Latch latch(kIos);
  std::atomic<bool> submitted{false};
  std::atomic<bool> held{false};
  struct Ctx {
    Io io;
    char buf[512];
    Latch* latch;
    std::atomic<bool>* submitted;
    std::atomic<bool>* held;
  };
  std::vector<std::unique_ptr<Ctx>> ctxs;
  const IoClass classes[] = {IoClass::kForegroundSync, IoClass::kJournal, IoClass::kBtree, IoClass::kBackground};
  for (int i = 0; i < kIos; i++) {
    auto c = std::make_unique<Ctx>();
    c->latch = &latch;
    c->submitted = &submitted;
    c->held = &held;
    c->io.req.op = i % 3 == 0 ? IoOp::kRead : IoOp::kWrite;
    c->io.req.origin = IoOrigin::kOther;
    c->io.req.offset = u64(i % 64) * 512;
    c->io.req.length = 512;
    c->io.req.buf = c->buf;
    c->io.cls = classes[i % 4];
    c->io.caller_data = c.get();
    c->io.done = [](Io* io, Status st) {
      EXPECT_TRUE(st.ok());
      Ctx* ctx = static_cast<Ctx*>(io->caller_data);
      if (!ctx->held->exchange(true)) {
        while (!ctx->submitted->load()) std::this_thread::yield();
      }
      ctx->latch->CountDown();
    };
    q.Submit(&c->io);
    ctxs.push_back(std::move(c));
  }
  EXPECT_GT(q.State().queued, 0u);
  submitted.store(true);
  ASSERT_TRUE(latch.WaitFor(60 * platform::kNsPerSec));
  EXPECT_EQ(q.State().in_flight, 0u);
  EXPECT_EQ(q.State().queued, 0u);
  EXPECT_GT(q.State().deferred_dispatches, 0u);
}

TEST(IoQueueTest, RejectsBadConfig) {
  ManualDevice dev;
  IoQueue q;
  QueueConfig c = SmallConfig();
  c.reserved = c.max_in_flight;
  EXPECT_TRUE(q.Init(&dev, c).Is(ErrorClass::kInvalid));
  EXPECT_TRUE(q.Init(nullptr, SmallConfig()).Is(ErrorClass::kInvalid));
}

TEST(IoQueueTest, BackgroundNeverTakesTheReservedSlot) {
  ManualDevice dev;
  IoQueue q;
  ASSERT_TRUE(q.Init(&dev, SmallConfig()).ok());
  Tracker t;
  std::vector<std::unique_ptr<TestIo>> ios;
  // Ten background reads: only max_in_flight - reserved = 3 reach the device.
  for (int i = 0; i < 10; i++) {
    ios.push_back(MakeIo(&t, 100 + i, IoOp::kRead, IoOrigin::kReconcile, IoClass::kBackground));
    q.Submit(&ios.back()->io);
  }
  EXPECT_EQ(dev.pending(), 3u);
  EXPECT_EQ(q.State().queued, 7u);
  // A foreground read still gets a slot at once.
  ios.push_back(MakeIo(&t, 1, IoOp::kRead, IoOrigin::kForegroundRead, IoClass::kForegroundSync));
  q.Submit(&ios.back()->io);
  EXPECT_EQ(dev.pending(), 4u);
  EXPECT_EQ(q.State().in_flight, 4u);
  // Now the device is full: a second foreground read queues ahead of the background.
  ios.push_back(MakeIo(&t, 2, IoOp::kRead, IoOrigin::kForegroundRead, IoClass::kForegroundSync));
  q.Submit(&ios.back()->io);
  EXPECT_EQ(dev.pending(), 4u);
  // Completing one background read dispatches the foreground read, not background.
  ASSERT_TRUE(dev.CompleteNext());
  auto log = dev.log();
  EXPECT_EQ(log.back().origin, IoOrigin::kForegroundRead);
  dev.CompleteAll();
  while (q.State().in_flight > 0) dev.CompleteAll();
  EXPECT_EQ(t.completed.size(), 12u);
  for (const Status& st : t.status) EXPECT_TRUE(st.ok());
}

TEST(IoQueueTest, QueuedWorkRunsInClassPriorityOrder) {
  ManualDevice dev;
  IoQueue q;
  QueueConfig c = SmallConfig();
  c.max_in_flight = 2;
  c.reserved = 0;
  ASSERT_TRUE(q.Init(&dev, c).ok());
  Tracker t;
  std::vector<std::unique_ptr<TestIo>> ios;
  auto submit = [&](int tag, IoOrigin o, IoClass cls) {
    ios.push_back(MakeIo(&t, tag, IoOp::kRead, o, cls));
    q.Submit(&ios.back()->io);
  };
  submit(90, IoOrigin::kOther, IoClass::kForegroundAsync);  // occupy both slots
  submit(91, IoOrigin::kOther, IoClass::kForegroundAsync);
  submit(5, IoOrigin::kCopygc, IoClass::kBackground);
  submit(4, IoOrigin::kBtree, IoClass::kBtree);
  submit(3, IoOrigin::kForegroundWrite, IoClass::kForegroundAsync);
  submit(2, IoOrigin::kJournal, IoClass::kJournal);
  submit(1, IoOrigin::kForegroundRead, IoClass::kForegroundSync);
  // Complete one at a time; each completion dispatches the best queued I/O.
  while (dev.CompleteNext()) {
  }
  ASSERT_EQ(t.completed.size(), 7u);
  EXPECT_EQ(t.completed, (std::vector<int>{90, 91, 1, 2, 3, 4, 5}));
}

TEST(IoQueueTest, ReadaheadIsDeclinedNotQueuedWhenBusy) {
  ManualDevice dev;
  IoQueue q;
  ASSERT_TRUE(q.Init(&dev, SmallConfig()).ok());
  Tracker t;
  auto ra1 = MakeIo(&t, 1, IoOp::kRead, IoOrigin::kReadahead, IoClass::kReadahead);
  EXPECT_TRUE(q.SubmitReadahead(&ra1->io).ok());  // idle device: admitted
  auto fg = MakeIo(&t, 2, IoOp::kRead, IoOrigin::kForegroundRead, IoClass::kForegroundSync);
  q.Submit(&fg->io);
  // Two in flight == readahead_max_in_flight: declined, not queued, no callback.
  auto ra2 = MakeIo(&t, 3, IoOp::kRead, IoOrigin::kReadahead, IoClass::kReadahead);
  EXPECT_EQ(q.SubmitReadahead(&ra2->io), Status(Err::kNotAdmitted));
  EXPECT_EQ(dev.pending(), 2u);
  EXPECT_EQ(q.State().queued, 0u);
  EXPECT_EQ(q.State().readahead_declined, 1u);
  dev.CompleteAll();
  EXPECT_EQ(t.completed.size(), 2u);
  // Idle again: admitted.
  EXPECT_TRUE(q.SubmitReadahead(&ra2->io).ok());
  dev.CompleteAll();
  EXPECT_EQ(t.completed.size(), 3u);
}

// The window's quantile is the sorted samples' value at ceil(n * q), for
// every fill from one sample to past a wrap of the ring (the oldest
// samples dropped), with repeated values too.
TEST(IoQueueTest, TheLatencyWindowsQuantileIsTheSortedWindowsValue) {
  const u32 quantiles[][2] = {{99, 100}, {999, 1000}, {97, 100}, {1, 1}};
  u64 seed = 12345;
  for (u32 n = 1; n <= 3 * LatencyWindow::kSize + 7; n++) {
    LatencyWindow w;
    std::vector<u64> all;
    for (u32 i = 0; i < n; i++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      const u64 v = (seed >> 33) % (n % 3 == 0 ? 8 : 1000000);  // (every third fill: many repeats)
      w.Record(v);
      all.push_back(v);
    }
    std::vector<u64> kept(all.end() - std::min<size_t>(all.size(), LatencyWindow::kSize), all.end());
    std::sort(kept.begin(), kept.end());
    ASSERT_EQ(w.samples(), kept.size());
    for (const auto& q : quantiles) {
      const size_t need = (kept.size() * q[0] + q[1] - 1) / q[1];
      EXPECT_EQ(w.Quantile(q[0], q[1]), kept[need - 1]) << n << " samples, " << q[0] << "/" << q[1];
    }
  }
  EXPECT_EQ(LatencyWindow().Quantile(99, 100), 0u);
}

// ReadState: reads' service times fill the window (writes do not), and the
// oldest request at the device is as old as it is (a later one completing
// does not make it younger); idle, there is none.
TEST(IoQueueTest, ReadStateCountsReadsAndTheOldestRequestsAge) {
  ManualDevice dev;
  IoQueue q;
  ASSERT_TRUE(q.Init(&dev, SmallConfig()).ok());
  Tracker t;
  EXPECT_EQ(q.GetReadState().samples, 0u);
  EXPECT_EQ(q.GetReadState().p99_ns, 0u);
  auto w = MakeIo(&t, 1, IoOp::kWrite, IoOrigin::kForegroundWrite, IoClass::kForegroundSync);
  q.Submit(&w->io);
  dev.CompleteAll();
  EXPECT_EQ(q.GetReadState().samples, 0u);
  auto r = MakeIo(&t, 2, IoOp::kRead, IoOrigin::kForegroundRead, IoClass::kForegroundSync);
  q.Submit(&r->io);
  EXPECT_EQ(q.GetReadState().in_flight, 1u);
  const u64 t0 = platform::NowNs();
  ASSERT_TRUE(Eventually([&] { return platform::NowNs() - t0 > 2 * platform::kNsPerMs; }));
  auto r2 = MakeIo(&t, 3, IoOp::kRead, IoOrigin::kForegroundRead, IoClass::kForegroundSync);
  q.Submit(&r2->io);
  ASSERT_EQ(dev.pending(), 2u);
  dev.CompleteNext(Status::Ok(), /*newest=*/true);  // the younger one
  const ReadState stuck = q.GetReadState();
  EXPECT_GE(stuck.oldest_ns, 2 * platform::kNsPerMs);
  EXPECT_EQ(stuck.samples, 1u);
  EXPECT_EQ(stuck.in_flight, 1u);
  dev.CompleteAll();
  const ReadState after = q.GetReadState();
  EXPECT_EQ(after.samples, 2u);
  EXPECT_GE(after.p99_ns, 2 * platform::kNsPerMs);  // (the first's service time: at least the wait above)
  EXPECT_EQ(after.oldest_ns, 0u);
  EXPECT_EQ(after.in_flight, 0u);
}

TEST(IoQueueTest, DurabilityDebtIsClearedOnlyByAFlushThatCoversTheWrites) {
  ManualDevice dev;
  IoQueue q;
  ASSERT_TRUE(q.Init(&dev, SmallConfig()).ok());
  Tracker t;
  EXPECT_FALSE(q.HasDurabilityDebt());
  auto w1 = MakeIo(&t, 1, IoOp::kWrite, IoOrigin::kForegroundWrite, IoClass::kForegroundAsync);
  q.Submit(&w1->io);
  EXPECT_FALSE(q.HasDurabilityDebt());  // not acknowledged yet
  dev.CompleteAll();
  EXPECT_TRUE(q.HasDurabilityDebt());
  // A flush submitted now covers w1; a write completing after it does not.
  auto f = MakeIo(&t, 2, IoOp::kFlush, IoOrigin::kJournal, IoClass::kJournal);
  q.Submit(&f->io);
  auto w2 = MakeIo(&t, 3, IoOp::kWrite, IoOrigin::kForegroundWrite, IoClass::kForegroundAsync);
  q.Submit(&w2->io);
  // Complete w2 first, then the flush.
  auto log = dev.log();
  ASSERT_EQ(dev.pending(), 2u);
  dev.CompleteNext();  // the flush (oldest)
  EXPECT_FALSE(q.HasDurabilityDebt());
  dev.CompleteNext();  // w2
  EXPECT_TRUE(q.HasDurabilityDebt());
  // FUA writes create no debt.
  auto f2 = MakeIo(&t, 4, IoOp::kFlush, IoOrigin::kJournal, IoClass::kJournal);
  q.Submit(&f2->io);
  dev.CompleteAll();
  EXPECT_FALSE(q.HasDurabilityDebt());
  auto w3 = MakeIo(&t, 5, IoOp::kWrite, IoOrigin::kJournal, IoClass::kJournal, IoRequest::kFua);
  q.Submit(&w3->io);
  dev.CompleteAll();
  EXPECT_FALSE(q.HasDurabilityDebt());
}

// A write's generation (Io::flush_gen) is covered by a flush dispatched
// after the write completed -- not by one dispatched before, even if that
// one completes later; FUA and failed writes have none (0: covered).
TEST(IoQueueTest, AWriteIsCoveredByAFlushDispatchedAfterItCompleted) {
  ManualDevice dev;
  IoQueue q;
  ASSERT_TRUE(q.Init(&dev, SmallConfig()).ok());
  Tracker t;
  auto w1 = MakeIo(&t, 1, IoOp::kWrite, IoOrigin::kReconcile, IoClass::kBackground);
  q.Submit(&w1->io);
  auto early = MakeIo(&t, 2, IoOp::kFlush, IoOrigin::kJournal, IoClass::kJournal);
  q.Submit(&early->io);  // dispatched before w1 completes
  ASSERT_TRUE(dev.CompleteNext());  // w1
  const u64 g1 = w1->io.flush_gen;
  EXPECT_NE(g1, 0u);
  EXPECT_FALSE(q.Covered(g1));
  ASSERT_TRUE(dev.CompleteNext());  // the early flush: it does not cover w1
  EXPECT_FALSE(q.Covered(g1));
  auto w2 = MakeIo(&t, 3, IoOp::kWrite, IoOrigin::kReconcile, IoClass::kBackground);
  q.Submit(&w2->io);
  ASSERT_TRUE(dev.CompleteNext());
  const u64 g2 = w2->io.flush_gen;
  EXPECT_GT(g2, g1);
  auto f = MakeIo(&t, 4, IoOp::kFlush, IoOrigin::kReconcile, IoClass::kBackground);
  q.Submit(&f->io);  // covers w1 and w2
  auto w3 = MakeIo(&t, 5, IoOp::kWrite, IoOrigin::kReconcile, IoClass::kBackground);
  q.Submit(&w3->io);
  ASSERT_TRUE(dev.CompleteNext());  // the flush
  ASSERT_TRUE(dev.CompleteNext());  // w3, after it
  EXPECT_TRUE(q.Covered(g1));
  EXPECT_TRUE(q.Covered(g2));
  EXPECT_FALSE(q.Covered(w3->io.flush_gen));
  // FUA: durable at completion; its Io says 0 (covered), reused Ios too.
  w1->io.flush_gen = 99;
  w1->io.req.flags = IoRequest::kFua;
  q.Submit(&w1->io);
  ASSERT_TRUE(dev.CompleteNext());
  EXPECT_EQ(w1->io.flush_gen, 0u);
  EXPECT_TRUE(q.Covered(0));
}

// LateWatch (6c's rule, one helper): slots not started have no deadline;
// a slot past its bound on a member that is not stalling starts its bound
// again; one on a stalling member is late. The clock is the caller's: the
// test hands it times, and waits only for the queue's own stall to show.
TEST(IoQueueTest, LateWatchLeavesOnlyWhatAStallingMemberHolds) {
  ManualDevice quiet_dev, stuck_dev;
  IoQueue quiet, stuck;
  ASSERT_TRUE(quiet.Init(&quiet_dev, SmallConfig()).ok());
  ASSERT_TRUE(stuck.Init(&stuck_dev, SmallConfig()).ok());
  LateWatch<4> watch;
  EXPECT_EQ(watch.Deadline(0xf), platform::kForever) << "nothing started";
  watch.Start(0, quiet, 1000);
  watch.Start(2, stuck, 5000);
  // No service time known yet: the bound is kLateMaxNs.
  EXPECT_EQ(watch.Deadline(0xf), 1000 + kLateMaxNs);
  EXPECT_EQ(watch.Deadline(1u << 2), 5000 + kLateMaxNs);
  EXPECT_EQ(watch.Late(0xf, 1000 + kLateMaxNs - 1), 0u) << "before the bound";
  // Past the bound, nothing stalling: both bounds start again from then.
  const u64 t1 = 6000 + kLateMaxNs;
  EXPECT_EQ(watch.Late(0xf, t1), 0u);
  EXPECT_EQ(watch.Deadline(0xf), t1 + kLateMaxNs);
  // One request held at `stuck`'s device until its queue calls it a stall.
  Tracker t;
  auto w = MakeIo(&t, 1, IoOp::kWrite, IoOrigin::kReconcile, IoClass::kBackground);
  stuck.Submit(&w->io);
  const u64 give_up_at = platform::NowNs() + 60 * platform::kNsPerSec;
  while (!Stalling(stuck.GetReadState(false)) && platform::NowNs() < give_up_at) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(Stalling(stuck.GetReadState(false)));
  const u64 t2 = t1 + kLateMaxNs;
  EXPECT_EQ(watch.Late(0xf, t2), 1u << 2) << "only the stalling member's slot";
  EXPECT_EQ(watch.Deadline(1u << 0), t2 + kLateMaxNs) << "the quiet member's bound started again";
  EXPECT_EQ(watch.Deadline(1u << 2), t1 + kLateMaxNs) << "the late one's did not";
  // A stalling member's slot within its bound is not late: Restart moves the bound.
  watch.Restart(2, t2);
  EXPECT_EQ(watch.Deadline(1u << 2), t2 + kLateMaxNs);
  EXPECT_EQ(watch.Late(1u << 2, t2 + kLateMaxNs - 1), 0u);
  EXPECT_EQ(watch.Late(1u << 2, t2 + kLateMaxNs), 1u << 2);
  stuck_dev.CompleteAll();
}

TEST(IoQueueTest, FuaIsEmulatedWithWriteAndFlush) {
  ManualDevice dev(1 << 20, /*supports_fua=*/false);
  IoQueue q;
  ASSERT_TRUE(q.Init(&dev, SmallConfig()).ok());
  Tracker t;
  auto w = MakeIo(&t, 1, IoOp::kWrite, IoOrigin::kJournal, IoClass::kJournal, IoRequest::kFua);
  q.Submit(&w->io);
  ASSERT_TRUE(dev.CompleteNext());  // the write part
  EXPECT_TRUE(t.completed.empty());
  ASSERT_TRUE(dev.CompleteNext());  // the flush part
  ASSERT_EQ(t.completed.size(), 1u);
  auto log = dev.log();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].op, IoOp::kWrite);
  EXPECT_EQ(log[0].flags & IoRequest::kFua, 0);
  EXPECT_EQ(log[1].op, IoOp::kFlush);
  EXPECT_FALSE(q.HasDurabilityDebt());
  // The caller gets its request back as it submitted it.
  EXPECT_EQ(w->io.req.op, IoOp::kWrite);
  EXPECT_NE(w->io.req.flags & IoRequest::kFua, 0);
  EXPECT_EQ(w->io.flush_gen, 0u) << "a FUA write: nothing for a flush to cover";
  // Its write part failing: the caller gets it back as submitted too, and
  // sent again it is a FUA write again (write, then flush).
  q.Submit(&w->io);
  ASSERT_TRUE(dev.CompleteNext(Status(Err::kIo)));
  ASSERT_EQ(t.completed.size(), 2u);
  EXPECT_EQ(w->io.req.op, IoOp::kWrite);
  EXPECT_NE(w->io.req.flags & IoRequest::kFua, 0);
  EXPECT_EQ(w->io.flush_gen, 0u);
  q.Submit(&w->io);
  ASSERT_TRUE(dev.CompleteNext());
  EXPECT_EQ(t.completed.size(), 2u) << "the write part; its flush follows";
  ASSERT_TRUE(dev.CompleteNext());
  ASSERT_EQ(t.completed.size(), 3u);
  log = dev.log();
  ASSERT_EQ(log.size(), 5u);
  EXPECT_EQ(log[3].op, IoOp::kWrite);
  EXPECT_EQ(log[4].op, IoOp::kFlush);
}

TEST(IoQueueTest, StallDetectedWhileNothingCompletes) {
  ManualDevice dev;
  IoQueue q;
  ASSERT_TRUE(q.Init(&dev, SmallConfig()).ok());
  Tracker t;
  EXPECT_FALSE(q.Stalled());  // idle is not stalled
  auto r = MakeIo(&t, 1, IoOp::kRead, IoOrigin::kForegroundRead, IoClass::kForegroundSync);
  q.Submit(&r->io);
  EXPECT_FALSE(q.Stalled());
  platform::SleepNs(80 * platform::kNsPerMs);
  EXPECT_TRUE(q.Stalled());
  // Readahead is declined on a stalled device even with free slots.
  auto ra = MakeIo(&t, 2, IoOp::kRead, IoOrigin::kReadahead, IoClass::kReadahead);
  EXPECT_EQ(q.SubmitReadahead(&ra->io), Status(Err::kNotAdmitted));
  EXPECT_EQ(q.State().stall_events, 1u);
  dev.CompleteAll();
  EXPECT_FALSE(q.Stalled());
  EXPECT_GE(q.State().latency_ewma_ns, 70 * platform::kNsPerMs);
}

TEST(IoQueueTest, CountsByOriginWithHistograms) {
  userspace::MemDeviceOptions o;
  o.size = 1 << 20;
  userspace::MemDevice dev(o);
  IoQueue q;
  ASSERT_TRUE(q.Init(&dev, QueueConfig{}).ok());
  Latch latch(20);
  struct Ctx {
    Io io;
    char buf[4096];
    Latch* latch;
  };
  std::vector<std::unique_ptr<Ctx>> ctxs;
  for (int i = 0; i < 20; i++) {
    auto c = std::make_unique<Ctx>();
    c->latch = &latch;
    c->io.req.op = i < 15 ? IoOp::kWrite : IoOp::kRead;
    c->io.req.origin = i < 15 ? IoOrigin::kJournal : IoOrigin::kForegroundRead;
    c->io.req.offset = u64(i) * 4096;
    c->io.req.length = 4096;
    c->io.req.buf = c->buf;
    c->io.cls = DefaultClass(c->io.req.origin);
    c->io.caller_data = c.get();
    c->io.done = [](Io* io, Status st) {
      EXPECT_TRUE(st.ok());
      static_cast<Ctx*>(io->caller_data)->latch->CountDown();
    };
    q.Submit(&c->io);
    ctxs.push_back(std::move(c));
  }
  ASSERT_TRUE(latch.WaitFor(10 * platform::kNsPerSec));
  auto stats = std::make_unique<OriginStats>();
  q.ReadStats(IoOrigin::kJournal, stats.get());
  EXPECT_EQ(stats->ops[int(IoOp::kWrite)], 15u);
  EXPECT_EQ(stats->bytes[int(IoOp::kWrite)], 15u * 4096);
  EXPECT_EQ(stats->service_time.count(), 15u);
  EXPECT_EQ(stats->queue_time.count(), 15u);
  q.ReadStats(IoOrigin::kForegroundRead, stats.get());
  EXPECT_EQ(stats->ops[int(IoOp::kRead)], 5u);
  q.ReadStats(IoOrigin::kCopygc, stats.get());
  EXPECT_EQ(stats->ops[int(IoOp::kRead)] + stats->ops[int(IoOp::kWrite)], 0u);
  EXPECT_EQ(q.State().in_flight, 0u);
}

TEST(IoQueueTest, DefaultClasses) {
  EXPECT_EQ(DefaultClass(IoOrigin::kForegroundRead), IoClass::kForegroundSync);
  EXPECT_EQ(DefaultClass(IoOrigin::kJournal), IoClass::kJournal);
  EXPECT_EQ(DefaultClass(IoOrigin::kReconcile), IoClass::kBackground);
  EXPECT_EQ(DefaultClass(IoOrigin::kReadahead), IoClass::kReadahead);
  EXPECT_STREQ(IoClassName(IoClass::kBtree), "btree");
}

// A waiting submitter's own request goes to the device marked kInline when it
// is dispatched in the submitter's thread; one queued behind a full device
// (dispatched later by a completion) and plain Submit()s are not.
TEST(IoQueueTest, WaitingSubmitterMarksItsOwnRequestInline) {
  ManualDevice dev;
  IoQueue q;
  QueueConfig c = SmallConfig();
  c.max_in_flight = 1;
  c.reserved = 0;
  ASSERT_TRUE(q.Init(&dev, c).ok());
  Tracker t;
  auto plain = MakeIo(&t, 1, IoOp::kWrite, IoOrigin::kForegroundWrite, IoClass::kForegroundSync);
  q.Submit(&plain->io);
  auto waiting = MakeIo(&t, 2, IoOp::kRead, IoOrigin::kForegroundRead, IoClass::kForegroundSync);
  q.Submit(&waiting->io, /*waiting=*/true);  // queued: the device is full
  ASSERT_EQ(dev.pending(), 1u);
  dev.CompleteNext();  // dispatches the queued one from this "completion"
  auto first = MakeIo(&t, 3, IoOp::kRead, IoOrigin::kForegroundRead, IoClass::kForegroundSync);
  dev.CompleteNext();
  q.Submit(&first->io, /*waiting=*/true);  // dispatched at once
  dev.CompleteAll();
  const std::vector<IoRequest> log = dev.log();
  ASSERT_EQ(log.size(), 3u);
  EXPECT_FALSE(log[0].flags & IoRequest::kInline);
  EXPECT_FALSE(log[1].flags & IoRequest::kInline);
  EXPECT_TRUE(log[2].flags & IoRequest::kInline);
  // The flag does not outlive the request.
  EXPECT_FALSE(first->io.req.flags & IoRequest::kInline);
  EXPECT_EQ(t.completed, (std::vector<int>{1, 2, 3}));
}

// A flight's copy (SubmitFlight) goes to the device marked kWaited -- never
// kInline -- when it is dispatched in the submitter's thread; one queued
// behind a full device (dispatched later by a completion, in another
// thread) is not, and the flag does not outlive the request.
TEST(IoQueueTest, FlightCopiesDispatchedInTheirThreadAreMarkedWaited) {
  ManualDevice dev;
  IoQueue q;
  QueueConfig c = SmallConfig();
  c.max_in_flight = 1;
  c.reserved = 0;
  ASSERT_TRUE(q.Init(&dev, c).ok());
  Tracker t;
  auto plain = MakeIo(&t, 1, IoOp::kWrite, IoOrigin::kForegroundWrite, IoClass::kForegroundSync);
  q.Submit(&plain->io);
  auto queued = MakeIo(&t, 2, IoOp::kWrite, IoOrigin::kForegroundWrite, IoClass::kForegroundSync);
  q.SubmitFlight(&queued->io);  // queued: the device is full
  ASSERT_EQ(dev.pending(), 1u);
  dev.CompleteNext();  // dispatches the queued one from this "completion"
  auto first = MakeIo(&t, 3, IoOp::kRead, IoOrigin::kForegroundRead, IoClass::kForegroundSync);
  dev.CompleteNext();
  q.SubmitFlight(&first->io);  // dispatched at once
  dev.CompleteAll();
  const std::vector<IoRequest> log = dev.log();
  ASSERT_EQ(log.size(), 3u);
  EXPECT_FALSE(log[0].flags & (IoRequest::kWaited | IoRequest::kInline));
  EXPECT_FALSE(log[1].flags & (IoRequest::kWaited | IoRequest::kInline));
  EXPECT_TRUE(log[2].flags & IoRequest::kWaited);
  EXPECT_FALSE(log[2].flags & IoRequest::kInline);
  EXPECT_FALSE(first->io.req.flags & IoRequest::kWaited);
  // A request submitted again plainly after a flight carries no stale mark.
  q.Submit(&first->io);
  dev.CompleteAll();
  ASSERT_EQ(dev.log().size(), 4u);
  EXPECT_FALSE(dev.log()[3].flags & IoRequest::kWaited);
  EXPECT_EQ(t.completed, (std::vector<int>{1, 2, 3, 3}));
}

}  // namespace
}  // namespace tfs::dev
