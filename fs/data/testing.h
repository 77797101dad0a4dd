// Test fixtures for the data path's tests: a device that holds back or fails
// the requests of one kind (an op and an origin), so a test can keep a read
// or a copy's write in flight for as long as it needs, or make a member's
// data writes fail; and a tap on the allocator's persistence sink that
// counts the data path's free commits and fails chosen allocations. Tests
// only (kernel_safe_check.py skips testing.h headers); the store and posix
// fixtures are mount/testing.h's.
#ifndef TFS_DATA_TESTING_H_
#define TFS_DATA_TESTING_H_

#include <atomic>
#include <initializer_list>
#include <utility>
#include <mutex>
#include <vector>

#include "alloc/allocator.h"
#include "data/policy.h"
#include "platform/block_device.h"

namespace tfs::testing {

// A device over another. Requests of op `op` and origin `origin` (in
// GateFrom's range of offsets) are parked
// while closed (Close; Open submits them, in order) and completed with an
// I/O error while failing (Fail; counted, failed()) -- failing first. Every
// other request goes straight through. Thread-safe.
class GateDevice final : public BlockDevice {
 public:
  GateDevice(BlockDevice* inner, IoOp op, IoOrigin origin) : inner_(inner), op_(op), origin_(origin) {}
  void Submit(IoRequest* req) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      const bool gated = req->op == op_ && (any_origin_ || req->origin == origin_) && req->offset >= min_offset_ &&
                         req->offset < end_offset_;
      if (gated && failing_) {
        failed_++;
      } else if (gated && closed_) {
        parked_.push_back(req);
        return;
      } else {
        inner_->Submit(req);
        return;
      }
    }
    req->done(req, Status(Err::kIo));
  }
  const BlockDeviceInfo& Info() const override { return inner_->Info(); }
  const char* Name() const override { return inner_->Name(); }
  void Close() {
    std::lock_guard<std::mutex> l(mu_);
    closed_ = true;
  }
  size_t parked() {
    std::lock_guard<std::mutex> l(mu_);
    return parked_.size();
  }
  void Open() {
    std::vector<IoRequest*> go;
    {
      std::lock_guard<std::mutex> l(mu_);
      closed_ = false;
      go.swap(parked_);
    }
    for (IoRequest* r : go) {
      // Sent from this thread, not the submitter's: not inline, not its ring
      // (platform/block_device.h, kWaited).
      r->flags &= u8(~(IoRequest::kInline | IoRequest::kWaited));
      inner_->Submit(r);
    }
  }
  // Opens the gate, completing what it parked with an I/O error instead
  // of sending it (a stalled request that ends failing).
  void OpenFailing() {
    std::vector<IoRequest*> go;
    {
      std::lock_guard<std::mutex> l(mu_);
      closed_ = false;
      go.swap(parked_);
    }
    for (IoRequest* r : go) r->done(r, Status(Err::kIo));
  }
  void Fail(bool on) {
    std::lock_guard<std::mutex> l(mu_);
    failing_ = on;
  }
  // Gates requests of op `op` from every origin from now on (a member
  // whose writes, or flushes, all fail); Regate: of `op` and `origin`.
  void GateEveryOrigin(IoOp op) {
    std::lock_guard<std::mutex> l(mu_);
    op_ = op;
    any_origin_ = true;
  }
  void Regate(IoOp op, IoOrigin origin) {
    std::lock_guard<std::mutex> l(mu_);
    op_ = op;
    origin_ = origin;
    any_origin_ = false;
  }
  // Gates only requests at `offset` or past it (e.g. a member's node
  // writes, not its roots block), and before `end`.
  void GateFrom(u64 offset, u64 end = ~u64(0)) {
    std::lock_guard<std::mutex> l(mu_);
    min_offset_ = offset;
    end_offset_ = end;
  }
  u64 failed() {
    std::lock_guard<std::mutex> l(mu_);
    return failed_;
  }
  // The offsets of the requests parked now.
  std::vector<u64> ParkedOffsets() {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<u64> v;
    for (const IoRequest* r : parked_) v.push_back(r->offset);
    return v;
  }

 private:
  BlockDevice* inner_;
  IoOp op_;  // (mu_, as origin_ and any_origin_)
  IoOrigin origin_;
  bool any_origin_ = false;
  u64 min_offset_ = 0;
  u64 end_offset_ = ~u64(0);
  std::mutex mu_;
  bool closed_ = false;
  bool failing_ = false;
  u64 failed_ = 0;
  std::vector<IoRequest*> parked_;
};

// A sink put in front of an allocator's (Allocator::SetPersist): it passes
// every change on to the sink that was there, and counts the commits of
// user buckets' frees (the data path's: alloc::PersistFn's owner kUser,
// every change a free) and the frees they carry. With FailUserAllocations,
// allocations of user buckets after the first `pass` from then on fail with
// kIo (Allocator::SetAllocFaultForTest: as a journal settle that failed --
// the write point's allocations commit no record since step 3b-3). Attach it once
// the store is open; it must outlive the store (calls through it may run
// until the store has closed), so declare it before the fixture that owns
// the store. Counters: read after the calls they count have returned.
class SinkTap {
 public:
  SinkTap() = default;
  SinkTap(const SinkTap&) = delete;
  SinkTap& operator=(const SinkTap&) = delete;
  void Attach(alloc::Allocator* a) {
    a->GetPersist(&fn_, &ctx_);
    a->SetPersist(Persist, this);
    a->SetAllocFaultForTest(Fault, this);
  }
  void FailUserAllocations(u64 pass) {
    pass_.store(pass);
    failing_.store(true);
  }
  void StopFailing() { failing_.store(false); }
  std::atomic<u64> free_commits{0};  // commits of user buckets' frees
  std::atomic<u64> frees{0};         // the frees they carried
  std::atomic<u64> user_commits{0};  // commits for user buckets that are not frees only (allocations, repairs)
  std::atomic<u64> failed{0};        // allocations failed

 private:
  static Result<u64> Persist(void* self, const alloc::RecordChange* changes, u32 n, alloc::BucketState owner,
                             alloc::PersistProgress* progress) {
    auto* t = static_cast<SinkTap*>(self);
    bool all_free = n > 0;
    for (u32 i = 0; i < n; i++) all_free &= changes[i].b.state == alloc::BucketState::kFree;
    Result<u64> r = t->fn_(t->ctx_, changes, n, owner, progress);
    if (owner == alloc::BucketState::kUser && !all_free) t->user_commits += progress->transactions;
    if (owner == alloc::BucketState::kUser && all_free) {
      t->free_commits += progress->transactions;
      t->frees += progress->committed;
    }
    return r;
  }
  static Status Fault(void* self, alloc::BucketState purpose, bool /*recorded*/) {
    auto* t = static_cast<SinkTap*>(self);
    if (purpose != alloc::BucketState::kUser || !t->failing_.load()) return Status::Ok();
    u64 pass = t->pass_.load();
    while (pass > 0 && !t->pass_.compare_exchange_weak(pass, pass - 1)) {
    }
    if (pass > 0) return Status::Ok();
    t->failed++;
    return Err::kIo;
  }

  alloc::PersistFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::atomic<u64> pass_{0};
  std::atomic<bool> failing_{false};
};

// The policy and reconcile tests' filesystem: members "ssd" (0) and "hdd"
// (1), each a group of one, durability 1; foreground target ssd,
// background target hdd, one copy.
inline data::MemberTable TwoTierTable() {
  data::MemberTable t;
  t.count = 2;
  t.group[0] = 0b01;
  t.group[1] = 0b10;
  t.durability[0] = t.durability[1] = 1;
  t.durable = 0b11;
  t.fg_target = 0b01;
  t.bg_target = 0b10;
  return t;
}

// An extent of inode `ino`, blocks [end - blocks, end), with plain copies
// (member, cached) in order and `crcs` (blocks of them) as their crcs.
inline data::Extent ExtentOn(u64 ino, u64 end, u32 blocks, std::initializer_list<std::pair<u8, bool>> copies,
                             const u8* crcs) {
  data::Extent e;
  e.ino = ino;
  e.start = end - blocks;
  e.end = end;
  for (const auto& [dev, cached] : copies) {
    data::Extent::Ptr& p = e.ptrs[e.nr_ptrs++];
    p.dev = dev;
    p.cached = cached;
  }
  e.crcs = crcs;
  return e;
}

}  // namespace tfs::testing

#endif  // TFS_DATA_TESTING_H_
