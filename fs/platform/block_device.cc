// Names for I/O ops and origins, and the request validation every BlockDevice
// implementation shares (so "misaligned" means the same thing on every platform).
#include "platform/block_device.h"

#include "platform/sync.h"

namespace tfs {
namespace {

constexpr const char* kOriginNames[kIoOriginCount] = {
    "foreground_read", "foreground_write", "journal",   "btree",
    "reconcile",       "promote",          "copygc",    "readahead",
    "superblock",      "fsck",             "alloc",     "other",
};

}  // namespace

const char* IoOpName(IoOp op) {
  switch (op) {
    case IoOp::kRead: return "read";
    case IoOp::kWrite: return "write";
    case IoOp::kFlush: return "flush";
    case IoOp::kDiscard: return "discard";
  }
  return "unknown";
}

const char* IoOriginName(IoOrigin origin) {
  u8 i = u8(origin);
  return i < kIoOriginCount ? kOriginNames[i] : "unknown";
}

Result<IoOrigin> IoOriginFromName(const char* name) {
  for (int i = 0; i < kIoOriginCount; i++) {
    if (StrEqual(name, kOriginNames[i])) return IoOrigin(i);
  }
  return Err::kNotFound;
}

Status BlockDevice::CheckRequest(const IoRequest& req) const {
  const BlockDeviceInfo& info = Info();
  if (u8(req.op) >= kIoOpCount || u8(req.origin) >= kIoOriginCount) return Err::kInvalidArgument;
  if (req.op == IoOp::kFlush) return Status::Ok();
  if (req.op != IoOp::kRead && info.read_only) return Err::kReadOnly;
  if (req.op == IoOp::kDiscard && !info.supports_discard) return Err::kNotSupported;
  if (req.length == 0 || (req.op != IoOp::kDiscard && req.buf == nullptr))
    return Err::kInvalidArgument;
  u64 lbs = info.logical_block_size;
  TFS_BUG_ON(lbs == 0);
  if (req.offset % lbs != 0 || req.length % lbs != 0) return Err::kMisaligned;
  if (req.offset > info.size || req.length > info.size - req.offset) return Err::kOutOfRange;
  return Status::Ok();
}

namespace {
struct Waiter {
  Latch latch{1};
  Status status;
};
}  // namespace

Status SubmitAndWait(BlockDevice& dev, IoRequest& req) {
  Waiter w;
  req.caller_data = &w;
  req.done = [](IoRequest* r, Status st) {
    auto* waiter = static_cast<Waiter*>(r->caller_data);
    waiter->status = st;
    waiter->latch.CountDown();
  };
  dev.Submit(&req);
  w.latch.Wait();
  return w.status;
}

Status SyncIo(BlockDevice& dev, IoOp op, u64 offset, void* buf, u64 length, u8 flags,
              IoOrigin origin) {
  IoRequest req;
  req.op = op;
  req.flags = flags;
  req.origin = origin;
  req.offset = offset;
  req.length = length;
  req.buf = buf;
  return SubmitAndWait(dev, req);
}

}  // namespace tfs
