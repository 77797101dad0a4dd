// Reads of file data (data.h): ReadBlocks finds the extents over the range
// (phase 1, FindPieces), then pins each bucket and reads it (phase 2),
// verifying every block it returns: a mismatch is kDataCorrupt and counted,
// never the bytes. Holes and unwritten extents read as zeros; a compressed
// blob is read and decompressed whole. HasData, HasBlockData and SeekBlock
// answer from the extents alone.
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
  Extent e;   // e.crcs: the read's own copy of block lo's crc onwards (compressed: the blob's)
  u64 lo, hi;
};

Status DataPath::FindPieces(u64 ino, u64 first, u64 end, Piece* pieces, u32* n, u8* crcs) {
  *n = 0;
  u32 ncrc = 0;
  u64 covered_to = 0;  // the end of the extent before (the first may start before `first`)
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  Status st = it.Seek(ExtentPos(ino, first + 1));
  for (; st.ok() && it.Valid() && it.pos().inode == ino; st = it.Next()) {
    Extent e;
    TFS_TRY(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e));
    if (e.start >= end) break;
    // Keys come in order, so the extents of one committed state are disjoint;
    // an overlap means the walk crossed a commit: kAgain (and the arrays,
    // sized for disjoint pieces of the range, stay in bounds).
    if (e.start < covered_to) return Err::kAgain;
    covered_to = e.end;
    if (e.unwritten) continue;  // zeros
    Piece& p = pieces[(*n)++];
    p.e = e;
    p.lo = Max(e.start, first);
    p.hi = Min(e.end, end);
    // Only the crcs this read needs: the blocks' own, or the blob's one.
    const u32 count = e.compressed ? 1 : u32(p.hi - p.lo);
    MemCopy(crcs + 4 * ncrc, e.compressed ? e.crcs : e.crcs + 4 * (p.lo - e.start), 4 * count);
    p.e.crcs = crcs + 4 * ncrc;  // block lo's (or the blob's)
    ncrc += count;
  }
  return st;
}

Status DataPath::ReadBlocks(const IoContext& ctx, u64 ino, u64 first, u32 nblocks, u8* buf) {
  if (store_ == nullptr) return Err::kInvalidArgument;
  const u64 end = first + nblocks;
  // Phase 1 finds the extents, copying what phase 2 needs, and is repeated
  // if an extent commit of this inode overlapped it: a commit replaces keys
  // one by one, and a walk through the middle of one could see neither the
  // old nor the new extent of a block (and read zeros that were never
  // there). Phase 2 pins each bucket and reads it; if the bucket was freed
  // since phase 1, everything starts again.
  Piece* pieces = static_cast<Piece*>(platform::Alloc(u64(nblocks) * sizeof(Piece), 16));
  u8* crcs = static_cast<u8*>(platform::Alloc(u64(nblocks) * 4, 16));
  u8* tmp = nullptr;
  Status st = pieces == nullptr || crcs == nullptr ? Status(Err::kNoMemory) : Status::Ok();
  const u32 s = CommitStripe(ino);
  const sb::Superblock& sb = store_->sb();
  u32 stale = 0;
  u32 torn = 0;
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
    u32 n = 0;
    st = FindPieces(ino, first, end, pieces, &n, crcs);
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
    MemSet(buf, 0, u64(nblocks) * kBlockSize);
    bool again = false;
    for (u32 i = 0; st.ok() && !again && i < n; i++) {
      const Extent& e = pieces[i].e;
      const u64 lo = pieces[i].lo;
      const u64 hi = pieces[i].hi;
      const u64 at = e.ptr.offset.get() + (u64(e.offset) + (lo - e.start)) * kBlockSize;
      const u64 len = (hi - lo) * kBlockSize;
      // The pointer must land in one bucket.
      const u64 b = sb.BucketOf(e.ptr.offset.get());
      if (e.ptr.dev >= sb.nr_members || b >= store_->alloc().nbuckets(e.ptr.dev) ||
          e.ptr.offset.get() + e.DiskBlocks() * kBlockSize > sb.BucketOffset(b) + sb.bucket_size) {
        st = Err::kCorrupt;
        break;
      }
      // A user bucket of the pointer's generation, held until the read is
      // done. If it is not (any more), an overwrite committed and freed it
      // since phase 1: again. A pointer that stays wrong is corrupt.
      if (!Pin(e.ptr.dev, b, e.ptr.gen)) {
        if (++stale > kMaxStaleLookups) {
          st = Err::kCorrupt;
          break;
        }
        ctr_.stale_lookups.FetchAdd(1, MemOrder::kRelaxed);
        again = true;
        break;
      }
      // Into the caller's buffer if it is aligned for O_DIRECT devices (it then
      // holds unverified bytes until the check below passes or fails the read),
      // else through a bounce buffer; a compressed blob always decompresses
      // into one.
      const bool direct = !e.compressed && reinterpret_cast<uptr>(buf) % kBlockSize == 0;
      if (!direct && tmp == nullptr) tmp = static_cast<u8*>(platform::Alloc(u64(kMaxExtentBlocks) * kBlockSize, kBlockSize));
      if (!direct && tmp == nullptr) {
        Unpin(e.ptr.dev, b);
        st = Err::kNoMemory;
        break;
      }
      if (e.compressed) {
        st = ReadCompressed(ctx, e, tmp);
        Unpin(e.ptr.dev, b);
        if (!st.ok()) break;
        MemCopy(buf + (lo - first) * kBlockSize, tmp + (u64(e.offset) + (lo - e.start)) * kBlockSize, len);
        ctr_.bytes_read.FetchAdd(e.DiskBlocks() * kBlockSize, MemOrder::kRelaxed);
        ctr_.blocks_read.FetchAdd(hi - lo, MemOrder::kRelaxed);
        continue;
      }
      u8* into = direct ? buf + (lo - first) * kBlockSize : tmp;
      st = ContextIo(ctx, store_->devs().member(e.ptr.dev)->queue(), IoOp::kRead, at, into, len);
      Unpin(e.ptr.dev, b);
      if (!st.ok()) break;
      for (u64 blk = lo; blk < hi; blk++) {
        const u8* data = into + (blk - lo) * kBlockSize;
        Le32 want;
        MemCopy(&want, e.crcs + 4 * (blk - lo), 4);
        if (platform::Crc32c(data, kBlockSize) != want.get()) {
          ctr_.csum_errors.FetchAdd(1, MemOrder::kRelaxed);
          platform::Log(platform::LogLevel::kError,
                        "data: checksum mismatch: inode %llu block %llu (member %u offset %llu)",
                        (unsigned long long)ino, (unsigned long long)blk, unsigned(e.ptr.dev),
                        (unsigned long long)(at + (blk - lo) * kBlockSize));
          st = Err::kDataCorrupt;
          break;
        }
      }
      if (!st.ok()) break;
      if (!direct) MemCopy(buf + (lo - first) * kBlockSize, tmp, len);
      ctr_.bytes_read.FetchAdd(len, MemOrder::kRelaxed);
      ctr_.blocks_read.FetchAdd(hi - lo, MemOrder::kRelaxed);
    }
    if (!again) break;
  }
  platform::Free(tmp);
  platform::Free(crcs);
  platform::Free(pieces);
  return st;
}

Status DataPath::ReadCompressed(const IoContext& ctx, const Extent& e, u8* out) {
  const u64 disk = e.DiskBlocks() * kBlockSize;
  u8* z = static_cast<u8*>(platform::Alloc(disk, kBlockSize));
  if (z == nullptr) return Err::kNoMemory;
  Status st = ContextIo(ctx, store_->devs().member(e.ptr.dev)->queue(), IoOp::kRead, e.ptr.offset.get(), z, disk);
  if (st.ok()) {
    Le32 want;
    MemCopy(&want, e.crcs, 4);
    if (platform::Crc32c(z, e.disk_bytes) != want.get()) {
      ctr_.csum_errors.FetchAdd(1, MemOrder::kRelaxed);
      platform::Log(platform::LogLevel::kError,
                    "data: checksum mismatch: inode %llu compressed blob at block %llu (member %u offset %llu)",
                    (unsigned long long)e.ino, (unsigned long long)(e.start - e.offset), unsigned(e.ptr.dev),
                    (unsigned long long)e.ptr.offset.get());
      st = Err::kDataCorrupt;
    }
  }
  if (st.ok()) {
    // A blob that passes its crc but does not decompress to exactly its
    // blocks was written wrong: corrupt, never partial data.
    const u64 want = u64(e.stored_blocks) * kBlockSize;
    auto r = platform::ZstdDecompress(out, want, z, e.disk_bytes);
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
