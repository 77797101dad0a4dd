// Bucket allocator with watermark reserves and journaled, checkpointed state (see
// allocator.h and docs/format/alloc.md).
//
// Invariants: every bucket in state kFree is either on free_list (its free is
// durable) or on pending (not yet), each once; free_count == free_list.size(); a
// bucket's version only grows; pin_, when active, is at or before the journal
// sequence of every change made since the last checkpoint snapshot.
#include "alloc/allocator.h"

#include "platform/platform.h"

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

// The journal key that records bucket `bucket`'s state `b`.
AllocKey KeyFor(u32 dev, u64 bucket, const Bucket& b) {
  AllocKey k;
  MemSet(&k, 0, sizeof(k));
  k.dev.set(u16(dev));
  k.gen = b.gen;
  k.state = u8(b.state);
  k.live_sectors.set(b.live_sectors);
  k.bucket.set(bucket);
  k.version.set(b.version);
  return k;
}

u32 HeadCsum(const TableHeader& h) {
  return platform::Crc32cSkippingField(reinterpret_cast<const u8*>(&h), __builtin_offsetof(TableHeader, head_csum),
                                       __builtin_offsetof(TableHeader, csum));
}

u32 TableCsum(const u8* slot, u64 bytes) {
  return platform::Crc32cSkippingField(slot, bytes, __builtin_offsetof(TableHeader, csum));
}

}  // namespace

const char* BucketStateName(BucketState s) {
  switch (s) {
    case BucketState::kFree: return "free";
    case BucketState::kMeta: return "meta";
    case BucketState::kJournal: return "journal";
    case BucketState::kBtree: return "btree";
    case BucketState::kUser: return "user";
    case BucketState::kCached: return "cached";
  }
  return "unknown";
}

BucketState LayoutState(const sb::Member& m, u64 b) {
  if (b < m.alloc_table_buckets) return BucketState::kMeta;
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

void Allocator::SetJournal(journal::Journal* journal) {
  MutexLock lock(mu_);
  journal_ = journal;
}

Status Allocator::Init(dev::DeviceSet* devs, const sb::Superblock& sb, journal::Journal* journal) {
  devs_ = devs;
  journal_ = journal;
  sb_ = sb;
  nr_ = sb.nr_members;
  for (u32 i = 0; i < nr_; i++) {
    const sb::Member& m = sb.members[i];
    Dev& d = devices_[i];
    TFS_TRY(d.buckets.Resize(m.nbuckets));
    TFS_TRY(d.free_list.Reserve(m.nbuckets));
    TFS_TRY(d.pending.Reserve(m.nbuckets));
    d.data_allowed = m.data_allowed;
    d.table_buckets = m.alloc_table_buckets;
    d.slow = m.journal_nbuckets == 0;
    if (d.slow) TFS_TRY(d.durable_version.Resize(m.nbuckets));
    d.reserves.btree = Max<u64>(1, m.nbuckets / 128);
    d.reserves.copygc = Max<u64>(1, m.nbuckets / 128);
    d.reserves.foreground = Max<u64>(2, m.nbuckets / 64);
  }
  return Status::Ok();
}

void Allocator::InitFresh() {
  for (u32 i = 0; i < nr_; i++) {
    const sb::Member& m = sb_.members[i];
    Dev& d = devices_[i];
    for (u64 b = 0; b < d.buckets.size(); b++) {
      Bucket& bk = d.buckets[b];
      bk = Bucket();
      bk.state = LayoutState(m, b);
      if (bk.state != BucketState::kFree) bk.version = 1;
    }
    d.checkpoint = 0;
    d.last_slot = 1;
    d.changes++;  // no table on disk yet
  }
  Finish().IgnoreError();  // free lists were reserved at Init: cannot fail
}

Status Allocator::Finish() {
  MutexLock lock(mu_);
  for (u32 i = 0; i < nr_; i++) {
    Dev& d = devices_[i];
    d.free_list.Clear();
    d.pending.Clear();  // after load or repair, every free bucket's state is on disk
    for (u64 b = d.buckets.size(); b-- > 0;) {
      if (d.buckets[b].state == BucketState::kFree) TFS_TRY(d.free_list.PushBack(b));
    }
    d.free_count = d.free_list.size();
  }
  return Status::Ok();
}

Status Allocator::Load(Diag* diag) {
  for (u32 i = 0; i < nr_; i++) {
    Dev& d = devices_[i];
    const u64 n = d.buckets.size();
    const u64 slot_bytes = TableSlotBytes(n);
    u8* buf = static_cast<u8*>(platform::Alloc(slot_bytes, 4096));
    if (buf == nullptr) return Err::kNoMemory;
    u64 best_checkpoint = 0, best_journal_seq = 0;
    i32 best_slot = -1;
    Status io_error;
    i32 bad_slot = -1;  // a slot that could not be read or fails its checks
    u64 bad_checkpoint = 0;  // its header's checkpoint, if the header is ours
    u32 records_crc[2] = {};
    u32 valid = 0;
    for (u32 slot = 0; slot < 2; slot++) {
      u64 offset = sb_.BucketOffset(0) + slot * slot_bytes;
      Status st = dev::QueueSyncIo(devs_->member(i)->queue(), IoOp::kRead, offset, buf, slot_bytes, 0,
                                   IoOrigin::kAlloc);
      if (!st.ok()) {
        io_error = st;
        bad_slot = i32(slot);
        continue;
      }
      const auto* h = reinterpret_cast<const TableHeader*>(buf);
      bool ok = h->magic.get() == kAllocMagic && h->version.get() == kAllocVersion &&
                h->dev_idx.get() == i && h->nbuckets.get() == n &&
                MemCompare(h->fs_uuid, sb_.fs_uuid, 16) == 0 && h->csum.get() == TableCsum(buf, slot_bytes);
      const auto* rec = reinterpret_cast<const BucketFormat*>(buf + sizeof(TableHeader));
      for (u64 b = 0; b < n && ok; b++) ok = rec[b].state < kBucketStateCount;
      if (!ok) {
        bad_slot = i32(slot);
        const bool ours = h->magic.get() == kAllocMagic && h->version.get() == kAllocVersion &&
                          h->dev_idx.get() == i && h->nbuckets.get() == n &&
                          MemCompare(h->fs_uuid, sb_.fs_uuid, 16) == 0 && h->head_csum.get() != 0 &&
                          h->head_csum.get() == HeadCsum(*h);
        bad_checkpoint = ours ? h->checkpoint.get() : 0;
        continue;
      }
      records_crc[valid++] = platform::Crc32c(buf + sizeof(TableHeader), slot_bytes - sizeof(TableHeader));
      if (best_slot >= 0 && h->checkpoint.get() <= best_checkpoint) continue;
      for (u64 b = 0; b < n; b++) {
        Bucket& bk = d.buckets[b];
        bk.gen = rec[b].gen;
        bk.state = BucketState(rec[b].state);
        bk.live_sectors = rec[b].live_sectors.get();
        bk.version = rec[b].version.get();
        if (d.slow) d.durable_version[b] = bk.version;
      }
      best_checkpoint = h->checkpoint.get();
      best_journal_seq = h->journal_seq.get();
      best_slot = i32(slot);
    }
    platform::Free(buf);
    if (best_slot < 0) {
      return DiagError(diag, io_error.ok() ? Status(Err::kCorrupt) : io_error,
                       "member %s: no valid allocation table in either slot%s", sb_.members[i].label,
                       io_error.ok() ? "" : " (I/O error)");
    }
    // One slot unusable: the other may be older than the newest checkpoint
    // (a torn checkpoint write, or damage). Never silent: the journal covers
    // only changes since the newest checkpoint.
    if (bad_slot >= 0)
      platform::Log(platform::LogLevel::kWarn,
                    "alloc: member %s: allocation table slot %d %s; using slot %d (checkpoint %llu)",
                    sb_.members[i].label, bad_slot, io_error.ok() ? "fails its checks" : "could not be read",
                    best_slot, (unsigned long long)best_checkpoint);
    d.checkpoint = best_checkpoint;
    d.last_slot = u32(best_slot);
    d.loaded = LoadedTable{best_checkpoint, best_journal_seq, best_slot, bad_slot, bad_slot >= 0 && !io_error.ok(),
                           bad_checkpoint};
    // Both slots hold the same buckets (a converged checkpoint): nothing to
    // rewrite at the next Checkpoint.
    d.other_slot_stale = !(valid == 2 && records_crc[0] == records_crc[1]);
  }
  return Status::Ok();
}

u64 Allocator::DurableCheckpoint(u32 dev) const {
  MutexLock lock(mu_);
  return dev < nr_ ? devices_[dev].checkpoint : 0;
}

void Allocator::SetJournalSeqFloor(u64 seq) { journal_seq_floor_.Store(seq, MemOrder::kRelaxed); }

u64 Allocator::TableJournalSeq() const {
  const u64 floor = journal_seq_floor_.Load(MemOrder::kRelaxed);
  const u64 head = journal_ != nullptr ? journal_->next_seq() : 0;
  return Max(floor, head);
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
      bk.version++;  // past the loaded table and every key replayed into it
    }
    d.changes++;
  }
}

bool Allocator::RebuildMark(u32 dev, u64 bucket, BucketState state, u8 gen, u32 sectors) {
  MutexLock lock(mu_);
  if (dev >= nr_ || bucket >= devices_[dev].buckets.size()) return false;
  Bucket& bk = devices_[dev].buckets[bucket];
  if (bk.state == BucketState::kMeta || bk.state == BucketState::kJournal) return false;  // the layout's
  if ((bk.state == BucketState::kBtree || bk.state == BucketState::kUser) && bk.state != state) return false;
  if (bk.state == state && state == BucketState::kUser && bk.gen != gen) {
    // Two generations point in: the newer one's data is there now (a bucket
    // is freed, gen bumped, before it is reused); the older extents are stale.
    if (u8(gen - bk.gen) > 127) return true;
    bk.live_sectors = 0;
  }
  bk.state = state;
  if (state == BucketState::kUser) bk.gen = gen;  // btree buckets keep theirs (node pointers carry none)
  bk.live_sectors = Min<u64>(u64(bk.live_sectors) + sectors, sb_.bucket_size / 512);
  return true;
}

Status Allocator::EndRebuild() { return Finish(); }

Status Allocator::Apply(const journal::Key& key) {
  if (key.type != journal::kKeyAlloc || key.len != sizeof(AllocKey)) return Err::kCorrupt;
  const auto* k = static_cast<const AllocKey*>(key.val);
  u32 dev = k->dev.get();
  u64 bucket = k->bucket.get();
  if (dev >= nr_ || bucket >= devices_[dev].buckets.size() || k->state >= kBucketStateCount)
    return Err::kCorrupt;
  MutexLock lock(mu_);
  Bucket& b = devices_[dev].buckets[bucket];
  if (k->version.get() <= b.version) return Status::Ok();  // the table is newer
  devices_[dev].changes++;
  b.gen = k->gen;
  b.state = BucketState(k->state);
  b.live_sectors = k->live_sectors.get();
  b.version = k->version.get();
  return Status::Ok();
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
  return (d.data_allowed & DataBit(purpose)) != 0 && d.free_count > FreeFloor(dev, wm);
}

void Allocator::ReleasePending(Dev& d, u64 settled_seq) {
  usize keep = 0;
  for (usize i = 0; i < d.pending.size(); i++) {
    if (d.pending[i].seq <= settled_seq) {
      d.free_list.PushBack(d.pending[i].bucket).IgnoreError();  // capacity reserved at Init
      d.free_count++;
    } else {
      d.pending[keep++] = d.pending[i];
    }
  }
  d.pending.Resize(keep).IgnoreError();  // shrinking never allocates
}

Result<BucketRef> Allocator::Allocate(dev::DevMask target, dev::DevMask fallback,
                                      BucketState purpose, Watermark wm) {
  if (purpose == BucketState::kFree || purpose == BucketState::kMeta || u8(wm) > u8(Watermark::kJournal))
    return Err::kInvalidArgument;
  bool pending_seen = false;
  Result<BucketRef> r = TryAllocate(target, fallback, purpose, wm, &pending_seen);
  if (r.ok() || !pending_seen || journal_ == nullptr) return r;
  // Only buckets whose free is not yet settled are left: settle it (a durable
  // free in an unordered journal entry settles with the next durable entry).
  {
    MutexLock lock(mu_);
    stats_.flush_waits++;
  }
  TFS_TRY(journal_->Settle());
  return TryAllocate(target, fallback, purpose, wm, &pending_seen);
}

Result<BucketRef> Allocator::TryAllocate(dev::DevMask target, dev::DevMask fallback,
                                         BucketState purpose, Watermark wm, bool* pending_seen) {
  // Reuse waits for settled, not just durable: replay may still read what the
  // newest unordered entry's group wrote to check it (journal.h, settled_seq).
  u64 settled = journal_ != nullptr ? journal_->settled_seq() : ~u64(0);
  BucketRef ref;
  Bucket snapshot;
  {
    MutexLock lock(mu_);
    for (u32 i = 0; i < nr_; i++) {
      if (!devices_[i].pending.empty()) ReleasePending(devices_[i], settled);
    }
    i32 best = -1;
    for (int pass = 0; pass < 2 && best < 0; pass++) {
      dev::DevMask mask = pass == 0 ? target : (fallback & ~target);
      for (u32 i : dev::Bits(mask)) {
        if (i >= nr_ || !Usable(i, purpose, wm)) continue;
        if (best < 0 || devices_[i].free_count > devices_[u32(best)].free_count) best = i32(i);
      }
      if (best >= 0 && pass == 1) stats_.fallbacks++;
    }
    if (best < 0) {
      for (u32 i : dev::Bits((target | fallback) & all_devices())) {
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
    bk.state = purpose;
    bk.live_sectors = 0;
    bk.version++;
    d.changes++;
    stats_.allocs[u8(wm)]++;
    ref = BucketRef{u32(best), b, bk.gen};
    snapshot = bk;
  }
  TFS_TRY(JournalChange(ref.dev, ref.bucket, snapshot, purpose));
  return ref;
}

Status Allocator::Free(const BucketRef& ref) {
  Bucket snapshot;
  BucketState was;
  {
    MutexLock lock(mu_);
    if (ref.dev >= nr_ || ref.bucket >= devices_[ref.dev].buckets.size()) return Err::kInvalidArgument;
    Dev& d = devices_[ref.dev];
    Bucket& bk = d.buckets[ref.bucket];
    if (bk.gen != ref.gen || bk.state == BucketState::kFree || bk.state == BucketState::kMeta ||
        bk.state == BucketState::kJournal)
      return Err::kInvalidArgument;
    was = bk.state;
    const Bucket before = bk;
    bk.gen++;
    bk.state = BucketState::kFree;
    bk.live_sectors = 0;
    bk.version++;
    d.changes++;
    stats_.frees++;
    snapshot = bk;
    // Pending from the change on, so that no table holds the free before it is
    // journaled and settled (TableCopy). A free whose commit fails stays here.
    if (journal_ != nullptr) d.pending.PushBack(Dev::Pending{ref.bucket, kUnjournaled, before}).IgnoreError();
  }
  Result<u64> seq = JournalChange(ref.dev, ref.bucket, snapshot, was);
  MutexLock lock(mu_);
  Dev& d = devices_[ref.dev];
  if (journal_ == nullptr) {
    if (!seq.ok()) return seq.status();
    d.free_list.PushBack(ref.bucket).IgnoreError();  // capacity reserved at Init
    d.free_count++;
    return Status::Ok();
  }
  if (!seq.ok()) return seq.status();
  for (usize i = d.pending.size(); i-- > 0;) {  // just pushed: near the back
    if (d.pending[i].bucket == ref.bucket && d.pending[i].seq == kUnjournaled) {
      d.pending[i].seq = seq.value();
      break;
    }
  }
  return Status::Ok();
}

u64 Allocator::TableSettledSeq() const {
  if (journal_ == nullptr || journal_stopped_.Load(MemOrder::kRelaxed)) return kUnjournaled - 1;
  return journal_->settled_seq();
}

Status Allocator::TableCopy(const Dev& d, u64 settled, Vector<Bucket>* out, bool* left_out) const {
  TFS_TRY(out->CopyFrom(d.buckets));
  *left_out = false;
  for (const Dev::Pending& p : d.pending) {
    if (p.seq <= settled) continue;
    (*out)[p.bucket] = p.before;
    *left_out = true;
  }
  return Status::Ok();
}

Status Allocator::SetLiveSectors(const BucketRef& ref, u32 live_sectors) {
  Bucket snapshot;
  {
    MutexLock lock(mu_);
    if (ref.dev >= nr_ || ref.bucket >= devices_[ref.dev].buckets.size()) return Err::kInvalidArgument;
    Bucket& bk = devices_[ref.dev].buckets[ref.bucket];
    if (bk.gen != ref.gen || bk.state == BucketState::kFree) return Err::kInvalidArgument;
    if (u64(live_sectors) * 512 > sb_.bucket_size) return Err::kInvalidArgument;
    bk.live_sectors = live_sectors;
    bk.version++;
    devices_[ref.dev].changes++;
    snapshot = bk;
  }
  return JournalChange(ref.dev, ref.bucket, snapshot, snapshot.state).status();
}

Status Allocator::RepairState(u32 dev, u64 bucket, BucketState state) {
  Bucket snapshot;
  {
    MutexLock lock(mu_);
    if (dev >= nr_ || bucket >= devices_[dev].buckets.size()) return Err::kInvalidArgument;
    Bucket& bk = devices_[dev].buckets[bucket];
    if (bk.state == BucketState::kFree) bk.gen++;
    bk.state = state;
    bk.live_sectors = 0;
    bk.version++;
    devices_[dev].changes++;
    snapshot = bk;
  }
  TFS_TRY(Finish());
  return JournalChange(dev, bucket, snapshot, state).status();
}

Result<u64> Allocator::JournalChange(u32 dev, u64 bucket, const Bucket& b, BucketState owner) {
  if (journal_ == nullptr) return u64(0);
  const AllocKey k = KeyFor(dev, bucket, b);
  journal::Key key{journal::kKeyAlloc, sizeof(k), &k};
  journal::Pin local;
  // Btree buckets change only in checkpoints, which journal reclaim waits for:
  // those changes must not wait for journal room themselves.
  const journal::Watermark wm = owner == BucketState::kBtree ? journal::Watermark::kReclaim : journal::Watermark::kNormal;
  u64 seq = TFS_TRY(journal_->Commit(&key, 1, 0, journal::CommitMode::kNoFlush, &local, wm));
  journal::Pin drop;
  {
    MutexLock lock(mu_);
    // Keep the oldest pin: it holds every newer change in the ring too. A
    // slow member's changes are pinned apart (relogged, see CheckpointForRoom).
    drop = KeepOlder(devices_[dev].slow ? &devices_[dev].pin : &pin_, local);
  }
  journal_->PinDrop(&drop);
  return seq;
}

journal::Pin Allocator::KeepOlder(journal::Pin* into, journal::Pin p) {
  if (!p.active) return journal::Pin();
  if (!into->active) {
    *into = p;
    return journal::Pin();
  }
  if (p.seq < into->seq) Swap(*into, p);
  return p;
}

u8* Allocator::BuildTable(u32 dev, const Bucket* snapshot, u64 n, u64 checkpoint, u64 journal_seq) {
  const u64 slot_bytes = TableSlotBytes(n);
  u8* buf = static_cast<u8*>(platform::Alloc(slot_bytes, 4096, true));
  if (buf == nullptr) return nullptr;
  auto* h = reinterpret_cast<TableHeader*>(buf);
  h->magic.set(kAllocMagic);
  h->version.set(kAllocVersion);
  h->dev_idx.set(u16(dev));
  MemCopy(h->fs_uuid, sb_.fs_uuid, 16);
  h->checkpoint.set(checkpoint);
  h->journal_seq.set(journal_seq);
  h->nbuckets.set(n);
  h->head_csum.set(HeadCsum(*h));
  auto* rec = reinterpret_cast<BucketFormat*>(buf + sizeof(TableHeader));
  for (u64 b = 0; b < n; b++) {
    rec[b].gen = snapshot[b].gen;
    rec[b].state = u8(snapshot[b].state);
    rec[b].live_sectors.set(snapshot[b].live_sectors);
    rec[b].version.set(snapshot[b].version);
  }
  h->csum.set(TableCsum(buf, slot_bytes));
  return buf;
}

Status Allocator::WriteTable(u32 dev, const Bucket* snapshot, u64 n, u64 checkpoint, u32 slot,
                             u64 journal_seq) {
  const u64 slot_bytes = TableSlotBytes(n);
  u8* buf = BuildTable(dev, snapshot, n, checkpoint, journal_seq);
  if (buf == nullptr) return Err::kNoMemory;
  dev::IoQueue& q = devs_->member(dev)->queue();
  u64 offset = sb_.BucketOffset(0) + slot * slot_bytes;
  // The rest first and a flush, then the head, written through (FUA: no
  // second flush of the whole cache). LoadedTable::rejected_checkpoint.
  const u64 head = TableHeadBytes(dev, slot_bytes);
  Status st;
  if (head < slot_bytes) {
    st = dev::QueueSyncIo(q, IoOp::kWrite, offset + head, buf + head, slot_bytes - head, 0, IoOrigin::kAlloc);
    if (st.ok()) st = dev::QueueSyncIo(q, IoOp::kFlush, 0, nullptr, 0, 0, IoOrigin::kAlloc);
  }
  if (st.ok()) st = dev::QueueSyncIo(q, IoOp::kWrite, offset, buf, head, IoRequest::kFua, IoOrigin::kAlloc);
  platform::Free(buf);
  return st;
}

u64 Allocator::TableHeadBytes(u32 dev, u64 slot_bytes) const {
  const u64 lbs = devs_->member(dev)->bdev()->Info().logical_block_size;
  return Min(Max(u64(sizeof(TableHeader)), lbs), slot_bytes);
}

Allocator::~Allocator() { WaitForBackgroundWrites(); }

Status Allocator::WriteTables(dev::DevMask mask, bool converge, bool counted) {
  // Per member, on the heap (2.7 KiB: more than a kernel frame may hold).
  struct PerMember {
    Vector<Bucket> copies[dev::kMaxDevices];
    u64 snap_changes[dev::kMaxDevices] = {};
    u64 slot_checkpoint[dev::kMaxDevices] = {};
    u32 slot[dev::kMaxDevices] = {};
    bool write[dev::kMaxDevices] = {};
    bool catch_up[dev::kMaxDevices] = {};  // unchanged, rewritten into the older slot
    journal::Pin slow_pin[dev::kMaxDevices];
    bool unsettled[dev::kMaxDevices] = {};  // a table leaves frees out (TableCopy): not every change
    journal::Pin drop[dev::kMaxDevices + 1];
  };
  auto per = platform::Owned<PerMember>::Make();
  if (!per) return Err::kNoMemory;
  auto& copies = per->copies;
  auto& snap_changes = per->snap_changes;
  auto& slot_checkpoint = per->slot_checkpoint;
  auto& slot = per->slot;
  auto& write = per->write;
  auto& catch_up = per->catch_up;
  auto& slow_pin = per->slow_pin;
  auto& unsettled = per->unsettled;
  auto& drop = per->drop;
  journal::Pin fast_pin;
  bool fast_all = true;  // every fast member is in mask: pin_ is covered
  u64 journal_seq = TableJournalSeq();
  const u64 settled = TableSettledSeq();
  {
    MutexLock lock(mu_);
    // A member whose table already holds every change is left alone: every
    // journaled change a pin keeps was made (under mu_) on a member counted
    // here as changed, so its table is in this checkpoint.
    for (u32 i = 0; i < nr_; i++) {
      Dev& d = devices_[i];
      const bool in = (mask & (dev::DevMask(1) << i)) != 0;
      if (!in) {
        fast_all &= d.slow;
        continue;
      }
      TFS_BUG_ON(d.writing);  // the caller waited, or skipped slow members
      write[i] = d.changes != d.written_changes;
      catch_up[i] = !write[i] && converge && d.other_slot_stale;
      write[i] |= catch_up[i];
      snap_changes[i] = d.changes;
      slot[i] = d.last_slot ^ 1;
      slot_checkpoint[i] = d.checkpoint + 1;
      if (write[i]) TFS_TRY(TableCopy(d, settled, &copies[i], &unsettled[i]));  // (no pin taken yet)
    }
    for (u32 i : dev::Bits(mask & all_devices())) {
      Dev& d = devices_[i];
      if (d.slow) {
        slow_pin[i] = d.pin;
        d.pin = journal::Pin();
      }
    }
    if (fast_all) {
      fast_pin = pin_;
      pin_ = journal::Pin();
    }
  }
  Status st;
  bool fast_failed = false;
  u64 written = 0, unchanged = 0;
  u32 ndrop = 0;
  for (u32 i = 0; i < nr_; i++) {
    if ((mask & (dev::DevMask(1) << i)) == 0) continue;
    Dev& d = devices_[i];
    Status wst;
    if (!write[i]) {
      unchanged++;
    } else {
      wst = st.ok() ? WriteTable(i, copies[i].data(), copies[i].size(), slot_checkpoint[i], slot[i], journal_seq)
                    : st;  // after a failure, the rest stay pinned too
    }
    MutexLock lock(mu_);
    if (write[i] && wst.ok()) {
      d.checkpoint = slot_checkpoint[i];
      d.last_slot = slot[i];
      // A table that left frees out does not hold every change: written again.
      d.written_changes = unsettled[i] ? snap_changes[i] - 1 : snap_changes[i];
      d.other_slot_stale = !catch_up[i];  // a catch-up wrote what the newer slot holds
      if (d.slow)
        for (u64 b = 0; b < copies[i].size(); b++) d.durable_version[b] = copies[i][b].version;
      written++;
    }
    if (!wst.ok()) {
      if (st.ok()) st = wst;
      if (d.slow) {
        drop[ndrop++] = KeepOlder(&d.pin, slow_pin[i]);  // not on disk yet: keep pinned
      } else {
        fast_failed = true;
      }
    } else if (d.slow) {
      drop[ndrop++] = slow_pin[i];
    }
  }
  {
    MutexLock lock(mu_);
    stats_.table_writes += written;
    stats_.tables_unchanged += unchanged;
    if (fast_failed) {
      drop[ndrop++] = KeepOlder(&pin_, fast_pin);  // not on disk yet: keep pinned
    } else {
      drop[ndrop++] = fast_pin;
    }
    if (st.ok() && counted) stats_.checkpoints++;
  }
  if (journal_ != nullptr)
    for (u32 i = 0; i < ndrop; i++) journal_->PinDrop(&drop[i]);
  return st;
}

Status Allocator::Checkpoint() {
  MutexLock serial(checkpoint_mu_);
  WaitForBackgroundWrites();
  // Twice when needed: a member whose older slot is stale gets the same state
  // written there too, so that a later fallback to it (the newer one damaged
  // or unreadable) loses nothing -- an idle member is otherwise never written
  // again (see CheckpointForRoom).
  TFS_TRY(WriteTables(all_devices(), true));
  return WriteTables(all_devices(), true, false);  // one checkpoint, in two passes
}

Status Allocator::CheckpointForRoom(bool relog) {
  platform::NoFsScope nofs;  // the tables are written under checkpoint_mu_
  // The reclaim hook runs in whichever thread holds the journal's writer role
  // -- the thread of a Relog below, flushing, among them: it must not wait
  // for checkpoint_mu_ (a running checkpoint frees the room anyway).
  if (relog) {
    checkpoint_mu_.Lock();
  } else if (!checkpoint_mu_.TryLock()) {
    return Status::Ok();
  }
  struct Unlock {
    Mutex& m;
    ~Unlock() { m.Unlock(); }
  } unlock{checkpoint_mu_};
  dev::DevMask fast = 0, slow = 0;
  for (u32 i = 0; i < nr_; i++) (devices_[i].slow ? slow : fast) |= dev::DevMask(1) << i;
  Status st = WriteTables(fast, false);
  room_round_++;
  for (u32 i : dev::Bits(slow)) StartTableWrite(i);
  if (relog && journal_ != nullptr) {
    // One relog budget per round for all slow members, within what the
    // journal's reserve can take next to the entries that advance last_seq.
    u64 budget = RelogBudget();
    for (u32 i : dev::Bits(slow)) {
      bool relogged = true;
      Status r = Relog(i, &budget, &relogged);
      if (!r.ok()) {
        // The pins stay (Relog restored them); the round goes on, so the
        // btree checkpoint that frees the rest of the ring still runs.
        platform::Log(platform::LogLevel::kError, "alloc: relog of member %u failed: %s", i, r.Message());
        continue;
      }
      if (relogged) continue;
      // Too many changed buckets to relog: as before slow members existed,
      // this checkpoint waits for the member's table (its background write,
      // then one more if it changed since) -- the ring must not fill with
      // its pin while a btree checkpoint needs room to settle.
      {
        MutexLock lock(mu_);
        while (devices_[i].writing) table_cv_.Wait(mu_);
      }
      Status w = WriteTables(dev::DevMask(1) << i, false);
      if (st.ok()) st = w;
    }
  }
  return st;
}

// A slow member's background table write: the slot, then a flush. Each step
// is submitted from process context: StartTableWrite, then the deferred work
// that each completion queues (OnTableWritten -> ContinueTableWrite).
struct Allocator::TableWrite {
  Allocator* a = nullptr;
  u32 dev = 0;
  u32 slot = 0;
  u64 checkpoint = 0;
  u64 changes = 0;        // the member's change count the snapshot holds
  Vector<u32> versions;   // the snapshot's bucket versions
  u8* buf = nullptr;
  u64 offset = 0, bytes = 0, head = 0;  // the slot, and its first logical block (written last)
  // The slot but its head, a flush; then the head, FUA (WriteTable's order).
  dev::Io write, flush, head_write;
  // The step that completed last, for the deferred work (one step in flight
  // at a time, so one Work item).
  dev::Io* completed = nullptr;
  Status completed_status;
  Work next;
};

void Allocator::StartTableWrite(u32 dev) {
  TableWrite* w = platform::New<TableWrite>();
  Vector<Bucket> copy;
  u64 journal_seq = TableJournalSeq();
  const u64 settled = TableSettledSeq();
  bool unsettled = false;
  {
    MutexLock lock(mu_);
    Dev& d = devices_[dev];
    if (d.writing || d.changes == d.written_changes) {
      platform::Delete(w);
      return;
    }
    if (w == nullptr || !TableCopy(d, settled, &copy, &unsettled).ok()) {
      platform::Delete(w);
      stats_.background_table_errors++;
      return;  // out of memory: the changes stay pinned (and relogged)
    }
    w->a = this;
    w->dev = dev;
    w->next.fn = ContinueTableWrite;
    w->next.arg = w;
    w->slot = d.last_slot ^ 1;
    w->checkpoint = d.checkpoint + 1;
    w->changes = unsettled ? d.changes - 1 : d.changes;  // frees left out: written again
    d.writing = true;
    d.write_round = room_round_;
    d.writing_pin = d.pin;
    d.pin = journal::Pin();
    stats_.background_table_writes++;
  }

  Status st = w->versions.Resize(copy.size());
  if (st.ok()) {
    for (u64 b = 0; b < copy.size(); b++) w->versions[b] = copy[b].version;
    w->buf = BuildTable(dev, copy.data(), copy.size(), w->checkpoint, journal_seq);
    if (w->buf == nullptr) st = Err::kNoMemory;
  }
  if (!st.ok()) {
    FinishTableWrite(w, st);
    return;
  }
  w->bytes = TableSlotBytes(copy.size());
  w->offset = sb_.BucketOffset(0) + w->slot * w->bytes;
  w->head = TableHeadBytes(dev, w->bytes);
  if (w->head < w->bytes) {
    SubmitTableIo(w, &w->write, IoOp::kWrite, w->head, w->bytes - w->head);
  } else {
    SubmitTableIo(w, &w->head_write, IoOp::kWrite, 0, w->head);
  }
}

void Allocator::SubmitTableIo(TableWrite* w, dev::Io* io, IoOp op, u64 at, u64 len) {
  io->req.op = op;
  io->req.origin = IoOrigin::kAlloc;
  if (op == IoOp::kWrite) {
    io->req.offset = w->offset + at;
    io->req.length = len;
    io->req.buf = w->buf + at;
    if (io == &w->head_write) io->req.flags = IoRequest::kFua;  // durable when done
  }
  io->cls = dev::DefaultClass(IoOrigin::kAlloc);
  io->done = OnTableWritten;
  io->caller_data = w;
  devs_->member(w->dev)->queue().Submit(io);
}

void Allocator::OnTableWritten(dev::Io* io, Status st) {
  // A completion: it may not submit the next step or take mu_ (FinishTableWrite).
  // Always deferred -- a background write, never on a latency path.
  auto* w = static_cast<TableWrite*>(io->caller_data);
  w->completed = io;
  w->completed_status = st;
  w->a->devs_->work().Queue(&w->next);
}

void Allocator::ContinueTableWrite(void* arg) {
  auto* w = static_cast<TableWrite*>(arg);
  Allocator* a = w->a;
  const dev::Io* io = w->completed;
  const Status st = w->completed_status;
  if (!st.ok() || io == &w->head_write) {
    a->FinishTableWrite(w, st);
  } else if (io == &w->write) {
    a->SubmitTableIo(w, &w->flush, IoOp::kFlush, 0, 0);
  } else {  // the flush after the records: the head, written through
    a->SubmitTableIo(w, &w->head_write, IoOp::kWrite, 0, w->head);
  }
}

void Allocator::FinishTableWrite(TableWrite* w, Status st) {
  journal::Pin drop;
  {
    MutexLock lock(mu_);
    Dev& d = devices_[w->dev];
    if (st.ok()) {
      d.checkpoint = w->checkpoint;
      d.last_slot = w->slot;
      d.other_slot_stale = true;
      for (u64 b = 0; b < w->versions.size(); b++) d.durable_version[b] = w->versions[b];
      if (w->changes > d.written_changes) d.written_changes = w->changes;
      drop = d.writing_pin;  // (inactive if a relog took it over)
      stats_.table_writes++;
    } else {
      drop = KeepOlder(&d.pin, d.writing_pin);  // not on disk: keep pinned
      stats_.background_table_errors++;
      platform::Log(platform::LogLevel::kError, "alloc: background table write of member %u failed: %s", w->dev,
                    st.Message());
    }
    d.writing_pin = journal::Pin();
  }
  if (journal_ != nullptr) journal_->PinDrop(&drop);
  platform::Free(w->buf);
  const u32 dev = w->dev;
  platform::Delete(w);
  // Last: a waiter (Checkpoint, WaitForBackgroundWrites, the destructor) may
  // free the allocator and the journal as soon as it sees this.
  MutexLock lock(mu_);
  devices_[dev].writing = false;
  table_cv_.Broadcast();
}

void Allocator::WaitForBackgroundWrites() {
  MutexLock lock(mu_);
  for (u32 i = 0; i < nr_; i++)
    while (devices_[i].writing) table_cv_.Wait(mu_);
}

u64 Allocator::RelogBudget() const {
  // Buckets (journal key + header each) a round may relog: a quarter of a
  // journal bucket, so that two generations of relogs pinned at once (the new
  // one is pinned before the old goes) stay within the ring's reserve.
  return Min<u64>(8192, sb_.bucket_size / 4 / (sizeof(journal::KeyHeader) + sizeof(AllocKey)));
}

Status Allocator::Relog(u32 dev, u64* budget, bool* relogged) {
  Vector<AllocKey> keys;
  journal::Pin covered[2];
  {
    MutexLock lock(mu_);
    Dev& d = devices_[dev];
    if (!d.pin.active && !d.writing_pin.active) return Status::Ok();
    // Only a member whose table write has been in flight since an earlier
    // round (slow, or stalled) is relogged; one that started this round is
    // given until the next round to finish.
    if (d.writing && d.write_round == room_round_) return Status::Ok();
    u64 n = 0;
    for (u64 b = 0; b < d.buckets.size(); b++) n += d.buckets[b].version != d.durable_version[b];
    if (n > *budget) {
      stats_.relogs_too_big++;
      *relogged = false;
      return Status::Ok();
    }
    *budget -= n;
    TFS_TRY(keys.Resize(n));
    n = 0;
    for (u64 b = 0; b < d.buckets.size(); b++) {
      if (d.buckets[b].version != d.durable_version[b]) keys[n++] = KeyFor(dev, b, d.buckets[b]);
    }
    covered[0] = d.pin;
    covered[1] = d.writing_pin;
    d.pin = journal::Pin();
    d.writing_pin = journal::Pin();
  }
  // Journaled again as they are now (replay keeps the newest version), then
  // durable -- a flush of journal members only -- before the pins go: until
  // then only the old entries hold these changes.
  journal::Pin relog_pin;
  Status st;
  constexpr u32 kBatch = 128;  // 4 KiB of keys: fits any entry size the journal accepts
  Vector<journal::Key> jk;     // (2 KiB: on the heap, not a kernel frame)
  st = jk.Resize(kBatch);
  const u32 per_entry = u32(Min<u64>(kBatch, (journal_->max_entry_bytes() / 2) / (sizeof(journal::KeyHeader) + sizeof(AllocKey))));
  for (u64 at = 0; st.ok() && at < keys.size(); at += per_entry) {
    const u32 n = u32(Min<u64>(per_entry, keys.size() - at));
    for (u32 i = 0; i < n; i++) jk[i] = journal::Key{journal::kKeyAlloc, sizeof(AllocKey), &keys[at + i]};
    journal::Pin local;
    auto r = journal_->Commit(jk.data(), n, 0, journal::CommitMode::kNoFlush, &local, journal::Watermark::kReclaim);
    st = r.status();
    journal::Pin extra = KeepOlder(&relog_pin, local);
    journal_->PinDrop(&extra);
  }
  if (st.ok() && !keys.empty()) st = journal_->Flush();
  journal::Pin drop[3];
  {
    MutexLock lock(mu_);
    Dev& d = devices_[dev];
    if (st.ok()) {
      drop[0] = KeepOlder(&d.pin, relog_pin);
      drop[1] = covered[0];
      drop[2] = covered[1];
      if (!keys.empty()) stats_.relogs++;
      stats_.relogged_buckets += keys.size();
    } else {
      drop[0] = KeepOlder(&d.pin, covered[0]);
      drop[1] = KeepOlder(&d.pin, covered[1]);
      drop[2] = KeepOlder(&d.pin, relog_pin);
    }
  }
  for (journal::Pin& p : drop) journal_->PinDrop(&p);
  return st;
}

void Allocator::ReclaimHook(void* self, u64) {
  Status st = static_cast<Allocator*>(self)->CheckpointForRoom(false);
  if (!st.ok()) platform::Log(platform::LogLevel::kError, "alloc: checkpoint failed: %s", st.Message());
}

Bucket Allocator::Get(u32 dev, u64 bucket) const {
  MutexLock lock(mu_);
  if (dev >= nr_ || bucket >= devices_[dev].buckets.size()) return Bucket();
  return devices_[dev].buckets[bucket];
}

DeviceUsage Allocator::Usage(u32 dev) const {
  DeviceUsage u;
  MutexLock lock(mu_);
  if (dev >= nr_) return u;
  const Dev& d = devices_[dev];
  u.nbuckets = d.buckets.size();
  u.pending_free = d.pending.size();
  for (const Bucket& b : d.buckets) {
    u.by_state[u8(b.state)]++;
    u.live_sectors += b.live_sectors;
  }
  u.reserves = d.reserves;
  u.metadata_need = d.metadata_need.Load(MemOrder::kRelaxed);
  u.reserves.btree = BtreeReserve(d.reserves, u.metadata_need, d.metadata_held.Load(MemOrder::kRelaxed));
  return u;
}

AllocStats Allocator::Stats() const {
  MutexLock lock(mu_);
  return stats_;
}

}  // namespace tfs::alloc
