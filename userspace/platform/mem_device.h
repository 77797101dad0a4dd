// MemDevice: an in-memory BlockDevice for tests.
//
// Completes requests either inline (inside Submit) or on one worker thread that,
// with `reorder`, completes queued requests in a seeded random order -- so code that
// silently assumes completion order fails its tests here rather than on real disks.
//
// With `volatile_cache`, writes are acknowledged into a volatile image: a flush (or
// a FUA write) makes them durable, and Crash() throws away everything not yet
// durable, as a power cut does to a disk's write cache. Counters by op and origin
// let tests assert which I/O a layer issued (e.g. "no flush reached the HDD").
//
// With `completions_may_submit` false it plays a device whose completions run
// in interrupt context (the kernel's): its Info() says so, and a Submit() to it
// from inside any MemDevice completion callback is a bug (it traps) -- the
// I/O queue must hand such dispatches to deferred work.
//
// Thread safety: Submit() and every accessor from any thread. The destructor waits
// for queued requests to complete; no Submit() may race with it.
#ifndef TFS_USERSPACE_PLATFORM_MEM_DEVICE_H_
#define TFS_USERSPACE_PLATFORM_MEM_DEVICE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "platform/block_device.h"

namespace tfs::userspace {

struct MemDeviceOptions {
  std::string name = "mem";
  uint64_t size = 64 << 20;
  uint32_t logical_block_size = 512;
  bool read_only = false;
  bool supports_fua = true;
  bool supports_discard = true;
  bool threaded = true;        // false: complete inside Submit()
  bool reorder = true;         // threaded only: complete in random order
  uint64_t seed = 1;
  bool volatile_cache = false;  // see Crash()
  bool completions_may_submit = true;  // false: see above
  std::vector<uint8_t> initial_image;  // if not empty: the starting contents (size bytes)
};

class MemDevice final : public BlockDevice {
 public:
  explicit MemDevice(const MemDeviceOptions& options = {});
  ~MemDevice() override;

  void Submit(IoRequest* req) override;
  const BlockDeviceInfo& Info() const override { return info_; }
  const char* Name() const override { return name_.c_str(); }

  // Direct access to the current contents, bypassing the I/O path (corruption tests
  // edit bytes here). Ranges must lie inside the device.
  void ReadRaw(uint64_t offset, void* buf, uint64_t len) const;
  void WriteRaw(uint64_t offset, const void* buf, uint64_t len);

  // Power cut: every write not yet made durable by a flush or FUA is lost; the
  // device then reads back its durable contents. Waits for queued requests first;
  // the caller must not submit concurrently.
  void Crash();
  // What a power cut at this instant would leave: the durable contents (all of
  // them without a volatile cache). Safe to call while I/O is in flight.
  std::vector<uint8_t> SnapshotDurable() const;
  // A power cut of several devices at one instant: each one's durable contents,
  // taken while holding all of their locks. Snapshotting devices one after
  // another while I/O runs is no power cut at all: a write that completed on
  // one device after its snapshot may have been what let another device's
  // (snapshotted, later) write be issued -- the btree's roots block after its
  // nodes' flush, for one.
  static std::vector<std::vector<uint8_t>> SnapshotDurable(const std::vector<const MemDevice*>& devices);
  // The same, for a cache that persisted some of what it held when the power
  // went: each written-but-not-durable block keeps its new contents with
  // probability 1/2 (a seeded choice), in any order -- a later write without
  // the earlier one, an entry without its data.
  static std::vector<std::vector<uint8_t>> SnapshotTorn(const std::vector<const MemDevice*>& devices,
                                                        uint64_t seed);
  // Blocks of logical_block_size that hold written-but-not-durable data.
  uint64_t dirty_blocks() const;

  // Requests completed, by op and by origin (errors included).
  uint64_t ops(IoOp op) const;
  uint64_t ops(IoOp op, IoOrigin origin) const;
  uint64_t bytes(IoOp op) const;
  void ResetCounters();

 private:
  // SnapshotDurable / SnapshotTorn (torn: the coin for each dirty block).
  static std::vector<std::vector<uint8_t>> SnapshotAtOnce(const std::vector<const MemDevice*>& devices,
                                                          std::mt19937_64* torn);
  void Execute(IoRequest* req);  // performs and completes one request
  void WorkerLoop();

  std::string name_;
  BlockDeviceInfo info_;
  bool threaded_;
  bool reorder_;
  bool volatile_cache_;

  // mu_ guards the images, the dirty map, the queue and the counters; never held
  // while a completion callback runs.
  mutable std::mutex mu_;
  std::condition_variable cv_;       // work for the worker
  std::condition_variable idle_cv_;  // the worker went idle
  std::vector<uint8_t> current_;
  std::vector<uint8_t> durable_;   // only with volatile_cache
  std::vector<bool> dirty_;        // per logical block, only with volatile_cache
  uint64_t dirty_count_ = 0;
  std::deque<IoRequest*> queue_;
  uint64_t executing_ = 0;
  bool stop_ = false;
  std::mt19937_64 rng_;
  uint64_t ops_[kIoOpCount][kIoOriginCount] = {};
  uint64_t bytes_[kIoOpCount] = {};
  std::thread worker_;
};

}  // namespace tfs::userspace

#endif  // TFS_USERSPACE_PLATFORM_MEM_DEVICE_H_
