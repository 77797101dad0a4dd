// Arrival schedules: constant arrivals are exact and staggered across threads;
// Poisson arrivals have the right mean rate and exponential gaps (coefficient of
// variation near 1) and are reproducible from the seed.
#include "workloads/probe/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace tfs::probe {
namespace {

TEST(ScheduleTest, ConstantIsEvenlySpacedAcrossThreads) {
  // 1000 ops/s over 4 threads: merged stream every 1 ms exactly.
  std::vector<uint64_t> all;
  for (int t = 0; t < 4; t++) {
    Schedule s(Arrivals::kConstant, 1000, 4, t, 1);
    for (int i = 0; i < 250; i++) all.push_back(s.Next());
  }
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i < all.size(); i++) ASSERT_EQ(all[i], i * 1'000'000) << i;
}

TEST(ScheduleTest, PoissonHasRateAndExponentialGaps) {
  Schedule s(Arrivals::kPoisson, 2000, 1, 0, 42);
  const int n = 100000;
  std::vector<double> gaps;
  uint64_t prev = 0;
  for (int i = 0; i < n; i++) {
    uint64_t t = s.Next();
    ASSERT_GE(t, prev);
    gaps.push_back(double(t - prev));
    prev = t;
  }
  double mean = 0;
  for (double g : gaps) mean += g;
  mean /= n;
  double var = 0;
  for (double g : gaps) var += (g - mean) * (g - mean);
  double cv = std::sqrt(var / n) / mean;
  EXPECT_NEAR(mean, 500'000, 500'000 * 0.02);  // 1/2000 s
  EXPECT_NEAR(cv, 1.0, 0.03);
}

TEST(ScheduleTest, PoissonIsReproducibleAndThreadsDiffer) {
  Schedule a(Arrivals::kPoisson, 100, 2, 0, 7), b(Arrivals::kPoisson, 100, 2, 0, 7);
  Schedule c(Arrivals::kPoisson, 100, 2, 1, 7);
  bool differs = false;
  for (int i = 0; i < 100; i++) {
    uint64_t x = a.Next();
    ASSERT_EQ(x, b.Next());
    differs = differs || x != c.Next();
  }
  EXPECT_TRUE(differs);
}

}  // namespace
}  // namespace tfs::probe
