// Space accounting (data.h): per bucket, the live blocks of committed
// extents (their pointers that are not cached), the blocks of their cached
// pointers (counted apart: a cached copy is not what keeps the data, and the
// cache will be dropped by bucket, issue 22), the blocks reserved by writes
// not yet applied or aborted (pending), the reads in flight (Pin/Unpin) and
// whether a write point holds it; and the sum of unwritten reservations. It
// lives in memory and is rebuilt from the extents at Open -- the one record
// of what is live, so a crash cannot leave the two disagreeing -- and a user
// bucket no extent points into is freed there. Afterwards a bucket none of
// them holds is freed at once, or by the last read that has it pinned
// (kDoomed). Which pointers count is one rule (PtrCounts), so that Open and
// QueuePunch count and uncount the same ones: not a pointer outside the
// buckets, nor a stale cached one.
//
// All of it is under acct_mu_, the innermost lock (taken after the write
// point table's mutex or one write point's). acct_mu_ is never held across
// I/O, a btree call or the allocator's Free: ReleaseLocked only says which
// bucket to free, and its caller frees it after dropping acct_mu_. Open and
// Close run alone: the mount opens the data path before its users and closes
// it after them.
#include "data/data.h"

#include "platform/platform.h"
#include "sb/format.h"

namespace tfs::data {

using btree::Iterator;

DataPath::~DataPath() { Close(); }

Status DataPath::Open(store::Store* store) {
  if (store_ != nullptr || store == nullptr || !store->open()) return Err::kInvalidArgument;
  store_ = store;
  trees_ = &store->btrees();
  const sb::Superblock& sb = store->sb();
  bucket_blocks_ = sb.bucket_size / kBlockSize;
  journal_members_ = 0;
  for (u32 m = 0; m < sb.nr_members; m++)
    if (sb.members[m].journal_nbuckets > 0) journal_members_ |= dev::DevMask(1) << m;
  // The targets, once: the superblock's options do not change while mounted.
  // One that names nothing is no preference (the fallback: every member).
  const char* names[] = {sb.options.foreground_target, sb.options.background_target, sb.options.promote_target};
  for (u32 k = 0; k < 3; k++) {
    auto t = store->devs().ResolveTarget(names[k]);
    targets_[k] = t.ok() ? t.value() : 0;
  }
  // Each member's group, for kGroup targets (files' options), and what a
  // copy on it counts for (replicas).
  const dev::DeviceSet& devs = store->devs();
  data_replicas_ = sb.options.data_replicas;
  durable_ = 0;
  for (u32 m = 0; m < devs.size(); m++) {
    durability_[m] = m < sb.nr_members ? sb.members[m].durability : 0;
    if (durability_[m] > 0) durable_ |= dev::DevMask(1) << m;
    groups_[m] = 0;
    for (u32 i = 0; i < devs.size(); i++)
      if (StrEqual(devs.member(i)->group(), devs.member(m)->group())) groups_[m] |= dev::DevMask(1) << i;
  }
  alloc::Allocator& a = store->alloc();
  for (u32 d = 0; d < a.members(); d++) {
    TFS_TRY(live_[d].Resize(a.nbuckets(d)));
    TFS_TRY(cached_[d].Resize(a.nbuckets(d)));
    TFS_TRY(pending_[d].Resize(a.nbuckets(d)));
    TFS_TRY(reads_[d].Resize(a.nbuckets(d)));
    TFS_TRY(held_[d].Resize(a.nbuckets(d)));
  }
  // Live and cached blocks per bucket, from the extents: the one record of
  // what is live. A bad pointer (fsck's business) counts nowhere, nor does a
  // stale cached one (normal); the extent's other pointers still count.
  Iterator it(trees_, btree::kBtreeExtents);
  Status st = it.SeekToFirst();
  u64 bad = 0;
  reserved_ = 0;
  for (; st.ok() && it.Valid(); st = it.Next()) {
    Extent e;
    if (!ParseExtent(it.pos(), it.value(), it.val_bytes(), &e).ok()) {
      bad++;
      continue;
    }
    if (e.unwritten) {
      reserved_ += e.blocks();
      continue;
    }
    bool bad_ptr = false;
    for (u32 i = 0; i < e.nr_ptrs; i++) {
      const Extent::Ptr& p = e.ptrs[i];
      u64 b;
      if (!PtrCounts(p, &b)) {
        bad_ptr |= !PtrBucket(store_->sb(), p, &b);  // (a stale cached pointer is not bad)
        continue;
      }
      (p.cached ? cached_ : live_)[p.dev][b] += e.blocks();
    }
    bad += bad_ptr;
  }
  if (!st.ok()) return st;
  if (bad > 0) platform::Log(platform::LogLevel::kError, "data: %llu extents with bad pointers (fsck)", (unsigned long long)bad);
  // User buckets no extent points into (a crash between allocating and
  // committing, or the last write point of a crash): free them.
  for (u32 d = 0; d < a.members(); d++)
    for (u64 b = 0; b < live_[d].size(); b++) {
      const alloc::Bucket k = a.Get(d, b);
      if (k.state != alloc::BucketState::kUser || live_[d][b] != 0 || cached_[d][b] != 0) continue;
      TFS_TRY(a.Free(alloc::BucketRef{d, b, k.gen}));
      ctr_.buckets_freed.FetchAdd(1, MemOrder::kRelaxed);
    }
  return Status::Ok();
}

void DataPath::Close() {
  if (store_ == nullptr) return;
  {
    MutexLock t(wps_mu_);
    const u32 n = nr_wps_.Load(MemOrder::kAcquire);
    for (u32 i = 0; i < n; i++) {
      WritePoint* wp = wps_[i];
      alloc::BucketRef refs[kMaxPtrs];
      u32 nfree = 0;
      {
        MutexLock l(wp->mu);
        for (WritePoint::Slot& s : wp->slots) {
          if (!s.open) continue;
          MutexLock a(acct_mu_);
          held_[s.ref.dev][s.ref.bucket] = 0;
          if (ReleaseLocked(s.ref.dev, s.ref.bucket, &refs[nfree])) nfree++;
          s.open = false;
        }
      }
      // (Not on a store closed already -- a test's crash: the next mount
      // frees a user bucket no extent points into.)
      for (u32 k = 0; k < nfree; k++)
        if (store_->open() && store_->alloc().Free(refs[k]).ok()) ctr_.buckets_freed.FetchAdd(1, MemOrder::kRelaxed);
      platform::Delete(wp);
      wps_[i] = nullptr;
    }
    nr_wps_.Store(0, MemOrder::kRelease);
  }
  for (auto& v : live_) v.Resize(0).IgnoreError();
  for (auto& v : cached_) v.Resize(0).IgnoreError();
  for (auto& v : pending_) v.Resize(0).IgnoreError();
  for (auto& v : reads_) v.Resize(0).IgnoreError();
  for (auto& v : held_) v.Resize(0).IgnoreError();
  reserved_ = 0;
  store_ = nullptr;
  trees_ = nullptr;
}

u64 DataPath::FreeBlocksLocked() const {
  const alloc::Allocator& a = store_->alloc();
  u64 buckets = 0;
  for (u32 d = 0; d < a.members(); d++) {
    const alloc::DeviceUsage u = a.Usage(d);
    const u64 free = u.by_state[u32(alloc::BucketState::kFree)] + u.pending_free;
    const u64 floor = a.FreeFloor(d, alloc::Watermark::kForeground);
    if (free > floor) buckets += free - floor;
  }
  // What is left in the write points (each read once: a write point moving
  // on meanwhile is the same race as an allocation right after this).
  u64 blocks = buckets * bucket_blocks_;
  const u32 n = nr_wps_.Load(MemOrder::kAcquire);
  for (u32 i = 0; i < n; i++) blocks += wps_[i]->left.Load(MemOrder::kRelaxed);
  return blocks;
}

bool DataPath::PtrCounts(const Extent::Ptr& p, u64* bucket) const {
  if (!PtrBucket(store_->sb(), p, bucket)) return false;
  alloc::Bucket k;
  if (p.cached) k = store_->alloc().Get(p.dev, *bucket);  // (only a cached pointer asks: one lock less)
  return PtrCountsIn(p, k.state == alloc::BucketState::kUser, k.gen);
}

bool DataPath::ReleaseLocked(u32 dev, u64 bucket, alloc::BucketRef* ref) {
  if (live_[dev][bucket] != 0 || cached_[dev][bucket] != 0 || pending_[dev][bucket] != 0 || held_[dev][bucket] != 0)
    return false;
  if (reads_[dev][bucket] != 0) {
    reads_[dev][bucket] |= kDoomed;  // the last read frees it (Unpin)
    return false;
  }
  *ref = alloc::BucketRef{dev, bucket, store_->alloc().Get(dev, bucket).gen};
  return true;
}

void DataPath::Account(u32 dev, u64 bucket, i64 blocks, i64 cached, i64 pending) {
  bool free_it = false;
  alloc::BucketRef ref{};
  {
    MutexLock l(acct_mu_);
    if (dev >= dev::kMaxDevices || bucket >= live_[dev].size()) return;
    u32& live = live_[dev][bucket];
    u32& cach = cached_[dev][bucket];
    u32& pend = pending_[dev][bucket];
    TFS_BUG_ON((blocks < 0 && u64(-blocks) > live) || (pending < 0 && u64(-pending) > pend));
    // Cached blocks may be uncounted that were never counted: a cached
    // pointer stale at mount (counted nowhere) looks current again once its
    // bucket is reused at the pointer's generation (a wrap, or a hostile
    // value one ahead). The count stops at 0: a cache bucket freed early only
    // makes its other cached pointers stale, which reads and fsck expect.
    if (cached < 0 && u64(-cached) > cach) {
      ctr_.cached_underflows.FetchAdd(1, MemOrder::kRelaxed);
      cached = -i64(cach);
    }
    live = u32(i64(live) + blocks);
    cach = u32(i64(cach) + cached);
    pend = u32(i64(pend) + pending);
    if (blocks < 0) ctr_.blocks_released.FetchAdd(u64(-blocks), MemOrder::kRelaxed);
    free_it = ReleaseLocked(dev, bucket, &ref);
  }
  if (free_it && store_->alloc().Free(ref).ok()) ctr_.buckets_freed.FetchAdd(1, MemOrder::kRelaxed);
}

void DataPath::Apply(const Delta& delta) {
  // Gains first: reserved space that becomes live or cached, and blocks a
  // pointer into a blob counted already gains (a copy added to an extent, a
  // cached copy made authoritative); then every change that loses
  // something. A bucket losing and gaining in one delta never looks empty.
  // (A change's pending is what its write reserved: Apply releases it.)
  auto gains = [](const Delta::Change& c) { return c.blocks >= 0 && c.cached >= 0; };
  for (const Delta::Change& c : delta.changes)
    if (gains(c) && (c.blocks > 0 || c.cached > 0 || c.pending > 0))
      Account(c.dev, c.bucket, c.blocks, c.cached, -Max<i64>(c.pending, 0));
  for (const Delta::Change& c : delta.changes)
    if (!gains(c)) Account(c.dev, c.bucket, c.blocks, c.cached, -Max<i64>(c.pending, 0));
  if (delta.unreserved > 0) {
    MutexLock a(acct_mu_);
    TFS_BUG_ON(delta.unreserved > reserved_);
    reserved_ -= delta.unreserved;
  }
}

void DataPath::Abort(const Delta& delta) {
  // The space reserved for it is unreferenced: its bucket may go once empty.
  for (const Delta::Change& c : delta.changes)
    if (c.pending > 0) Account(c.dev, c.bucket, 0, 0, -c.pending);
  if (delta.reserved > 0) {
    MutexLock a(acct_mu_);
    TFS_BUG_ON(delta.reserved > reserved_);
    reserved_ -= delta.reserved;
  }
}

bool DataPath::Pin(u32 dev, u64 bucket, u8 gen) {
  MutexLock a(acct_mu_);
  const alloc::Bucket k = store_->alloc().Get(dev, bucket);
  if (k.gen != gen || k.state != alloc::BucketState::kUser) return false;
  reads_[dev][bucket]++;
  return true;
}

void DataPath::Unpin(u32 dev, u64 bucket) {
  alloc::BucketRef ref{};
  {
    MutexLock a(acct_mu_);
    u32& r = reads_[dev][bucket];
    TFS_BUG_ON((r & ~kDoomed) == 0);
    r--;
    if (r != kDoomed) return;
    r = 0;  // the last read of a bucket emptied meanwhile: free it now
    ref = alloc::BucketRef{dev, bucket, store_->alloc().Get(dev, bucket).gen};
  }
  if (store_->alloc().Free(ref).ok()) ctr_.buckets_freed.FetchAdd(1, MemOrder::kRelaxed);
}

void DataPath::BucketCounts(u32 dev, u64 bucket, u32* live, u32* cached) const {
  MutexLock a(acct_mu_);
  const bool in = dev < dev::kMaxDevices && bucket < live_[dev].size();
  *live = in ? live_[dev][bucket] : 0;
  *cached = in ? cached_[dev][bucket] : 0;
}

Stats DataPath::GetStats() const {
  Stats s;
  TFS_COUNTER_LOAD(TFS_DATA_COUNTERS, ctr_, s);
  s.write_points = nr_wps_.Load(MemOrder::kAcquire);
  MutexLock a(acct_mu_);
  s.blocks_reserved = reserved_;
  return s;
}

}  // namespace tfs::data
