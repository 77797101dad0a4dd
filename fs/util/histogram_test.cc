#include "util/histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

namespace tfs {
namespace {

TEST(HistogramTest, BucketsTileTheRange) {
  // Every bucket starts right after the previous one ends, and maps back to itself.
  for (u32 i = 0; i + 1 < Histogram::kBuckets; i++) {
    ASSERT_EQ(Histogram::BucketHigh(i) + 1, Histogram::BucketLow(i + 1)) << i;
    ASSERT_EQ(Histogram::BucketIndex(Histogram::BucketLow(i)), i);
    ASSERT_EQ(Histogram::BucketIndex(Histogram::BucketHigh(i)), i);
  }
  EXPECT_EQ(Histogram::BucketIndex(~u64(0)), Histogram::kBuckets - 1);
}

TEST(HistogramTest, BucketWidthIsWithinTwoPercentOfValue) {
  for (u32 i = Histogram::kSub; i < Histogram::kBuckets; i++) {
    double lo = double(Histogram::BucketLow(i));
    double width = double(Histogram::BucketHigh(i) - Histogram::BucketLow(i) + 1);
    ASSERT_LE(width / lo, 1.0 / 64 + 1e-12) << i;
  }
}

// Exact percentile of sorted samples, same rank rule as Quantile().
u64 Exact(const std::vector<u64>& sorted, u64 num, u64 den) {
  u64 rank = (sorted.size() * num + den - 1) / den;
  if (rank == 0) rank = 1;
  return sorted[rank - 1];
}

TEST(HistogramTest, QuantilesWithinOnePercentFromMicrosecondsToHundredSeconds) {
  std::mt19937_64 rng(11);
  // Log-uniform between 1 us and 100 s, in ns.
  std::uniform_real_distribution<double> exp10(3.0, 11.0);
  auto h = std::make_unique<Histogram>();
  std::vector<u64> samples;
  for (int i = 0; i < 200000; i++) {
    u64 v = u64(std::pow(10.0, exp10(rng)));
    samples.push_back(v);
    h->Record(v);
  }
  std::sort(samples.begin(), samples.end());
  for (auto [num, den] : std::vector<std::pair<u64, u64>>{
           {1, 1000}, {1, 100}, {1, 2}, {9, 10}, {99, 100}, {999, 1000}, {9999, 10000}}) {
    double exact = double(Exact(samples, num, den));
    double got = double(h->Quantile(num, den));
    EXPECT_LE(std::abs(got - exact) / exact, 0.01) << num << "/" << den;
  }
  EXPECT_EQ(h->min(), samples.front());
  EXPECT_EQ(h->max(), samples.back());
  EXPECT_EQ(h->Quantile(1, 1), samples.back());
  EXPECT_EQ(h->count(), samples.size());
}

TEST(HistogramTest, SmallValuesAreExact) {
  auto h = std::make_unique<Histogram>();
  for (u64 v = 0; v < 64; v++) h->Record(v);
  EXPECT_EQ(h->Quantile(1, 2), 31u);
  EXPECT_EQ(h->Quantile(1, 64), 0u);
  EXPECT_EQ(h->Mean(), 31u);
}

TEST(HistogramTest, MergeAndReset) {
  auto a = std::make_unique<Histogram>();
  auto b = std::make_unique<Histogram>();
  a->Record(1000, 3);
  b->Record(5000000);
  b->Record(7);
  a->Merge(*b);
  EXPECT_EQ(a->count(), 5u);
  EXPECT_EQ(a->min(), 7u);
  EXPECT_EQ(a->max(), 5000000u);
  EXPECT_EQ(a->sum(), 3000u + 5000000u + 7u);
  a->Reset();
  EXPECT_EQ(a->count(), 0u);
  EXPECT_EQ(a->Quantile(99, 100), 0u);
  EXPECT_EQ(a->min(), 0u);
}

TEST(HistogramTest, HugeValuesClampButKeepExactMax) {
  auto h = std::make_unique<Histogram>();
  u64 huge = u64(1) << 50;
  h->Record(huge);
  EXPECT_EQ(h->max(), huge);
  EXPECT_EQ(h->Quantile(1, 2), huge);  // midpoint of the last bucket clamps to [min, max]
}

}  // namespace
}  // namespace tfs
