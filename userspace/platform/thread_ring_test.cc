// Thread rings (thread_ring.h) and the UringDevice's kWaited path. Requests
// that must stay pending until the test says so are reads of a pipe, sent on
// a thread ring directly; nothing here asserts on timing (waits that must end
// have a watchdog that fails the test instead of hanging it).
#include "userspace/platform/thread_ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "platform/platform.h"
#include "userspace/platform/io_testing.h"
#include "userspace/platform/uring_device.h"

namespace tfs::userspace {
namespace {

constexpr int kWatchdogSeconds = 120;

// Polls `cond` until it holds; fails the test (and stops it: a hang would
// follow) after kWatchdogSeconds.
template <typename F>
void AwaitOrDie(const char* what, F cond) {
  for (int i = 0; i < kWatchdogSeconds * 1000; i++) {
    if (cond()) return;
    usleep(1000);
  }
  ADD_FAILURE() << "never happened: " << what;
  abort();
}

// Every ring made so far has been handed over and closed (each test's
// threads have exited; the test's main thread never makes one).
bool AllRingsClosed() {
  const ThreadRingStats s = GetThreadRingStats();
  return s.rings == s.handed_over;
}

struct Pipe {
  Pipe() { EXPECT_EQ(pipe2(fd, O_CLOEXEC), 0); }
  ~Pipe() {
    close(fd[0]);
    close(fd[1]);
  }
  void Put(size_t n) {
    std::vector<char> b(n, 'x');
    ASSERT_EQ(write(fd[1], b.data(), n), ssize_t(n));
  }
  int fd[2];
};

// One pipe read on the calling thread's ring; `done` records where and how
// it completed and wakes `word`.
struct PipeRead {
  char buf[8] = {};
  std::atomic<int> res{INT_MIN};
  std::atomic<pthread_t> by{};
  uint32_t word = 0;

  static void Done(void* owner, IoRequest*, int res) {
    auto* p = static_cast<PipeRead*>(owner);
    p->by.store(pthread_self());
    p->res.store(res);
    __atomic_store_n(&p->word, 1, __ATOMIC_RELEASE);
    tfs_plat_wake(&p->word, 0);
  }
  bool Send(int fd) {
    io_uring_sqe* sqe = ThreadRingGetSqe();
    if (sqe == nullptr) return false;
    io_uring_prep_read(sqe, fd, buf, sizeof buf, 0);
    ThreadRingSubmit(sqe, Done, this, nullptr);
    return true;
  }
  bool finished() const { return res.load() != INT_MIN; }
  // Waits for it in this thread (tfs_plat_wait_io), until it completed.
  void Await() {
    while (__atomic_load_n(&word, __ATOMIC_ACQUIRE) == 0) (void)tfs_plat_wait_io(&word, 0, ~0ull);
  }
};

// A ring waiter sleeping on its ring is woken by a plain tfs_plat_wake of the
// word it waits on (the registry and the wake eventfd): a flight's copy that
// went elsewhere still ends the wait.
TEST(ThreadRingTest, AWakeFromElsewhereEndsARingWait) {
  Pipe p;
  PipeRead r;
  uint32_t word = 0;
  std::atomic<bool> woke{false};
  const uint64_t wakes0 = GetThreadRingStats().wakes;
  std::thread t([&] {
    ASSERT_TRUE(r.Send(p.fd[0]));
    while (__atomic_load_n(&word, __ATOMIC_ACQUIRE) == 0) (void)tfs_plat_wait_io(&word, 0, ~0ull);
    woke = true;
    r.Await();  // (its own request: reaped here or by the janitor)
  });
  // Registered: from here the thread either sees the store below or sleeps
  // on its ring and gets the wake through its eventfd.
  AwaitOrDie("the thread waits on its ring", [] { return GetThreadRingStats().waiting == 1; });
  __atomic_store_n(&word, 1, __ATOMIC_RELEASE);
  tfs_plat_wake(&word, 0);
  AwaitOrDie("the ring waiter woke", [&] { return woke.load(); });
  EXPECT_FALSE(r.finished());  // (the pipe is still empty)
  p.Put(8);
  t.join();
  EXPECT_EQ(r.res.load(), 8);
  EXPECT_GE(GetThreadRingStats().wakes, wakes0 + 1);
  EXPECT_EQ(GetThreadRingStats().waiting, 0u);
}

// A request left on a ring whose owner is elsewhere (a late copy, a hedge's
// loser) is reaped at once by the janitor; an exiting owner's ring is handed
// to it and closed once it is empty.
TEST(ThreadRingTest, OrphansAreReapedByTheJanitorAndExitedRingsClosed) {
  Pipe p;
  PipeRead r;
  std::atomic<bool> release{false};
  std::atomic<bool> left_wait{false};
  std::atomic<pthread_t> owner{};
  const ThreadRingStats s0 = GetThreadRingStats();
  std::thread t([&] {
    owner = pthread_self();
    ASSERT_TRUE(r.Send(p.fd[0]));
    uint32_t never = 0;
    // Leaves the wait at the timeout, and the flight, with the read still
    // out: an orphan.
    EXPECT_EQ(tfs_plat_wait_io(&never, 0, 1000000), -ETIMEDOUT);
    tfs_plat_io_leave();
    left_wait = true;
    while (!release.load()) usleep(1000);  // elsewhere, not reaping its ring
  });
  AwaitOrDie("the owner left its wait", [&] { return left_wait.load(); });
  p.Put(8);
  AwaitOrDie("the janitor reaped the orphan", [&] { return r.finished(); });
  EXPECT_EQ(r.res.load(), 8);
  EXPECT_FALSE(pthread_equal(r.by.load(), owner.load()));
  EXPECT_GE(GetThreadRingStats().reaped_by_janitor, s0.reaped_by_janitor + 1);
  release = true;
  t.join();
  AwaitOrDie("the exited thread's ring was closed", [] { return AllRingsClosed(); });
}

// A flight that ends with a completion already posted on its ring but not
// reaped: the janitor still takes it (emptying the completion eventfd at the
// hand-over had thrown its signal away: review helper-85).
TEST(ThreadRingTest, ALeftoverPostedBeforeTheFlightEndsIsReaped) {
  Pipe p;
  PipeRead r;
  std::atomic<bool> release{false};
  std::thread t([&] {
    ASSERT_TRUE(r.Send(p.fd[0]));
    p.Put(8);
    // Posted (by this thread's task work, run on its next return from the
    // kernel) and not reaped: this thread never waits on its ring here.
    AwaitOrDie("the completion was posted", [] { return ThreadRingPosted() == 1; });
    tfs_plat_io_leave();
    while (!release.load()) usleep(1000);  // elsewhere
  });
  AwaitOrDie("the janitor reaped the posted leftover", [&] { return r.finished(); });
  EXPECT_EQ(r.res.load(), 8);
  release = true;
  t.join();
  AwaitOrDie("every ring closed", [] { return AllRingsClosed(); });
}

// A thread that exits with a request still on its ring: the request still
// completes (its data, or ECANCELED when the kernel cancelled it with the
// task), reaped by the janitor, which then closes the ring.
TEST(ThreadRingTest, AThreadExitingWithARequestOutHandsItOver) {
  Pipe p;
  PipeRead r;
  const ThreadRingStats s0 = GetThreadRingStats();
  std::thread t([&] {
    ASSERT_TRUE(r.Send(p.fd[0]));
    uint32_t never = 0;
    (void)tfs_plat_wait_io(&never, 0, 1000000);
  });
  t.join();
  p.Put(8);
  AwaitOrDie("the orphan of an exited thread completed", [&] { return r.finished(); });
  EXPECT_TRUE(r.res.load() == 8 || r.res.load() == -ECANCELED) << r.res.load();
  AwaitOrDie("its ring was closed", [] { return AllRingsClosed(); });
  EXPECT_GT(GetThreadRingStats().handed_over, s0.handed_over);
}

// A ring holds kThreadRingDepth requests; the next GetSqe says no (the device
// then uses its shared ring), and the ring takes requests again once reaped.
TEST(ThreadRingTest, AFullRingRefusesAndRecovers) {
  Pipe p;
  std::thread t([&] {
    std::vector<PipeRead> reads(kThreadRingDepth);
    const uint64_t full0 = GetThreadRingStats().full;
    for (PipeRead& r : reads) ASSERT_TRUE(r.Send(p.fd[0]));
    EXPECT_EQ(ThreadRingGetSqe(), nullptr);
    EXPECT_EQ(GetThreadRingStats().full, full0 + 1);
    p.Put(8 * kThreadRingDepth);
    for (PipeRead& r : reads) r.Await();
    for (PipeRead& r : reads) EXPECT_EQ(r.res.load(), 8);
    PipeRead again;
    ASSERT_TRUE(again.Send(p.fd[0]));
    p.Put(8);
    again.Await();
    EXPECT_EQ(again.res.load(), 8);
  });
  t.join();
}

// The device's kWaited path: a waited request goes on the submitter's ring
// and, when the submitter waits for it at once, completes in the submitter's
// thread (no other thread woken), with its data.
TEST(ThreadRingTest, WaitedDeviceRequestsCompleteInTheWaitingThread) {
  ScratchFile f(1 << 20);
  auto opened = UringDevice::Open(f.path());
  ASSERT_TRUE(opened.ok());
  std::unique_ptr<UringDevice> dev = std::move(opened).value();
  struct Waited {
    IoRequest req;
    uint32_t word = 0;
    Status st;
    pthread_t by{};
  };
  std::thread t([&] {
    const pthread_t me = pthread_self();
    auto run = [&](IoOp op, uint64_t off, void* buf, size_t len) {
      Waited w;
      w.req.op = op;
      w.req.flags = IoRequest::kWaited;
      w.req.offset = off;
      w.req.length = len;
      w.req.buf = buf;
      w.req.caller_data = &w;
      w.req.done = [](IoRequest* r, Status st) {
        auto* w = static_cast<Waited*>(r->caller_data);
        w->st = st;
        w->by = pthread_self();
        __atomic_store_n(&w->word, 1, __ATOMIC_RELEASE);
        tfs_plat_wake(&w->word, 0);
      };
      dev->Submit(&w.req);
      while (__atomic_load_n(&w.word, __ATOMIC_ACQUIRE) == 0) (void)tfs_plat_wait_io(&w.word, 0, ~0ull);
      EXPECT_TRUE(pthread_equal(w.by, me));
      return w.st;
    };
    std::vector<uint8_t> data(16384), odd(16384 + 1), back(16384);
    std::mt19937 rng(5);
    for (auto& b : data) b = uint8_t(rng());
    memcpy(odd.data() + 1, data.data(), data.size());
    void* aligned = aligned_alloc(4096, data.size());
    memcpy(aligned, data.data(), data.size());
    EXPECT_TRUE(run(IoOp::kWrite, 0, aligned, data.size()).ok());
    EXPECT_TRUE(run(IoOp::kWrite, 65536, odd.data() + 1, data.size()).ok());  // (bounced)
    EXPECT_TRUE(run(IoOp::kRead, 65536, back.data(), back.size()).ok());
    EXPECT_EQ(memcmp(back.data(), data.data(), data.size()), 0);
    EXPECT_TRUE(run(IoOp::kRead, 0, aligned, data.size()).ok());
    EXPECT_EQ(memcmp(aligned, data.data(), data.size()), 0);
    EXPECT_FALSE(run(IoOp::kRead, 1 << 20, aligned, data.size()).ok());  // past the end: refused
    free(aligned);
  });
  t.join();
  const UringStats s = dev->Stats();
  EXPECT_EQ(s.waited_ios + s.waited_shared, 4u);
  EXPECT_EQ(s.completed, s.submitted);
}

// Many threads, each sending flights of waited requests to two devices and
// waiting for them with short deadlines, often leaving some behind (late
// copies, hedges' losers) and sometimes exiting with some out: every request
// completes exactly once, with its data, and the devices close.
TEST(ThreadRingTest, ManyWaitersWithDeadlinesLoseNoCompletion) {
  constexpr int kThreads = 6;
  constexpr int kRounds = 150;
  constexpr size_t kLen = 4096;
  ScratchFile fa(8 << 20), fb(8 << 20);
  auto oa = UringDevice::Open(fa.path());
  auto ob = UringDevice::Open(fb.path());
  ASSERT_TRUE(oa.ok() && ob.ok());
  std::unique_ptr<UringDevice> devs[2] = {std::move(oa).value(), std::move(ob).value()};
  struct Req {
    IoRequest req;
    uint32_t* word;
    std::atomic<int>* left;
    std::atomic<int>* calls;
    alignas(4096) uint8_t buf[kLen];
  };
  std::atomic<int> left{0}, calls{0};
  auto done = [](IoRequest* r, Status st) {
    auto* q = static_cast<Req*>(r->caller_data);
    EXPECT_TRUE(st.ok()) << st.Message();
    q->calls->fetch_add(1);
    uint32_t* word = q->word;
    std::atomic<int>* left = q->left;
    delete q;
    __atomic_fetch_add(word, 1, __ATOMIC_ACQ_REL);
    tfs_plat_wake(word, 0);  // (the word outlives every request: the test owns it)
    left->fetch_sub(1);
  };
  std::vector<uint32_t> words(kThreads, 0);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; t++) {
    ts.emplace_back([&, t] {
      std::mt19937 rng(uint32_t(t) + 1);
      for (int i = 0; i < kRounds; i++) {
        const uint32_t before = __atomic_load_n(&words[t], __ATOMIC_ACQUIRE);
        for (int c = 0; c < 2; c++) {
          auto* q = new Req();
          q->word = &words[t];
          q->left = &left;
          q->calls = &calls;
          const uint64_t slot = uint64_t(t) * kRounds + uint64_t(i);
          memset(q->buf, int(slot % 251), kLen);
          q->req.op = IoOp::kWrite;
          q->req.flags = IoRequest::kWaited;
          q->req.offset = slot * kLen;
          q->req.length = kLen;
          q->req.buf = q->buf;
          q->req.caller_data = q;
          q->req.done = done;
          left.fetch_add(1);
          devs[c]->Submit(&q->req);
        }
        // Waits for both, or leaves at a short deadline.
        const uint64_t deadline = tfs_plat_now_ns() + rng() % 200000;
        for (;;) {
          const uint32_t now_word = __atomic_load_n(&words[t], __ATOMIC_ACQUIRE);
          const uint64_t now = tfs_plat_now_ns();
          if (now_word - before >= 2 || now >= deadline) break;
          (void)tfs_plat_wait_io(&words[t], now_word, deadline - now);
        }
        tfs_plat_io_leave();  // (what is left: the janitor's)
      }
      // Waits (plainly) for what it left behind before it exits: a request
      // of an exited thread may come back failed (thread_ring.h), which
      // AThreadExitingWithARequestOutHandsItOver covers.
      const uint32_t all = 2 * kRounds;
      AwaitOrDie("a thread's leftovers completed", [&] { return __atomic_load_n(&words[t], __ATOMIC_ACQUIRE) == all; });
    });
  }
  for (auto& th : ts) th.join();
  AwaitOrDie("every request completed", [&] { return left.load() == 0; });
  EXPECT_EQ(calls.load(), 2 * kThreads * kRounds);
  for (auto& d : devs) {
    const UringStats s = d->Stats();
    EXPECT_EQ(s.submitted, uint64_t(kThreads * kRounds));
    EXPECT_EQ(s.completed, s.submitted);
    EXPECT_EQ(s.errors, 0u);
    EXPECT_EQ(s.waited_ios + s.waited_shared, s.submitted);
    EXPECT_GT(s.waited_ios, 0u);
  }
  // Every write landed.
  for (int d = 0; d < 2; d++) {
    std::vector<uint8_t> back(kLen);
    for (uint64_t slot = 0; slot < uint64_t(kThreads * kRounds); slot += 37) {
      ASSERT_TRUE(SyncIo(*devs[d], IoOp::kRead, slot * kLen, back.data(), kLen).ok());
      EXPECT_EQ(back[0], uint8_t(slot % 251));
      EXPECT_EQ(back[kLen - 1], uint8_t(slot % 251));
    }
  }
  devs[0].reset();  // (waits for anything still out: nothing)
  devs[1].reset();
  AwaitOrDie("every ring closed", [] { return AllRingsClosed(); });
}

// While the thread has requests on its ring, its single waited I/O is not
// done inline (an uninterruptible syscall would hold their completions --
// its task work -- for as long as it lasts): it goes on the shared ring.
TEST(ThreadRingTest, NoInlineIoWhileTheThreadsRingHasRequestsOut) {
  ScratchFile f(1 << 20);
  auto opened = UringDevice::Open(f.path());
  ASSERT_TRUE(opened.ok());
  std::unique_ptr<UringDevice> dev = std::move(opened).value();
  Pipe p;
  PipeRead r;
  std::thread t([&] {
    std::vector<uint8_t> buf(4096);
    ASSERT_TRUE(SyncIo(*dev, IoOp::kRead, 0, buf.data(), buf.size(), IoRequest::kInline).ok());
    EXPECT_EQ(dev->Stats().inline_ios, 1u);
    ASSERT_TRUE(r.Send(p.fd[0]));
    EXPECT_TRUE(ThreadRingBusy());
    ASSERT_TRUE(SyncIo(*dev, IoOp::kRead, 0, buf.data(), buf.size(), IoRequest::kInline).ok());
    EXPECT_EQ(dev->Stats().inline_ios, 1u);  // (the shared ring's)
    p.Put(8);
    r.Await();
    EXPECT_FALSE(ThreadRingBusy());
    ASSERT_TRUE(SyncIo(*dev, IoOp::kRead, 0, buf.data(), buf.size(), IoRequest::kInline).ok());
    EXPECT_EQ(dev->Stats().inline_ios, 2u);
  });
  t.join();
  AwaitOrDie("every ring closed", [] { return AllRingsClosed(); });
}

}  // namespace
}  // namespace tfs::userspace
