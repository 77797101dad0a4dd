// What the data path's own files share (write.cc, read.cc, repair.cc): the
// extent key, the lookup batch, pointer equality, the flights of multi-copy
// I/O and the one way it submits a request to a member. Private
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

// The copies of one multi-copy I/O in flight: a piece read from several
// copies (ReadCopies: per copy its request, its own buffer -- the blocks
// [lo, hi), or the compressed blob -- and its status), or a replicated
// write's copies (WriteCopies, `write`: the write's own copy of the data,
// which every copy writes, and per copy its bucket and pending blocks).
// Shared by the waiting thread and the copies at their members: `refs` is
// one for the waiter and one per copy submitted whose completion has not
// finished. A waiter that leaves before them (a reader whose hedge won, a
// writer that left a late copy behind) abandons the flight; the completion
// that drops the last reference puts it on a list -- a read's on reap_
// (abandoned_reads; Reap frees it), a write's on late_ (late_writes;
// Reap(true) gives its late copies' space back and frees it) -- a completion
// never frees (it may run in interrupt context).
struct DataPath::Flight {
  struct Copy {
    dev::Io io;
    Flight* flight = nullptr;
    u8* buf = nullptr;  // a read's: platform::Alloc'd (kBlockSize-aligned: O_DIRECT members)
    u64 at = 0;         // a read's: the device offset read
    u64 bucket = 0;     // a read's: pinned while the reader waits; a write's: the copy's
    u32 dev = 0;        // a write's: the copy's member
    u32 pending = 0;    // a write's: the blocks pending in its bucket for it
    u32 ptr = 0;        // a read's: its index in e.ptrs
    u32 place = 0;      // a read's: its place in the reader's order
    bool pinned = false;
    bool hedge = false;  // submitted by a hedge (hedge_wins)
    bool seen = false;   // the waiter has taken its completion
    bool late = false;   // a write's copy the writer left behind (its pending blocks given back by FinishFlight)
    Atomic<i32> err{0};
    Atomic<u32> done{0};
  };
  DataPath* dp = nullptr;
  Copy copies[kMaxPtrs];
  u32 submitted = 0;
  bool write = false;
  u8* data = nullptr;     // a write's own copy of its data (platform::Alloc'd, aligned)
  Atomic<u32> events{0};  // completions so far (the waiter sleeps on it)
  Atomic<u32> refs{1};
  Flight* next = nullptr;  // reap_ or late_
};

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
