// UringDevice: a BlockDevice over a regular file or a block device, on io_uring.
//
// One ring per device with a bounded number of requests in flight (queue_depth);
// requests beyond that wait in a FIFO inside the device (linked through the
// request's own scratch space, so Submit() never allocates for queueing and never
// blocks). One completion thread per device ("tfs-uring") reaps completions and calls the
// requests' callbacks -- no thread per request. Callbacks run on that thread with no
// device lock held and may Submit() again.
//
// A kWaited request (a flight's copy, IoRequest::kWaited) goes on the
// submitting thread's own ring instead (thread_ring.h): that thread reaps it
// while it waits in tfs_plat_wait_io (the janitor when it does not), so the
// completion wakes no other thread. Its callback then runs in that thread,
// with no device lock held. Without a thread ring (setup refused, full) it
// goes on the shared ring.
//
// O_DIRECT is used when the file system or device accepts it (checked with a real
// aligned read at open); then the logical block size is the device's (block
// devices) or 4096 (files), and unaligned caller buffers are bounced through an
// aligned copy. Without O_DIRECT the block size is 512. FUA is a write with
// RWF_DSYNC; flush is fdatasync; discard punches a hole (fallocate).
//
// Thread safety: Submit() from any number of threads. The destructor waits for all
// in-flight requests to complete; no Submit() may race with it.
#ifndef TFS_USERSPACE_PLATFORM_URING_DEVICE_H_
#define TFS_USERSPACE_PLATFORM_URING_DEVICE_H_

#include <liburing.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "platform/block_device.h"
#include "util/counters.h"

namespace tfs::userspace {

struct UringOptions {
  bool read_only = false;
  bool try_direct = true;   // use O_DIRECT when the backing store allows it
  unsigned queue_depth = 64;  // requests in flight in the ring
};

// The device's counters (kept under its lock; util/counters.h).
#define TFS_URING_COUNTERS(X, A)                                                                 \
  X(submitted, counter, "requests accepted by Submit()")                                         \
  X(completed, counter, "callbacks called (counted just before each call)")                      \
  X(errors, counter, "callbacks called with an error")                                           \
  X(bounced, counter, "requests that needed an aligned bounce buffer")                           \
  X(resubmits, counter, "short transfers continued; transient failures (EAGAIN, EINTR, ECANCELED) sent again") \
  X(queued_max, level, "deepest FIFO seen outside the ring")                                     \
  X(inline_ios, counter, "kInline requests done in the submitter's thread")                      \
  X(waited_ios, counter, "kWaited requests sent on the submitter's own ring (thread_ring.h)")     \
  X(waited_shared, counter, "kWaited requests sent on the shared ring (no thread ring, or it was full)")

struct UringStats {
  TFS_COUNTER_FIELDS(TFS_URING_COUNTERS)
};

class UringDevice final : public BlockDevice {
 public:
  // Opens `path`. Errors: kNotFound (no such file), kPermission/kAccess,
  // kInvalidArgument (a directory, or smaller than one block), kNoMemory, kIo.
  static Result<std::unique_ptr<UringDevice>> Open(const std::string& path,
                                                   const UringOptions& options = {});
  ~UringDevice() override;

  void Submit(IoRequest* req) override;
  const BlockDeviceInfo& Info() const override { return info_; }
  const char* Name() const override { return path_.c_str(); }

  bool direct() const { return direct_; }
  UringStats Stats() const;

 private:
  UringDevice() = default;
  Status Init(const std::string& path, const UringOptions& options);
  // Puts `req` (its remaining part) into the ring, or the FIFO when the ring is full.
  // Caller holds mu_.
  void Enqueue(IoRequest* req);
  void PrepSqe(IoRequest* req);
  // Fills `sqe` for what is left of `req` (dev.u0 bytes done).
  void PrepIo(io_uring_sqe* sqe, IoRequest* req) const;
  // Judges a completion's result: true when `req` is finished (*st set),
  // false when it must be sent again (a transient failure, a short
  // transfer: dev.u0 advanced). Caller holds mu_.
  bool TakeResult(IoRequest* req, int res, Status* st);
  // A completion from a thread ring (ThreadRingSubmit's done).
  static void RingDone(void* owner, IoRequest* req, int res);
  void CompletionLoop();
  void Complete(IoRequest* req, Status st);
  // Does a kInline read, write or flush in the calling thread.
  Status InlineIo(IoRequest* req);

  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
  BlockDeviceInfo info_;
  unsigned depth_ = 0;
  bool ring_ready_ = false;
  io_uring ring_{};

  // mu_ guards the ring's submission side, the FIFO and in_flight_. Never held while
  // a callback runs.
  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  IoRequest* fifo_head_ = nullptr;
  IoRequest* fifo_tail_ = nullptr;
  uint64_t fifo_len_ = 0;
  unsigned in_flight_ = 0;  // in the ring
  uint64_t outstanding_ = 0;  // submitted, callback not yet called
  UringStats stats_;
  std::thread reaper_;
};

}  // namespace tfs::userspace

#endif  // TFS_USERSPACE_PLATFORM_URING_DEVICE_H_
