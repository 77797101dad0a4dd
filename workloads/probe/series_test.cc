// Per-second series: threads' histograms for the same second are merged, a second
// is summarised only once every thread has moved past it, and empty seconds appear.
#include "workloads/probe/series.h"

#include <gtest/gtest.h>

namespace tfs::probe {
namespace {

TEST(SeriesTest, MergesThreadsAndFillsGaps) {
  TimeSeries ts(2);
  auto h = std::make_unique<Histogram>();
  h->Record(1000, 99);
  h->Record(5'000'000);
  ts.Add(0, *h);  // thread 0, second 0
  ts.Advance(0, 3);
  h->Reset();
  h->Record(2000);
  ts.Add(0, *h);  // thread 1, second 0
  ts.Add(2, *h);  // thread 1, second 2
  ts.Advance(1, UINT64_MAX);
  ts.Advance(0, UINT64_MAX);
  auto pts = ts.Finish(4);
  ASSERT_EQ(pts.size(), 4u);
  EXPECT_EQ(pts[0].count, 101u);
  EXPECT_EQ(pts[0].max_ns, 5'000'000u);
  EXPECT_NEAR(double(pts[0].p50_ns), 1000, 10);
  EXPECT_NEAR(double(pts[0].p99_ns), 2000, 20);
  EXPECT_EQ(pts[1].count, 0u);
  EXPECT_EQ(pts[2].count, 1u);
  EXPECT_EQ(pts[2].max_ns, 2000u);
  EXPECT_EQ(pts[3].count, 0u);
  for (size_t i = 0; i < pts.size(); i++) EXPECT_EQ(pts[i].second, i);
}

}  // namespace
}  // namespace tfs::probe
