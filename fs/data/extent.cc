// The extent value format (data.h, docs/format/inodes-extents.md): the value
// of a kBtreeExtents key (ino, end block) -- a header (ExtentFormat), then one
// pointer and a crc32c per block for written data; the header alone for an
// unwritten extent (a reservation that reads as zeros); one pointer and one
// crc over the blob's disk_bytes for a compressed extent. BuildPiece is what
// an overwrite or punch leaves of an extent (a piece keeps its blob), and
// fsck trims overlaps with it; ParseExtent is kCorrupt for any value that is
// not a valid extent ending at its key.
//
// Pure functions of their arguments: no lock, no I/O, no btree call, no
// state -- the write path, the read path, fsck and the fuzz targets call them
// alike.
#include "data/data.h"
#include "data/internal.h"

namespace tfs::data {

using btree::Pos;

u32 BuildExtent(u8* buf, const ExtentPtr& ptr, u32 offset, u32 blocks, const u8* crcs) {
  ExtentFormat h;
  MemSet(&h, 0, sizeof(h));
  h.version = kExtentVersion;
  h.nr_ptrs = 1;
  h.blocks.set(blocks);
  h.offset.set(offset);
  MemCopy(buf, &h, sizeof(h));
  MemCopy(buf + sizeof(h), &ptr, sizeof(ptr));
  MemCopy(buf + sizeof(h) + sizeof(ptr), crcs, 4 * usize(blocks));
  return u32(sizeof(h) + sizeof(ptr)) + 4 * blocks;
}

u32 BuildUnwritten(u8* buf, u32 blocks) {
  ExtentFormat h;
  MemSet(&h, 0, sizeof(h));
  h.version = kExtentVersion;
  h.flags = kExtentUnwritten;
  h.blocks.set(blocks);
  MemCopy(buf, &h, sizeof(h));
  return u32(sizeof(h));
}

u32 BuildCompressed(u8* buf, const ExtentPtr& ptr, u32 offset, u32 blocks, u32 stored_blocks, u32 disk_bytes,
                    const u8* crc) {
  ExtentFormat h;
  MemSet(&h, 0, sizeof(h));
  h.version = kExtentVersion;
  h.flags = kExtentCompressed;
  h.nr_ptrs = 1;
  h.stored_blocks = u8(stored_blocks);
  h.blocks.set(blocks);
  h.offset.set(offset);
  h.disk_bytes.set(disk_bytes);
  MemCopy(buf, &h, sizeof(h));
  MemCopy(buf + sizeof(h), &ptr, sizeof(ptr));
  MemCopy(buf + sizeof(h) + sizeof(ptr), crc, 4);
  return u32(sizeof(h) + sizeof(ptr)) + 4;
}

u32 BuildPiece(u8* buf, const Extent& e, u64 skip, u32 blocks) {
  if (e.unwritten) return BuildUnwritten(buf, blocks);
  if (e.compressed) return BuildCompressed(buf, e.ptr, e.offset + u32(skip), blocks, e.stored_blocks, e.disk_bytes, e.crcs);
  return BuildExtent(buf, e.ptr, e.offset + u32(skip), blocks, e.crcs + 4 * skip);
}

Status ParseExtent(const Pos& pos, const u8* value, u32 len, Extent* out) {
  if (len < sizeof(ExtentFormat)) return Err::kCorrupt;
  ExtentFormat h;
  MemCopy(&h, value, sizeof(h));
  const u32 blocks = h.blocks.get();
  if (h.version != kExtentVersion || blocks == 0 || pos.offset < blocks) return Err::kCorrupt;
  if (h.flags == kExtentUnwritten) {
    if (h.nr_ptrs != 0 || blocks > kMaxUnwrittenBlocks || h.offset.get() != 0 || h.stored_blocks != 0 ||
        h.disk_bytes.get() != 0 || len != sizeof(h))
      return Err::kCorrupt;
  } else if (h.flags == kExtentCompressed) {
    const u32 stored = h.stored_blocks;
    if (h.nr_ptrs != 1 || stored == 0 || stored > kMaxCompressedBlocks || blocks > stored ||
        h.offset.get() > stored - blocks || h.disk_bytes.get() == 0 || h.disk_bytes.get() >= stored * kBlockSize ||
        len != sizeof(h) + sizeof(ExtentPtr) + 4)
      return Err::kCorrupt;
  } else if (h.flags != 0 || h.nr_ptrs != 1 || blocks > kMaxExtentBlocks || h.stored_blocks != 0 ||
             h.disk_bytes.get() != 0 || len != sizeof(h) + sizeof(ExtentPtr) + 4 * blocks) {
    return Err::kCorrupt;
  }
  out->ino = pos.inode;
  out->end = pos.offset;
  out->start = pos.offset - blocks;
  out->offset = h.offset.get();
  out->unwritten = h.flags == kExtentUnwritten;
  out->compressed = h.flags == kExtentCompressed;
  out->stored_blocks = h.stored_blocks;
  out->disk_bytes = h.disk_bytes.get();
  if (out->unwritten) {
    MemSet(&out->ptr, 0, sizeof(ExtentPtr));
    out->crcs = nullptr;
  } else {
    MemCopy(&out->ptr, value + sizeof(h), sizeof(ExtentPtr));
    out->crcs = value + sizeof(h) + sizeof(ExtentPtr);
  }
  return Status::Ok();
}

}  // namespace tfs::data
