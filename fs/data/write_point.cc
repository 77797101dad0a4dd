// Write points (data.h, io_context.h): open buckets per (target, I/O
// class) that new data is appended to, filled in order, so a background
// writer never shares a bucket with the foreground nor waits on its write
// point's lock -- one bucket per copy a write wants (slots, on distinct
// members: replicas). Reserve hands out space at ctx's write point on as
// many members as the write wants copies, allocating a new bucket (at ctx's
// watermark, on ctx's target) for a slot that is full -- or, for a
// compressed blob that must be whole, too full -- and refuses space that
// the unwritten reservations of others need.
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
    *out = wp->slots[0].ref;
    return wp->slots[0].open;
  }
  return false;  // (a query: no write point is made for it)
}

u32 DataPath::Wanted(const IoContext& ctx) const {
  const u32 r = ctx.replicas != 0 ? ctx.replicas : data_replicas_;
  return Max<u32>(1, Min<u32>(r, kMaxPtrs));
}

Status DataPath::Reserve(const IoContext& ctx, u32 want, u64 covered, bool whole, Space* out, u32* copies,
                         u32* got) {
  auto found = FindWritePoint(ctx);
  TFS_TRY(found.status());
  WritePoint& wp = *found.value();
  const u32 wanted = Wanted(ctx);
  alloc::BucketRef retired[kMaxPtrs];
  u32 nretired = 0;
  Status st;
  {
    MutexLock l(wp.mu);
    // The write point's target (ctx's, or the foreground's after a fallback).
    const u32 member = wp.target.member % dev::kMaxDevices;
    dev::DevMask target = targets_[u32(wp.target.kind) % kTargetKinds];  // (0 for kMember, kGroup)
    if (wp.target.kind == TargetKind::kMember) target = dev::DevMask(1) << member;
    if (wp.target.kind == TargetKind::kGroup) target = groups_[member];
    const dev::DevMask all = store_->devs().all();
    // Further copies: members the target names (every member if it names
    // none: no preference) that count as a copy. Never the fallback: a
    // replica must not put a slow member the target leaves out on the
    // foreground path.
    const dev::DevMask further = (target != 0 ? target : all) & durable_;
    // The slots this write uses, in order: each open with room, on a member
    // no earlier one of this write has; a slot that is not gets a new
    // bucket (its old one retired) from the members still free to take.
    u32 chosen[kMaxPtrs];
    u32 nchosen = 0;
    dev::DevMask used = 0;
    u32 durability = 0;
    bool exhausted = false;  // a further copy found no member with room: later slots neither
    for (u32 i = 0; i < kMaxPtrs && durability < wanted; i++) {
      WritePoint::Slot& s = wp.slots[i];
      const dev::DevMask bit = dev::DevMask(1) << (s.ref.dev % dev::kMaxDevices);
      const bool room = s.open && s.used < bucket_blocks_ && (!whole || bucket_blocks_ - s.used >= want);
      if (!(room && (used & bit) == 0 && (i == 0 || (further & bit) != 0))) {
        if (exhausted) continue;
        const dev::DevMask may = further & ~used;
        if (i > 0 && may == 0) {
          exhausted = true;
          continue;
        }
        auto r = i == 0 ? store_->alloc().Allocate(target, all, alloc::BucketState::kUser, ctx.watermark)
                        : store_->alloc().Allocate(may, may, alloc::BucketState::kUser, ctx.watermark);
        if (!r.ok()) {
          if (i == 0) return r.status();  // no copy at all: as a one-copy write fails
          exhausted = true;
          continue;
        }
        MutexLock a(acct_mu_);
        if (s.open) {
          // All of it overwritten already, and no write in flight into it:
          // freed (or by the last read of it).
          held_[s.ref.dev][s.ref.bucket] = 0;
          if (ReleaseLocked(s.ref.dev, s.ref.bucket, &retired[nretired])) nretired++;
        }
        s.ref = r.value();
        s.used = 0;
        s.open = true;
        held_[s.ref.dev][s.ref.bucket] = 1;
        ctr_.buckets_opened.FetchAdd(1, MemOrder::kRelaxed);
      }
      chosen[nchosen++] = i;
      used |= dev::DevMask(1) << s.ref.dev;
      durability += durability_[s.ref.dev];
    }
    // The same blocks on every copy: what the fullest slot has left.
    u32 n = want;
    for (u32 c = 0; c < nchosen; c++) n = u32(Min<u64>(n, bucket_blocks_ - wp.slots[chosen[c]].used));
    MutexLock a(acct_mu_);
    // The reservations of others must still fit in what stays free: the
    // first copy's blocks, and as many further copies as fit beside them.
    const u64 others = reserved_ > covered ? reserved_ - covered : 0;
    const u64 free = others > 0 ? FreeBlocksLocked() : 0;
    if (others > 0 && free < others + n) {
      ctr_.reserve_refused.FetchAdd(1, MemOrder::kRelaxed);
      st = Err::kNoSpace;
    } else {
      if (others > 0) nchosen = u32(Min<u64>(nchosen, (free - others) / n));
      for (u32 c = 0; c < nchosen; c++) {
        WritePoint::Slot& s = wp.slots[chosen[c]];
        out[c].ref = s.ref;
        out[c].offset = store_->sb().BucketOffset(s.ref.bucket) + s.used * kBlockSize;
        s.used += n;
        pending_[s.ref.dev][s.ref.bucket] += n;
      }
      *copies = nchosen;
      *got = n;
    }
    u64 left = 0;
    for (const WritePoint::Slot& s : wp.slots)
      if (s.open) left += bucket_blocks_ - s.used;
    wp.left.Store(left, MemOrder::kRelaxed);
  }
  for (u32 i = 0; i < nretired; i++)
    if (store_->alloc().Free(retired[i]).ok()) ctr_.buckets_freed.FetchAdd(1, MemOrder::kRelaxed);
  return st;
}

}  // namespace tfs::data
