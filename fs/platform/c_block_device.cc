// The adapter from BlockDevice to a C device (c_block_device.h): requests are
// translated field by field into the tfs_block_request inside the IoRequest,
// and the completion finds its IoRequest again by that field's offset (the
// kernel's container_of), so a request costs no allocation and no lookup.
// The enums of tfs_block_device.h are asserted equal to the C++ ones, and the
// info mirror to BlockDeviceInfo, so the two headers cannot drift.
#include "platform/c_block_device.h"

#include "platform/platform.h"

namespace tfs {
namespace {

static_assert(TFS_BLOCK_READ == int(IoOp::kRead) && TFS_BLOCK_WRITE == int(IoOp::kWrite) &&
              TFS_BLOCK_FLUSH == int(IoOp::kFlush) && TFS_BLOCK_DISCARD == int(IoOp::kDiscard) &&
              kIoOpCount == 4, "tfs_block_op mirrors IoOp");
static_assert(TFS_BLOCK_FUA == IoRequest::kFua, "TFS_BLOCK_FUA mirrors IoRequest::kFua");
static_assert(TFS_IO_FOREGROUND_READ == int(IoOrigin::kForegroundRead) &&
              TFS_IO_FOREGROUND_WRITE == int(IoOrigin::kForegroundWrite) &&
              TFS_IO_JOURNAL == int(IoOrigin::kJournal) && TFS_IO_BTREE == int(IoOrigin::kBtree) &&
              TFS_IO_RECONCILE == int(IoOrigin::kReconcile) &&
              TFS_IO_PROMOTE == int(IoOrigin::kPromote) && TFS_IO_COPYGC == int(IoOrigin::kCopygc) &&
              TFS_IO_READAHEAD == int(IoOrigin::kReadahead) &&
              TFS_IO_SUPERBLOCK == int(IoOrigin::kSuperblock) && TFS_IO_FSCK == int(IoOrigin::kFsck) &&
              TFS_IO_ALLOC == int(IoOrigin::kAlloc) && TFS_IO_OTHER == int(IoOrigin::kOther) &&
              kIoOriginCount == 12, "tfs_io_origin mirrors IoOrigin");

// The number of fields of an aggregate: the most initializers T{...} takes.
struct AnyField {
  template <typename U>
  operator U() const;  // only named in unevaluated operands
};
template <typename T, typename... Fields>
constexpr usize FieldCount() {
  if constexpr (requires { T{Fields{}..., AnyField{}}; }) {
    return FieldCount<T, Fields..., AnyField>();
  } else {
    return sizeof...(Fields);
  }
}
#define TFS_COUNT_FIELD(type, name) +1
static_assert(FieldCount<BlockDeviceInfo>() == 0 TFS_BLOCK_DEVICE_INFO_FIELDS(TFS_COUNT_FIELD),
              "BlockDeviceInfo and TFS_BLOCK_DEVICE_INFO_FIELDS (tfs_block_device.h) differ: "
              "a field added to one is added to the other");
#undef TFS_COUNT_FIELD

// container_of needs a fixed offset of `dev.c` in every IoRequest.
static_assert(__is_standard_layout(IoRequest), "IoRequest is standard-layout");
constexpr usize kCRequestOffset = __builtin_offsetof(IoRequest, dev.c);

}  // namespace

CBlockDevice::CBlockDevice(tfs_block_device* dev) : dev_(dev) {
  TFS_BUG_ON(dev == nullptr || dev->ops == nullptr || dev->ops->submit == nullptr ||
             dev->name == nullptr);
#define TFS_COPY_FIELD(type, name) info_.name = dev->info.name;
  TFS_BLOCK_DEVICE_INFO_FIELDS(TFS_COPY_FIELD)
#undef TFS_COPY_FIELD
  const u32 lbs = info_.logical_block_size;
  TFS_BUG_ON(lbs == 0 || (lbs & (lbs - 1)) != 0 || info_.size % lbs != 0);
}

CBlockDevice::~CBlockDevice() = default;

void* CBlockDevice::operator new(usize size) noexcept {
  return tfs_plat_alloc(size, alignof(CBlockDevice) < 16 ? 16 : alignof(CBlockDevice), 0);
}

void CBlockDevice::operator delete(void* p) { tfs_plat_free(p); }

void CBlockDevice::Submit(IoRequest* req) {
  Status st = CheckRequest(*req);
  if (!st.ok()) {
    req->done(req, st);
    return;
  }
  tfs_block_request* c = &req->dev.c;
  c->op = u8(req->op);
  c->flags = req->op == IoOp::kWrite ? u8(req->flags & IoRequest::kFua) : 0;
  c->origin = u8(req->origin);
  const bool flush = req->op == IoOp::kFlush;
  c->offset = flush ? 0 : req->offset;
  c->length = flush ? 0 : req->length;
  c->buf = req->op == IoOp::kRead || req->op == IoOp::kWrite ? req->buf : nullptr;
  c->complete = &CBlockDevice::OnComplete;
  c->device_private[0] = nullptr;
  c->device_private[1] = nullptr;
  dev_->ops->submit(dev_, c);
}

void CBlockDevice::OnComplete(tfs_block_request* c, int error) {
  IoRequest* req = reinterpret_cast<IoRequest*>(reinterpret_cast<char*>(c) - kCRequestOffset);
  req->done(req, Status::FromErrno(error));
}

}  // namespace tfs
