// Helpers for the fault device tests: a profile from inline TOML, a FaultDevice over
// an in-memory backing device, and asynchronous requests whose completion time and
// status are recorded.
#ifndef TFS_FAULTDEVICES_TESTING_H_
#define TFS_FAULTDEVICES_TESTING_H_

#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "faultdevices/device.h"
#include "faultdevices/profile.h"
#include "userspace/platform/mem_device.h"

namespace faultdev::testing {

inline Profile MustParse(const std::string& toml, const std::vector<std::string>& sets = {}) {
  std::string error;
  std::optional<Profile> p = ParseProfile(toml, "inline.toml", sets, &error);
  EXPECT_TRUE(p.has_value()) << error;
  return p ? *p : Profile{};
}

// A FaultDevice over a MemDevice; `mem` stays valid for raw access.
struct TestDevice {
  tfs::userspace::MemDevice* mem = nullptr;
  std::unique_ptr<FaultDevice> dev;
};

inline TestDevice MakeDevice(const Profile& p, uint64_t size = 64 << 20, uint32_t block = 512) {
  tfs::userspace::MemDeviceOptions o;
  o.size = size;
  o.logical_block_size = block;
  o.threaded = false;
  auto mem = std::make_unique<tfs::userspace::MemDevice>(o);
  TestDevice t;
  t.mem = mem.get();
  std::string error;
  t.dev = FaultDevice::Open(p, std::move(mem), &error);
  EXPECT_TRUE(t.dev != nullptr) << error;
  return t;
}

// One asynchronous request with its result.
struct Pending {
  tfs::IoRequest req;
  std::vector<uint8_t> buf;
  uint64_t submitted = 0;
  uint64_t completed = 0;
  tfs::Status status;
  bool done = false;
  std::mutex* mu = nullptr;
  std::condition_variable* cv = nullptr;
};

// Submits requests and waits for them; completion times are recorded.
class Batch {
 public:
  explicit Batch(tfs::BlockDevice& dev) : dev_(dev) {}
  Pending& Add(tfs::IoOp op, uint64_t offset, uint64_t length, uint8_t fill = 0, uint8_t flags = 0,
               tfs::IoOrigin origin = tfs::IoOrigin::kOther) {
    auto p = std::make_unique<Pending>();
    p->buf.assign(length, fill);
    p->req.op = op;
    p->req.flags = flags;
    p->req.origin = origin;
    p->req.offset = offset;
    p->req.length = length;
    p->req.buf = length ? p->buf.data() : nullptr;
    p->req.caller_data = p.get();
    p->mu = &mu_;
    p->cv = &cv_;
    p->req.done = [](tfs::IoRequest* r, tfs::Status st) {
      auto* q = static_cast<Pending*>(r->caller_data);
      std::lock_guard<std::mutex> lock(*q->mu);
      q->completed = NowNs();
      q->status = st;
      q->done = true;
      q->cv->notify_all();
    };
    items_.push_back(std::move(p));
    return *items_.back();
  }
  // Submits every request added and not yet submitted.
  void Submit() {
    for (; submitted_ < items_.size(); submitted_++) {
      items_[submitted_]->submitted = NowNs();
      dev_.Submit(&items_[submitted_]->req);
    }
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] {
      for (auto& p : items_) {
        if (!p->done) return false;
      }
      return true;
    });
  }
  // Submits one request and waits for it.
  Pending& Sync(tfs::IoOp op, uint64_t offset, uint64_t length, uint8_t fill = 0, uint8_t flags = 0,
                tfs::IoOrigin origin = tfs::IoOrigin::kOther) {
    Pending& p = Add(op, offset, length, fill, flags, origin);
    Submit();
    Wait();
    return p;
  }
  size_t size() const { return items_.size(); }
  Pending& operator[](size_t i) { return *items_[i]; }

 private:
  tfs::BlockDevice& dev_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Pending>> items_;
  size_t submitted_ = 0;
};

inline double Ms(uint64_t ns) { return double(ns) / 1e6; }

}  // namespace faultdev::testing

#endif  // TFS_FAULTDEVICES_TESTING_H_
