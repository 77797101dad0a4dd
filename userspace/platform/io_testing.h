// Helpers for tests that drive a BlockDevice: a scratch file that removes itself
// and a device that completes requests only when told to.
#ifndef TFS_USERSPACE_PLATFORM_IO_TESTING_H_
#define TFS_USERSPACE_PLATFORM_IO_TESTING_H_

#include <stdlib.h>
#include <unistd.h>

#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "platform/block_device.h"

namespace tfs::userspace {

// SyncIo (submit and wait) is tfs::SyncIo from platform/block_device.h.
using tfs::SyncIo;

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

// A device that completes nothing until the test says so: requests pile up in
// arrival order and CompleteNext()/CompleteAll() finish them (data is not moved;
// reads return whatever is in the buffer). Lets queue tests hold slots busy.
// With `completions_may_submit` false it plays an interrupt-context device:
// Info() says so, and it counts the requests submitted to it from inside one
// of its completions (submits_in_completion(), which must stay 0).
class ManualDevice final : public BlockDevice {
 public:
  explicit ManualDevice(uint64_t size = 1 << 20, bool supports_fua = true,
                        bool completions_may_submit = true) {
    info_.size = size;
    info_.logical_block_size = 512;
    info_.supports_fua = supports_fua;
    info_.supports_discard = true;
    info_.completions_may_submit = completions_may_submit;
  }
  void Submit(IoRequest* req) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (completing_ == this) submits_in_completion_++;
    pending_.push_back(req);
    log_.push_back(*req);
  }
  const BlockDeviceInfo& Info() const override { return info_; }
  const char* Name() const override { return "manual"; }

  size_t pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_.size();
  }
  // Completes the oldest pending request (`newest`: the newest); false if none.
  bool CompleteNext(Status st = Status::Ok(), bool newest = false) {
    IoRequest* req;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.empty()) return false;
      req = newest ? pending_.back() : pending_.front();
      if (newest) {
        pending_.pop_back();
      } else {
        pending_.pop_front();
      }
    }
    const ManualDevice* outer = completing_;
    completing_ = this;
    req->done(req, st);
    completing_ = outer;
    return true;
  }
  void CompleteAll() {
    while (CompleteNext()) {
    }
  }
  // Copies of every request as submitted, in order.
  std::vector<IoRequest> log() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }
  uint64_t submits_in_completion() {
    std::lock_guard<std::mutex> lock(mu_);
    return submits_in_completion_;
  }

 private:
  // The device whose completion this thread runs (innermost).
  static inline thread_local const ManualDevice* completing_ = nullptr;

  BlockDeviceInfo info_;
  uint64_t submits_in_completion_ = 0;
  std::mutex mu_;
  std::deque<IoRequest*> pending_;
  std::vector<IoRequest> log_;
};

}  // namespace tfs::userspace

#endif  // TFS_USERSPACE_PLATFORM_IO_TESTING_H_
