// Timer: events run in deadline order, never early, and late by well under the
// 0.2 ms median the fault devices promise (bounds here are generous: the test
// machine is shared and noisy).
#include "faultdevices/timer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

namespace faultdev {
namespace {

TEST(Timer, RunsInDeadlineOrderAndNeverEarly) {
  Timer t;
  std::mutex mu;
  std::vector<int> order;
  std::vector<int64_t> early;
  uint64_t base = NowNs() + 5'000'000;
  for (int i : {3, 1, 4, 0, 2}) {
    uint64_t when = base + uint64_t(i) * 2'000'000;
    t.At(when, [&, i, when] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
      early.push_back(int64_t(when) - int64_t(NowNs()));
    });
  }
  t.At(base + 20'000'000, [] {});
  while (t.pending() != 0) t.Sync();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  for (int64_t e : early) EXPECT_LE(e, 0) << "an event ran before its deadline";
}

TEST(Timer, MedianLatenessIsSmall) {
  Timer t;
  std::mutex mu;
  std::vector<uint64_t> late;
  const int kN = 200;
  for (int i = 0; i < kN; i++) {
    uint64_t when = NowNs() + 1'000'000;
    t.At(when, [&, when] {
      std::lock_guard<std::mutex> lock(mu);
      late.push_back(NowNs() - when);
    });
    // One at a time so the events do not batch.
    while (true) {
      std::lock_guard<std::mutex> lock(mu);
      if (int(late.size()) == i + 1) break;
    }
  }
  std::sort(late.begin(), late.end());
  // The requirement is < 0.2 ms; allow 1 ms for a loaded CI machine.
  EXPECT_LT(late[kN / 2], 1'000'000u) << "median lateness " << late[kN / 2] << " ns";
}

TEST(Timer, EventsMayScheduleEventsAndPastDeadlinesRunAtOnce) {
  Timer t;
  std::atomic<int> n{0};
  t.At(0, [&] {
    n++;
    t.At(NowNs() + 1'000'000, [&] { n++; });
  });
  uint64_t start = NowNs();
  while (n.load() < 2 && NowNs() - start < 5'000'000'000ull) t.Sync();
  EXPECT_EQ(n.load(), 2);
}

TEST(Timer, DestructorDropsFutureEvents) {
  std::atomic<int> ran{0};
  {
    Timer t;
    t.At(NowNs() + 60'000'000'000ull, [&] { ran++; });
  }
  EXPECT_EQ(ran.load(), 0);
}

TEST(Timer, CancelDropsOnlyEventsNotYetStarted) {
  Timer t;
  std::atomic<int> ran{0};
  uint64_t a = t.AtCancellable(NowNs() + 50'000'000, [&] { ran += 1; });
  uint64_t b = t.AtCancellable(NowNs(), [&] { ran += 10; });
  t.Sync();  // b has run
  EXPECT_TRUE(t.Cancel(a));
  EXPECT_FALSE(t.Cancel(a));  // already cancelled
  EXPECT_FALSE(t.Cancel(b));  // already ran
  t.At(NowNs() + 60'000'000, [] {});
  while (t.pending() != 0) t.Sync();
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
}  // namespace faultdev
