// io_uring BlockDevice (see uring_device.h for the contract).
//
// Per-request device state lives in IoRequest::dev: `ptr` is the bounce buffer (or
// null), `u0` the bytes already transferred (short reads/writes are continued, not
// failed), `next` links the FIFO of requests waiting for a ring slot. A request is in
// exactly one place at a time: the FIFO, the ring, or being completed.
#include "userspace/platform/uring_device.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "platform/platform.h"
#include "userspace/platform/thread_ring.h"

namespace tfs::userspace {
namespace {

constexpr size_t kDirectFileBlock = 4096;
constexpr size_t kBufferedBlock = 512;

int OpenFlags(bool read_only, bool direct) {
  return (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC | (direct ? O_DIRECT : 0);
}

// True if an aligned O_DIRECT read at offset 0 works on this fd (some file systems
// accept the flag at open and reject the I/O).
bool DirectReadWorks(int fd, size_t block, uint64_t size) {
  if (size < block) return true;
  void* buf = nullptr;
  if (posix_memalign(&buf, block, block) != 0) return false;
  ssize_t n = pread(fd, buf, block, 0);
  free(buf);
  return n >= 0;
}

}  // namespace

Result<std::unique_ptr<UringDevice>> UringDevice::Open(const std::string& path,
                                                       const UringOptions& options) {
  std::unique_ptr<UringDevice> dev(new UringDevice());
  Status st = dev->Init(path, options);
  if (!st.ok()) return st;
  return dev;
}

Status UringDevice::Init(const std::string& path, const UringOptions& options) {
  path_ = path;
  if (options.queue_depth == 0 || options.queue_depth > 4096) return Err::kInvalidArgument;

  struct stat st;
  if (stat(path.c_str(), &st) != 0) return Status::FromErrno(errno);
  bool is_block = S_ISBLK(st.st_mode);
  if (!is_block && !S_ISREG(st.st_mode)) return Err::kInvalidArgument;

  direct_ = options.try_direct;
  fd_ = open(path.c_str(), OpenFlags(options.read_only, direct_));
  if (fd_ < 0 && direct_ && errno == EINVAL) {
    direct_ = false;
    fd_ = open(path.c_str(), OpenFlags(options.read_only, false));
  }
  if (fd_ < 0) return Status::FromErrno(errno);

  uint64_t size = uint64_t(st.st_size);
  size_t block = direct_ ? kDirectFileBlock : kBufferedBlock;
  if (is_block) {
    int ssz = 0;
    if (ioctl(fd_, BLKGETSIZE64, &size) != 0 || ioctl(fd_, BLKSSZGET, &ssz) != 0)
      return Status::FromErrno(errno);
    if (direct_) block = size_t(ssz);
  }
  if (direct_ && !DirectReadWorks(fd_, block, size)) {
    close(fd_);
    direct_ = false;
    block = kBufferedBlock;
    fd_ = open(path.c_str(), OpenFlags(options.read_only, false));
    if (fd_ < 0) return Status::FromErrno(errno);
  }

  info_.logical_block_size = uint32_t(block);
  info_.size = size - size % block;
  info_.read_only = options.read_only;
  info_.supports_fua = true;
  info_.supports_discard = true;
  if (info_.size == 0) return Err::kInvalidArgument;

  depth_ = options.queue_depth;
  int rc = io_uring_queue_init(depth_, &ring_, 0);
  if (rc < 0) return Status::FromErrno(rc);
  ring_ready_ = true;
  reaper_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "tfs-uring");  // (per-thread views: top -H, /proc/PID/task)
    ThreadRingNever();  // (it never waits for its own I/O: a ring here would go unreaped)
    CompletionLoop();
  });
  return Status::Ok();
}

UringDevice::~UringDevice() {
  if (ring_ready_) {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [this] { return outstanding_ == 0; });
    // Wake the reaper with a sentinel (user_data null) and let it exit.
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    TFS_BUG_ON(sqe == nullptr);
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, nullptr);
    while (io_uring_submit(&ring_) < 0) {
    }
    lock.unlock();
    reaper_.join();
    io_uring_queue_exit(&ring_);
  }
  if (fd_ >= 0) close(fd_);
}

UringStats UringDevice::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void UringDevice::Submit(IoRequest* req) {
  req->dev = IoRequest::DevicePrivate{};
  Status st = CheckRequest(*req);
  if (!st.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.submitted++;
      outstanding_++;
    }
    Complete(req, st);
    return;
  }
  bool data_op = req->op == IoOp::kRead || req->op == IoOp::kWrite;
  bool may_inline = data_op || req->op == IoOp::kFlush;
  if (direct_ && data_op && reinterpret_cast<uintptr_t>(req->buf) % info_.logical_block_size != 0) {
    void* bounce = nullptr;
    if (posix_memalign(&bounce, info_.logical_block_size, req->length) != 0) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.submitted++;
        outstanding_++;
      }
      Complete(req, Err::kNoMemory);
      return;
    }
    if (req->op == IoOp::kWrite) memcpy(bounce, req->buf, req->length);
    req->dev.ptr = bounce;
  }
  // (Not inline while this thread has requests on its own ring: their
  // completions are its task work, held while it sleeps in a syscall that a
  // stalling device may make long -- thread_ring.h.)
  const bool inline_io = may_inline && (req->flags & IoRequest::kInline) && !ThreadRingBusy();
  const bool waited = data_op && !inline_io && (req->flags & IoRequest::kWaited);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.submitted++;
    outstanding_++;
    if (req->dev.ptr != nullptr) stats_.bounced++;
    if (!inline_io && !waited) {
      Enqueue(req);
      return;
    }
    if (inline_io) stats_.inline_ios++;
  }
  if (waited) {
    // The submitter reaps it from its own ring while it waits: no other
    // thread is woken for it (thread_ring.h).
    if (io_uring_sqe* sqe = ThreadRingGetSqe()) {
      PrepIo(sqe, req);
      {
        // (Counted first: once sent, its completion may be reaped at once.)
        std::lock_guard<std::mutex> lock(mu_);
        stats_.waited_ios++;
      }
      ThreadRingSubmit(sqe, RingDone, this, req);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.waited_shared++;
    Enqueue(req);
    return;
  }
  // The submitter waits for it in this thread anyway: a plain syscall here
  // saves handing it to the completion thread and back (two wake-ups).
  Complete(req, InlineIo(req));
}

void UringDevice::RingDone(void* owner, IoRequest* req, int res) {
  auto* dev = static_cast<UringDevice*>(owner);
  Status st;
  bool finished;
  {
    std::lock_guard<std::mutex> lock(dev->mu_);
    finished = dev->TakeResult(req, res, &st);
    // The rest (a short transfer, a transient failure) on the shared ring:
    // its waiter may have left, and the thread that reaped this need not
    // be the one that waits.
    if (!finished) dev->Enqueue(req);
  }
  if (finished) dev->Complete(req, st);
}

bool UringDevice::TakeResult(IoRequest* req, int res, Status* st) {
  const bool data_op = req->op == IoOp::kRead || req->op == IoOp::kWrite;
  if (res == -EAGAIN || res == -EINTR || (res == -ECANCELED && req->dev.u1 == 0)) {
    // Transient: resubmit as is (the part not done yet). ECANCELED:
    // io_uring's worker had not started it when the thread that submitted
    // it exited (a request handed to the kernel's worker pool -- a buffered
    // one, or a direct one that would have blocked -- belongs to its
    // submitter's task); sent again on the shared ring, whose submitters
    // are threads that live as long as the device or wait for what they
    // send, so a second ECANCELED is not that (io_uring could not start a
    // worker at all) and fails it.
    // (A retry the kernel runs as task work of an exited submitter fails
    // EFAULT instead: not told apart, it fails the request. Rare: it needs
    // a thread that exits with a request out whose first try the kernel
    // retries; the FUSE daemon's workers wait for their flights' copies
    // or leave them only when their member is stalling.)
    if (res == -ECANCELED) req->dev.u1 = 1;
    stats_.resubmits++;
    return false;
  }
  if (res < 0) {
    *st = Status::FromErrno(res);
  } else if (data_op) {
    if (res == 0) {
      *st = Err::kIo;  // end of file inside the device: the backing file shrank
    } else {
      req->dev.u0 += uint64_t(res);
      if (req->dev.u0 < req->length) {
        stats_.resubmits++;
        return false;
      }
    }
  }
  return true;
}

Status UringDevice::InlineIo(IoRequest* req) {
  if (req->op == IoOp::kFlush) {
    int rc;
    do {
      rc = fdatasync(fd_);
    } while (rc < 0 && errno == EINTR);
    return rc < 0 ? Status::FromErrno(-errno) : Status::Ok();
  }
  char* base = static_cast<char*>(req->dev.ptr != nullptr ? req->dev.ptr : req->buf);
  uint64_t done = 0;
  while (done < req->length) {
    iovec v{base + done, size_t(req->length - done)};
    ssize_t n = req->op == IoOp::kRead
                    ? preadv2(fd_, &v, 1, off_t(req->offset + done), 0)
                    : pwritev2(fd_, &v, 1, off_t(req->offset + done), (req->flags & IoRequest::kFua) ? RWF_DSYNC : 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return Status::FromErrno(-errno);
    if (n == 0) return Err::kIo;  // end of file inside the device: the backing file shrank
    done += uint64_t(n);
  }
  return Status::Ok();
}

void UringDevice::Enqueue(IoRequest* req) {
  if (in_flight_ >= depth_ || fifo_head_ != nullptr) {
    // Keep FIFO order: once anything waits, newcomers wait behind it.
    req->dev.next = nullptr;
    if (fifo_tail_ != nullptr) {
      fifo_tail_->dev.next = req;
    } else {
      fifo_head_ = req;
    }
    fifo_tail_ = req;
    fifo_len_++;
    if (fifo_len_ > stats_.queued_max) stats_.queued_max = fifo_len_;
    return;
  }
  PrepSqe(req);
}

void UringDevice::PrepSqe(IoRequest* req) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  TFS_BUG_ON(sqe == nullptr);  // in_flight_ <= depth_ == the SQ size
  PrepIo(sqe, req);
  io_uring_sqe_set_data(sqe, req);
  in_flight_++;
  int rc;
  do {
    rc = io_uring_submit(&ring_);
  } while (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY);
  // Any other failure leaves the SQE in the ring; the next submit retries it.
  if (rc < 0) platform::Log(platform::LogLevel::kWarn, "%s: io_uring_submit: %s", path_.c_str(), strerror(-rc));
}

void UringDevice::PrepIo(io_uring_sqe* sqe, IoRequest* req) const {
  uint64_t done = req->dev.u0;
  char* base = static_cast<char*>(req->dev.ptr != nullptr ? req->dev.ptr : req->buf);
  switch (req->op) {
    case IoOp::kRead:
      io_uring_prep_read(sqe, fd_, base + done, unsigned(req->length - done), req->offset + done);
      break;
    case IoOp::kWrite:
      io_uring_prep_write(sqe, fd_, base + done, unsigned(req->length - done), req->offset + done);
      if (req->flags & IoRequest::kFua) sqe->rw_flags = RWF_DSYNC;
      break;
    case IoOp::kFlush:
      io_uring_prep_fsync(sqe, fd_, IORING_FSYNC_DATASYNC);
      break;
    case IoOp::kDiscard:
      io_uring_prep_fallocate(sqe, fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                              req->offset, req->length);
      break;
  }
}

void UringDevice::CompletionLoop() {
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    int rc = io_uring_wait_cqe(&ring_, &cqe);
    if (rc == -EINTR || rc == -EAGAIN) continue;
    TFS_BUG_ON(rc < 0);
    auto* req = static_cast<IoRequest*>(io_uring_cqe_get_data(cqe));
    int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    if (req == nullptr) return;  // shutdown sentinel

    bool finished;
    Status st;
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_--;
      finished = TakeResult(req, res, &st);
      if (!finished) {
        Enqueue(req);
      }
      while (fifo_head_ != nullptr && in_flight_ < depth_) {
        IoRequest* next = fifo_head_;
        fifo_head_ = next->dev.next;
        if (fifo_head_ == nullptr) fifo_tail_ = nullptr;
        fifo_len_--;
        PrepSqe(next);
      }
    }
    if (finished) Complete(req, st);
  }
}

void UringDevice::Complete(IoRequest* req, Status st) {
  if (req->dev.ptr != nullptr) {
    if (st.ok() && req->op == IoOp::kRead) memcpy(req->buf, req->dev.ptr, req->length);
    free(req->dev.ptr);
    req->dev.ptr = nullptr;
  }
  {
    // Counted before the callback: a caller woken by its last callback must see
    // completed == submitted in Stats().
    std::lock_guard<std::mutex> lock(mu_);
    stats_.completed++;
    if (!st.ok()) stats_.errors++;
  }
  IoDoneFn done = req->done;
  done(req, st);  // `req` may be freed from here on
  std::lock_guard<std::mutex> lock(mu_);
  if (--outstanding_ == 0) idle_cv_.notify_all();
}

}  // namespace tfs::userspace
