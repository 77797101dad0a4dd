// Extent values, format v2 (extent.h, docs/format/inodes-extents.md): the
// parser of hostile bytes, the builder, the piece an overwrite leaves and the
// pointer edits. The rules live once, in Valid(), on the decoded form: the
// parser decodes (checking only what the decoded form cannot show: the
// version, unknown flags, reserved bytes, the exact length) and then applies
// them, and every builder applies them before it writes a byte -- so nothing
// builds a value ParseExtent would refuse. The edits check the extent they
// are given before they index its pointers: it may be anything.
//
// Pure functions of their arguments: no lock, no I/O, no allocation, no
// state -- the write path, the read path, fsck and the fuzz targets call them
// alike.
#include "data/extent.h"

namespace tfs::data {

namespace {

constexpr u32 kHeaderBytes = u32(sizeof(ExtentFormat));
constexpr u32 kPtrBytes = u32(sizeof(ExtentPtr));

bool AllZero(const u8* p, usize n) {
  for (usize i = 0; i < n; i++)
    if (p[i] != 0) return false;
  return true;
}

// The rules of ParseExtent (extent.h) on a decoded extent.
bool Valid(const Extent& e) {
  if (e.end <= e.start) return false;
  const u64 blocks = e.end - e.start;
  if (e.unwritten) return e.nr_ptrs == 0 && blocks <= kMaxUnwrittenBlocks && e.crcs == nullptr;
  if (e.nr_ptrs == 0 || e.nr_ptrs > kMaxPtrs) return false;
  bool authoritative = false;
  bool plain = false;
  for (u32 i = 0; i < e.nr_ptrs; i++) {
    const Extent::Ptr& p = e.ptrs[i];
    for (u32 j = 0; j < i; j++)
      if (e.ptrs[j].dev == p.dev) return false;  // copies on distinct members
    authoritative |= !p.cached;
    if (p.compressed) {
      const u32 stored = p.stored_blocks;
      if (stored == 0 || stored > kMaxCompressedBlocks || u64(p.blob_offset) + blocks > stored ||
          p.disk_bytes == 0 || p.disk_bytes >= stored * kBlockSize)
        return false;
    } else {
      plain = true;
      // (A plain blob is at most kMaxExtentBlocks: a piece never reaches past it.)
      if (u64(p.blob_offset) + blocks > kMaxExtentBlocks || p.stored_blocks != 0 || p.disk_bytes != 0 || p.crc != 0)
        return false;
    }
  }
  return authoritative && plain == (e.crcs != nullptr);
}

}  // namespace

Status CheckExtent(const Extent& e) { return Valid(e) ? Status::Ok() : Status(Err::kInvalidArgument); }

Status ParseExtent(const btree::Pos& pos, const u8* value, u32 len, Extent* out) {
  if (len < kHeaderBytes) return Err::kCorrupt;
  ExtentFormat h;
  MemCopy(&h, value, sizeof(h));
  const u32 blocks = h.blocks.get();
  if (h.version != kExtentVersion || (h.flags & ~kExtentUnwritten) != 0 || h.reserved != 0 ||
      h.nr_ptrs > kMaxPtrs || blocks == 0 || pos.offset < blocks || pos.inode >= btree::kInoLimit)
    return Err::kCorrupt;
  Extent e;
  e.ino = pos.inode;
  e.end = pos.offset;
  e.start = pos.offset - blocks;
  e.policy.fg_target = h.policy.fg_target.get();
  e.policy.bg_target = h.policy.bg_target.get();
  e.policy.replicas = h.policy.replicas;
  e.policy.compression = h.policy.compression;
  e.policy.flags = h.policy.flags;
  e.policy.reserved = h.policy.reserved;
  e.unwritten = h.flags == kExtentUnwritten;
  e.nr_ptrs = h.nr_ptrs;
  u64 need = kHeaderBytes + u64(e.nr_ptrs) * kPtrBytes;
  if (len < need) return Err::kCorrupt;
  for (u32 i = 0; i < e.nr_ptrs; i++) {
    ExtentPtr f;
    MemCopy(&f, value + kHeaderBytes + i * kPtrBytes, sizeof(f));
    if ((f.flags & ~(kPtrCached | kPtrCompressed)) != 0 || !AllZero(f.reserved, sizeof(f.reserved)))
      return Err::kCorrupt;
    Extent::Ptr& p = e.ptrs[i];
    p.dev = f.dev;
    p.gen = f.gen;
    p.cached = (f.flags & kPtrCached) != 0;
    p.compressed = (f.flags & kPtrCompressed) != 0;
    p.stored_blocks = f.stored_blocks;
    p.blob_offset = f.blob_offset.get();
    p.offset = f.offset.get();
    p.disk_bytes = f.disk_bytes.get();
    p.crc = f.crc.get();
  }
  if (e.HasPlain()) {
    need += 4 * u64(blocks);
    e.crcs = value + kHeaderBytes + e.nr_ptrs * kPtrBytes;
  }
  if (len != need || !Valid(e)) return Err::kCorrupt;
  *out = e;
  return Status::Ok();
}

Result<u32> BuildExtent(const Extent& e, u8* buf) {
  if (!Valid(e)) return Err::kInvalidArgument;
  const u32 blocks = e.blocks();
  const u32 at = kHeaderBytes + e.nr_ptrs * kPtrBytes;
  // The crcs first: e may have been parsed from buf, and they move (see extent.h).
  const u32 ncrcs = e.crcs != nullptr ? blocks : 0;
  MemMove(buf + at, e.crcs, 4 * usize(ncrcs));
  ExtentFormat h;
  MemSet(&h, 0, sizeof(h));
  h.version = kExtentVersion;
  h.flags = e.unwritten ? kExtentUnwritten : 0;
  h.nr_ptrs = u8(e.nr_ptrs);
  h.blocks.set(blocks);
  h.policy.fg_target.set(e.policy.fg_target);
  h.policy.bg_target.set(e.policy.bg_target);
  h.policy.replicas = e.policy.replicas;
  h.policy.compression = e.policy.compression;
  h.policy.flags = e.policy.flags;
  h.policy.reserved = e.policy.reserved;
  MemCopy(buf, &h, sizeof(h));
  for (u32 i = 0; i < e.nr_ptrs; i++) {
    const Extent::Ptr& p = e.ptrs[i];
    ExtentPtr f;
    MemSet(&f, 0, sizeof(f));
    f.dev = p.dev;
    f.gen = p.gen;
    f.flags = u8((p.cached ? kPtrCached : 0) | (p.compressed ? kPtrCompressed : 0));
    f.stored_blocks = p.stored_blocks;
    f.blob_offset.set(p.blob_offset);
    f.offset.set(p.offset);
    f.disk_bytes.set(p.disk_bytes);
    f.crc.set(p.crc);
    MemCopy(buf + kHeaderBytes + i * kPtrBytes, &f, sizeof(f));
  }
  return at + 4 * ncrcs;
}

u32 BuildUnwritten(u32 blocks, u8* buf) {
  ExtentFormat h;
  MemSet(&h, 0, sizeof(h));
  h.version = kExtentVersion;
  h.flags = kExtentUnwritten;
  h.blocks.set(blocks);
  MemCopy(buf, &h, sizeof(h));
  return kHeaderBytes;
}

Result<u32> BuildPiece(const Extent& e, u64 skip, u32 blocks, u8* buf) {
  if (!Valid(e) || blocks == 0 || skip > e.end - e.start || blocks > e.end - e.start - skip)
    return Err::kInvalidArgument;
  Extent x = e;
  x.start = e.start + skip;
  x.end = x.start + blocks;
  for (u32 i = 0; i < x.nr_ptrs; i++) {
    const u64 off = u64(x.ptrs[i].blob_offset) + skip;
    if (off > ~u32(0)) return Err::kInvalidArgument;
    x.ptrs[i].blob_offset = u32(off);
  }
  if (x.crcs != nullptr) x.crcs += 4 * skip;
  return BuildExtent(x, buf);
}

namespace {

// AddPtr's and ReplacePtr's rule for the crcs of a new pointer p of e (x: e
// edited): a plain p needs them -- e's, or `crcs` when e has none -- and
// `crcs` given beside e's must be the same (a copy of the same bytes).
bool TakeCrcs(const Extent& e, const Extent::Ptr& p, const u8* crcs, Extent* x) {
  if (p.compressed) return true;
  if (e.crcs == nullptr) {
    x->crcs = crcs;
    return crcs != nullptr;
  }
  return crcs == nullptr || MemCompare(crcs, e.crcs, 4 * usize(e.blocks())) == 0;
}

}  // namespace

Result<u32> AddPtr(const Extent& e, const Extent::Ptr& p, const u8* crcs, u8* buf) {
  if (!Valid(e) || e.unwritten || e.nr_ptrs >= kMaxPtrs) return Err::kInvalidArgument;
  Extent x = e;
  x.ptrs[x.nr_ptrs++] = p;
  if (!TakeCrcs(e, p, crcs, &x)) return Err::kInvalidArgument;
  return BuildExtent(x, buf);
}

Result<u32> ReplacePtr(const Extent& e, u32 i, const Extent::Ptr& p, const u8* crcs, u8* buf) {
  if (!Valid(e) || i >= e.nr_ptrs) return Err::kInvalidArgument;
  Extent x = e;
  x.ptrs[i] = p;
  if (!TakeCrcs(e, p, crcs, &x)) return Err::kInvalidArgument;
  if (!x.HasPlain()) x.crcs = nullptr;  // the last plain copy replaced by a compressed one
  return BuildExtent(x, buf);
}

Result<u32> DropPtr(const Extent& e, u32 i, u8* buf) {
  if (!Valid(e) || i >= e.nr_ptrs) return Err::kInvalidArgument;
  Extent x = e;
  for (u32 j = i; j + 1 < x.nr_ptrs; j++) x.ptrs[j] = x.ptrs[j + 1];
  x.ptrs[--x.nr_ptrs] = Extent::Ptr{};
  if (!x.HasPlain()) x.crcs = nullptr;  // the last plain copy took the crcs with it
  return BuildExtent(x, buf);
}

Result<u32> SetCached(const Extent& e, u32 i, bool cached, u8* buf) {
  if (!Valid(e) || i >= e.nr_ptrs) return Err::kInvalidArgument;
  Extent x = e;
  x.ptrs[i].cached = cached;
  return BuildExtent(x, buf);
}

bool PtrBucket(const sb::Superblock& sb, const Extent::Ptr& p, u64* bucket) {
  if (p.dev >= sb.nr_members || p.offset < sb::kBucketsOffset) return false;
  *bucket = sb.BucketOf(p.offset);
  return *bucket < sb.members[p.dev].nbuckets;
}

u32 CountedMembers(const sb::Superblock& sb, const Extent& e) {
  u32 mask = 0;
  u64 b;
  for (u32 i = 0; i < e.nr_ptrs; i++)
    if (!e.ptrs[i].cached && PtrBucket(sb, e.ptrs[i], &b)) mask |= u32(1) << e.ptrs[i].dev;
  return mask;
}

bool PtrInBucket(const sb::Superblock& sb, const Extent& e, const Extent::Ptr& p, u64* bucket) {
  // (No overflow: the bucket is a member's, and DiskBlocks is below 2^33.)
  return PtrBucket(sb, p, bucket) &&
         p.offset + e.DiskBlocks(p) * kBlockSize <= sb.BucketOffset(*bucket) + sb.bucket_size;
}

}  // namespace tfs::data
