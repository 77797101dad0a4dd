// What the data path's own files share (write.cc, read.cc, repair.cc): the
// extent key, the lookup batch, pointer equality and the one way it submits
// a request to a member. Private
// to fs/data/: nothing outside it includes this header (the public API is
// data.h; extent values: extent.h). None keeps state or takes a lock;
// ContextIo alone does I/O (and waits for it).
#ifndef TFS_DATA_INTERNAL_H_
#define TFS_DATA_INTERNAL_H_

#include "btree/key.h"
#include "data/data.h"
#include "data/io_context.h"
#include "dev/io_queue.h"
#include "util/status.h"

namespace tfs::data {

// Keys an extent lookup copies at first: a read or write of a few blocks
// needs the extent at its start and maybe one more (later steps double it).
inline constexpr u32 kPointBatch = 2;

inline btree::Pos ExtentPos(u64 ino, u64 end) { return btree::Pos{btree::kBtreeExtents, ino, end}; }

// Whether p and q are the same pointer (every field: the same copy of the
// same blocks).
inline bool SamePtr(const Extent::Ptr& p, const Extent::Ptr& q) {
  return p.dev == q.dev && p.gen == q.gen && p.offset == q.offset && p.blob_offset == q.blob_offset &&
         p.cached == q.cached && p.compressed == q.compressed && p.disk_bytes == q.disk_bytes && p.crc == q.crc &&
         p.stored_blocks == q.stored_blocks;
}

// One request for ctx on a member's queue, waited for: tagged with ctx's
// origin, queued in ctx's class.
inline Status ContextIo(const IoContext& ctx, dev::IoQueue& queue, IoOp op, u64 offset, void* buf, u64 length) {
  dev::Io io;
  io.req.op = op;
  io.req.origin = ctx.origin;
  io.req.offset = offset;
  io.req.length = length;
  io.req.buf = buf;
  io.cls = ctx.io_class;
  return dev::SubmitAndWait(queue, &io);
}

}  // namespace tfs::data

#endif  // TFS_DATA_INTERNAL_H_
