// Log-bucketed histogram (see histogram.h). Bucket layout: indices 0..kSub-1 hold
// the values 0..kSub-1 exactly; above that, a value whose highest set bit is b
// (b >= kSubBits) falls in group g = b - kSubBits + 1, at offset
// (value >> (b - kSubBits)) - kSub within the group's kSub buckets.
#include "util/histogram.h"

namespace tfs {
namespace {

u32 HighBit(u64 v) { return 63u - u32(__builtin_clzll(v)); }

}  // namespace

void Histogram::Reset() {
  MemSet(buckets_, 0, sizeof(buckets_));
  count_ = 0;
  sum_ = 0;
  min_ = ~u64(0);
  max_ = 0;
}

u32 Histogram::BucketIndex(u64 value) {
  if (value < kSub) return u32(value);
  u32 b = HighBit(value);
  if (b >= kMaxBits) return kBuckets - 1;
  u32 shift = b - kSubBits;
  u32 group = shift + 1;
  return group * kSub + u32(value >> shift) - kSub;
}

u64 Histogram::BucketLow(u32 index) {
  if (index < kSub) return index;
  u32 group = index / kSub;
  u32 shift = group - 1;
  u64 top = u64(index % kSub) + kSub;  // the value's top kSubBits+1 bits
  return top << shift;
}

u64 Histogram::BucketHigh(u32 index) {
  if (index < kSub) return index;
  u32 shift = index / kSub - 1;
  return BucketLow(index) + (u64(1) << shift) - 1;
}

void Histogram::Record(u64 value, u64 n) {
  if (n == 0) return;
  buckets_[BucketIndex(value)] += n;
  count_ += n;
  sum_ += value * n;
  if (value < min_) min_ = value;
  if (value > max_) max_ = value;
}

void Histogram::Merge(const Histogram& o) {
  if (o.count_ == 0) return;
  for (u32 i = 0; i < kBuckets; i++) buckets_[i] += o.buckets_[i];
  count_ += o.count_;
  sum_ += o.sum_;
  if (o.min_ < min_) min_ = o.min_;
  if (o.max_ > max_) max_ = o.max_;
}

u64 Histogram::Quantile(u64 num, u64 den) const {
  if (count_ == 0 || den == 0) return 0;
  if (num >= den) return max_;
  // rank = ceil(count * num / den), at least 1; computed without overflow for
  // counts below 2^40 and den <= 2^20.
  u64 rank = (count_ * num + den - 1) / den;
  if (rank == 0) rank = 1;
  u64 seen = 0;
  for (u32 i = 0; i < kBuckets; i++) {
    seen += buckets_[i];
    if (seen >= rank) {
      u64 lo = BucketLow(i), hi = BucketHigh(i);
      u64 mid = lo + (hi - lo) / 2;
      if (mid < min_) mid = min_;
      if (mid > max_) mid = max_;
      return mid;
    }
  }
  return max_;
}

}  // namespace tfs
