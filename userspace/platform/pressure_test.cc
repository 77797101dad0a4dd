// The userspace shrinker registry and pressure thread (pressure.h).
#include "userspace/platform/pressure.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "platform/platform.h"

namespace tfs::userspace {
namespace {

// A cache of `pages` that gives back what it is asked for.
struct FakeCache {
  std::atomic<u64> pages{0};
  std::atomic<u64> scans{0};
  static u64 Count(void* c) { return static_cast<FakeCache*>(c)->pages.load(); }
  static u64 Scan(void* c, u64 n) {
    auto* f = static_cast<FakeCache*>(c);
    f->scans++;
    const u64 give = std::min<u64>(n, f->pages.load());
    f->pages -= give;
    return give;
  }
};

TEST(PressureTest, PagesToShrinkFollowsRssAndPsi) {
  PressureOptions o;
  o.rss_limit = 100 << 20;
  o.psi_some_pct = 10;
  PressureReading r;
  r.rss = 50 << 20;
  EXPECT_EQ(PagesToShrink(o, r, 1000), 0u);  // under the limit, no PSI
  r.rss = (100 << 20) + 4096;                 // one page over: that and a tenth of the limit
  EXPECT_EQ(PagesToShrink(o, r, 100000), 1u + (10u << 20) / 4096);
  EXPECT_EQ(PagesToShrink(o, r, 7), 7u);  // never more than the caches have
  r.rss = 0;
  r.psi_known = true;
  r.some_avg10 = 9.9;
  EXPECT_EQ(PagesToShrink(o, r, 1000), 0u);
  r.some_avg10 = 10.0;
  EXPECT_EQ(PagesToShrink(o, r, 1000), 250u);  // a quarter
  o.psi_some_pct = 0;                          // PSI ignored
  EXPECT_EQ(PagesToShrink(o, r, 1000), 0u);
  r.psi_known = false;
  o.psi_some_pct = 10;
  EXPECT_EQ(PagesToShrink(o, r, 1000), 0u);  // no PSI file: only the RSS limit counts
}

TEST(PressureTest, AnEpisodeTrimsOnceAndThenHoldsTheLevel) {
  PressureEpisode e;
  EXPECT_EQ(e.Ask(false, 0, 1000), 0u);
  EXPECT_EQ(e.Ask(true, 250, 1000), 250u);  // the first look of an episode: all of it
  EXPECT_EQ(e.Ask(true, 250, 750), 0u);     // the same pressure again: held, not emptied
  EXPECT_EQ(e.Ask(true, 250, 800), 50u);    // what it grew back
  EXPECT_EQ(e.Ask(true, 10, 900), 10u);     // at most what the look asks
  EXPECT_EQ(e.Ask(false, 0, 900), 0u);      // over
  EXPECT_EQ(e.Ask(true, 225, 900), 225u);   // a new episode trims again
  PressureOptions o;
  o.rss_limit = 100;
  PressureReading r;
  r.rss = 101;
  EXPECT_TRUE(UnderPressure(o, r));
  r.rss = 100;
  EXPECT_FALSE(UnderPressure(o, r));
}

TEST(PressureTest, ShrinkAllSharesByWhatEachCouldGive) {
  FakeCache a, b;
  a.pages = 300;
  b.pages = 100;
  platform::Shrinker sa, sb;
  ASSERT_TRUE(sa.Register(&FakeCache::Count, &FakeCache::Scan, &a, "a").ok());
  ASSERT_TRUE(sb.Register(&FakeCache::Count, &FakeCache::Scan, &b, "b").ok());
  EXPECT_EQ(sa.Register(&FakeCache::Count, &FakeCache::Scan, &a, "a").code(), Err::kBusy);
  EXPECT_EQ(GetPressureStats().shrinkers, 2u);
  EXPECT_EQ(CountAll(), 400u);
  EXPECT_EQ(ShrinkAll(100), 100u);
  EXPECT_EQ(a.pages.load(), 225u);  // 3/4 of the request
  EXPECT_EQ(b.pages.load(), 75u);
  sb.Unregister();
  EXPECT_EQ(CountAll(), 225u);
  EXPECT_EQ(ShrinkAll(1000), 225u);  // at most what it has
  EXPECT_EQ(a.pages.load(), 0u);
  EXPECT_EQ(ShrinkAll(10), 0u);  // nothing left: not even called
}

// The thread looks on its own: a limit the process is always over makes it
// ask the cache (no timing asserted: it waits as long as it takes).
TEST(PressureTest, TheThreadAsksTheCachesWhenOverTheLimit) {
  const PressureOptions saved = GetPressureOptions();
  PressureOptions o;
  o.rss_limit = 1;  // bytes: always over
  o.psi_some_pct = 0;
  o.interval_ms = 10;
  SetPressureOptions(o);
  FakeCache c;
  c.pages = 1u << 30;
  const u64 looks0 = GetPressureStats().looks;
  {
    platform::Shrinker s;
    ASSERT_TRUE(s.Register(&FakeCache::Count, &FakeCache::Scan, &c, "c").ok());
    while (c.scans.load() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    // The first ask trimmed it (by the RSS's excess); within the episode
    // only what it grows back is asked for.
    while (GetPressureStats().looks - looks0 < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(c.scans.load(), 1u);
    const u64 level = c.pages.load();
    EXPECT_LT(level, 1ull << 30);
    c.pages += 100;
    while (c.scans.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    while (c.pages.load() != level) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }  // unregistered (and the thread stopped): no scan after this
  const u64 scans = c.scans.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(c.scans.load(), scans);
  const PressureStats st = GetPressureStats();
  EXPECT_GE(st.looks - looks0, 3u);
  EXPECT_GE(st.pressured, 3u);
  EXPECT_GT(st.pages_freed, 0u);
  EXPECT_EQ(st.shrinkers, 0u);
  SetPressureOptions(saved);
}

}  // namespace
}  // namespace tfs::userspace
