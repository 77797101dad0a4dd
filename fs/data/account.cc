// Space accounting (data.h). The live and cached counts of every bucket
// are the allocator's (its records in the alloc btree: docs/design/copies.md,
// "As built: step 3b-2"), changed only inside the extent transactions that
// change them: Commit sums the delta per bucket (QueueCounts), queues one
// SetLater slot per bucket, and the transaction's commit hook stages the new
// counts and fills the records under the btree's commit_mu (PrepareCounts)
// and publishes them once journaled (FinishCounts) -- so a record's version
// order is its journal order and a crash keeps an extent change and its
// buckets' records together. Kept here, in memory only: per bucket, the
// blocks reserved by writes not yet applied or aborted (pending), the reads
// in flight (Pin/Unpin) and whether a write point holds it; and the sum of
// unwritten reservations (from the kReserved accounting key at Open,
// which walks no extent: step 3b-5b). A user bucket none of them holds is freed -- by the
// transaction's Apply when its publish emptied it, by whoever drops the last
// pending block or write point hold, or by the last read that has it pinned
// (kDoomed). Which pointers count is one rule (PtrCounts: data::PtrBucket and
// data::PtrCountsIn), so that CountExtents (fsck) and QueuePunch count and
// uncount the same ones: not a pointer outside the buckets, nor a stale
// cached one.
//
// acct_mu_ guards pending, reads, held and the reservations; it is the
// innermost of the data path's locks (taken after the write point table's
// mutex or one write point's), taken before the allocator's mu_ (reading
// counts), and never held across I/O, a btree call or the allocator's Free
// or RepairCounts: ReleaseLocked only says which bucket to free (marking it
// kFreeing, so that no read pins it and no commit's gain holds it before
// the Free changes its generation), and its caller frees it after dropping
// acct_mu_ (FreeReleased). A commit holds every bucket it gains in from
// before its commit until Apply or Abort (HoldGains), so no free comes
// between a record's staging and its publishing. The commit hook takes no data
// path lock (only the allocator's mu_, under commit_mu). Open and Close run
// alone: the mount opens the data path before its users and closes it after
// them.
#include "data/data.h"

#include "platform/platform.h"
#include "sb/format.h"
#include "util/sort.h"

static_assert(tfs::alloc::kCountFactor == tfs::data::kMaxCompressedBlocks,
              "a bucket counts logical sectors: up to a compressed blob's blocks per disk block");
static_assert(tfs::alloc::kAcctMaxMembers == tfs::data::kMaxPtrs, "a replicas set: an extent's pointers' members");

namespace tfs::data {

using btree::Iterator;

Status Delta::AddSet(dev::DevMask members, i64 n) {
  if (members == 0 || n == 0) return Status::Ok();
  for (SetChange& c : sets) {
    if (c.members != members) continue;
    c.sectors += n;
    return Status::Ok();
  }
  return sets.PushBack(SetChange{members, n});
}

Status MoveSet(const sb::Superblock& sb, const Extent& from, const Extent& to, Delta* delta) {
  const dev::DevMask a = CountedMembers(sb, from), b = CountedMembers(sb, to);
  if (a == b) return Status::Ok();
  TFS_TRY(delta->AddSet(a, -i64(PtrSectors(from))));
  return delta->AddSet(b, i64(PtrSectors(to)));
}

DataPath::~DataPath() { Close(); }

Status DataPath::Open(store::Store* store) {
  if (store_ != nullptr || store == nullptr || !store->open()) return Err::kInvalidArgument;
  store_ = store;
  trees_ = &store->btrees();
  // (A member's read errors are this mount's: the members may be others now.)
  for (auto& t : read_error_ns_) t.Store(0, MemOrder::kRelaxed);
  const sb::Superblock& sb = store->sb();
  bucket_blocks_ = sb.bucket_size / kBlockSize;
  journal_members_ = 0;
  for (u32 m = 0; m < sb.nr_members; m++)
    if (sb.members[m].journal_nbuckets > 0) journal_members_ |= dev::DevMask(1) << m;
  // The targets, the groups (kGroup targets: files' options), what a copy
  // on each member counts for (replicas), once: the superblock's options
  // and the members do not change while mounted.
  BuildMemberTable(store->devs(), sb, &members_);
  alloc::Allocator& a = store->alloc();
  for (u32 d = 0; d < a.members(); d++) {
    TFS_TRY(pending_[d].Resize(a.nbuckets(d)));
    TFS_TRY(reads_[d].Resize(a.nbuckets(d)));
    TFS_TRY(held_[d].Resize(a.nbuckets(d)));
  }
  // The counts, the reservations and the replicas totals are the records'
  // and the accounting keys' (step 3b-5b): no walk of the extents. The
  // store checked them against each other and freed the user buckets
  // counting nothing.
  reserved_ = store->acct().reserved_sectors() / (kBlockSize / 512);
  return Status::Ok();
}

Status DataPath::VerifyAgainstExtents(u64* counts_wrong, u64* totals_wrong) {
  *counts_wrong = *totals_wrong = 0;
  if (store_ == nullptr) return Err::kInvalidArgument;
  const sb::Superblock& sb = store_->sb();
  const alloc::Allocator& a = store_->alloc();
  auto owned = platform::Owned<ExtentCounts>::Make();  // (kMaxDevices Vectors: off the kernel's stack)
  if (!owned) return Err::kNoMemory;
  ExtentCounts& counts = *owned;
  TFS_TRY(CountExtents(trees_, sb, a, &counts));
  for (u32 d = 0; d < a.members(); d++) {
    for (u64 b = 0; b < a.nbuckets(d); b++) {
      const alloc::Bucket k = a.Get(d, b);
      if (k.state != alloc::BucketState::kUser) continue;
      const u64 most = alloc::MaxCountSectors(sb, k.state);
      if (k.live_sectors != Min<u64>(counts.live(d, b), most) || k.cached_sectors != Min<u64>(counts.cached(d, b), most))
        ++*counts_wrong;
    }
  }
  const alloc::Accounting& acct = store_->acct();
  Vector<alloc::AcctValue> want;
  TFS_TRY(AcctTotals(counts, &want));
  for (const alloc::AcctValue& w : want) *totals_wrong += acct.Get(w.kind, w.offset) != w.sectors;
  Vector<alloc::ReplicasEntry> have;
  TFS_TRY(acct.ReplicasInto(&have));
  for (const alloc::ReplicasEntry& r : have) {
    bool listed = false;
    for (const alloc::AcctValue& w : want) listed |= w.kind == alloc::AcctKind::kReplicas && w.offset == r.members;
    *totals_wrong += !listed && r.sectors != 0;
  }
  return Status::Ok();
}

Status AcctTotals(const ExtentCounts& counts, Vector<alloc::AcctValue>* out) {
  out->Clear();
  TFS_TRY(out->Reserve(counts.replicas.size() + 1));
  alloc::AcctValue v;
  v.kind = alloc::AcctKind::kReserved;
  v.sectors = counts.unwritten_blocks * (kBlockSize / 512);
  out->PushBack(v).IgnoreError();  // reserved
  for (const alloc::ReplicasEntry& r : counts.replicas) {
    v.kind = alloc::AcctKind::kReplicas;
    v.offset = r.members;
    v.sectors = r.sectors;
    out->PushBack(v).IgnoreError();  // reserved
  }
  return Status::Ok();
}

Status CountExtents(btree::Btrees* trees, const sb::Superblock& sb, const alloc::Allocator& a, ExtentCounts* out) {
  for (u32 d = 0; d < a.members(); d++) TFS_TRY(out->sums[d].Resize(2 * a.nbuckets(d)));
  Iterator it(trees, btree::kBtreeExtents);
  usize last_set = ~usize(0);
  Status st = it.SeekToFirst();
  for (; st.ok() && it.Valid(); st = it.Next()) {
    Extent e;
    if (!ParseExtent(it.pos(), it.value(), it.val_bytes(), &e).ok()) {
      out->bad_extents++;
      continue;
    }
    if (e.unwritten) {
      out->unwritten_blocks += e.blocks();
      continue;
    }
    // Its set's total (the same rule as the data path's: CountedMembers).
    // (Consecutive extents mostly share a set: the last one's is tried first.)
    const dev::DevMask set = CountedMembers(sb, e);
    if (set != 0) {
      if (last_set >= out->replicas.size() || out->replicas[last_set].members != set) {
        usize k = 0;
        while (k < out->replicas.size() && out->replicas[k].members < set) k++;
        if (k == out->replicas.size() || out->replicas[k].members != set) {
          TFS_TRY(out->replicas.PushBack(alloc::ReplicasEntry{}));
          for (usize j = out->replicas.size() - 1; j > k; j--) out->replicas[j] = out->replicas[j - 1];
          out->replicas[k] = alloc::ReplicasEntry{set, 0};
        }
        last_set = k;
      }
      out->replicas[last_set].sectors += PtrSectors(e);
    }
    bool bad_ptr = false;
    for (u32 i = 0; i < e.nr_ptrs; i++) {
      const Extent::Ptr& p = e.ptrs[i];
      u64 b;
      if (!PtrBucket(sb, p, &b) || p.dev >= a.members() || b >= a.nbuckets(p.dev)) {
        bad_ptr = true;
        continue;
      }
      // A plain pointer counts whatever its bucket (one that is not user is
      // settled below, per bucket); a cached one only in the user bucket of
      // its generation -- the allocator is asked for those only (its lock
      // per pointer would slow the mount's walk).
      if (p.cached) {
        const alloc::Bucket k = a.Get(p.dev, b);
        if (!PtrCountsIn(p, k.state == alloc::BucketState::kUser, k.gen)) continue;  // stale: normal
      }
      u32& sum = out->sums[p.dev][2 * b + (p.cached ? 1 : 0)];
      const u32 add = PtrSectors(e);
      sum = add > ~u32(0) - sum ? ~u32(0) : sum + add;
    }
    out->bad_extents += bad_ptr;
  }
  TFS_TRY(st);
  // Sums in buckets that are not user: pointers fsck drops, counted nowhere.
  for (u32 d = 0; d < a.members(); d++)
    for (u64 b = 0; b < a.nbuckets(d); b++) {
      if (out->live(d, b) == 0 && out->cached(d, b) == 0) continue;
      if (a.Get(d, b).state == alloc::BucketState::kUser) continue;
      out->foreign_buckets++;
      out->sums[d][2 * b] = out->sums[d][2 * b + 1] = 0;
    }
  return Status::Ok();
}

void DataPath::Close() {
  if (store_ == nullptr) return;
  // Copies still at a member that no reader waits for (a hedge's loser)
  // complete first: their completions touch this data path. (A poll: rare,
  // and only an unmount's -- as long as that member holds them, as any
  // I/O in flight there holds the unmount.)
  for (Reap(); ctr_.abandoned_reads.Load(MemOrder::kAcquire) != 0; Reap()) platform::SleepNs(platform::kNsPerMs);
  // Repairs nobody will take now (the worker stopped with posix's unmount).
  DropRepairs();
  // Replicated writes' late copies still at their members: their space is
  // given back once they complete (a poll, as for the reads above).
  for (Reap(true); ctr_.late_writes.Load(MemOrder::kAcquire) != 0; Reap(true)) platform::SleepNs(platform::kNsPerMs);
  // The write points' buckets nothing else holds are freed with one record
  // commit (one per write point, should the list not grow), after the
  // locks. Not on a store closed already -- a test's crash: the next mount
  // frees a user bucket no extent points into.
  const bool free_them = store_->open();
  Vector<alloc::BucketRef> frees;
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
      // (A list that cannot grow: these are freed here, under wps_mu_ --
      // which nothing on the commit path takes.)
      u32 listed = 0;
      while (free_them && listed < nfree && frees.PushBack(refs[listed]).ok()) listed++;
      if (free_them) FreeReleased(refs + listed, nfree - listed).IgnoreError();  // (counted)
      platform::Delete(wp);
      wps_[i] = nullptr;
    }
    nr_wps_.Store(0, MemOrder::kRelease);
  }
  FreeReleased(frees.data(), u32(frees.size())).IgnoreError();  // (counted; a failed commit: record_errors)
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
    // Free buckets, those whose free is not settled yet among them: a bucket
    // is kFree from its free on, on the pending list or the free list.
    // (FreeCount, not Usage: only this, O(1) under the allocator's mu_ --
    // which the commit hook takes under commit_mu.)
    const u64 free = a.FreeCount(d);
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

Status DataPath::FreeReleased(const alloc::BucketRef* refs, u32 n) {
  if (n == 0) return Status::Ok();
  TestPoint("free.decided");
  // (One alone: Free, which needs no memory. A batch whose list cannot be
  // allocated -- FreeBuckets changed nothing then -- goes one by one.)
  alloc::Allocator& a = store_->alloc();
  u32 freed = 0;
  Status st = n == 1 ? Status(Err::kNoMemory) : a.FreeBuckets(refs, n, &freed);
  if (st.code() == Err::kNoMemory && freed == 0) {
    // (Were the frees made and their commit short of memory instead, each
    // Free finds a stale ref and changes nothing.)
    for (u32 i = 0; i < n; i++)
      if (a.Free(refs[i]).ok()) freed++;
    if (freed == n) st = Status::Ok();
  }
  ctr_.buckets_freed.FetchAdd(freed, MemOrder::kRelaxed);
  if (freed != n) {
    // A bucket still the user bucket of its ref's generation was not freed
    // (a Free changes the generation first, whatever its commit does): no
    // longer being freed -- its record says user, the next mount frees it.
    MutexLock l(acct_mu_);
    for (u32 i = 0; i < n; i++) {
      const alloc::BucketRef& r = refs[i];
      if (r.dev >= dev::kMaxDevices || r.bucket >= held_[r.dev].size()) continue;
      const alloc::Bucket k = a.Get(r.dev, r.bucket);
      if (k.state == alloc::BucketState::kUser && k.gen == r.gen) held_[r.dev][r.bucket] &= u8(~kFreeing);
    }
  }
  return st;
}

bool DataPath::PtrCounts(const Extent::Ptr& p, u64* bucket) const {
  if (!PtrBucket(store_->sb(), p, bucket)) return false;
  alloc::Bucket k;
  if (p.cached) k = store_->alloc().Get(p.dev, *bucket);  // (only a cached pointer asks: one lock less)
  return PtrCountsIn(p, k.state == alloc::BucketState::kUser, k.gen);
}

bool DataPath::ReleaseLocked(u32 dev, u64 bucket, alloc::BucketRef* ref, u32 gen) {
  const alloc::Bucket k = store_->alloc().Get(dev, bucket);
  // Another generation: freed (and maybe reused) since the caller's
  // transaction emptied it -- not the caller's bucket any more.
  if (k.state != alloc::BucketState::kUser || (gen != kCurrentGen && k.gen != gen)) return false;
  if (k.live_sectors != 0 || k.cached_sectors != 0 || pending_[dev][bucket] != 0 || held_[dev][bucket] != 0)
    return false;
  if (reads_[dev][bucket] != 0) {
    reads_[dev][bucket] |= kDoomed;  // the last read frees it (Unpin)
    return false;
  }
  *ref = alloc::BucketRef{dev, bucket, k.gen};
  held_[dev][bucket] |= kFreeing;  // until the Free: Pin and a gain refuse it
  return true;
}

u64 DataPath::PendingBlocksForTest(u32 dev) const {
  MutexLock l(acct_mu_);
  u64 n = 0;
  if (dev < dev::kMaxDevices)
    for (u32 p : pending_[dev]) n += p;
  return n;
}

void DataPath::Account(u32 dev, u64 bucket, i64 pending, u32 gen) {
  bool free_it = false;
  alloc::BucketRef ref{};
  {
    MutexLock l(acct_mu_);
    if (dev >= dev::kMaxDevices || bucket >= pending_[dev].size()) return;
    u32& pend = pending_[dev][bucket];
    TFS_BUG_ON(pending < 0 && u64(-pending) > pend);
    pend = u32(i64(pend) + pending);
    free_it = ReleaseLocked(dev, bucket, &ref, gen);
  }
  if (free_it) FreeReleased(&ref, 1).IgnoreError();  // (counted; a failed Free: the next mount)
}

Status DataPath::QueueCounts(btree::Transaction* tx, const Delta& delta, CommitCounts* cc) {
  Vector<alloc::CountStage>& st = cc->stages;
  st.Clear();
  cc->acct.Clear();
  u32 n = 0;
  for (const Delta::Change& c : delta.changes) n += c.blocks != 0 || c.cached != 0;
  TFS_TRY(st.Reserve(n));
  constexpr i64 kSectors = kBlockSize / 512;
  for (const Delta::Change& c : delta.changes) {
    if (c.blocks == 0 && c.cached == 0) continue;
    alloc::CountStage s;
    s.dev = c.dev;
    s.bucket = c.bucket;
    s.live = c.blocks * kSectors;
    s.cached = c.cached * kSectors;
    st.PushBack(s).IgnoreError();  // reserved
  }
  // One stage per bucket: the changes of a bucket summed (a write's
  // overwrite of its own bucket's blocks nets out), those that net 0 gone.
  Sort(st.data(), st.size(), [](const alloc::CountStage& x, const alloc::CountStage& y) {
    return x.dev != y.dev ? x.dev < y.dev : x.bucket < y.bucket;
  });
  usize k = 0;
  for (usize i = 0; i < st.size(); i++) {
    if (k > 0 && st[k - 1].dev == st[i].dev && st[k - 1].bucket == st[i].bucket) {
      st[k - 1].live += st[i].live;
      st[k - 1].cached += st[i].cached;
    } else {
      st[k++] = st[i];
    }
  }
  usize kept = 0;
  for (usize i = 0; i < k; i++)
    if (st[i].live != 0 || st[i].cached != 0) st[kept++] = st[i];
  st.Resize(kept).IgnoreError();  // (shrinking)
  // The accounting totals it changes: its sets' (one change per set:
  // AddSet summed them) and the reserved blocks'.
  for (const Delta::SetChange& c : delta.sets)
    if (c.sectors != 0) TFS_TRY(cc->acct.PushBack(alloc::AcctChange{alloc::AcctKind::kReplicas, c.members, c.sectors}));
  const i64 reserved = (i64(delta.reserved) - i64(delta.unreserved)) * kSectors;
  if (reserved != 0) TFS_TRY(cc->acct.PushBack(alloc::AcctChange{alloc::AcctKind::kReserved, 0, reserved}));
  if (kept == 0 && cc->acct.empty()) return Status::Ok();
  TFS_TRY(cc->acct_staged.Resize(cc->acct.size()));
  // A record's slot per bucket, in stage order, then a slot per total
  // (their bytes: PrepareCounts).
  for (usize i = 0; i < kept; i++) {
    const u32 slot = TFS_TRY(tx->SetLater(btree::Pos{btree::kBtreeAlloc, st[i].dev, st[i].bucket},
                                          u32(sizeof(alloc::AllocRecord))));
    if (i == 0) cc->first_slot = slot;
  }
  for (usize i = 0; i < cc->acct.size(); i++) {
    const alloc::AcctChange& c = cc->acct[i];
    const u32 slot = TFS_TRY(
        tx->SetLater(btree::Pos{btree::kBtreeAlloc, alloc::AcctInode(c.kind), c.offset}, u32(sizeof(alloc::AcctRecord))));
    if (i == 0) cc->first_acct_slot = slot;
  }
  TFS_TRY(HoldGains(delta, cc));
  cc->dp = this;
  cc->hook = btree::CommitHook{PrepareCounts, FinishCounts, cc};
  tx->SetCommitHook(&cc->hook);
  return Status::Ok();
}

Status DataPath::HoldGains(const Delta& delta, CommitCounts* cc) {
  // The invariant PublishCounts relies on (allocator.h): a bucket with a
  // change in flight is neither freed nor reallocated until the change is
  // published. A loss is held by the counted pointer it removes; a gain is
  // held here -- a new write's bucket has its pending blocks already, but a
  // new pointer into a blob committed before (a copy of another extent's)
  // has nothing else, and the blob's own extent may be punched meanwhile.
  // (A bucket the delta has pending blocks in is held by them until Apply or
  // Abort already: no hold of its own.)
  auto needs_hold = [&](const alloc::CountStage& s) {
    if (s.live <= 0 && s.cached <= 0) return false;
    for (const Delta::Change& c : delta.changes)
      if (c.pending > 0 && c.dev == s.dev && c.bucket == s.bucket) return false;
    return true;
  };
  bool check = false;  // a gain with no pending blocks: its bucket may have gone since the caller read it
  for (const Delta::Change& c : delta.changes) {
    if (c.blocks <= 0 && c.cached <= 0) continue;
    if (c.gen > 0xff || c.dev >= dev::kMaxDevices || c.bucket >= held_[c.dev].size()) return Err::kInvalidArgument;
    check |= c.pending == 0;
  }
  u32 n = 0;
  for (const alloc::CountStage& s : cc->stages) n += needs_hold(s);
  if (!check && n == 0) return Status::Ok();  // (a write: its pending blocks hold its buckets)
  TFS_TRY(cc->holds.Reserve(n));
  const alloc::Allocator& a = store_->alloc();
  MutexLock l(acct_mu_);
  for (const Delta::Change& c : delta.changes) {
    if ((c.blocks <= 0 && c.cached <= 0) || c.pending > 0) continue;
    const alloc::Bucket k = a.Get(c.dev, c.bucket);
    if (k.state != alloc::BucketState::kUser || k.gen != c.gen || (held_[c.dev][c.bucket] & kFreeing) != 0) {
      // Freed (or being freed, or reused) since the caller read the pointer:
      // its blob is gone. Not damage: the caller looks again.
      ctr_.gains_refused.FetchAdd(1, MemOrder::kRelaxed);
      return Err::kAgain;
    }
  }
  for (const alloc::CountStage& s : cc->stages) {
    if (!needs_hold(s)) continue;
    pending_[s.dev][s.bucket]++;
    cc->holds.PushBack(alloc::BucketRef{s.dev, s.bucket, a.Get(s.dev, s.bucket).gen}).IgnoreError();  // reserved
  }
  return Status::Ok();
}

void DataPath::DropHolds(CommitCounts* cc) {
  for (const alloc::BucketRef& h : cc->holds) Account(h.dev, h.bucket, -1);
  cc->holds.Clear();
}

Status DataPath::PrepareCounts(void* ctx, btree::Transaction* tx) {
  auto* cc = static_cast<CommitCounts*>(ctx);
  Vector<alloc::CountStage>& st = cc->stages;
  store::Store* store = cc->dp->store_;
  if (!st.empty()) TFS_TRY(store->alloc().StageCounts(st.data(), u32(st.size()), &cc->note));
  for (usize i = 0; i < st.size(); i++) MemCopy(tx->LaterValue(cc->first_slot + u32(i)), &st[i].rec, sizeof(st[i].rec));
  return store::StageAcctInto(store, tx, cc->first_acct_slot, cc->acct.data(), u32(cc->acct.size()),
                              cc->acct_staged.data());
}

void DataPath::FinishCounts(void* ctx, u64 /*seq*/, bool journaled) {
  auto* cc = static_cast<CommitCounts*>(ctx);
  if (!journaled) return;  // nothing published: the counts stay the last journaled ones
  store::Store* store = cc->dp->store_;
  if (!cc->stages.empty()) store->alloc().PublishCounts(cc->stages.data(), u32(cc->stages.size()), &cc->note);
  if (!cc->acct.empty()) store->acct().Publish(cc->acct_staged.data(), u32(cc->acct_staged.size()));
  cc->published = true;
}

void DataPath::Apply(const Delta& delta, CommitCounts* cc, bool frees) {
  // The counts moved with the commit (published by its hook); what the
  // writes reserved is released now, and the holds, and a bucket the commit
  // emptied that nothing else holds is freed -- checked at the generation
  // it was emptied at, so a bucket freed and reused meanwhile is left alone.
  for (const Delta::Change& c : delta.changes) {
    if (c.blocks < 0) ctr_.blocks_released.FetchAdd(u64(-c.blocks), MemOrder::kRelaxed);
    if (c.pending > 0) Account(c.dev, c.bucket, -c.pending);
  }
  DropHolds(cc);
  if (cc->published && frees) {
    for (const alloc::CountStage& s : cc->stages)
      if (s.changed && s.b.live_sectors == 0 && s.b.cached_sectors == 0) Account(s.dev, s.bucket, 0, s.b.gen);
  }
  if (delta.unreserved > 0) {
    // More released than the sum holds: the reserved total the mount took
    // was too low (damage the mount cannot see; fsck recounts it). Stops
    // at 0, counted -- never a crash (review of 3b-5b, finding 4).
    MutexLock a(acct_mu_);
    const u64 take = Min(delta.unreserved, reserved_);
    if (take != delta.unreserved) ctr_.reserve_underflows.FetchAdd(1, MemOrder::kRelaxed);
    reserved_ -= take;
  }
}

void DataPath::Abort(const Delta& delta) {
  // The space reserved for it is unreferenced: its bucket may go once empty.
  for (const Delta::Change& c : delta.changes)
    if (c.pending > 0) Account(c.dev, c.bucket, -c.pending);
  if (delta.reserved > 0) {
    // (An Apply that released more than the sum held -- a reserved total
    // too low -- may have taken this delta's blocks already: stop at 0.)
    MutexLock a(acct_mu_);
    const u64 take = Min(delta.reserved, reserved_);
    if (take != delta.reserved) ctr_.reserve_underflows.FetchAdd(1, MemOrder::kRelaxed);
    reserved_ -= take;
  }
}

bool DataPath::Pin(u32 dev, u64 bucket, u8 gen) {
  MutexLock a(acct_mu_);
  const alloc::Bucket k = store_->alloc().Get(dev, bucket);
  if (k.gen != gen || k.state != alloc::BucketState::kUser) return false;
  if ((held_[dev][bucket] & kFreeing) != 0) return false;  // decided: the Free is on its way
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
    // The last read of a bucket emptied meanwhile: free it now -- if it is
    // still empty (a commit's gain may have held it since: HoldGains).
    r = 0;
    if (!ReleaseLocked(dev, bucket, &ref)) return;
  }
  FreeReleased(&ref, 1).IgnoreError();  // (counted; a failed Free: the next mount)
}

void DataPath::BucketCounts(u32 dev, u64 bucket, u32* live, u32* cached) const {
  const alloc::Bucket k = store_->alloc().Get(dev, bucket);  // (outside the members: counts 0)
  *live = k.live_sectors / (kBlockSize / 512);
  *cached = k.cached_sectors / (kBlockSize / 512);
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
