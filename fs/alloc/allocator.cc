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
    u64 best_checkpoint = 0;
    i32 best_slot = -1;
    Status io_error;
    for (u32 slot = 0; slot < 2; slot++) {
      u64 offset = sb_.BucketOffset(0) + slot * slot_bytes;
      Status st = dev::QueueSyncIo(devs_->member(i)->queue(), IoOp::kRead, offset, buf, slot_bytes, 0,
                                   IoOrigin::kAlloc);
      if (!st.ok()) {
        io_error = st;
        continue;
      }
      const auto* h = reinterpret_cast<const TableHeader*>(buf);
      bool ok = h->magic.get() == kAllocMagic && h->version.get() == kAllocVersion &&
                h->dev_idx.get() == i && h->nbuckets.get() == n &&
                MemCompare(h->fs_uuid, sb_.fs_uuid, 16) == 0 && h->csum.get() == TableCsum(buf, slot_bytes);
      if (!ok || (best_slot >= 0 && h->checkpoint.get() <= best_checkpoint)) continue;
      const auto* rec = reinterpret_cast<const BucketFormat*>(buf + sizeof(TableHeader));
      bool records_ok = true;
      for (u64 b = 0; b < n && records_ok; b++) records_ok = rec[b].state < kBucketStateCount;
      if (!records_ok) continue;
      for (u64 b = 0; b < n; b++) {
        Bucket& bk = d.buckets[b];
        bk.gen = rec[b].gen;
        bk.state = BucketState(rec[b].state);
        bk.live_sectors = rec[b].live_sectors.get();
        bk.version = rec[b].version.get();
      }
      best_checkpoint = h->checkpoint.get();
      best_slot = i32(slot);
    }
    platform::Free(buf);
    if (best_slot < 0) {
      return DiagError(diag, io_error.ok() ? Status(Err::kCorrupt) : io_error,
                       "member %s: no valid allocation table in either slot%s", sb_.members[i].label,
                       io_error.ok() ? "" : " (I/O error)");
    }
    d.checkpoint = best_checkpoint;
    d.last_slot = u32(best_slot);
  }
  return Status::Ok();
}

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

u64 Allocator::FreeFloor(u32 dev, Watermark wm) const {
  const Reserves& r = devices_[dev].reserves;
  switch (wm) {
    case Watermark::kBackground: return r.foreground + r.copygc + r.btree;
    case Watermark::kForeground: return r.copygc + r.btree;
    case Watermark::kCopygc: return r.btree;
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
    bk.gen++;
    bk.state = BucketState::kFree;
    bk.live_sectors = 0;
    bk.version++;
    d.changes++;
    stats_.frees++;
    snapshot = bk;
  }
  u64 seq = TFS_TRY(JournalChange(ref.dev, ref.bucket, snapshot, was));
  MutexLock lock(mu_);
  Dev& d = devices_[ref.dev];
  if (journal_ == nullptr) {
    d.free_list.PushBack(ref.bucket).IgnoreError();  // capacity reserved at Init
    d.free_count++;
  } else {
    d.pending.PushBack(Dev::Pending{ref.bucket, seq}).IgnoreError();  // capacity reserved at Init
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
  AllocKey k;
  MemSet(&k, 0, sizeof(k));
  k.dev.set(u16(dev));
  k.gen = b.gen;
  k.state = u8(b.state);
  k.live_sectors.set(b.live_sectors);
  k.bucket.set(bucket);
  k.version.set(b.version);
  journal::Key key{journal::kKeyAlloc, sizeof(k), &k};
  journal::Pin local;
  // Btree buckets change only in checkpoints, which journal reclaim waits for:
  // those changes must not wait for journal room themselves.
  const journal::Watermark wm = owner == BucketState::kBtree ? journal::Watermark::kReclaim : journal::Watermark::kNormal;
  u64 seq = TFS_TRY(journal_->Commit(&key, 1, 0, journal::CommitMode::kNoFlush, &local, wm));
  journal::Pin drop;
  {
    MutexLock lock(mu_);
    // Keep the oldest pin: it holds every newer change in the ring too.
    if (!pin_.active) {
      pin_ = local;
    } else if (local.seq < pin_.seq) {
      drop = pin_;
      pin_ = local;
    } else {
      drop = local;
    }
  }
  journal_->PinDrop(&drop);
  return seq;
}

Status Allocator::WriteTable(u32 dev, const Bucket* snapshot, u64 n, u64 checkpoint, u32 slot,
                             u64 journal_seq) {
  const u64 slot_bytes = TableSlotBytes(n);
  u8* buf = static_cast<u8*>(platform::Alloc(slot_bytes, 4096, true));
  if (buf == nullptr) return Err::kNoMemory;
  auto* h = reinterpret_cast<TableHeader*>(buf);
  h->magic.set(kAllocMagic);
  h->version.set(kAllocVersion);
  h->dev_idx.set(u16(dev));
  MemCopy(h->fs_uuid, sb_.fs_uuid, 16);
  h->checkpoint.set(checkpoint);
  h->journal_seq.set(journal_seq);
  h->nbuckets.set(n);
  auto* rec = reinterpret_cast<BucketFormat*>(buf + sizeof(TableHeader));
  for (u64 b = 0; b < n; b++) {
    rec[b].gen = snapshot[b].gen;
    rec[b].state = u8(snapshot[b].state);
    rec[b].live_sectors.set(snapshot[b].live_sectors);
    rec[b].version.set(snapshot[b].version);
  }
  h->csum.set(TableCsum(buf, slot_bytes));
  dev::IoQueue& q = devs_->member(dev)->queue();
  u64 offset = sb_.BucketOffset(0) + slot * slot_bytes;
  Status st = dev::QueueSyncIo(q, IoOp::kWrite, offset, buf, slot_bytes, 0, IoOrigin::kAlloc);
  if (st.ok()) st = dev::QueueSyncIo(q, IoOp::kFlush, 0, nullptr, 0, 0, IoOrigin::kAlloc);
  platform::Free(buf);
  return st;
}

Status Allocator::Checkpoint() {
  MutexLock serial(checkpoint_mu_);
  Vector<Bucket> copies[dev::kMaxDevices];
  u64 snap_changes[dev::kMaxDevices] = {};
  bool write[dev::kMaxDevices] = {};
  journal::Pin old_pin;
  u64 journal_seq = journal_ != nullptr ? journal_->next_seq() : 0;
  {
    MutexLock lock(mu_);
    // A member whose table already holds every change is left alone: every
    // journaled change the pin keeps was made (under mu_) on a member counted
    // here as changed, so its table is in this checkpoint.
    for (u32 i = 0; i < nr_; i++) {
      write[i] = devices_[i].changes != devices_[i].written_changes;
      snap_changes[i] = devices_[i].changes;
      if (write[i]) TFS_TRY(copies[i].CopyFrom(devices_[i].buckets));
    }
    old_pin = pin_;
    pin_ = journal::Pin();
  }
  Status st;
  u64 written = 0, unchanged = 0;
  for (u32 i = 0; i < nr_ && st.ok(); i++) {
    Dev& d = devices_[i];
    if (!write[i]) {
      unchanged++;
      continue;
    }
    u32 slot = d.last_slot ^ 1;
    st = WriteTable(i, copies[i].data(), copies[i].size(), d.checkpoint + 1, slot, journal_seq);
    if (st.ok()) {
      d.checkpoint++;
      d.last_slot = slot;
      written++;
      MutexLock lock(mu_);
      d.written_changes = snap_changes[i];
    }
  }
  {
    MutexLock lock(mu_);
    stats_.table_writes += written;
    stats_.tables_unchanged += unchanged;
    if (!st.ok()) {
      // Keep the changes pinned: they are not on disk yet.
      if (old_pin.active && (!pin_.active || old_pin.seq < pin_.seq)) Swap(old_pin, pin_);
    } else {
      stats_.checkpoints++;
    }
  }
  if (journal_ != nullptr) journal_->PinDrop(&old_pin);
  return st;
}

void Allocator::ReclaimHook(void* self, u64) {
  Status st = static_cast<Allocator*>(self)->Checkpoint();
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
  return u;
}

AllocStats Allocator::Stats() const {
  MutexLock lock(mu_);
  return stats_;
}

}  // namespace tfs::alloc
