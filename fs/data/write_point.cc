// Write points (data.h, io_context.h): one open bucket per (target, I/O
// class) that new data is appended to, filled in order, so a background
// writer never shares a bucket with the foreground nor waits on its write
// point's lock. Reserve hands out space at ctx's write point, allocating a
// new bucket (at ctx's watermark, on ctx's target) when it is full -- or,
// for a compressed blob that must be whole, too full -- and refuses space
// that the unwritten reservations of others need.
//
// The table only grows until Close: lookups read it without a lock (entries
// published with release) and wps_mu_ serializes adding one. Targets are
// keyed by the members they name (WritePointTarget), and the table holds
// one for every key in every class; were it ever full, a write would go to
// the foreground target's write point (counted), never fail. A write point's
// fields are under its own mu; the accounting mutex (acct_mu_) is taken
// inside it, never the other way round. The bucket a write point moves on
// from is released like any other (a read pinned on it keeps it) and freed
// after both locks are dropped. No device I/O here: the caller writes into
// the space Reserve returns.
#include "data/data.h"

#include "platform/platform.h"

namespace tfs::data {

Target DataPath::WritePointTarget(Target t) const {
  if (t.kind != TargetKind::kMember && t.kind != TargetKind::kGroup) return Target{t.kind, 0};
  const u32 member = t.member % dev::kMaxDevices;
  if (t.kind == TargetKind::kMember) return Target{TargetKind::kMember, u8(member)};
  const dev::DevMask group = groups_[member];
  if (group == 0) return Target{TargetKind::kMember, u8(member)};  // (no such member: its mask is its own bit)
  const u32 first = u32(__builtin_ctz(group));
  const bool alone = (group & (group - 1)) == 0;
  return Target{alone ? TargetKind::kMember : TargetKind::kGroup, u8(first)};
}

Result<DataPath::WritePoint*> DataPath::FindWritePoint(const IoContext& ctx) {
  const Target key = WritePointTarget(ctx.target);
  // Lock-free for the ones that exist (every write looks its up).
  u32 n = nr_wps_.Load(MemOrder::kAcquire);
  for (u32 i = 0; i < n; i++)
    if (wps_[i]->target == key && wps_[i]->io_class == ctx.io_class) return wps_[i];
  MutexLock t(wps_mu_);
  n = nr_wps_.Load(MemOrder::kAcquire);
  for (u32 i = 0; i < n; i++)
    if (wps_[i]->target == key && wps_[i]->io_class == ctx.io_class) return wps_[i];
  // Only the foreground target's may take the last entries (at most one per
  // class): the fallback always finds its write point or room for it.
  u32 others = 0;
  for (u32 i = 0; i < n; i++) others += wps_[i]->target.kind != TargetKind::kForeground ? 1 : 0;
  Target target = key;
  if (key.kind != TargetKind::kForeground && others >= wp_limit_) {
    ctr_.write_point_fallbacks.FetchAdd(1, MemOrder::kRelaxed);
    target = Target{};
    for (u32 i = 0; i < n; i++)
      if (wps_[i]->target == target && wps_[i]->io_class == ctx.io_class) return wps_[i];
  }
  if (n == kMaxWritePoints) {  // (only with an I/O class out of range: the last entries are kForeground's)
    platform::Log(platform::LogLevel::kError, "data: more than %u write points asked for", kMaxWritePoints);
    return Err::kInvalidArgument;
  }
  WritePoint* wp = platform::New<WritePoint>();
  if (wp == nullptr) return Err::kNoMemory;
  wp->target = target;
  wp->io_class = ctx.io_class;
  wps_[n] = wp;
  nr_wps_.Store(n + 1, MemOrder::kRelease);
  return wp;
}

bool DataPath::WritePointBucket(const IoContext& ctx, alloc::BucketRef* out) {
  const Target key = WritePointTarget(ctx.target);
  const u32 n = nr_wps_.Load(MemOrder::kAcquire);
  for (u32 i = 0; i < n; i++) {
    WritePoint* wp = wps_[i];
    if (!(wp->target == key && wp->io_class == ctx.io_class)) continue;
    MutexLock l(wp->mu);
    *out = wp->ref;
    return wp->open;
  }
  return false;  // (a query: no write point is made for it)
}

Status DataPath::Reserve(const IoContext& ctx, u32 want, u64 covered, bool whole, alloc::BucketRef* ref,
                         u64* offset, u32* got) {
  auto found = FindWritePoint(ctx);
  TFS_TRY(found.status());
  WritePoint& wp = *found.value();
  alloc::BucketRef retired{};
  bool retire = false;
  Status st;
  {
    MutexLock l(wp.mu);
    if (!wp.open || wp.used == bucket_blocks_ || (whole && bucket_blocks_ - wp.used < want)) {
      // The write point's target (ctx's, or the foreground's after a fallback).
      const u32 member = wp.target.member % dev::kMaxDevices;
      dev::DevMask target = targets_[u32(wp.target.kind) % kTargetKinds];  // (0 for kMember, kGroup)
      if (wp.target.kind == TargetKind::kMember) target = dev::DevMask(1) << member;
      if (wp.target.kind == TargetKind::kGroup) target = groups_[member];
      auto r = store_->alloc().Allocate(target, store_->devs().all(), alloc::BucketState::kUser, ctx.watermark);
      if (!r.ok()) return r.status();
      MutexLock a(acct_mu_);
      if (wp.open) {
        // All of it overwritten already, and no write in flight into it:
        // freed (or by the last read of it).
        held_[wp.ref.dev][wp.ref.bucket] = 0;
        retire = ReleaseLocked(wp.ref.dev, wp.ref.bucket, &retired);
      }
      wp.ref = r.value();
      wp.used = 0;
      wp.left.Store(bucket_blocks_, MemOrder::kRelaxed);
      wp.open = true;
      held_[wp.ref.dev][wp.ref.bucket] = 1;
      ctr_.buckets_opened.FetchAdd(1, MemOrder::kRelaxed);
    }
    const u32 n = u32(Min<u64>(want, bucket_blocks_ - wp.used));
    MutexLock a(acct_mu_);
    // The reservations of others must still fit in what stays free.
    const u64 others = reserved_ > covered ? reserved_ - covered : 0;
    if (others > 0 && FreeBlocksLocked() < others + n) {
      ctr_.reserve_refused.FetchAdd(1, MemOrder::kRelaxed);
      st = Err::kNoSpace;
    } else {
      *ref = wp.ref;
      *got = n;
      *offset = store_->sb().BucketOffset(wp.ref.bucket) + wp.used * kBlockSize;
      wp.used += n;
      wp.left.Store(bucket_blocks_ - wp.used, MemOrder::kRelaxed);
      pending_[wp.ref.dev][wp.ref.bucket] += n;
    }
  }
  if (retire && store_->alloc().Free(retired).ok()) ctr_.buckets_freed.FetchAdd(1, MemOrder::kRelaxed);
  return st;
}

}  // namespace tfs::data
