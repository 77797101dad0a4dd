// Bucket allocator with watermark reserves; every change persisted as a
// record of the alloc btree through the Store's sink (see allocator.h and
// docs/format/alloc.md).
//
// Invariants: every bucket in state kFree is on exactly one of free_list
// (reusable), blocked (settled, but at the generation guard: GenGap(gen,
// oldest_gen) == kGenGuard) or pending (its free not yet settled); every
// bucket's GenGap is at most kGenGuard, and below it for every bucket that
// is not free (so a free, one generation more, stays within it: KeepBelowGuard
// where a state is set other than by an allocation); free_count ==
// free_list.size(); a bucket's version only grows, by one per change, and
// the record handed to the sink carries the version it was changed to; a
// member's sums (Usage) are its buckets' summed: every change of a bucket's
// state or counts is made inside a Resum, which moves the bucket's share
// (SumsMatchScan recounts them; checked builds do in Usage).
#include "alloc/allocator.h"

#include "platform/platform.h"
#include "util/sort.h"

namespace tfs::alloc {
namespace {

u8 DataBit(BucketState purpose) {
  switch (purpose) {
    case BucketState::kBtree: return sb::kDataBtree;
    case BucketState::kJournal: return sb::kDataJournal;
    case BucketState::kUser:
    case BucketState::kCached: return sb::kDataUser;
    default: return 0;
  }
}

// A bucket taking a state other than free keeps its gen below the guard
// (the file's invariants), so that its free -- one generation more --
// stays within it: oldest_gen raised to kGenGuard - 1 generations behind
// at most. Pointers older than that may remain: fsck's check then calls
// them older than the bucket's oldest generation. Only RepairState of a
// free bucket at the guard's last generation gets here (the mount's
// reconciliation of a node bucket whose allocation a cut lost, while a
// stale cached pointer into it was 95 generations old), and fsck -y drops
// such a pointer.
// Raises oldest_gen so that gen is at most `most` generations past it.
void CapGenGap(Bucket& bk, u8 most) {
  if (GenGap(bk.gen, bk.oldest_gen) > most) bk.oldest_gen = u8(bk.gen - most);
}
void KeepBelowGuard(Bucket& bk) { CapGenGap(bk, kGenGuard - 1); }

// A bucket as an absent record leaves it.
Bucket AbsentBucket(const sb::Member& m, u64 b) {
  Bucket bk;
  bk.state = LayoutState(m, b);
  return bk;
}

// Adds bucket b's share to a member's sums, or takes it out.
void AddShare(BucketSums& s, const Bucket& b, bool add) {
  if (add) {
    s.by_state[u8(b.state)]++;
    s.live_sectors += b.live_sectors;
    s.cached_sectors += b.cached_sectors;
  } else {
    s.by_state[u8(b.state)]--;
    s.live_sectors -= b.live_sectors;
    s.cached_sectors -= b.cached_sectors;
  }
}

// Keeps a member's sums right across a change of one of its buckets (mu_
// held): the bucket's share out now, its new share in at the end of the
// scope -- whatever the scope changed, or did not.
class Resum {
 public:
  Resum(BucketSums& s, const Bucket& b) : s_(s), b_(b) { AddShare(s_, b_, false); }
  ~Resum() { AddShare(s_, b_, true); }
  Resum(const Resum&) = delete;
  Resum& operator=(const Resum&) = delete;

 private:
  BucketSums& s_;
  const Bucket& b_;
};

}  // namespace

const char* BucketStateName(BucketState s) {
  switch (s) {
    case BucketState::kFree: return "free";
    case BucketState::kSb: return "superblock";
    case BucketState::kJournal: return "journal";
    case BucketState::kBtree: return "btree";
    case BucketState::kUser: return "user";
    case BucketState::kCached: return "cached";
  }
  return "unknown";
}

BucketState LayoutState(const sb::Member& m, u64 b) {
  if (m.journal_nbuckets > 0 && b >= m.journal_first_bucket &&
      b < m.journal_first_bucket + m.journal_nbuckets)
    return BucketState::kJournal;
  return BucketState::kFree;
}

const char* WatermarkName(Watermark w) {
  switch (w) {
    case Watermark::kBackground: return "background";
    case Watermark::kForeground: return "foreground";
    case Watermark::kCopygc: return "copygc";
    case Watermark::kBtree: return "btree";
    case Watermark::kJournal: return "journal";
  }
  return "unknown";
}

u64 MaxCountSectors(const sb::Superblock& sb, BucketState state) {
  const u64 sectors = sb.bucket_size / 512;
  return state == BucketState::kUser || state == BucketState::kCached ? sectors * kCountFactor : sectors;
}

void EncodeRecord(const Bucket& b, AllocRecord* out) {
  MemSet(out, 0, sizeof(*out));
  out->gen = b.gen;
  out->oldest_gen = b.oldest_gen;
  out->state = u8(b.state);
  out->live_sectors.set(b.live_sectors);
  out->cached_sectors.set(b.cached_sectors);
  out->version.set(b.version);
}

Status ParseRecord(const sb::Superblock& sb, u64 dev, u64 bucket, const void* val, u32 len, Bucket* out,
                   Diag* diag) {
  if (dev >= sb.nr_members)
    return DiagError(diag, Err::kCorrupt, "alloc: record of member %llu bucket %llu: no such member",
                     (unsigned long long)dev, (unsigned long long)bucket);
  const sb::Member& m = sb.members[dev];
  if (bucket >= m.nbuckets)
    return DiagError(diag, Err::kCorrupt, "alloc: member %s bucket %llu: outside the member's %llu buckets",
                     m.label, (unsigned long long)bucket, (unsigned long long)m.nbuckets);
  auto bad = [&](const char* what, unsigned long long v) {
    return DiagError(diag, Err::kCorrupt, "alloc: member %s bucket %llu: %s %llu", m.label,
                     (unsigned long long)bucket, what, v);
  };
  if (len != sizeof(AllocRecord)) return bad("record of bad size", len);
  AllocRecord r;
  MemCopy(&r, val, sizeof(r));
  if (r.state >= kBucketStateCount) return bad("unknown state", r.state);
  if (r.reserved0 != 0 || r.reserved1.get() != 0)
    return bad("nonzero reserved field", r.reserved0 != 0 ? r.reserved0 : r.reserved1.get());
  const BucketState state = BucketState(r.state);
  const u64 most = MaxCountSectors(sb, state);  // (logical sectors: compressed data counts more than it takes)
  if (r.live_sectors.get() > most) return bad("live sectors beyond what the bucket can count:", r.live_sectors.get());
  if (r.cached_sectors.get() > most)
    return bad("cached sectors beyond what the bucket can count:", r.cached_sectors.get());
  if (state == BucketState::kFree && (r.live_sectors.get() != 0 || r.cached_sectors.get() != 0))
    return bad("free, yet with live or cached sectors:", r.live_sectors.get() + u64(r.cached_sectors.get()));
  const BucketState layout = LayoutState(m, bucket);
  if ((layout == BucketState::kJournal) != (state == BucketState::kJournal) || state == BucketState::kSb)
    return DiagError(diag, Err::kCorrupt, "alloc: member %s bucket %llu: state %s where the layout has %s", m.label,
                     (unsigned long long)bucket, BucketStateName(state), BucketStateName(layout));
  if (state == BucketState::kJournal && (r.live_sectors.get() != 0 || r.cached_sectors.get() != 0))
    return bad("journal, yet with live or cached sectors:", r.live_sectors.get() + u64(r.cached_sectors.get()));
  // (The member's allowed data is fixed at format: nothing allocates a
  // bucket for data it does not allow.)
  if (state != BucketState::kFree && (m.data_allowed & DataBit(state)) == 0)
    return DiagError(diag, Err::kCorrupt, "alloc: member %s bucket %llu: state %s on a member that does not allow it",
                     m.label, (unsigned long long)bucket, BucketStateName(state));
  if (GenGap(r.gen, r.oldest_gen) > kGenGuard)
    return bad("oldest_gen further behind gen than the generation guard allows:", r.oldest_gen);
  if (state != BucketState::kFree && GenGap(r.gen, r.oldest_gen) == kGenGuard)
    return bad("in use, yet at the generation guard: oldest_gen", r.oldest_gen);
  if (r.version.get() >= kRecordVersionLimit) return bad("version out of range:", r.version.get());
  out->gen = r.gen;
  out->oldest_gen = r.oldest_gen;
  out->state = state;
  out->recorded = true;
  out->live_sectors = r.live_sectors.get();
  out->cached_sectors = r.cached_sectors.get();
  out->version = r.version.get();
  return Status::Ok();
}

Status Allocator::Init(const sb::Superblock& sb) {
  sb_ = sb;
  nr_ = sb.nr_members;
  for (u32 i = 0; i < nr_; i++) {
    const sb::Member& m = sb.members[i];
    Dev& d = devices_[i];
    TFS_TRY(d.buckets.Resize(m.nbuckets));
    TFS_TRY(d.free_list.Reserve(m.nbuckets));
    TFS_TRY(d.pending.Reserve(m.nbuckets));
    TFS_TRY(d.blocked.Reserve(m.nbuckets));
    d.data_allowed = m.data_allowed;
    d.reserves.btree = Max<u64>(1, m.nbuckets / 128);
    d.reserves.copygc = Max<u64>(1, m.nbuckets / 128);
    d.reserves.foreground = Max<u64>(2, m.nbuckets / 64);
  }
  BeginLoad();
  return Finish();
}

void Allocator::SetPersist(PersistFn fn, void* ctx) {
  MutexLock lock(mu_);
  persist_ = fn;
  persist_ctx_ = ctx;
}

void Allocator::GetPersist(PersistFn* fn, void** ctx) const {
  MutexLock lock(mu_);
  *fn = persist_;
  *ctx = persist_ctx_;
}

void Allocator::SetJournal(journal::Journal* journal) {
  MutexLock lock(mu_);
  journal_ = journal;
}

void Allocator::BeginLoad() {
  MutexLock lock(mu_);
  for (u32 i = 0; i < nr_; i++) {
    Dev& d = devices_[i];
    for (u64 b = 0; b < d.buckets.size(); b++) d.buckets[b] = AbsentBucket(sb_.members[i], b);
  }
  ResumAllLocked();
  stats_.records_loaded = 0;
}

Status Allocator::LoadRecord(u64 dev, u64 bucket, const void* val, u32 len, Diag* diag) {
  Bucket b;
  Status st = ParseRecord(sb_, dev, bucket, val, len, &b, diag);
  if (!st.ok()) {
    if (dev < nr_ && bucket < devices_[dev].buckets.size()) {
      // The bucket keeps its state, but a rebuild must replace the record:
      // one is written for it (recorded), with a version past the bad one's
      // when the merge rule would otherwise keep that (a plausible value).
      MutexLock lock(mu_);
      Bucket& cur = devices_[dev].buckets[bucket];
      cur.recorded = true;
      u64 v;
      if (RecordPlausible(val, len, &v)) cur.version = Max(cur.version, v);
    }
    return st;
  }
  MutexLock lock(mu_);
  Bucket& cur = devices_[dev].buckets[bucket];
  if (cur.recorded && cur.version >= b.version) return Status::Ok();  // a newer one is loaded
  if (!cur.recorded) stats_.records_loaded++;
  Resum r(devices_[dev].sums, cur);
  cur = b;
  return Status::Ok();
}

Status Allocator::Finish() {
  MutexLock lock(mu_);
  for (u32 i = 0; i < nr_; i++) {
    Dev& d = devices_[i];
    d.free_list.Clear();
    d.blocked.Clear();
    d.free_count = 0;
    d.pending.Clear();  // (load and rebuild only: nothing is pending or held then)
    for (u64 b = d.buckets.size(); b-- > 0;) {
      if (d.buckets[b].state == BucketState::kFree) ListFreeLocked(d, b, false);  // (capacity reserved at Init)
    }
  }
  held_ = 0;
  return Status::Ok();
}

Result<u64> Allocator::FreeEmptyUserBuckets() {
  Vector<BucketRef> refs;
  {
    MutexLock lock(mu_);
    for (u32 i = 0; i < nr_; i++) {
      const Dev& d = devices_[i];
      for (u64 b = 0; b < d.buckets.size(); b++) {
        const Bucket& bk = d.buckets[b];
        if (bk.state != BucketState::kUser || bk.unrecorded || bk.live_sectors != 0 || bk.cached_sectors != 0)
          continue;
        TFS_TRY(refs.PushBack(BucketRef{i, b, bk.gen}));
      }
    }
  }
  u32 freed = 0;
  Status st = FreeBuckets(refs.data(), u32(refs.size()), &freed);
  {
    MutexLock lock(mu_);
    stats_.empty_freed_at_mount += freed;
  }
  TFS_TRY(st);
  return u64(freed);
}

u64 Allocator::UserLiveSectors() const {
  MutexLock lock(mu_);
  u64 sum = 0;
  for (u32 i = 0; i < nr_; i++)
    for (const Bucket& bk : devices_[i].buckets)
      if (bk.state == BucketState::kUser) sum += bk.live_sectors;
  return sum;
}

void Allocator::BeginRebuild() {
  MutexLock lock(mu_);
  TFS_BUG_ON(journal_ != nullptr);
  for (u32 i = 0; i < nr_; i++) {
    Dev& d = devices_[i];
    for (u64 b = 0; b < d.buckets.size(); b++) {
      Bucket& bk = d.buckets[b];
      bk.state = LayoutState(sb_.members[i], b);
      bk.live_sectors = 0;
      bk.cached_sectors = 0;
      bk.unrecorded = false;
      bk.version++;  // past every record in the tree (a bad one was never loaded: it is replaced anyway)
    }
  }
  ResumAllLocked();
}

bool Allocator::RebuildMark(u32 dev, u64 bucket, BucketState state, u8 gen) {
  MutexLock lock(mu_);
  if (dev >= nr_ || bucket >= devices_[dev].buckets.size()) return false;
  Bucket& bk = devices_[dev].buckets[bucket];
  if (bk.state == BucketState::kSb || bk.state == BucketState::kJournal) return false;  // the layout's
  if ((bk.state == BucketState::kBtree || bk.state == BucketState::kUser) && bk.state != state) return false;
  // Two generations point in: the newer one's data is there now (a bucket
  // is freed, gen bumped, before it is reused); the older extents are stale.
  if (bk.state == state && state == BucketState::kUser && bk.gen != gen && u8(gen - bk.gen) > 127) return true;
  Resum r(devices_[dev].sums, bk);
  bk.state = state;
  if (state == BucketState::kUser) bk.gen = gen;  // btree buckets keep theirs (node pointers carry none)
  // (A record must stay within the guard; the data pass drops the stale
  // cached pointers and raises oldest_gen after.)
  KeepBelowGuard(bk);
  return true;
}

bool Allocator::RebuildCount(u32 dev, u64 bucket, bool cached, u32 sectors) {
  MutexLock lock(mu_);
  if (dev >= nr_ || bucket >= devices_[dev].buckets.size()) return false;
  Bucket& bk = devices_[dev].buckets[bucket];
  if (bk.state != BucketState::kUser) return false;
  Resum r(devices_[dev].sums, bk);
  u32& count = cached ? bk.cached_sectors : bk.live_sectors;
  count = u32(Min<u64>(u64(count) + sectors, MaxCountSectors(sb_, bk.state)));
  return true;
}

Status Allocator::EndRebuild() {
  TFS_TRY(Finish());
  // A record for every bucket that has one (a bad one included: the merge
  // rule replaces an implausible value whatever its version) or is not in
  // its absent-record state.
  Vector<RecordChange> changes;
  {
    MutexLock lock(mu_);
    u64 n = 0;
    for (u32 i = 0; i < nr_; i++) {
      for (u64 b = 0; b < devices_[i].buckets.size(); b++) {
        const Bucket& bk = devices_[i].buckets[b];
        const Bucket absent = AbsentBucket(sb_.members[i], b);
        n += bk.recorded || bk.state != absent.state || bk.gen != 0 || bk.live_sectors != 0 || bk.cached_sectors != 0;
      }
    }
    TFS_TRY(changes.Reserve(n));
    for (u32 i = 0; i < nr_; i++) {
      for (u64 b = 0; b < devices_[i].buckets.size(); b++) {
        Bucket& bk = devices_[i].buckets[b];
        const Bucket absent = AbsentBucket(sb_.members[i], b);
        if (!(bk.recorded || bk.state != absent.state || bk.gen != 0 || bk.live_sectors != 0 || bk.cached_sectors != 0))
          continue;
        TFS_BUG_ON(bk.unrecorded);  // (a rebuild runs before anything allocates: BeginRebuild cleared it)
        bk.recorded = true;
        changes.PushBack(RecordChange{i, b, bk}).IgnoreError();  // reserved
      }
    }
  }
  if (changes.empty()) return Status::Ok();
  return Persist(changes.data(), u32(changes.size()), BucketState::kFree).status();
}

Result<u64> Allocator::RebaseVersions() {
  Vector<RecordChange> changes;
  {
    MutexLock lock(mu_);
    TFS_BUG_ON(journal_ != nullptr);
    u64 n = 0;
    for (u32 i = 0; i < nr_; i++)
      for (const Bucket& bk : devices_[i].buckets) n += bk.version >= kRecordVersionRebase;
    if (n == 0) return u64(0);
    TFS_TRY(changes.Reserve(n));
    for (u32 i = 0; i < nr_; i++) {
      for (u64 b = 0; b < devices_[i].buckets.size(); b++) {
        Bucket& bk = devices_[i].buckets[b];
        if (bk.version < kRecordVersionRebase) continue;
        TFS_BUG_ON(bk.unrecorded);  // (before the journal runs: nothing allocated yet)
        bk.version = 1;
        bk.recorded = true;
        RecordChange c{i, b, bk};
        c.replace = true;
        changes.PushBack(c).IgnoreError();  // reserved
      }
    }
    stats_.rebased_records += n;
  }
  platform::Log(platform::LogLevel::kWarn, "alloc: %llu allocation records had versions of 2^47 or more: started "
                "again at 1", (unsigned long long)changes.size());
  TFS_TRY(Persist(changes.data(), u32(changes.size()), BucketState::kFree).status());
  return u64(changes.size());
}

Result<u64> Allocator::Persist(const RecordChange* changes, u32 n, BucketState owner, PersistProgress* progress) {
  PersistFn fn;
  void* ctx;
  {
    MutexLock lock(mu_);
    fn = persist_;
    ctx = persist_ctx_;
  }
  PersistProgress local;
  if (progress == nullptr) progress = &local;
  *progress = PersistProgress{};
  if (fn == nullptr || n == 0) {
    progress->committed = n;
    return u64(0);
  }
  Result<u64> r = fn(ctx, changes, n, owner, progress);
  MutexLock lock(mu_);
  stats_.record_commits += progress->transactions;
  if (r.ok()) {
    stats_.records += n;
  } else {
    stats_.records += progress->committed;
    stats_.record_errors++;
  }
  return r;
}

void Allocator::SetMetadataNeed(u32 dev, u64 buckets, u64 held) {
  if (dev >= nr_) return;
  devices_[dev].metadata_held.Store(held, MemOrder::kRelaxed);
  devices_[dev].metadata_need.Store(buckets, MemOrder::kRelaxed);
}

namespace {
// The btree reserve in force: the declared need plus growth room for the
// dirty set to double (at least the fixed share) before the next checkpoint
// -- the whole need's, the buckets the btree holds ahead included (the need
// is declared net of them).
u64 BtreeReserve(const Reserves& r, u64 need, u64 held) { return need + Max<u64>(r.btree, need + held); }
}  // namespace

bool Allocator::MetadataShortLocked(bool growth) const {
  for (u32 i = 0; i < nr_; i++) {
    const Dev& d = devices_[i];
    const u64 need = d.metadata_need.Load(MemOrder::kRelaxed);
    if (need == 0) continue;
    const u64 want = growth ? BtreeReserve(d.reserves, need, d.metadata_held.Load(MemOrder::kRelaxed))
                            : need + d.reserves.copygc;
    if (d.free_count + d.pending.size() < want) return true;
  }
  return false;
}

bool Allocator::MetadataRoom() {
  MutexLock lock(mu_);
  if (!MetadataShortLocked(false)) return true;
  stats_.metadata_refused++;
  return false;
}

bool Allocator::MetadataShort() const {
  MutexLock lock(mu_);
  return MetadataShortLocked(false);
}

bool Allocator::MetadataTight() const {
  MutexLock lock(mu_);
  return MetadataShortLocked(true);
}

u64 Allocator::FreeFloor(u32 dev, Watermark wm) const {
  const Dev& d = devices_[dev];
  const Reserves& r = d.reserves;
  const u64 btree =
      BtreeReserve(r, d.metadata_need.Load(MemOrder::kRelaxed), d.metadata_held.Load(MemOrder::kRelaxed));
  switch (wm) {
    case Watermark::kBackground: return r.foreground + r.copygc + btree;
    case Watermark::kForeground: return r.copygc + btree;
    case Watermark::kCopygc: return btree;
    case Watermark::kBtree:
    case Watermark::kJournal: return 0;
  }
  return ~u64(0);
}

bool Allocator::Usable(u32 dev, BucketState purpose, Watermark wm) const {
  const Dev& d = devices_[dev];
  return ((UnavailableLocked() >> dev) & 1) == 0 && (d.data_allowed & DataBit(purpose)) != 0 &&
         d.free_count > FreeFloor(dev, wm);
}

void Allocator::SetUnavailable(dev::DevMask mask) {
  MutexLock lock(mu_);
  unavailable_ = mask;
}

void Allocator::WatchFailed(const Atomic<dev::DevMask>* failed) {
  MutexLock lock(mu_);
  failed_ = failed;
}

dev::DevMask Allocator::unavailable() const {
  MutexLock lock(mu_);
  return UnavailableLocked();
}

template <typename Release>
u64 Allocator::ReleaseWhere(Dev& d, Release release) {
  usize keep = 0;
  u64 n = 0;
  for (usize i = 0; i < d.pending.size(); i++) {
    if (release(d.pending[i].seq)) {
      ListFreeLocked(d, d.pending[i].bucket);
      n++;
    } else {
      d.pending[keep++] = d.pending[i];
    }
  }
  d.pending.Resize(keep).IgnoreError();  // shrinking never allocates
  return n;
}

void Allocator::ReleasePending(Dev& d, u64 settled_seq) {
  ReleaseWhere(d, [settled_seq](u64 seq) { return seq <= settled_seq && seq != kHeld; });
}

u64 Allocator::HoldFree(u32 dev, const u64* buckets, usize n) {
  MutexLock lock(mu_);
  TFS_BUG_ON(journal_ != nullptr);
  if (dev >= nr_ || n == 0) return 0;
  Dev& d = devices_[dev];
  auto listed = [&](u64 b) {
    const usize at = LowerBound(buckets, n, [b](u64 x) { return x < b; });
    return at < n && buckets[at] == b;
  };
  u64 held = 0;
  for (usize i = 0; i < d.free_list.size();) {
    const u64 b = d.free_list[i];
    if (!listed(b)) {
      i++;
      continue;
    }
    d.free_list[i] = d.free_list.back();  // (the swapped-in entry is looked at next)
    d.free_list.PopBack();
    d.free_count--;
    d.pending.PushBack(Dev::Pending{b, kHeld}).IgnoreError();  // capacity reserved at Init
    held++;
  }
  held_ += held;
  stats_.replay_held += held;
  return held;
}

u64 Allocator::ReleaseHeldLocked() {
  u64 n = 0;
  for (u32 i = 0; i < nr_ && held_ != 0; i++) n += ReleaseWhere(devices_[i], [](u64 seq) { return seq == kHeld; });
  held_ = 0;
  return n;
}

u64 Allocator::ReleaseHeld() {
  MutexLock lock(mu_);
  return ReleaseHeldLocked();
}

u64 Allocator::HeldTaken() const {
  MutexLock lock(mu_);
  return stats_.replay_held_taken;
}

void Allocator::ListFreeLocked(Dev& d, u64 b, bool count) {
  const Bucket& bk = d.buckets[b];
  if (GenGap(bk.gen, bk.oldest_gen) >= kGenGuard) {
    d.blocked.PushBack(b).IgnoreError();  // capacity reserved at Init (each bucket listed once)
    stats_.gen_guard_blocked += count;
    return;
  }
  d.free_list.PushBack(b).IgnoreError();  // capacity reserved at Init
  d.free_count++;
}

bool Allocator::UnlistBlockedLocked(Dev& d, u64 b) {
  for (usize i = 0; i < d.blocked.size(); i++) {
    if (d.blocked[i] != b) continue;
    d.blocked[i] = d.blocked.back();
    d.blocked.PopBack();
    return true;
  }
  return false;
}

void Allocator::UnlistFreeLocked(Dev& d, u64 b) {
  for (usize i = 0; i < d.free_list.size(); i++) {
    if (d.free_list[i] != b) continue;
    d.free_list[i] = d.free_list.back();
    d.free_list.PopBack();
    d.free_count--;
    return;
  }
  if (UnlistBlockedLocked(d, b)) return;
  for (usize i = 0; i < d.pending.size(); i++) {
    if (d.pending[i].bucket != b) continue;
    if (d.pending[i].seq == kHeld) held_--;
    d.pending[i] = d.pending.back();
    d.pending.PopBack();
    return;
  }
}

Result<BucketRef> Allocator::Allocate(dev::DevMask target, dev::DevMask fallback,
                                      BucketState purpose, Watermark wm) {
  return AllocateWith(target, fallback, purpose, wm, true);
}

void Allocator::SetAllocFaultForTest(AllocFaultFn fn, void* ctx) {
  MutexLock lock(mu_);
  alloc_fault_ = fn;
  alloc_fault_ctx_ = ctx;
}

Result<BucketRef> Allocator::AllocateUnrecorded(dev::DevMask target, dev::DevMask fallback, Watermark wm) {
  return AllocateWith(target, fallback, BucketState::kUser, wm, false);
}

Result<BucketRef> Allocator::AllocateWith(dev::DevMask target, dev::DevMask fallback, BucketState purpose,
                                          Watermark wm, bool record) {
  if (purpose == BucketState::kFree || purpose == BucketState::kSb || purpose == BucketState::kJournal ||
      u8(wm) > u8(Watermark::kJournal))
    return Err::kInvalidArgument;
  bool pending_seen = false;
  Result<BucketRef> r = TryAllocate(target, fallback, purpose, wm, record, &pending_seen);
  if (r.ok() || !pending_seen || journal_ == nullptr) return r;
  // Only buckets whose free is not yet settled are left: settle it (a durable
  // free in an unordered journal entry settles with the next durable entry).
  {
    MutexLock lock(mu_);
    stats_.flush_waits++;
  }
  TFS_TRY(journal_->Settle());
  return TryAllocate(target, fallback, purpose, wm, record, &pending_seen);
}

Result<BucketRef> Allocator::TryAllocate(dev::DevMask target, dev::DevMask fallback,
                                         BucketState purpose, Watermark wm, bool record, bool* pending_seen) {
  // Reuse waits for settled, not just durable: replay may still read what the
  // newest unordered entry's group wrote to check it (journal.h, settled_seq).
  journal::Journal* const journal = journal_;
  u64 settled = journal != nullptr ? journal->settled_seq() : ~u64(0);
  BucketRef ref;
  RecordChange change;
  {
    MutexLock lock(mu_);
    if (alloc_fault_ != nullptr) TFS_TRY(alloc_fault_(alloc_fault_ctx_, purpose, record));  // (tests)
    for (u32 i = 0; i < nr_; i++) {
      if (!devices_[i].pending.empty()) ReleasePending(devices_[i], settled);
    }
    auto pick = [&]() {  // the member with the most free buckets, targets first
      i32 best = -1;
      for (int pass = 0; pass < 2 && best < 0; pass++) {
        dev::DevMask mask = pass == 0 ? target : (fallback & ~target);
        for (u32 i : dev::Bits(mask)) {
          if (i >= nr_ || !Usable(i, purpose, wm)) continue;
          if (best < 0 || devices_[i].free_count > devices_[u32(best)].free_count) best = i32(i);
        }
        if (best >= 0 && pass == 1) stats_.fallbacks++;
      }
      return best;
    };
    i32 best = pick();
    if (best < 0 && held_ != 0) {
      // Only the mount's held buckets are left: better a mount whose next
      // cut may lose the newest group than one that fails (HoldFree).
      stats_.replay_held_taken += ReleaseHeldLocked();
      best = pick();
    }
    if (best < 0) {
      for (u32 i : dev::Bits((target | fallback) & all_devices() & ~UnavailableLocked())) {
        const Dev& d = devices_[i];
        if ((d.data_allowed & DataBit(purpose)) != 0 && d.free_count + d.pending.size() > FreeFloor(i, wm))
          *pending_seen = true;
      }
      if (!*pending_seen) stats_.refused[u8(wm)]++;
      return Err::kNoSpace;
    }
    Dev& d = devices_[u32(best)];
    u64 b = d.free_list.back();
    d.free_list.PopBack();
    d.free_count--;
    Bucket& bk = d.buckets[b];
    TFS_BUG_ON(bk.state != BucketState::kFree);
    {
      Resum r(d.sums, bk);
      bk.state = purpose;
      bk.live_sectors = 0;
      bk.cached_sectors = 0;
      if (record) {
        bk.version++;
        bk.recorded = true;
      } else {
        bk.unrecorded = true;  // (version kept: the first record is the next)
      }
    }
    stats_.allocs[u8(wm)]++;
    stats_.unrecorded_allocs += !record;
    ref = BucketRef{u32(best), b, bk.gen};
    change = RecordChange{u32(best), b, bk};
  }
  if (!record) return ref;
  Result<u64> seq = Persist(&change, 1, purpose);
  if (!seq.ok()) {
    // Handed to no one: back to the free list, or it would be lost until the
    // next mount. (Not journaled; or possibly, by a journal that failed:
    // then nothing commits any more. The version stays: it only grows.)
    MutexLock lock(mu_);
    Dev& d = devices_[ref.dev];
    Bucket& bk = d.buckets[ref.bucket];
    if (bk.state == purpose && bk.gen == ref.gen && bk.version == change.b.version) {
      Resum r(d.sums, bk);
      bk.state = BucketState::kFree;
      d.free_list.PushBack(ref.bucket).IgnoreError();  // capacity reserved at Init
      d.free_count++;
      stats_.allocs[u8(wm)]--;
    }
    return seq.status();
  }
  return ref;
}

bool Allocator::FreeLocked(u32 dev, const BucketRef& ref, RecordChange* change, BucketState* was, bool* persist) {
  if (ref.dev >= nr_ || ref.bucket >= devices_[ref.dev].buckets.size()) return false;
  Dev& d = devices_[ref.dev];
  Bucket& bk = d.buckets[ref.bucket];
  if (bk.gen != ref.gen || bk.state == BucketState::kFree || bk.state == BucketState::kSb ||
      bk.state == BucketState::kJournal)
    return false;
  *was = bk.state;
  *persist = !bk.unrecorded;
  if (bk.unrecorded) {
    // Never recorded: the tree says free with this generation, and no
    // journal entry, written or not, names it -- a transaction counting in
    // it publishes its record (PublishCounts clears the flag) as soon as
    // the journal takes its keys, before the entry is written, so a
    // transaction that failed before that left nothing anywhere, and one
    // after it recorded the bucket. Free again at once, nothing to commit,
    // no settle to wait for (no replay can check data in it).
    {
      Resum r(d.sums, bk);
      bk.state = BucketState::kFree;
      bk.live_sectors = 0;
      bk.cached_sectors = 0;
      bk.unrecorded = false;
    }
    stats_.frees++;
    stats_.unrecorded_frees++;
    ListFreeLocked(d, ref.bucket);  // (its generation kept: below the guard, as when it was allocated)
    return true;
  }
  {
    Resum r(d.sums, bk);
    // Nothing counted in it and nothing older behind: no pointer names it,
    // oldest_gen moves with gen. Else (its cached copies dropped, or stale
    // ones from before) the pointers stay behind and so does oldest_gen: the
    // guard counts this free.
    const bool none = bk.cached_sectors == 0 && bk.live_sectors == 0 && bk.oldest_gen == bk.gen;
    bk.gen++;
    if (none) bk.oldest_gen = bk.gen;
    // (Below the guard before, as every bucket not free: at most at it now.
    // Should that ever break, the record still stays valid.)
    CapGenGap(bk, kGenGuard);
    bk.state = BucketState::kFree;
    bk.live_sectors = 0;
    bk.cached_sectors = 0;
    bk.version++;
    bk.recorded = true;
  }
  stats_.frees++;
  *change = RecordChange{dev, ref.bucket, bk};
  if (journal_ == nullptr) {
    // Before the journal runs (the mount): nothing written survives a cut
    // unless the mount's checkpoint does, and then with the free.
    ListFreeLocked(d, ref.bucket);
  } else {
    // Pending from the change on: reused once the entry recording it is
    // settled. A free whose commit fails stays here for good.
    d.pending.PushBack(Dev::Pending{ref.bucket, kUnjournaled}).IgnoreError();  // reserved at Init
  }
  return true;
}

void Allocator::NotePendingSeq(u32 dev, u64 bucket, u64 seq) {
  Dev& d = devices_[dev];
  for (usize i = d.pending.size(); i-- > 0;) {  // just pushed: near the back
    if (d.pending[i].bucket == bucket && d.pending[i].seq == kUnjournaled) {
      d.pending[i].seq = seq;
      return;
    }
  }
}

Status Allocator::Free(const BucketRef& ref) {
  RecordChange change;
  BucketState was;
  bool persist;
  {
    MutexLock lock(mu_);
    if (!FreeLocked(ref.dev, ref, &change, &was, &persist)) return Err::kInvalidArgument;
  }
  if (!persist) return Status::Ok();
  // (Never a reclaim commit, whatever the bucket was: a checkpoint frees
  // its buckets with FreeBuckets.)
  Result<u64> seq = Persist(&change, 1, was == BucketState::kBtree ? BucketState::kFree : was);
  if (!seq.ok()) return seq.status();
  MutexLock lock(mu_);
  if (journal_ != nullptr) NotePendingSeq(ref.dev, ref.bucket, seq.value());
  return Status::Ok();
}

Status Allocator::FreeBuckets(const BucketRef* refs, u32 n, u32* freed) {
  u32 unused;
  if (freed == nullptr) freed = &unused;
  *freed = 0;
  if (n == 0) return Status::Ok();
  Vector<RecordChange> changes;
  TFS_TRY(changes.Reserve(n));
  Status first;
  BucketState owner = BucketState::kBtree;
  u32 unrecorded = 0;  // freed without a record
  {
    MutexLock lock(mu_);
    for (u32 i = 0; i < n; i++) {
      RecordChange c;
      BucketState was;
      bool persist;
      if (!FreeLocked(refs[i].dev, refs[i], &c, &was, &persist)) {
        if (first.ok()) first = Err::kInvalidArgument;
        continue;
      }
      if (!persist) {
        unrecorded++;
        continue;
      }
      if (was != BucketState::kBtree) owner = BucketState::kUser;  // (not only a checkpoint's)
      changes.PushBack(c).IgnoreError();  // reserved
    }
  }
  *freed = unrecorded;
  if (changes.empty()) return first;
  PersistProgress done;
  Result<u64> seq = Persist(changes.data(), u32(changes.size()), owner, &done);
  // The frees committed (all, or the pieces before a failed one: a batch
  // too big for one entry is split) become reusable once settled; the rest
  // stay pending for good, as a failed Free.
  MutexLock lock(mu_);
  const u32 committed = u32(Min<u64>(done.committed, changes.size()));
  *freed += committed;
  if (journal_ != nullptr)
    for (u32 i = 0; i < committed; i++) NotePendingSeq(changes[i].dev, changes[i].bucket, done.seq);
  if (!seq.ok()) return seq.status();
  return first;
}

Status Allocator::SetLiveSectors(const BucketRef& ref, u32 live_sectors) {
  RecordChange change;
  {
    MutexLock lock(mu_);
    if (ref.dev >= nr_ || ref.bucket >= devices_[ref.dev].buckets.size()) return Err::kInvalidArgument;
    Bucket& bk = devices_[ref.dev].buckets[ref.bucket];
    if (bk.gen != ref.gen || bk.state == BucketState::kFree) return Err::kInvalidArgument;
    if (u64(live_sectors) * 512 > sb_.bucket_size) return Err::kInvalidArgument;
    Resum r(devices_[ref.dev].sums, bk);
    bk.live_sectors = live_sectors;
    bk.version++;
    bk.recorded = true;
    bk.unrecorded = false;
    change = RecordChange{ref.dev, ref.bucket, bk};
  }
  // (Never a reclaim commit: no checkpoint counts sectors.)
  return Persist(&change, 1, change.b.state == BucketState::kBtree ? BucketState::kFree : change.b.state).status();
}

template <typename Edit>
Status Allocator::EditBuckets(u32 n, BucketState owner, u64* changed, Edit edit) {
  Vector<RecordChange> changes;
  TFS_TRY(changes.Reserve(n));
  Status first;
  {
    MutexLock lock(mu_);
    for (u32 i = 0; i < n; i++) {
      u32 dev;
      u64 bucket;
      const int r = edit(i, &dev, &bucket);
      if (r < 0 && first.ok()) first = Err::kInvalidArgument;
      if (r <= 0) continue;
      Bucket& bk = devices_[dev].buckets[bucket];
      bk.version++;
      bk.recorded = true;
      bk.unrecorded = false;
      changes.PushBack(RecordChange{dev, bucket, bk}).IgnoreError();  // reserved
    }
  }
  if (changed != nullptr) *changed = changes.size();
  if (!changes.empty()) TFS_TRY(Persist(changes.data(), u32(changes.size()), owner).status());
  return first;
}

Status Allocator::RaiseOldestGen(const OldestRaise* raises, u32 n, u64* raised, bool user_too) {
  // (Counted as made in memory, as every change is: a record commit that
  // fails is record_errors'; the raised bucket is back on the free list
  // either way.)
  return EditBuckets(n, BucketState::kFree, raised, [&](u32 i, u32* dev, u64* bucket) {  // (under mu_)
    const OldestRaise& r = raises[i];
    if (r.dev >= nr_ || r.bucket >= devices_[r.dev].buckets.size()) return -1;
    Dev& d = devices_[r.dev];
    Bucket& bk = d.buckets[r.bucket];
    // Newer than oldest_gen, not newer than gen: fewer generations behind.
    // A user bucket is left to the pass after its free: its record
    // changes only in its extent transactions while it is in use (a
    // staged count carries the version after the published one).
    if ((bk.state == BucketState::kUser && (!user_too || bk.unrecorded)) ||
        GenGap(bk.gen, r.oldest) >= GenGap(bk.gen, bk.oldest_gen))
      return 0;
    const bool was_blocked = GenGap(bk.gen, bk.oldest_gen) >= kGenGuard;
    bk.oldest_gen = r.oldest;
    stats_.oldest_raised++;
    // (A pending one is listed when it settles.)
    if (was_blocked && bk.state == BucketState::kFree && UnlistBlockedLocked(d, r.bucket)) {
      ListFreeLocked(d, r.bucket);  // (below the guard now: the free list)
      stats_.gen_guard_released++;
    }
    *dev = r.dev;
    *bucket = r.bucket;
    return 1;
  });
}

Status Allocator::StageCounts(CountStage* stages, u32 n, CountNote* note) {
  // (Nothing is counted or logged here: PublishCounts counts what a
  // journaled commit met, the committing thread logs the note.)
  Status result;
  MutexLock lock(mu_);
  for (u32 i = 0; i < n; i++) {
    CountStage& s = stages[i];
    if (s.dev >= nr_ || s.bucket >= devices_[s.dev].buckets.size()) {
      result = Err::kInvalidArgument;
      break;
    }
    const Bucket& cur = devices_[s.dev].buckets[s.bucket];
    s.b = cur;
    s.changed = false;
    s.live_underflow = s.cached_underflow = s.overflow = s.foreign_loss = false;
    if (cur.state != BucketState::kUser) {
      if (s.live > 0 || s.cached > 0) {
        *note = CountNote{"gains sectors, but is not a user bucket", true, s.dev, s.bucket, 0,
                          s.live > 0 ? s.live : s.cached};
        result = Err::kCorrupt;
        break;
      }
      // Losses of pointers never counted here: the record stays as it is.
      s.foreign_loss = true;
      if (note->what == nullptr)
        *note = CountNote{"loses sectors, but is not a user bucket", false, s.dev, s.bucket, 0,
                          s.live < 0 ? s.live : s.cached};
    } else {
      const i64 most = i64(MaxCountSectors(sb_, cur.state));
      auto add = [&](u32 have, i64 change, bool live) -> u32 {
        i64 v = i64(have) + change;
        if (v < 0) {
          (live ? s.live_underflow : s.cached_underflow) = true;
          if (live && note->what == nullptr)
            *note = CountNote{"live count would go below 0", false, s.dev, s.bucket, have, change};
          v = 0;
        } else if (v > most) {
          s.overflow = true;
          if (note->what == nullptr)
            *note = CountNote{"count would pass what the bucket can count", false, s.dev, s.bucket, have, change};
          v = most;
        }
        return u32(v);
      };
      const u32 live = add(cur.live_sectors, s.live, true);
      const u32 cached = add(cur.cached_sectors, s.cached, false);
      // (An unrecorded bucket's first transaction records it whatever it
      // counts.)
      if (live != cur.live_sectors || cached != cur.cached_sectors || cur.unrecorded) {
        s.b.live_sectors = live;
        s.b.cached_sectors = cached;
        s.b.version = cur.version + 1;
        s.b.recorded = true;
        s.changed = true;
      }
    }
    EncodeRecord(s.b, &s.rec);
  }
  return result;
}

void Allocator::PublishCounts(const CountStage* stages, u32 n, CountNote* note) {
  MutexLock lock(mu_);
  for (u32 i = 0; i < n; i++) {
    const CountStage& s = stages[i];
    stats_.count_underflows += s.live_underflow;
    stats_.cached_underflows += s.cached_underflow;
    stats_.count_overflows += s.overflow;
    stats_.foreign_losses += s.foreign_loss;
    if (!s.changed) continue;
    Dev& d = devices_[s.dev];
    Bucket& b = d.buckets[s.bucket];
    // The invariant (allocator.h): nothing changed the bucket since
    // StageCounts. Checked builds stop; others keep what the other change
    // made and say so (fsck recounts).
    if (b.version + 1 != s.b.version || b.state != s.b.state || b.gen != s.b.gen) {
#if TFS_LOCK_CHECKS
      TFS_BUG_ON(true);
#endif
      note->broken++;
      // The journal holds this record now: a bucket of that life must not
      // be freed as never recorded (no commit, generation kept).
      if (b.state == BucketState::kUser && b.gen == s.b.gen) b.unrecorded = false;
      continue;
    }
    Resum r(d.sums, b);
    b.live_sectors = s.b.live_sectors;
    b.cached_sectors = s.b.cached_sectors;
    b.version = s.b.version;
    b.recorded = true;
    b.unrecorded = false;
    stats_.count_records++;
  }
}

void Allocator::LogCountNote(const CountNote& note, bool published) {
  const bool damage = note.what != nullptr && !note.error && published;
  const bool bug = (note.what != nullptr && note.error) || note.broken != 0;
  if (!damage && !bug) return;
  {
    // At most one line of each kind per 10 s: damage repeats itself, and so
    // would a bug on every commit that meets it (the counters count them all).
    MutexLock lock(mu_);
    const u64 now = platform::NowNs();
    u64& last = bug ? count_bug_logged_ns_ : underflow_logged_ns_;
    if (last != 0 && now + 1 < last + 10'000'000'000ull) return;
    last = now + 1;
  }
  if (note.what != nullptr && (note.error || published)) {
    const char* label = note.dev < nr_ ? sb_.members[note.dev].label : "?";
    platform::Log(note.error ? platform::LogLevel::kError : platform::LogLevel::kWarn,
                  "alloc: member %s bucket %llu: %s (%lld sectors, change %lld)%s", label,
                  (unsigned long long)note.bucket, note.what, (long long)note.have, (long long)note.change,
                  note.error ? ": the commit is refused (a bug)"
                             : "; stopped there: 'tierfs fsck -y' recounts it from the extents");
  }
  if (note.broken != 0)
    platform::Log(platform::LogLevel::kError, "alloc: %llu bucket counts changed by another change while their "
                  "transaction committed (a bug): kept the other change; 'tierfs fsck -y' recounts them",
                  (unsigned long long)note.broken);
}

Status Allocator::RepairCounts(const CountFix* fixes, u32 n) {
  return EditBuckets(n, BucketState::kUser, nullptr, [&](u32 i, u32* dev, u64* bucket) {  // (under mu_)
    const CountFix& f = fixes[i];
    if (f.dev >= nr_ || f.bucket >= devices_[f.dev].buckets.size() ||
        devices_[f.dev].buckets[f.bucket].state != BucketState::kUser)
      return -1;
    Bucket& bk = devices_[f.dev].buckets[f.bucket];
    const u64 most = MaxCountSectors(sb_, bk.state);
    {
      Resum r(devices_[f.dev].sums, bk);
      bk.live_sectors = u32(Min<u64>(f.live_sectors, most));
      bk.cached_sectors = u32(Min<u64>(f.cached_sectors, most));
    }
    stats_.count_repairs++;
    *dev = f.dev;
    *bucket = f.bucket;
    return 1;
  });
}

Status Allocator::RepairState(u32 dev, u64 bucket, BucketState state) {
  if (u8(state) >= kBucketStateCount) return Err::kInvalidArgument;
  RecordChange change;
  bool freed = false;
  {
    MutexLock lock(mu_);
    if (dev >= nr_ || bucket >= devices_[dev].buckets.size()) return Err::kInvalidArgument;
    Dev& d = devices_[dev];
    Bucket& bk = d.buckets[bucket];
    Resum r(d.sums, bk);
    const BucketState was = bk.state;
    if (was == BucketState::kFree) {
      UnlistFreeLocked(d, bucket);
      // Whatever pointed in while it was free is stale (damage: nothing
      // counted names a free bucket). oldest_gen moves with gen when
      // nothing older was behind (as a free of a bucket counting nothing);
      // else it stays -- older stale pointers may remain -- unless that
      // would pass the guard (a record must stay valid; fsck's data pass
      // drops stale cached pointers and raises it after).
      const bool none = bk.oldest_gen == bk.gen;
      bk.gen++;
      if (none) bk.oldest_gen = bk.gen;
    }
    bk.state = state;
    // (A bucket that is not free stays below the guard; a free one at most
    // at it. fsck's data pass drops stale cached pointers and raises
    // oldest_gen after.)
    CapGenGap(bk, state != BucketState::kFree ? kGenGuard - 1 : kGenGuard);
    bk.live_sectors = 0;
    bk.cached_sectors = 0;
    bk.version++;
    bk.recorded = true;
    bk.unrecorded = false;
    if (state == BucketState::kFree) {
      freed = journal_ != nullptr;
      if (freed) {
        d.pending.PushBack(Dev::Pending{bucket, kUnjournaled}).IgnoreError();  // reserved at Init
      } else {
        ListFreeLocked(d, bucket);
      }
    }
    change = RecordChange{dev, bucket, bk};
  }
  // (An ordinary commit, whatever the state: fsck and the mount, never a checkpoint.)
  Result<u64> seq = Persist(&change, 1, BucketState::kFree);
  if (!seq.ok()) return seq.status();
  if (freed) {
    MutexLock lock(mu_);
    NotePendingSeq(dev, bucket, seq.value());
  }
  return Status::Ok();
}

Bucket Allocator::Get(u32 dev, u64 bucket) const {
  MutexLock lock(mu_);
  if (dev >= nr_ || bucket >= devices_[dev].buckets.size()) return Bucket();
  return devices_[dev].buckets[bucket];
}

BucketSums Allocator::ScanSumsLocked(u32 dev) const {
  BucketSums s;
  for (const Bucket& b : devices_[dev].buckets) AddShare(s, b, true);
  return s;
}

void Allocator::ResumAllLocked() {
  for (u32 i = 0; i < nr_; i++) devices_[i].sums = ScanSumsLocked(i);
}

bool Allocator::SumsMatchScan(u32 dev, BucketSums* scanned) const {
  MutexLock lock(mu_);
  if (dev >= nr_) return false;
  const BucketSums s = ScanSumsLocked(dev);
  if (scanned != nullptr) *scanned = s;
  return MemCompare(&s, &devices_[dev].sums, sizeof(s)) == 0;
}

DeviceUsage Allocator::Usage(u32 dev) const {
  DeviceUsage u;
  MutexLock lock(mu_);
  if (dev >= nr_) return u;
  const Dev& d = devices_[dev];
#if TFS_LOCK_CHECKS
  {
    const BucketSums scan = ScanSumsLocked(dev);
    TFS_BUG_ON(MemCompare(&scan, &d.sums, sizeof(scan)) != 0);
  }
#endif
  u.nbuckets = d.buckets.size();
  u.pending_free = d.pending.size();
  u.gen_blocked = d.blocked.size();
  for (u32 k = 0; k < kBucketStateCount; k++) u.by_state[k] = d.sums.by_state[k];
  u.live_sectors = d.sums.live_sectors;
  u.cached_sectors = d.sums.cached_sectors;
  u.reserves = d.reserves;
  u.metadata_need = d.metadata_need.Load(MemOrder::kRelaxed);
  u.reserves.btree = BtreeReserve(d.reserves, u.metadata_need, d.metadata_held.Load(MemOrder::kRelaxed));
  return u;
}

u64 Allocator::FreeCount(u32 dev) const {
  MutexLock lock(mu_);
  if (dev >= nr_ || ((UnavailableLocked() >> dev) & 1) != 0) return 0;
  return devices_[dev].sums.by_state[u8(BucketState::kFree)] - devices_[dev].blocked.size();
}

AllocStats Allocator::Stats() const {
  MutexLock lock(mu_);
  AllocStats s = stats_;
  s.gen_guard_waiting = 0;
  for (u32 i = 0; i < nr_; i++) s.gen_guard_waiting += devices_[i].blocked.size();
  return s;
}

}  // namespace tfs::alloc
