// The repair of a bad copy (data.h; docs/design/copies.md, "Step 6b"): a
// read that another copy served queues the copy that failed (QueueRepair,
// from ReadCopies); the mount's repair worker (posix's) takes it
// (TakeRepair), prepares the new copy with no lock held (PrepareRepair: the
// extent looked up again, a good copy read and verified, written to new
// space on the bad copy's member), and under the inode's lock re-keys the
// extent if it is unchanged (QueueReplacePtr: the one re-key call, which
// the mover reuses), then commits (Commit) and counts (NoteRepair).
//
// The queue is a ring under a spin lock (the reader pushes with no other
// lock held; the worker pops); a waiter sleeps on repair_seq_. No lock of
// the data path is held across I/O or a btree call.
#include "data/backpointer.h"
#include "data/data.h"
#include "data/internal.h"

#include "platform/platform.h"

namespace tfs::data {

namespace {

// The index of pointer p among e's (false: e has no such pointer).
bool FindPtr(const Extent& e, const Extent::Ptr& p, u32* at) {
  for (u32 i = 0; i < e.nr_ptrs && i < kMaxPtrs; i++)
    if (SamePtr(e.ptrs[i], p)) {
      *at = i;
      return true;
    }
  return false;
}

}  // namespace

void DataPath::QueueRepair(const Extent& e, u32 c, bool io_error) {
  const Extent::Ptr& p = e.ptrs[c];
  if (store_->read_only() || (store_->devs().unavailable() & (dev::DevMask(1) << (p.dev % dev::kMaxDevices))) != 0)
    return;
  {
    SpinGuard l(repair_mu_);
    auto same = [&](const CopyRepair& q) { return q.ino == e.ino && q.end == e.end && SamePtr(q.bad, p); };
    if (repair_busy_ && same(repair_taken_)) return;  // (being repaired)
    for (u32 i = 0; i < repair_count_; i++)
      if (same(repairs_[(repair_head_ + i) % kRepairQueue])) return;  // (queued already)
    if (repair_count_ == kRepairQueue) {
      ctr_.repairs_dropped.FetchAdd(1, MemOrder::kRelaxed);
      return;
    }
    CopyRepair& r = repairs_[(repair_head_ + repair_count_) % kRepairQueue];
    r = CopyRepair{};
    r.ino = e.ino;
    r.end = e.end;
    r.start = e.start;
    r.bad = p;
    r.io_error = io_error;
    repair_count_++;
    ctr_.repairs_waiting.FetchAdd(1, MemOrder::kRelaxed);
  }
  ctr_.repairs_queued.FetchAdd(1, MemOrder::kRelaxed);
  KickRepairs();
}

bool DataPath::TakeRepair(CopyRepair* out) {
  SpinGuard l(repair_mu_);
  if (repair_count_ == 0) return false;
  *out = repairs_[repair_head_];
  repair_taken_ = *out;
  repair_busy_ = true;
  repair_head_ = (repair_head_ + 1) % kRepairQueue;
  repair_count_--;
  ctr_.repairs_waiting.FetchSub(1, MemOrder::kRelaxed);
  return true;
}

void DataPath::WaitRepairs(u32 seq, u64 timeout_ns) { (void)tfs_plat_wait(repair_seq_.Address(), seq, timeout_ns); }

void DataPath::KickRepairs() {
  repair_seq_.FetchAdd(1, MemOrder::kAcqRel);
  tfs_plat_wake(repair_seq_.Address(), 0);
}

void DataPath::DropRepairs() {
  SpinGuard l(repair_mu_);
  ctr_.repairs_dropped.FetchAdd(repair_count_, MemOrder::kRelaxed);
  ctr_.repairs_waiting.FetchSub(repair_count_, MemOrder::kRelaxed);
  repair_head_ = 0;
  repair_count_ = 0;
  repair_busy_ = false;
}

IoContext DataPath::RepairContext(const CopyRepair& r) {
  IoContext ctx;
  ctx.origin = IoOrigin::kReconcile;
  ctx.io_class = dev::IoClass::kBackground;
  ctx.watermark = alloc::Watermark::kBackground;
  ctx.target = Target{TargetKind::kMember, r.bad.dev};
  ctx.replicas = 1;
  ctx.target_only = true;  // (the copy belongs on its member: no fallback)
  return ctx;
}

Status DataPath::ReadGoodCopy(const IoContext& ctx, const Extent& e, u32 skip, u8* buf, u8* scratch, u32* from) {
  u8 order[kMaxPtrs];
  u64 bound[kMaxPtrs];
  OrderCopies(e, order, bound);
  Status first_error = Status::Ok();
  const u32 n = Min<u32>(e.nr_ptrs, kMaxPtrs);
  for (u32 k = 0; k < n; k++) {
    const u32 c = order[k];
    if (c == skip) continue;
    const Extent::Ptr& p = e.ptrs[c];
    Status st;
    u64 b;
    if (!PtrInBucket(store_->sb(), e, p, &b)) {
      st = Err::kCorrupt;
    } else if (!Pin(p.dev, b, p.gen)) {
      continue;  // stale (a cached copy's bucket reused; or the extent changed: the re-key finds out)
    } else {
      dev::IoQueue& q = store_->devs().member(p.dev)->queue();
      if (p.compressed) {
        st = ContextIo(ctx, q, IoOp::kRead, p.offset, buf, e.DiskBlocks(p) * kBlockSize);
        if (st.ok()) st = CheckBlob(e, p, buf, scratch);
      } else {
        const u64 at = p.offset + u64(p.blob_offset) * kBlockSize;
        st = ContextIo(ctx, q, IoOp::kRead, at, buf, u64(e.blocks()) * kBlockSize);
        if (st.ok()) st = CheckBlocks(e, p, e.start, e.end, buf, at);
      }
      Unpin(p.dev, b);
    }
    if (st.ok()) {
      *from = c;
      return Status::Ok();
    }
    NoteReadFailure(p.dev, st);
    if (first_error.ok()) first_error = st;
  }
  // (Every other copy stale: the extent is changing under the repair.)
  return first_error.ok() ? Status(Err::kAgain) : first_error;
}

Status DataPath::PrepareRepair(const CopyRepair& r, Replacement* out, Delta* delta) {
  if (store_ == nullptr) return Err::kInvalidArgument;
  out->ino = r.ino;
  out->end = r.end;
  out->old = r.bad;
  out->has_new = false;
  out->seen_len = 0;
  delta->ino = r.ino;
  // The extent as it is now: the one read, still with the bad copy.
  const btree::Pos pos = ExtentPos(r.ino, r.end);
  Extent e;
  {
    btree::Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
    TFS_TRY(it.Seek(pos));
    if (!it.Valid() || !(it.pos() == pos) || it.val_bytes() > kExtentValueMax) return Err::kAgain;
    out->seen_len = it.val_bytes();
    MemCopy(out->seen, it.value(), out->seen_len);
  }
  TFS_TRY(ParseExtent(pos, out->seen, out->seen_len, &e));  // (e.crcs into out->seen)
  u32 c;
  if (e.start != r.start || !FindPtr(e, r.bad, &c)) return Err::kAgain;
  if (r.bad.cached) return Status::Ok();  // dropped, not rewritten
  if ((store_->devs().unavailable() & (dev::DevMask(1) << (r.bad.dev % dev::kMaxDevices))) != 0)
    return Err::kMissing;  // (the member, not the copy: the reconcile's)
  const IoContext ctx = RepairContext(r);
  u8* buf = static_cast<u8*>(platform::Alloc(u64(kMaxExtentBlocks) * kBlockSize, kBlockSize));
  u8* scratch = static_cast<u8*>(platform::Alloc(u64(kMaxCompressedBlocks) * kBlockSize, kBlockSize));
  u32 from = 0;
  Status st = buf == nullptr || scratch == nullptr ? Status(Err::kNoMemory) : ReadGoodCopy(ctx, e, c, buf, scratch, &from);
  platform::Free(scratch);
  if (st.ok()) {
    // The good copy's bytes as they are stored: a compressed blob whole (its
    // pieces' offsets and crc stay valid), a plain copy's extent blocks.
    const Extent::Ptr& g = e.ptrs[from];
    const u32 disk = u32(g.compressed ? e.DiskBlocks(g) : e.blocks());
    Space sp[kMaxPtrs];
    u32 copies = 0, got = 0;
    st = Reserve(ctx, disk, 0, true, sp, &copies, &got);
    if (st.ok()) st = RecordCopies(sp, copies, e.blocks(), got, delta);  // (Abort gives them back)
    // One copy of the whole blob, on the bad copy's member (target_only:
    // never elsewhere; the write point table's fallback could still be):
    // anything else is no repair of this copy.
    if (st.ok() && (copies != 1 || got != disk || sp[0].ref.dev != r.bad.dev)) st = Err::kNoSpace;
    if (st.ok())
      st = ContextIo(ctx, store_->devs().member(sp[0].ref.dev)->queue(), IoOp::kWrite, sp[0].offset, buf,
                     u64(disk) * kBlockSize);
    if (st.ok()) {
      Extent::Ptr& now = out->now;
      now = g.compressed ? g : Extent::Ptr{};
      now.dev = u8(sp[0].ref.dev);
      now.gen = sp[0].ref.gen;
      now.offset = sp[0].offset;
      now.cached = false;
      out->has_new = true;
      delta->deps |= dev::DevMask(1) << sp[0].ref.dev;
    }
  }
  platform::Free(buf);
  return st;
}

Status DataPath::QueueReplacePtr(btree::Transaction* tx, const Replacement& r, Delta* delta) {
  if (store_ == nullptr || r.seen_len == 0) return Err::kInvalidArgument;
  const btree::Pos pos = ExtentPos(r.ino, r.end);
  {
    // Unchanged since it was seen, byte for byte (the caller's lock keeps it
    // so until the commit).
    btree::Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
    TFS_TRY(it.Seek(pos));
    if (!it.Valid() || !(it.pos() == pos) || it.val_bytes() != r.seen_len ||
        MemCompare(it.value(), r.seen, r.seen_len) != 0)
      return Err::kAgain;
  }
  Extent e;
  TFS_TRY(ParseExtent(pos, r.seen, r.seen_len, &e));
  u32 c;
  if (!FindPtr(e, r.old, &c)) return Err::kAgain;
  const sb::Superblock& sb = store_->sb();
  u8 value[kExtentValueMax];
  const u32 len = TFS_TRY(r.has_new ? ReplacePtr(e, c, r.now, e.crcs, value) : DropPtr(e, c, value));
  Extent x;
  TFS_TRY(ParseExtent(pos, value, len, &x));
  TFS_TRY(tx->Set(pos, value, len));
  TFS_TRY(QueueBackpointers(tx, sb, &e, &x));
  delta->ino = r.ino;
  if (r.has_new) {
    // The new copy's journal data check, as a write's (replay tells whether
    // it reached the member).
    Extent one;
    one.start = e.start;
    one.end = e.end;
    one.nr_ptrs = 1;
    one.ptrs[0] = r.now;
    one.crcs = r.now.compressed ? nullptr : e.crcs;
    TFS_TRY(QueueDataChecks(tx, one));
    // Sole when the other copies count for nothing (5c-3).
    u32 others = 0;
    for (u32 i = 0; i < x.nr_ptrs; i++)
      if (i != c && !x.ptrs[i].cached) others += members_.durability[x.ptrs[i].dev % dev::kMaxDevices];
    if (others == 0) delta->sole |= dev::DevMask(1) << r.now.dev;
  }
  // The bad copy's blocks leave its bucket (the new copy's count comes from
  // its pending blocks: PrepareRepair's change).
  u64 b;
  if (PtrCounts(r.old, &b)) {
    const i64 n = -i64(e.blocks());
    TFS_TRY(delta->changes.PushBack(
        Delta::Change{.dev = r.old.dev, .bucket = b, .blocks = r.old.cached ? 0 : n, .cached = r.old.cached ? n : 0}));
  }
  return MoveSet(sb, e, x, delta);
}

void DataPath::NoteRepair(const CopyRepair& r, const Replacement* done, Status st) {
  {
    SpinGuard l(repair_mu_);
    repair_busy_ = false;  // (TakeRepair's entry is done with)
  }
  char more[64];
  // (The subject of both log lines: which copy, and why it was bad.)
  char what[160];
  auto subject = [&]() {
    platform::Format(what, sizeof(what), "data: inode %llu blocks %llu..%llu: the copy on member %u (%s)",
                     (unsigned long long)r.ino, (unsigned long long)r.start, (unsigned long long)r.end - 1,
                     unsigned(r.bad.dev), r.io_error ? "an I/O error" : "a checksum mismatch");
    return what;
  };
  if (st.ok() && done != nullptr && !done->has_new) {
    ctr_.repair_cached_dropped.FetchAdd(1, MemOrder::kRelaxed);
    return;
  }
  if (st.ok()) {
    ctr_.repaired.FetchAdd(1, MemOrder::kRelaxed);
    if (repaired_log_.Admit(kRepairLogNs, more, sizeof(more)))
      platform::Log(platform::LogLevel::kWarn, "%s was rewritten there from a good copy%s", subject(), more);
    return;
  }
  if (st.code() == Err::kAgain || st.code() == Err::kMissing) {  // (changed; or its member failed: the reconcile's)
    ctr_.repair_skipped.FetchAdd(1, MemOrder::kRelaxed);
    return;
  }
  ctr_.repair_failed.FetchAdd(1, MemOrder::kRelaxed);
  if (repair_failed_log_.Admit(kRepairLogNs, more, sizeof(more)))
    platform::Log(platform::LogLevel::kError,
                  "%s could not be repaired: %s; it stays bad (reads use the other copies) and a later read queues it "
                  "again%s",
                  subject(), st.Message(), more);
}

}  // namespace tfs::data
