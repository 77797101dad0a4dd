// MissingDevice: the placeholder of a member a degraded mount opens without
// (docs/design/copies.md, "Step 5c"). It keeps the member's index, label and
// size in the DeviceSet -- targets, pointers and per-member state stay as
// they are -- and fails every request at once with Err::kMissing (an I/O
// class error: every path that falls back past a failed copy falls back past
// it), without I/O or waiting. Counted: requests().
#ifndef TFS_DEV_MISSING_DEVICE_H_
#define TFS_DEV_MISSING_DEVICE_H_

#include "platform/atomic.h"
#include "platform/block_device.h"
#include "platform/platform.h"
#include "util/status.h"

namespace tfs::dev {

class MissingDevice final : public BlockDevice {
 public:
  // `size`: the member's recorded size (sb::Member::size); `name` is copied.
  MissingDevice(u64 size, const char* name) {
    info_.size = size;
    info_.logical_block_size = 4096;
    info_.read_only = true;
    usize i = 0;
    for (; name != nullptr && name[i] != '\0' && i + 1 < sizeof(name_); i++) name_[i] = name[i];
    name_[i] = '\0';
  }
  void Submit(IoRequest* req) override {
    requests_.FetchAdd(1, MemOrder::kRelaxed);
    req->done(req, Status(Err::kMissing));
  }
  const BlockDeviceInfo& Info() const override { return info_; }
  const char* Name() const override { return name_; }
  // Requests failed so far.
  u64 requests() const { return requests_.Load(MemOrder::kRelaxed); }
  // The core's allocator (platform::New / Delete), so that the deleting
  // destructor the vtable holds calls no C++ runtime (as CBlockDevice).
  static void* operator new(usize size) noexcept { return tfs_plat_alloc(size, 16, 0); }
  static void* operator new(usize, void* where) noexcept { return where; }
  static void operator delete(void* p) { tfs_plat_free(p); }

 private:
  BlockDeviceInfo info_;
  char name_[48] = {};
  Atomic<u64> requests_{0};
};

}  // namespace tfs::dev

#endif  // TFS_DEV_MISSING_DEVICE_H_
