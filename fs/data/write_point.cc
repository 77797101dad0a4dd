// Write points (data.h, io_context.h): open buckets per (target, I/O
// class) that new data is appended to, filled in order, so a background
// writer never shares a bucket with the foreground nor waits on its write
// point's lock -- up to kMaxPtrs open buckets (slots), a write taking one
// per copy on distinct members (replicas). Reserve hands out space at ctx's
// write point on as many members as the write wants copies, from open
// slots with room first, allocating a new bucket (at ctx's watermark, on
// ctx's target) only for a copy no open slot has room for -- for a
// compressed blob that must be whole, room for all of it -- and refuses
// space that the unwritten reservations of others need. A bucket opened
// counts in the write point's free blocks (left) at once.
//
// The table only grows until Close: lookups read it without a lock (entries
// published with release) and wps_mu_ serializes adding one. Targets are
// keyed by the members they name (WritePointTarget), and the table holds
// one for every key in every class; were it ever full, a write would go to
// the foreground target's write point (counted), never fail. A write point's
// fields are under its own mu; the accounting mutex (acct_mu_) is taken
// inside it, never the other way round. The buckets a write point moves on
// from are released like any other (a read pinned on one keeps it) and
// freed after both locks are dropped, with one record commit (none for a
// bucket no transaction recorded: AllocateUnrecorded). No device
// I/O here: the caller writes into the space Reserve returns.
#include "data/data.h"

#include "platform/platform.h"

namespace tfs::data {

Target DataPath::WritePointTarget(Target t) const {
  if (t.kind != TargetKind::kMember && t.kind != TargetKind::kGroup) return Target{t.kind, 0};
  const u32 member = t.member % dev::kMaxDevices;
  if (t.kind == TargetKind::kMember) return Target{TargetKind::kMember, u8(member)};
  const dev::DevMask group = members_.group[member];
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
  // data_replicas is the foreground write path's default; any other writer
  // (promote, copygc, reconcile) writes one copy unless it asks for more.
  const u32 dflt = ctx.origin == IoOrigin::kForegroundWrite ? members_.data_replicas : 1;
  const u32 r = ctx.replicas != 0 ? ctx.replicas : dflt;
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
  Status copy_alloc_error;  // a further copy's allocation that failed other than for want of space
  u32 passed = 0;           // further copies not given to a stalling member (6c)
  {
    MutexLock l(wp.mu);
    // The write point's target (ctx's, or the foreground's after a fallback).
    const u32 member = wp.target.member % dev::kMaxDevices;
    dev::DevMask target = 0;
    switch (wp.target.kind) {
      case TargetKind::kForeground: target = members_.fg_target; break;
      case TargetKind::kBackground: target = members_.bg_target; break;
      case TargetKind::kPromote: target = members_.promote_target; break;
      case TargetKind::kMember: target = dev::DevMask(1) << member; break;
      case TargetKind::kGroup: target = members_.group[member]; break;
    }
    // (target_only: no member but the target's, even for the first copy.)
    const dev::DevMask all = ctx.target_only && target != 0 ? target : store_->devs().all();
    // Never a member missing or marked failed (5c-3): not even an open
    // slot's bucket there takes another copy.
    const dev::DevMask avail = all & ~store_->devs().unavailable();
    // Further copies: members the target names (every member if it names
    // none: no preference) that count as a copy. Never the fallback: a
    // replica must not put a slow member the target leaves out on the
    // foreground path.
    const dev::DevMask further = (target != 0 ? target : all) & members_.durable;
    // Members stalling now (6c) get no copy of a replicated write while
    // another member may take it: the write neither waits for them nor
    // piles more requests on them. (A one-copy write goes where it always
    // did: it has no other copy to go on with.)
    dev::DevMask stalling = 0;
    if (wanted > 1 && late_copies_)
      for (u32 m : dev::Bits(avail))
        if (Stalling(m)) stalling |= dev::DevMask(1) << m;
    auto bit = [](const WritePoint::Slot& s) { return dev::DevMask(1) << (s.ref.dev % dev::kMaxDevices); };
    // Blocks a slot has left (0: none open), and for this write (`whole`:
    // all `want` or nothing).
    auto rest = [&](const WritePoint::Slot& s) -> u64 { return s.open ? bucket_blocks_ - s.used : 0; };
    auto room = [&](const WritePoint::Slot& s) -> u64 {
      const u64 r = rest(s);
      return whole && r < want ? 0 : r;
    };
    // The copies this write uses, as slots: chosen by member, not by index.
    // Each copy takes an open slot with room on a member it may use and no
    // earlier copy of the write has (the first copy: the target's members
    // first, then any -- a fallback bucket is filled before the target gets
    // another); only when there is none does it get a new bucket -- on a
    // member no open slot has room on, if it may (so files wanting one and
    // two copies sharing the write point swap members between slots rather
    // than retire half-filled buckets) -- into a slot this write does not
    // use: an unopened or the emptiest one (retired as before).
    u32 chosen[kMaxPtrs];
    u32 nchosen = 0;
    dev::DevMask used = 0;
    u32 durability = 0;
    while (nchosen < kMaxPtrs && durability < wanted) {
      const bool first = nchosen == 0;
      const dev::DevMask open = (first ? all : further & ~used) & avail;
      // (The first copy: a stalling member only when every member it may
      // take is, and the target's stalling members rather than a member
      // outside the target.)
      const dev::DevMask open_ok = open & ~stalling;
      const dev::DevMask may = first && open_ok == 0 ? open : open_ok;
      const dev::DevMask tgt = (first ? (target != 0 ? target : all) : may) & avail;
      const dev::DevMask prefer = first && (tgt & ~stalling) != 0 ? tgt & ~stalling : tgt;
      if (may == 0) {  // (further copies: too few members, or only stalling ones: degraded)
        passed += open != 0;
        break;
      }
      bool taken[kMaxPtrs] = {};
      for (u32 c = 0; c < nchosen; c++) taken[chosen[c]] = true;
      u32 pick = kMaxPtrs;
      const dev::DevMask masks[2] = {prefer, may};
      for (u32 k = 0; k < 2 && pick == kMaxPtrs; k++)
        for (u32 i = 0; i < kMaxPtrs && pick == kMaxPtrs; i++)
          if (!taken[i] && room(wp.slots[i]) > 0 && (bit(wp.slots[i]) & masks[k] & ~used) != 0) pick = i;
      if (pick == kMaxPtrs) {
        dev::DevMask holding = 0;  // members an open slot has room on
        for (const WritePoint::Slot& s : wp.slots)
          if (rest(s) > 0) holding |= bit(s);
        const dev::DevMask fresh = prefer & ~holding;
        Result<alloc::BucketRef> r = Err::kNoSpace;
        Status failed;  // an attempt's error other than kNoSpace (a journal settle's)
        auto allocate = [&](dev::DevMask t, dev::DevMask fb) {
          r = store_->alloc().AllocateUnrecorded(t, fb, ctx.watermark);  // (no commit under wp.mu)
          if (!r.ok() && r.status().code() != Err::kNoSpace && failed.ok()) failed = r.status();
        };
        if (fresh != 0) allocate(fresh, fresh);
        if (!r.ok()) allocate(prefer, may);
        if (!r.ok()) {
          // No open slot had room either (one would have been picked): no
          // copy at all fails as a one-copy write does. A further copy goes
          // without, as a degraded write (counted by KeepWritten), and later
          // copies (fewer members) too: for want of space, or for an error
          // -- logged and counted below, never silent. Failing the write
          // for it would refuse data that has a copy to go to; a journal
          // that no longer commits fails the extent's own commit anyway.
          if (first) return failed.ok() ? r.status() : failed;  // (an I/O error is not ENOSPC)
          copy_alloc_error = failed;
          break;
        }
        u64 least = ~u64(0);
        for (u32 i = 0; i < kMaxPtrs; i++)
          if (!taken[i] && rest(wp.slots[i]) < least) {
            least = rest(wp.slots[i]);
            pick = i;
          }
        WritePoint::Slot& s = wp.slots[pick];
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
        held_[s.ref.dev][s.ref.bucket] = kWritePointHold;  // (a new life: no kFreeing)
        ctr_.buckets_opened.FetchAdd(1, MemOrder::kRelaxed);
        // The new bucket left the allocator's free count: it counts in the
        // write point's at once (FreeBlocksLocked: the check below, and a
        // concurrent QueueReserve), and a retired one's rest no more.
        u64 total = 0;
        for (const WritePoint::Slot& o : wp.slots) total += rest(o);
        wp.left.Store(total, MemOrder::kRelaxed);
      }
      chosen[nchosen++] = pick;
      used |= bit(wp.slots[pick]);
      durability += members_.durability[wp.slots[pick].ref.dev];
    }
    MutexLock a(acct_mu_);
    // The reservations of others must still fit in what stays free: the
    // first copy's blocks, and as many further copies as fit beside them.
    // Every copy gets the same blocks: the least room among the copies kept.
    const u64 others = reserved_ > covered ? reserved_ - covered : 0;
    const u64 free = others > 0 ? FreeBlocksLocked() : 0;
    u32 n = want;
    u32 keep = 0;
    for (; keep < nchosen; keep++) {
      const u32 m = u32(Min<u64>(n, rest(wp.slots[chosen[keep]])));
      if (others > 0 && free < others + u64(m) * (keep + 1)) break;
      n = m;
    }
    if (keep == 0) {
      ctr_.reserve_refused.FetchAdd(1, MemOrder::kRelaxed);
      st = Err::kNoSpace;
    } else {
      for (u32 c = 0; c < keep; c++) {
        WritePoint::Slot& s = wp.slots[chosen[c]];
        out[c].ref = s.ref;
        out[c].offset = store_->sb().BucketOffset(s.ref.bucket) + s.used * kBlockSize;
        s.used += n;
        pending_[s.ref.dev][s.ref.bucket] += n;
      }
      *copies = keep;
      *got = n;
    }
    u64 total = 0;
    for (const WritePoint::Slot& s : wp.slots) total += rest(s);
    wp.left.Store(total, MemOrder::kRelaxed);
  }
  if (passed != 0) ctr_.copies_passed_stalling.FetchAdd(passed, MemOrder::kRelaxed);
  if (!copy_alloc_error.ok()) {
    ctr_.copy_alloc_errors.FetchAdd(1, MemOrder::kRelaxed);
    LogCopyAllocError(copy_alloc_error);
  }
  FreeReleased(retired, nretired).IgnoreError();  // (one record commit at most; counted)
  return st;
}

}  // namespace tfs::data
