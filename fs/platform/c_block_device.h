// CBlockDevice: a BlockDevice over a device written in C (tfs_block_device.h).
//
// The kernel module's bio-backed device is plain C; the core uses it through
// this adapter like any other BlockDevice. Submit validates the request
// (CheckRequest: a bad one completes with its error here and never reaches the
// C side), translates it into the tfs_block_request that lives in the
// request's own scratch space (IoRequest::dev.c: no allocation, no data copy;
// `buf` is handed on as it is), and calls ops->submit. The C side's
// completion (0 or -errno, any context) becomes a Status through the one
// errno mapping, Status::FromErrno, and calls `done`; it takes no lock and
// allocates nothing, so it is as safe in interrupt context as `done` itself.
//
// Lifetime: the C device outlives the adapter; the adapter owns nothing.
// Thread safety: as the C device's submit (from any thread).
#ifndef TFS_PLATFORM_C_BLOCK_DEVICE_H_
#define TFS_PLATFORM_C_BLOCK_DEVICE_H_

#include "platform/block_device.h"
#include "platform/tfs_block_device.h"

namespace tfs {

class CBlockDevice final : public BlockDevice {
 public:
  // `dev` is filled and valid (ops->submit set, a power-of-two block size, a
  // size that is a multiple of it, a name): anything else is the C side's bug
  // and traps. Its info is read here, once.
  explicit CBlockDevice(tfs_block_device* dev);
  ~CBlockDevice() override;

  void Submit(IoRequest* req) override;
  const BlockDeviceInfo& Info() const override { return info_; }
  const char* Name() const override { return dev_->name; }

  tfs_block_device* c_device() const { return dev_; }

  // The core's allocator, so that `delete` through a BlockDevice* (the
  // deleting destructor every class with a virtual destructor has) needs no
  // C++ runtime: a kernel module has none. Make it with platform::New or
  // `new`; end it with platform::Delete or `delete`.
  static void* operator new(usize size) noexcept;
  static void* operator new(usize, void* where) noexcept { return where; }
  static void operator delete(void* p);

 private:
  static void OnComplete(tfs_block_request* c, int error);

  tfs_block_device* dev_;
  BlockDeviceInfo info_;
};

}  // namespace tfs

#endif  // TFS_PLATFORM_C_BLOCK_DEVICE_H_
