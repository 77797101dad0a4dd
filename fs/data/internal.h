// What the data path's own files share (extent.cc, write.cc, read.cc): the
// extent key, the lookup batch, the one way it submits a request to a member,
// and the builders of extent values. Private to fs/data/: nothing outside it
// includes this header (the public API is data.h). None keeps state or takes
// a lock; ContextIo alone does I/O (and waits for it).
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

// An extent value for `e` holding `blocks` blocks from `offset` with these crcs.
u32 BuildExtent(u8* buf, const ExtentPtr& ptr, u32 offset, u32 blocks, const u8* crcs);

// An unwritten extent's value: the header alone.
u32 BuildUnwritten(u8* buf, u32 blocks);

// A compressed extent's value: blocks [offset, offset + blocks) of a blob of
// stored_blocks blocks kept as disk_bytes compressed bytes whose crc is `crc`.
u32 BuildCompressed(u8* buf, const ExtentPtr& ptr, u32 offset, u32 blocks, u32 stored_blocks, u32 disk_bytes,
                    const u8* crc);

}  // namespace tfs::data

#endif  // TFS_DATA_INTERNAL_H_
