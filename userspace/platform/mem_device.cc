// In-memory BlockDevice (see mem_device.h). Writes land in `current_`; with a
// volatile cache they also mark their blocks dirty until a flush copies them to
// `durable_` (or a FUA write does so for its own blocks). Crash() copies the durable
// blocks back over the dirty ones.
#include "userspace/platform/mem_device.h"

#include <algorithm>

#include <cstring>

namespace tfs::userspace {
namespace {

// The MemDevice whose completion callback this thread is running (innermost).
thread_local const MemDevice* t_completing = nullptr;

}  // namespace

MemDevice::MemDevice(const MemDeviceOptions& o)
    : name_(o.name),
      threaded_(o.threaded),
      reorder_(o.reorder),
      volatile_cache_(o.volatile_cache),
      rng_(o.seed) {
  TFS_BUG_ON(o.logical_block_size == 0 || o.size % o.logical_block_size != 0);
  info_.size = o.size;
  info_.logical_block_size = o.logical_block_size;
  info_.read_only = o.read_only;
  info_.supports_fua = o.supports_fua;
  info_.supports_discard = o.supports_discard;
  info_.completions_may_submit = o.completions_may_submit;
  if (!o.initial_image.empty()) {
    TFS_BUG_ON(o.initial_image.size() != o.size);
    current_ = o.initial_image;
  } else {
    current_.assign(o.size, 0);
  }
  if (volatile_cache_) {
    durable_ = current_;
    dirty_.assign(o.size / o.logical_block_size, false);
  }
  if (threaded_) worker_ = std::thread([this] { WorkerLoop(); });
}

MemDevice::~MemDevice() {
  if (threaded_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
}

void MemDevice::Submit(IoRequest* req) {
  // Interrupt context, played: nothing may be submitted to this device there.
  TFS_BUG_ON(!info_.completions_may_submit && t_completing != nullptr);
  if (!threaded_) {
    Execute(req);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(req);
  }
  cv_.notify_one();
}

void MemDevice::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    size_t pick = 0;
    if (reorder_ && queue_.size() > 1) pick = size_t(rng_() % queue_.size());
    IoRequest* req = queue_[pick];
    queue_.erase(queue_.begin() + ptrdiff_t(pick));
    executing_++;
    lock.unlock();
    Execute(req);
    lock.lock();
    executing_--;
    if (executing_ == 0 && queue_.empty()) idle_cv_.notify_all();
  }
}

void MemDevice::Execute(IoRequest* req) {
  Status st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    st = CheckRequest(*req);
    if (st.ok()) {
      const uint64_t lbs = info_.logical_block_size;
      const uint64_t first = req->offset / lbs;
      const uint64_t count = req->length / lbs;
      switch (req->op) {
        case IoOp::kRead:
          memcpy(req->buf, &current_[req->offset], req->length);
          break;
        case IoOp::kWrite:
        case IoOp::kDiscard:
          if (req->op == IoOp::kWrite) {
            memcpy(&current_[req->offset], req->buf, req->length);
          } else {
            memset(&current_[req->offset], 0, req->length);
          }
          if (volatile_cache_) {
            bool fua = req->op == IoOp::kWrite && (req->flags & IoRequest::kFua);
            for (uint64_t b = first; b < first + count; b++) {
              if (fua) {
                memcpy(&durable_[b * lbs], &current_[b * lbs], lbs);
                if (dirty_[b]) dirty_count_--;
                dirty_[b] = false;
              } else if (!dirty_[b]) {
                dirty_[b] = true;
                dirty_count_++;
              }
            }
          }
          break;
        case IoOp::kFlush:
          if (volatile_cache_ && dirty_count_ > 0) {
            for (uint64_t b = 0; b < dirty_.size(); b++) {
              if (!dirty_[b]) continue;
              memcpy(&durable_[b * lbs], &current_[b * lbs], lbs);
              dirty_[b] = false;
            }
            dirty_count_ = 0;
          }
          break;
      }
    }
    ops_[int(req->op) % kIoOpCount][int(req->origin) % kIoOriginCount]++;
    if (st.ok() && req->op != IoOp::kFlush) bytes_[int(req->op)] += req->length;
  }
  const MemDevice* outer = t_completing;
  t_completing = this;
  req->done(req, st);
  t_completing = outer;
}

void MemDevice::ReadRaw(uint64_t offset, void* buf, uint64_t len) const {
  std::lock_guard<std::mutex> lock(mu_);
  TFS_BUG_ON(offset > current_.size() || len > current_.size() - offset);
  memcpy(buf, &current_[offset], len);
}

void MemDevice::WriteRaw(uint64_t offset, const void* buf, uint64_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  TFS_BUG_ON(offset > current_.size() || len > current_.size() - offset);
  memcpy(&current_[offset], buf, len);
  if (volatile_cache_) memcpy(&durable_[offset], buf, len);
}

void MemDevice::Crash() {
  std::unique_lock<std::mutex> lock(mu_);
  // A callback may still be returning on the worker: wait until it is idle.
  idle_cv_.wait(lock, [this] { return queue_.empty() && executing_ == 0; });
  if (!volatile_cache_) return;
  const uint64_t lbs = info_.logical_block_size;
  for (uint64_t b = 0; b < dirty_.size(); b++) {
    if (!dirty_[b]) continue;
    memcpy(&current_[b * lbs], &durable_[b * lbs], lbs);
    dirty_[b] = false;
  }
  dirty_count_ = 0;
}

std::vector<uint8_t> MemDevice::SnapshotDurable() const {
  std::lock_guard<std::mutex> lock(mu_);
  return volatile_cache_ ? durable_ : current_;
}

std::vector<std::vector<uint8_t>> MemDevice::SnapshotDurable(const std::vector<const MemDevice*>& devices) {
  return SnapshotAtOnce(devices, nullptr);
}

std::vector<std::vector<uint8_t>> MemDevice::SnapshotTorn(const std::vector<const MemDevice*>& devices,
                                                          uint64_t seed) {
  std::mt19937_64 rng(seed);
  return SnapshotAtOnce(devices, &rng);
}

std::vector<std::vector<uint8_t>> MemDevice::SnapshotAtOnce(const std::vector<const MemDevice*>& devices,
                                                            std::mt19937_64* torn) {
  std::vector<const MemDevice*> order(devices);
  std::sort(order.begin(), order.end());  // one lock order for every caller
  order.erase(std::unique(order.begin(), order.end()), order.end());
  for (const MemDevice* d : order) d->mu_.lock();
  std::vector<std::vector<uint8_t>> out;
  for (const MemDevice* d : devices) {
    out.push_back(d->volatile_cache_ ? d->durable_ : d->current_);
    if (torn == nullptr || !d->volatile_cache_) continue;
    const uint64_t lbs = d->info_.logical_block_size;
    for (uint64_t b = 0; b < d->dirty_.size(); b++) {
      if (d->dirty_[b] && ((*torn)() & 1)) memcpy(&out.back()[b * lbs], &d->current_[b * lbs], lbs);
    }
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) (*it)->mu_.unlock();
  return out;
}

uint64_t MemDevice::dirty_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dirty_count_;
}

uint64_t MemDevice::ops(IoOp op) const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (int o = 0; o < kIoOriginCount; o++) n += ops_[int(op)][o];
  return n;
}

uint64_t MemDevice::ops(IoOp op, IoOrigin origin) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_[int(op)][int(origin)];
}

uint64_t MemDevice::bytes(IoOp op) const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_[int(op)];
}

void MemDevice::ResetCounters() {
  std::lock_guard<std::mutex> lock(mu_);
  memset(ops_, 0, sizeof(ops_));
  memset(bytes_, 0, sizeof(bytes_));
}

}  // namespace tfs::userspace

