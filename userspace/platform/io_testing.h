// Helpers for tests that drive a BlockDevice: synchronous I/O on top of the
// asynchronous interface, and a scratch file that removes itself.
#ifndef TFS_USERSPACE_PLATFORM_IO_TESTING_H_
#define TFS_USERSPACE_PLATFORM_IO_TESTING_H_

#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "platform/block_device.h"
#include "platform/sync.h"

namespace tfs::userspace {

struct SyncIoWaiter {
  Latch latch{1};
  Status status;
};

// Submits one request and waits for its completion.
inline Status SyncIo(BlockDevice& dev, IoOp op, uint64_t offset, void* buf, uint64_t len,
                     uint8_t flags = 0, IoOrigin origin = IoOrigin::kOther) {
  SyncIoWaiter w;
  IoRequest req;
  req.op = op;
  req.flags = flags;
  req.origin = origin;
  req.offset = offset;
  req.length = len;
  req.buf = buf;
  req.caller_data = &w;
  req.done = [](IoRequest* r, Status st) {
    auto* waiter = static_cast<SyncIoWaiter*>(r->caller_data);
    waiter->status = st;
    waiter->latch.CountDown();
  };
  dev.Submit(&req);
  w.latch.Wait();
  return w.status;
}

// A file of `size` bytes in $TMPDIR (or /tmp), deleted on destruction.
class ScratchFile {
 public:
  explicit ScratchFile(uint64_t size) {
    const char* dir = getenv("TMPDIR");
    path_ = std::string(dir != nullptr && *dir ? dir : "/tmp") + "/tierfs-test-XXXXXX";
    int fd = mkstemp(path_.data());
    if (fd >= 0) {
      if (ftruncate(fd, off_t(size)) != 0) path_.clear();
      close(fd);
    } else {
      path_.clear();
    }
  }
  ~ScratchFile() {
    if (!path_.empty()) unlink(path_.c_str());
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tfs::userspace

#endif  // TFS_USERSPACE_PLATFORM_IO_TESTING_H_
