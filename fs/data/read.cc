// Reads of file data (data.h): ReadBlocks finds the extents over the range
// (phase 1, FindPieces), then reads each from one of its copies (phase 2,
// ReadCopy: pin the bucket, read, verify every block it returns): a mismatch
// is kDataCorrupt and counted, never the bytes. The copies are tried in the
// order the extent lists them and the first good one wins (copy_retries);
// the read fails only when every copy did, with the first failing copy's
// error -- unless a copy was stale (its bucket freed since the lookup, maybe:
// the extent was overwritten), then the lookup is repeated first.
// (Choosing by latency, hedging and repairing the bad copy are a later step:
// docs/design/copies.md.) Holes and unwritten extents read as zeros; a
// compressed blob is read and decompressed whole. HasData, HasBlockData and
// SeekBlock answer from the extents alone.
//
// Reads need no lock of the caller's. Phase 1 waits out, and is repeated
// after, an extent commit of the inode's stripe applying its keys
// (applying_), so a read never sees half a commit; phase 2 pins the bucket
// (Pin, under the accounting mutex, dropped before the I/O) so an overwrite
// committing meanwhile cannot free and reuse it under the read, and starts
// again if it was freed since phase 1. No lock is held across I/O.
#include "data/data.h"
#include "data/internal.h"

#include "platform/platform.h"

namespace tfs::data {

using btree::Iterator;

// One extent's part of a read, found in phase 1 of ReadBlocks.
struct DataPath::Piece {
  Extent e;   // e.crcs: the read's own copy of block lo's crc onwards (null: no plain copy)
  u64 lo, hi;
};

namespace {

// Whether a and b are the same extent (range and pointers; the crcs follow
// from the pointers' blobs).
bool SameExtent(const Extent& a, const Extent& b) {
  if (a.ino != b.ino || a.start != b.start || a.end != b.end || a.nr_ptrs != b.nr_ptrs) return false;
  for (u32 i = 0; i < a.nr_ptrs && i < kMaxPtrs; i++) {
    const Extent::Ptr& p = a.ptrs[i];
    const Extent::Ptr& q = b.ptrs[i];
    if (p.dev != q.dev || p.gen != q.gen || p.offset != q.offset || p.blob_offset != q.blob_offset ||
        p.cached != q.cached || p.compressed != q.compressed || p.disk_bytes != q.disk_bytes || p.crc != q.crc)
      return false;
  }
  return true;
}

}  // namespace

Status DataPath::FindPieces(u64 ino, u64 first, u64 end, Vector<Piece>* pieces, u8* crcs) {
  TFS_TRY(pieces->Resize(0));
  u32 ncrc = 0;
  u64 covered_to = 0;  // the end of the extent before (the first may start before `first`)
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  Status st = it.Seek(ExtentPos(ino, first + 1));
  for (; st.ok() && it.Valid() && it.pos().inode == ino; st = it.Next()) {
    Extent e;
    TFS_TRY(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e));
    if (e.start >= end) break;
    // Keys come in order, so the extents of one committed state are disjoint;
    // an overlap means the walk crossed a commit: kAgain (and the crcs,
    // sized for disjoint pieces of the range, stay in bounds).
    if (e.start < covered_to) return Err::kAgain;
    covered_to = e.end;
    if (e.unwritten) continue;  // zeros
    TFS_TRY(pieces->PushBack(Piece{}));
    Piece& p = (*pieces)[pieces->size() - 1];
    p.e = e;
    p.lo = Max(e.start, first);
    p.hi = Min(e.end, end);
    // Only the crcs this read needs (the plain copies' blocks; a compressed
    // copy's crc is in its pointer).
    if (e.crcs != nullptr) {
      const u32 count = u32(p.hi - p.lo);
      MemCopy(crcs + 4 * ncrc, e.crcs + 4 * (p.lo - e.start), 4 * count);
      p.e.crcs = crcs + 4 * ncrc;  // block lo's
      ncrc += count;
    }
  }
  return st;
}

Status DataPath::ReadCopy(const IoContext& ctx, const Extent& e, const Extent::Ptr& p, u64 lo, u64 hi, u8* out,
                          u8** tmp, bool* stale) {
  *stale = false;
  // The pointer must land in one bucket.
  u64 b;
  if (!PtrInBucket(store_->sb(), e, p, &b)) return Err::kCorrupt;
  // A user bucket of the pointer's generation, held until the read is done.
  // If it is not (any more), an overwrite committed and freed it since phase
  // 1, or the copy is stale: the caller decides.
  if (!Pin(p.dev, b, p.gen)) {
    *stale = true;
    return Err::kAgain;
  }
  // Into the caller's buffer if it is aligned for O_DIRECT devices (it then
  // holds unverified bytes until the check below passes or fails the copy),
  // else through a bounce buffer; a compressed blob always decompresses into
  // one.
  const bool direct = !p.compressed && reinterpret_cast<uptr>(out) % kBlockSize == 0;
  if (!direct && *tmp == nullptr) *tmp = static_cast<u8*>(platform::Alloc(u64(kMaxExtentBlocks) * kBlockSize, kBlockSize));
  if (!direct && *tmp == nullptr) {
    Unpin(p.dev, b);
    return Err::kNoMemory;
  }
  const u64 len = (hi - lo) * kBlockSize;
  if (p.compressed) {
    Status st = ReadCompressed(ctx, e, p, *tmp);
    Unpin(p.dev, b);
    TFS_TRY(st);
    MemCopy(out, *tmp + (u64(p.blob_offset) + (lo - e.start)) * kBlockSize, len);
    ctr_.bytes_read.FetchAdd(e.DiskBlocks(p) * kBlockSize, MemOrder::kRelaxed);
    ctr_.blocks_read.FetchAdd(hi - lo, MemOrder::kRelaxed);
    return Status::Ok();
  }
  const u64 at = p.offset + (u64(p.blob_offset) + (lo - e.start)) * kBlockSize;
  u8* into = direct ? out : *tmp;
  Status st = ContextIo(ctx, store_->devs().member(p.dev)->queue(), IoOp::kRead, at, into, len);
  Unpin(p.dev, b);
  TFS_TRY(st);
  for (u64 blk = lo; blk < hi; blk++) {
    const u8* data = into + (blk - lo) * kBlockSize;
    if (platform::Crc32c(data, kBlockSize) != e.BlockCrc(blk - lo)) {
      ctr_.csum_errors.FetchAdd(1, MemOrder::kRelaxed);
      platform::Log(platform::LogLevel::kError, "data: checksum mismatch: inode %llu block %llu (member %u offset %llu)",
                    (unsigned long long)e.ino, (unsigned long long)blk, unsigned(p.dev),
                    (unsigned long long)(at + (blk - lo) * kBlockSize));
      return Err::kDataCorrupt;
    }
  }
  if (!direct) MemCopy(out, *tmp, len);
  ctr_.bytes_read.FetchAdd(len, MemOrder::kRelaxed);
  ctr_.blocks_read.FetchAdd(hi - lo, MemOrder::kRelaxed);
  return Status::Ok();
}

Status DataPath::ReadBlocks(const IoContext& ctx, u64 ino, u64 first, u32 nblocks, u8* buf) {
  if (store_ == nullptr) return Err::kInvalidArgument;
  const u64 end = first + nblocks;
  // Phase 1 finds the extents, copying what phase 2 needs, and is repeated
  // if an extent commit of this inode overlapped it: a commit replaces keys
  // one by one, and a walk through the middle of one could see neither the
  // old nor the new extent of a block (and read zeros that were never
  // there). Phase 2 pins each bucket and reads it; if the bucket was freed
  // since phase 1, everything starts again. The pieces: one per extent found
  // (a few for most reads), not one per block.
  Vector<Piece> pieces;
  u8* crcs = static_cast<u8*>(platform::Alloc(u64(nblocks) * 4, 16));
  u8* tmp = nullptr;
  Status st = crcs == nullptr ? Status(Err::kNoMemory) : pieces.Reserve(Min<u32>(nblocks, 4));
  const u32 s = CommitStripe(ino);
  u32 stale = 0;
  u32 torn = 0;
  // The extent of the last piece that failed with a stale copy (see below).
  Extent failed_extent;
  bool failed_before = false;
  for (u32 attempt = 0; st.ok(); attempt++) {
    if (attempt > 0) platform::SleepNs(attempt < 8 ? 1000 : 100000);
    // While a commit of this stripe applies its keys (microseconds: no journal
    // wait in between; at most a read of an evicted leaf from the metadata
    // target), wait; never count that against the read.
    const u64 v = applying_[s].Load(MemOrder::kSeqCst);
    if ((v & 1) != 0) {
      ctr_.read_retries.FetchAdd(1, MemOrder::kRelaxed);
      continue;
    }
    st = FindPieces(ino, first, end, &pieces, crcs);
    const bool walk_torn = st.code() == Err::kAgain;
    if (walk_torn) st = Status::Ok();
    if (!st.ok()) break;
    // A walk no apply overlapped (the counter did not move) sees one committed
    // state, which never has overlapping extents: torn, it found extents that
    // overlap for good (fsck reports them), which would make phase 1 repeat
    // forever; after kMaxTornWalks such walks the read fails instead. A walk
    // an apply overlapped is retried and never counted.
    const bool raced = applying_[s].Load(MemOrder::kSeqCst) != v;
    if (walk_torn && !raced && ++torn > kMaxTornWalks) {
      platform::Log(platform::LogLevel::kError, "data: inode %llu: extents overlap under a read",
                    (unsigned long long)ino);
      st = Err::kCorrupt;
      break;
    }
    if (walk_torn || raced) {
      ctr_.read_retries.FetchAdd(1, MemOrder::kRelaxed);
      continue;
    }
    if (lookup_hook_ != nullptr) lookup_hook_(lookup_hook_ctx_);
    MemSet(buf, 0, u64(nblocks) * kBlockSize);
    bool again = false;
    for (u32 i = 0; st.ok() && !again && i < pieces.size(); i++) {
      const Extent& e = pieces[i].e;
      const u64 lo = pieces[i].lo;
      u8* out = buf + (lo - first) * kBlockSize;
      // The copies in order; the first good one wins. A copy whose bucket is
      // not the one it names is skipped: stale (a cached copy whose bucket
      // was invalidated: normal), or freed by an overwrite since phase 1.
      // If no copy read, the lookup is repeated when a copy was stale -- an
      // overwrite may have replaced the extent -- and the failure reported
      // when none was, or when the repeated lookup found the same extent
      // again (then its stale copies are stale for good: an overwrite
      // removes the extent before it frees a bucket).
      Status failed = Status::Ok();
      bool stale_copy = false;
      bool done = false;
      for (u32 c = 0; c < e.nr_ptrs && !done; c++) {
        if (c > 0) ctr_.copy_retries.FetchAdd(1, MemOrder::kRelaxed);
        bool stale_ptr = false;
        Status cs = ReadCopy(ctx, e, e.ptrs[c], lo, pieces[i].hi, out, &tmp, &stale_ptr);
        if (cs.ok()) {
          done = true;
        } else if (cs.code() == Err::kNoMemory) {
          failed = cs;
          break;
        } else if (stale_ptr) {
          stale_copy = true;
        } else if (failed.ok()) {
          failed = cs;
        }
      }
      if (done) continue;
      if (!failed.ok() && (!stale_copy || failed.code() == Err::kNoMemory ||
                           (failed_before && SameExtent(e, failed_extent)))) {
        st = failed;
        break;
      }
      // (stale_copy: some copy was, every one if none failed; e.nr_ptrs is at least 1.)
      TFS_BUG_ON(!stale_copy);
      if (++stale > kMaxStaleLookups) {
        // A pointer that stays wrong, or a failing copy whose extent kept
        // changing: its failure.
        st = failed.ok() ? Status(Err::kCorrupt) : failed;
        break;
      }
      if (!failed.ok()) {
        failed_extent = e;
        failed_extent.crcs = nullptr;
        failed_before = true;
      }
      ctr_.stale_lookups.FetchAdd(1, MemOrder::kRelaxed);
      again = true;
    }
    if (!again) break;
  }
  platform::Free(tmp);
  platform::Free(crcs);
  return st;
}

Status DataPath::ReadCompressed(const IoContext& ctx, const Extent& e, const Extent::Ptr& p, u8* out) {
  const u64 disk = e.DiskBlocks(p) * kBlockSize;
  u8* z = static_cast<u8*>(platform::Alloc(disk, kBlockSize));
  if (z == nullptr) return Err::kNoMemory;
  Status st = ContextIo(ctx, store_->devs().member(p.dev)->queue(), IoOp::kRead, p.offset, z, disk);
  if (st.ok() && platform::Crc32c(z, p.disk_bytes) != p.crc) {
    ctr_.csum_errors.FetchAdd(1, MemOrder::kRelaxed);
    platform::Log(platform::LogLevel::kError,
                  "data: checksum mismatch: inode %llu compressed blob at block %llu (member %u offset %llu)",
                  (unsigned long long)e.ino, (unsigned long long)(e.start - p.blob_offset), unsigned(p.dev),
                  (unsigned long long)p.offset);
    st = Err::kDataCorrupt;
  }
  if (st.ok()) {
    // A blob that passes its crc but does not decompress to exactly its
    // blocks was written wrong: corrupt, never partial data.
    const u64 want = u64(p.stored_blocks) * kBlockSize;
    auto r = platform::ZstdDecompress(out, want, z, p.disk_bytes);
    if (!r.ok() || r.value() != want) st = Err::kDataCorrupt;
  }
  if (st.ok()) ctr_.compressed_reads.FetchAdd(1, MemOrder::kRelaxed);
  platform::Free(z);
  return st;
}

Result<bool> DataPath::HasData(u64 ino) {
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, 0)));
  return it.Valid() && it.pos().inode == ino;
}

Result<bool> DataPath::HasBlockData(u64 ino, u64 block) {
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, block + 1)));
  if (!it.Valid() || it.pos().inode != ino) return false;
  Extent e;
  TFS_TRY(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e));
  return e.start <= block && !e.unwritten;
}

Result<u64> DataPath::SeekBlock(u64 ino, u64 block, bool data) {
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, block + 1)));  // the first extent ending past `block`
  u64 cur = block;
  for (; it.Valid() && it.pos().inode == ino; TFS_TRY(it.Next())) {
    Extent e;
    TFS_TRY(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e));
    if (e.unwritten) continue;
    if (data) return Max(cur, e.start);
    if (e.start > cur) return cur;  // a gap, or an unwritten extent, before it
    cur = e.end;
  }
  return data ? kNoBlock : cur;
}

}  // namespace tfs::data
