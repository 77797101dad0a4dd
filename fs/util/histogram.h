// Histogram: a log-bucketed (HDR-style) histogram of u64 values, integer only.
//
// Values are usually latencies in nanoseconds. Below 2^kSubBits every value has its
// own bucket; above, each power of two is split into 2^kSubBits equal buckets, so a
// bucket is at most 1/64 of its value wide and a reported quantile (the bucket's
// midpoint, clamped to the exact min and max) is within 0.8% of the true sample.
// Range: 0 .. 2^kMaxBits - 1 (about 18 minutes in ns); larger values count in the
// last bucket and still set max exactly.
//
// Fixed size (no allocation: ~18 KiB, so allocate it, do not put it on a kernel
// stack), kernel-safe, not thread-safe: keep one per thread or guard it, and Merge().
#ifndef TFS_UTIL_HISTOGRAM_H_
#define TFS_UTIL_HISTOGRAM_H_

#include "platform/types.h"

namespace tfs {

class Histogram {
 public:
  static constexpr u32 kSubBits = 6;
  static constexpr u32 kSub = 1u << kSubBits;
  static constexpr u32 kMaxBits = 40;
  static constexpr u32 kBuckets = kSub + (kMaxBits - kSubBits) * kSub;

  Histogram() { Reset(); }

  void Reset();
  void Record(u64 value, u64 n = 1);
  void Merge(const Histogram& other);

  u64 count() const { return count_; }
  u64 sum() const { return sum_; }
  u64 min() const { return count_ == 0 ? 0 : min_; }
  u64 max() const { return max_; }
  u64 Mean() const { return count_ == 0 ? 0 : sum_ / count_; }

  // The value at quantile num/den (e.g. 99/100, 999/1000): the smallest bucket
  // whose cumulative count reaches ceil(count * num / den), reported as its midpoint
  // clamped to [min, max]. 0 for an empty histogram.
  u64 Quantile(u64 num, u64 den) const;

  static u32 BucketIndex(u64 value);
  static u64 BucketLow(u32 index);   // smallest value in the bucket
  static u64 BucketHigh(u32 index);  // largest value in the bucket
  u64 bucket(u32 index) const { return buckets_[index]; }

 private:
  u64 buckets_[kBuckets];
  u64 count_;
  u64 sum_;
  u64 min_;
  u64 max_;
};

}  // namespace tfs

#endif  // TFS_UTIL_HISTOGRAM_H_
