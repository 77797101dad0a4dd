// Writes, punches and reservations of file data (data.h): Prepare writes a
// write's blobs -- whole 4 KiB blocks, zstd-compressed where that saves a
// block -- into space from ctx's write point, and builds their extent values;
// the Queue* calls put extent keys into the caller's transaction (the new
// ones, what an overwrite or punch leaves of the old ones, unwritten ones for
// fallocate), each with its backpointers (backpointer.h: QueueBackpointers,
// in the same transaction), and record in a Delta how the space accounting
// is to move;
// Commit commits the transaction and then Applies the delta, or Aborts it.
//
// Prepare needs no lock (its blobs are new) and does its device I/O before
// anything is queued; the Queue* calls for one inode and the commit that
// follows must be serialized by the caller (posix's inode stripe). Data is
// written and completed before its commit, which names the members written
// (Delta::deps); data on a member without a journal ring is flushed before
// the commit enters the journal (the slow-member rule). No lock of the data
// path is held across I/O or a btree call.
#include "data/backpointer.h"
#include "data/data.h"
#include "data/internal.h"

#include "platform/platform.h"

namespace tfs::data {

using btree::Iterator;

Status DataPath::WriteBlob(const IoContext& ctx, u32 dev, u64 offset, const u8* data, u32 nblocks) {
  const u64 len = u64(nblocks) * kBlockSize;
  // O_DIRECT devices need aligned buffers: copy only data that is not.
  u8* buf = nullptr;
  if (reinterpret_cast<uptr>(data) % kBlockSize != 0) {
    buf = static_cast<u8*>(platform::Alloc(len, kBlockSize));
    if (buf == nullptr) return Err::kNoMemory;
    MemCopy(buf, data, len);
  }
  Status st = ContextIo(ctx, store_->devs().member(dev)->queue(), IoOp::kWrite, offset,
                        buf != nullptr ? buf : const_cast<u8*>(data), len);
  platform::Free(buf);
  return st;
}

Status DataPath::QueueWrite(const IoContext& ctx, btree::Transaction* tx, u64 ino, u64 first, const u8* blocks,
                            u32 nblocks, Delta* delta, bool compress) {
  Prepared* p = platform::New<Prepared>();
  if (p == nullptr) return Err::kNoMemory;
  Status st = Prepare(ctx, ino, first, blocks, nblocks, compress, p, delta);
  if (st.ok()) st = QueuePrepared(tx, *p, delta);
  platform::Delete(p);
  return st;
}

Result<u64> DataPath::UnwrittenBlocks(u64 ino, u64 first, u64 end) {
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, first + 1)));
  u64 n = 0;
  for (; it.Valid() && it.pos().inode == ino; TFS_TRY(it.Next())) {
    Extent e;
    TFS_TRY(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e));
    if (e.start >= end) break;
    if (e.unwritten) n += Min(e.end, end) - Max(e.start, first);
  }
  return n;
}

Status DataPath::QueuePrepared(btree::Transaction* tx, const Prepared& p, Delta* delta) {
  if (store_ == nullptr || p.blocks == 0) return Err::kInvalidArgument;
  TFS_TRY(QueuePunch(tx, p.ino, p.first, p.first + p.blocks, delta));
  return QueuePreparedOverPunch(tx, p);
}

Status DataPath::QueuePreparedOverPunch(btree::Transaction* tx, const Prepared& p) {
  if (store_ == nullptr || p.blocks == 0) return Err::kInvalidArgument;
  for (const Prepared::Item& item : p.items) {
    Extent e;
    TFS_TRY(ParseExtent(ExtentPos(p.ino, item.end), item.value, item.len, &e));
    TFS_TRY(tx->Set(ExtentPos(p.ino, item.end), item.value, item.len));
    TFS_TRY(QueueBackpointers(tx, store_->sb(), nullptr, &e));
    TFS_TRY(QueueDataCheck(tx, item));
  }
  return Status::Ok();
}

Status DataPath::QueueDataCheck(btree::Transaction* tx, const Prepared::Item& item) {
  // The blobs were just written whole: a check per copy covers it with the
  // crcs the extent already holds (per block, or a compressed blob's one), so
  // replay can tell whether it reached the disk (journal/format.h,
  // kKeyDataCheck).
  Extent e;
  TFS_TRY(ParseExtent(ExtentPos(0, item.end), item.value, item.len, &e));
  for (u32 i = 0; i < e.nr_ptrs; i++) {
    const Extent::Ptr& p = e.ptrs[i];
    // A member without a journal is flushed by the committer (Commit): its
    // data is durable before the entry, and replay has nothing to check.
    if ((journal_members_ & (dev::DevMask(1) << p.dev)) == 0) continue;
    const u32 ncrcs = p.compressed ? 1 : e.blocks();
    u8 buf[sizeof(journal::DataCheckFormat) + 4 * kMaxExtentBlocks];
    auto* dc = reinterpret_cast<journal::DataCheckFormat*>(buf);
    MemSet(dc, 0, sizeof(*dc));
    dc->member.set(p.dev);
    dc->offset.set(p.offset + u64(p.compressed ? 0 : p.blob_offset) * kBlockSize);
    dc->length.set(p.compressed ? p.disk_bytes : ncrcs * kBlockSize);
    dc->unit.set(p.compressed ? p.disk_bytes : kBlockSize);
    if (p.compressed) {
      Le32 c;
      c.set(p.crc);
      MemCopy(buf + sizeof(*dc), &c, 4);
    } else {
      MemCopy(buf + sizeof(*dc), e.crcs, 4 * ncrcs);
    }
    TFS_TRY(tx->AddDataCheck(buf, journal::DataCheckBytes(ncrcs)));
  }
  return Status::Ok();
}

Status DataPath::Prepare(const IoContext& ctx, u64 ino, u64 first, const u8* blocks, u32 nblocks, bool compress,
                         Prepared* p, Delta* delta) {
  if (store_ == nullptr || nblocks == 0) return Err::kInvalidArgument;
  p->ino = ino;
  p->first = first;
  p->blocks = nblocks;
  TFS_TRY(p->items.Resize(0));
  auto covered = UnwrittenBlocks(ino, first, first + nblocks);  // reserved blocks this write replaces
  TFS_TRY(covered.status());
  u8 crcs[4 * kMaxExtentBlocks];
  // Plain blocks are written up to `plain_end`: all of them, or (compressing)
  // the current chunk when zstd did not save a block.
  u32 plain_end = compress ? 0 : nblocks;
  for (u32 done = 0; done < nblocks;) {
    if (done >= plain_end) {
      const u32 n = Min(nblocks - done, kMaxCompressedBlocks);
      Status st = WriteCompressed(ctx, p, first + done, blocks + u64(done) * kBlockSize, n, covered.value(), delta);
      if (st.ok()) {
        done += n;
        continue;
      }
      if (st.code() != Err::kNotSupported) return st;
      ctr_.incompressible.FetchAdd(1, MemOrder::kRelaxed);
      plain_end = done + n;
    }
    alloc::BucketRef ref;
    u64 offset;
    u32 got;
    TFS_TRY(Reserve(ctx, Min(plain_end - done, kMaxExtentBlocks), covered.value(), false, &ref, &offset, &got));
    // Recorded at once, so that Abort gives the reserved space back whatever fails next.
    Status st = delta->changes.PushBack(Delta::Change{ref.dev, ref.bucket, i64(got), i64(got), 0});
    if (!st.ok()) {
      Account(ref.dev, ref.bucket, 0, 0, -i64(got));
      return st;
    }
    delta->deps |= dev::DevMask(1) << ref.dev;
    const u8* data = blocks + u64(done) * kBlockSize;
    TFS_TRY(WriteBlob(ctx, ref.dev, offset, data, got));
    for (u32 i = 0; i < got; i++) {
      Le32 c;
      c.set(platform::Crc32c(data + u64(i) * kBlockSize, kBlockSize));
      MemCopy(crcs + 4 * i, &c, 4);
    }
    // One plain copy (the write path writes one; replicas are a later step).
    Extent x;
    x.start = first + done;
    x.end = x.start + got;
    x.nr_ptrs = 1;
    x.ptrs[0].dev = u8(ref.dev);
    x.ptrs[0].gen = ref.gen;
    x.ptrs[0].offset = offset;
    x.crcs = crcs;
    TFS_TRY(p->items.PushBack(Prepared::Item{}));
    Prepared::Item& item = p->items[p->items.size() - 1];
    item.end = x.end;
    item.len = TFS_TRY(BuildExtent(x, item.value));
    delta->sectors += i64(got) * (kBlockSize / 512);
    ctr_.bytes_written.FetchAdd(u64(got) * kBlockSize, MemOrder::kRelaxed);
    ctr_.extents_written.FetchAdd(1, MemOrder::kRelaxed);
    done += got;
  }
  return Status::Ok();
}

Status DataPath::WriteCompressed(const IoContext& ctx, Prepared* p, u64 first, const u8* data, u32 nblocks,
                                 u64 covered, Delta* delta) {
  if (nblocks < 2) return Err::kNotSupported;  // nothing to save
  const u64 in = u64(nblocks) * kBlockSize;
  const u64 cap = in - kBlockSize;  // it must save a block
  u8* z = static_cast<u8*>(platform::Alloc(in, kBlockSize));
  if (z == nullptr) return Err::kNoMemory;
  auto r = platform::ZstdCompress(z, cap, data, in);
  if (!r.ok()) {
    platform::Free(z);
    return r.status().code() == Err::kNoSpace ? Status(Err::kNotSupported) : r.status();
  }
  const u32 zbytes = u32(r.value());
  const u32 zblocks = (zbytes + kBlockSize - 1) / kBlockSize;
  MemSet(z + zbytes, 0, u64(zblocks) * kBlockSize - zbytes);
  alloc::BucketRef ref;
  u64 offset;
  u32 got;
  Status st = Reserve(ctx, zblocks, covered, true, &ref, &offset, &got);
  if (st.ok()) {
    st = delta->changes.PushBack(Delta::Change{ref.dev, ref.bucket, i64(nblocks), i64(zblocks), 0});
    if (!st.ok()) Account(ref.dev, ref.bucket, 0, 0, -i64(zblocks));
  }
  if (st.ok()) {
    delta->deps |= dev::DevMask(1) << ref.dev;
    st = ContextIo(ctx, store_->devs().member(ref.dev)->queue(), IoOp::kWrite, offset, z,
                   u64(zblocks) * kBlockSize);
  }
  if (st.ok()) {
    // One compressed copy: the whole blob, its own crc.
    Extent x;
    x.start = first;
    x.end = first + nblocks;
    x.nr_ptrs = 1;
    Extent::Ptr& ptr = x.ptrs[0];
    ptr.dev = u8(ref.dev);
    ptr.gen = ref.gen;
    ptr.offset = offset;
    ptr.compressed = true;
    ptr.stored_blocks = u8(nblocks);
    ptr.disk_bytes = zbytes;
    ptr.crc = platform::Crc32c(z, zbytes);
    st = p->items.PushBack(Prepared::Item{});
    if (st.ok()) {
      Prepared::Item& item = p->items[p->items.size() - 1];
      item.end = x.end;
      auto len = BuildExtent(x, item.value);
      st = len.status();
      if (st.ok()) item.len = len.value();
    }
  }
  platform::Free(z);
  TFS_TRY(st);
  delta->sectors += i64(nblocks) * (kBlockSize / 512);
  ctr_.bytes_written.FetchAdd(u64(zblocks) * kBlockSize, MemOrder::kRelaxed);
  ctr_.extents_written.FetchAdd(1, MemOrder::kRelaxed);
  ctr_.compressed_in.FetchAdd(in, MemOrder::kRelaxed);
  ctr_.compressed_out.FetchAdd(zbytes, MemOrder::kRelaxed);
  return Status::Ok();
}

Status DataPath::QueuePunch(btree::Transaction* tx, u64 ino, u64 first, u64 end, Delta* delta, u32 max_keys) {
  if (store_ == nullptr || end <= first) return store_ == nullptr ? Status(Err::kInvalidArgument) : Status::Ok();
  delta->ino = ino;
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, first + 1)));
  u8 value[kExtentValueMax];
  u32 touched = 0;
  for (; it.Valid() && it.pos().inode == ino && touched < max_keys; TFS_TRY(it.Next())) {
    Extent e;
    TFS_TRY(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e));
    if (e.start >= end) break;
    touched++;
    const u64 lo = Max(e.start, first);
    const u64 hi = Min(e.end, end);
    // The pieces (parsed back for their backpointers; their crcs, which
    // point into `value`, are not used after).
    const bool has_back = e.end > end, has_front = e.start < first;
    Extent back, front;
    if (has_back) {  // the piece after the range keeps the key
      const u32 len = TFS_TRY(BuildPiece(e, end - e.start, u32(e.end - end), value));
      TFS_TRY(tx->Set(ExtentPos(ino, e.end), value, len));
      TFS_TRY(ParseExtent(ExtentPos(ino, e.end), value, len, &back));
    } else {
      TFS_TRY(tx->Delete(ExtentPos(ino, e.end)));
    }
    if (has_front) {  // the piece before the range: a new key at `first`
      const u32 len = TFS_TRY(BuildPiece(e, 0, u32(first - e.start), value));
      TFS_TRY(tx->Set(ExtentPos(ino, first), value, len));
      TFS_TRY(ParseExtent(ExtentPos(ino, first), value, len, &front));
    }
    // The backpointers (QueueBackpointers): the front piece keeps e's
    // positions (its pointers' blob offsets are e's), so e's are rewritten
    // for it -- or moved to the back piece, or deleted -- and a back piece
    // beside a front one gets new ones.
    TFS_TRY(QueueBackpointers(tx, store_->sb(), &e, has_front ? &front : has_back ? &back : nullptr));
    if (has_front && has_back) TFS_TRY(QueueBackpointers(tx, store_->sb(), nullptr, &back));
    if (e.unwritten) delta->unreserved += hi - lo;
    // Each copy releases the blocks in its bucket (live, or cached); a bad
    // pointer was never counted (PtrBucket).
    for (u32 i = 0; i < e.nr_ptrs; i++) {
      const Extent::Ptr& ptr = e.ptrs[i];
      u64 b;
      if (!PtrBucket(ptr, &b)) continue;
      const i64 n = -i64(hi - lo);
      TFS_TRY(delta->changes.PushBack(Delta::Change{ptr.dev, b, ptr.cached ? 0 : n, 0, ptr.cached ? n : 0}));
    }
    delta->sectors -= i64(hi - lo) * (kBlockSize / 512);
  }
  return Status::Ok();
}

Result<u32> DataPath::CountExtentsFrom(u64 ino, u64 first, u32 limit) {
  if (store_ == nullptr) return Err::kInvalidArgument;
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, first + 1)));
  u32 n = 0;
  for (; it.Valid() && it.pos().inode == ino && n < limit; TFS_TRY(it.Next())) n++;
  return n;
}

Status DataPath::QueueReserve(btree::Transaction* tx, u64 ino, u64 first, u64 end, Delta* delta, u32 max_keys,
                              u64* next) {
  *next = first;
  if (store_ == nullptr || end < first) return Err::kInvalidArgument;
  delta->ino = ino;
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, first + 1)));
  u8 value[kExtentValueMax];  // (an unwritten extent's value: the header alone)
  u64 at = first;
  u32 keys = 0;
  while (at < end && keys < max_keys) {
    // The next extent at or after `at`: blocks before it are a hole.
    u64 hole_end = end;
    bool covered = false;
    if (it.Valid() && it.pos().inode == ino) {
      Extent e;
      TFS_TRY(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e));
      if (e.start <= at) {
        covered = true;
        at = Min(e.end, end);
        TFS_TRY(it.Next());
      } else {
        hole_end = Min(e.start, end);
      }
    }
    if (covered) continue;
    const u32 n = u32(Min<u64>(hole_end - at, kMaxUnwrittenBlocks));
    {
      MutexLock a(acct_mu_);
      const u64 free = FreeBlocksLocked();
      if (free < reserved_ || free - reserved_ < n) {
        ctr_.reserve_refused.FetchAdd(1, MemOrder::kRelaxed);
        return Err::kNoSpace;
      }
      reserved_ += n;
    }
    delta->reserved += n;  // counted now, so that Abort returns it whatever fails next
    TFS_TRY(tx->Set(ExtentPos(ino, at + n), value, BuildUnwritten(n, value)));
    delta->sectors += i64(n) * (kBlockSize / 512);
    at += n;
    keys++;
  }
  *next = at;
  return Status::Ok();
}

Status DataPath::FlushMembers(const IoContext& ctx, dev::DevMask mask) {
  for (u32 m : dev::Bits(mask)) {
    TFS_TRY(ContextIo(ctx, store_->devs().member(m)->queue(), IoOp::kFlush, 0, nullptr, 0));
    ctr_.slow_member_flushes.FetchAdd(1, MemOrder::kRelaxed);
  }
  return Status::Ok();
}

Status DataPath::FlushSlowMembers(const IoContext& ctx, Delta* delta) {
  const dev::DevMask slow = delta->deps & ~journal_members_;
  TFS_TRY(FlushMembers(ctx, slow));
  delta->deps &= ~slow;  // durable now: the commit depends on journal members only
  return Status::Ok();
}

Status DataPath::Commit(const IoContext& ctx, btree::Transaction* tx, const Delta& delta, journal::CommitMode mode) {
  // Data on members without a journal, if the caller did not flush it
  // already (FlushSlowMembers).
  const dev::DevMask slow = delta.deps & ~journal_members_;
  Status fst = FlushMembers(ctx, slow);
  if (!fst.ok()) {
    Abort(delta);
    return fst;
  }
  // Readers of this inode's extents see the commit whole or not at all (see
  // ReadBlocks): its stripe's counter is odd while the keys are applied.
  tx->SetApplySeq(&applying_[CommitStripe(delta.ino)]);
  auto r = tx->Commit(mode, delta.deps & ~slow);
  if (!r.ok()) {
    Abort(delta);
    return r.status();
  }
  Apply(delta);
  return Status::Ok();
}

}  // namespace tfs::data
