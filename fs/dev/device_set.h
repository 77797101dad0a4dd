// DeviceSet: the members of one filesystem, their labels and groups, and target
// resolution.
//
// A member has a label such as "ssd.nvme0"; the part before the first '.' is its
// group ("ssd"). A target names either a group ("hdd": every member of it) or one
// member ("ssd.nvme0") and resolves to a DevMask, a bit per member index. Each
// member owns an IoQueue through which all of its core I/O goes.
//
// The set is built once at format or mount time (Add) and is then read-only, so
// lookups need no lock. Members do not own their BlockDevice: the front end that
// opened a device closes it after the set is gone.
//
// The set also owns the deferred work of its members' completions
// (platform/work.h): each member whose device's completions may not submit
// has its own WorkQueue for the I/O they make runnable (a member's dispatch
// never waits behind another's: an HDD's submission, which may sleep for a
// request tag in the kernel, never holds up an SSD's), and the set has one,
// started with the first member, for the allocator's background table
// writes. They outlive every completion of the queues: ~DeviceSet drains and
// stops the set's, then the members', before any member goes.
#ifndef TFS_DEV_DEVICE_SET_H_
#define TFS_DEV_DEVICE_SET_H_

#include "dev/io_queue.h"
#include "platform/block_device.h"
#include "util/status.h"

namespace tfs::dev {

inline constexpr u32 kMaxDevices = 32;
inline constexpr u32 kLabelMax = 32;  // bytes including the terminating NUL
using DevMask = u32;
static_assert(kMaxDevices <= 32, "DevMask has one bit per member");

// Whether a write's or flush's error says the device failed (an I/O error or
// a timeout), as opposed to a missing member (kMissing: a degraded mount's),
// a caller's mistake or a lack of memory: what marks a member failed
// (DeviceSet::MarkFailed).
inline bool IsDeviceFailure(Status st) {
  return !st.ok() && st.Is(ErrorClass::kIo) && st.code() != Err::kMissing;
}

// Checks a member label: 1..31 bytes of [a-z0-9_-], at most one '.', which must
// not be first or last. kInvalidArgument otherwise.
Status ValidateLabel(const char* label);

class Member {
 public:
  u32 index() const { return index_; }
  const char* label() const { return label_; }
  // The group name: the label up to its first '.', or the whole label.
  const char* group() const { return group_; }
  BlockDevice* bdev() const { return bdev_; }
  IoQueue& queue() { return queue_; }
  const IoQueue& queue() const { return queue_; }

 private:
  friend class DeviceSet;
  u32 index_ = 0;
  char label_[kLabelMax] = {};
  char group_[kLabelMax] = {};
  BlockDevice* bdev_ = nullptr;
  // The member's own deferred dispatch (a device whose completions may not
  // submit; not started otherwise): declared before queue_, which cancels
  // its item on it when it goes.
  WorkQueue dispatch_;
  IoQueue queue_;
};

class DeviceSet {
 public:
  DeviceSet() = default;
  ~DeviceSet();
  DeviceSet(const DeviceSet&) = delete;
  DeviceSet& operator=(const DeviceSet&) = delete;

  // Adds a member with the next index. kInvalidArgument for a bad or duplicate
  // label, kNoSpace past kMaxDevices, kNoMemory.
  Result<Member*> Add(BlockDevice* bdev, const char* label, const QueueConfig& queue_config);

  u32 size() const { return count_; }
  Member* member(u32 index) const { return index < count_ ? members_[index] : nullptr; }
  DevMask all() const { return count_ == 32 ? ~DevMask(0) : (DevMask(1) << count_) - 1; }

  // A group name or a member label -> the members it names. kNotFound if it names
  // nothing; "" or "none" resolve to 0 (no target).
  Result<DevMask> ResolveTarget(const char* target) const;
  // Members whose queues hold durability debt (writes not yet covered by a flush).
  DevMask DebtMask() const;
  // Members a degraded mount opened without (each a dev::MissingDevice: every
  // request fails at once with Err::kMissing). Set once, before any I/O.
  DevMask missing() const { return missing_; }
  void SetMissing(DevMask mask) { missing_ = mask; }

  // Member health (docs/design/copies.md, step 5c-3): members marked failed
  // for this mount -- a metadata write or flush of theirs (a node copy, a
  // roots block, a journal ring's entry, a checkpoint's flush) failed with
  // a device error (IsDeviceFailure). Nothing chooses a failed member from
  // then on (the allocator, the checkpoint's copy set, the journal's rings,
  // the roots block, the unmount's superblock), as a missing one; reads
  // still go to it. Marked by the thread that waited for the I/O, never in
  // a completion; the mark is never cleared while mounted. The first mark
  // logs and keeps its error; MarkFailed says whether this call marked it
  // (never the last member neither missing nor failed, nor the last of a
  // vital group: SetVitalGroups).
  DevMask failed() const { return failed_.Load(MemOrder::kAcquire); }
  // Missing or failed: what no write chooses.
  DevMask unavailable() const { return missing_ | failed(); }
  bool MarkFailed(u32 index, Status why);
  // The error that marked member `index` failed (Ok if it is not).
  Status FailedError(u32 index) const {
    if (index >= kMaxDevices || ((failed() >> index) & 1) == 0) return Status::Ok();
    return Status(Err(failed_error_[index].Load(MemOrder::kAcquire)));
  }
  // The mask a writer reads (the allocator: Allocator::WatchFailed).
  const Atomic<DevMask>* failed_mask() const { return &failed_; }
  // Groups of members each of which must keep one member neither missing
  // nor failed (the journal's rings, the btree's members): a mark that
  // would leave one empty is refused -- with nothing to go on with, the
  // error fails the write as before. Set before any I/O; 0: none.
  void SetVitalGroups(DevMask a, DevMask b) {
    vital_[0] = a;
    vital_[1] = b;
  }
  // Called (fn(ctx)) after each mark, in the marking thread: it may take a
  // Mutex and wake a thread, never wait for I/O (the store's: its health
  // thread writes the superblocks). Set before any I/O.
  void SetOnFailed(void (*fn)(void*), void* ctx) {
    on_failed_ = fn;
    on_failed_ctx_ = ctx;
  }

  // The set's deferred work (running once a member was added). Items
  // queued here must be done before whatever they touch goes (the allocator
  // waits for its table writes); the set's destructor runs what is left.
  WorkQueue& work() { return work_; }

 private:
  Member* members_[kMaxDevices] = {};
  u32 count_ = 0;
  DevMask missing_ = 0;
  Atomic<DevMask> failed_{0};
  Atomic<i32> failed_error_[kMaxDevices] = {};
  DevMask vital_[2] = {};
  void (*on_failed_)(void*) = nullptr;
  void* on_failed_ctx_ = nullptr;
  WorkQueue work_;
};

// Iterates over the set bits of a mask: for (u32 i : Bits(mask)).
class Bits {
 public:
  explicit Bits(u32 mask) : mask_(mask) {}
  struct It {
    u32 m;
    u32 operator*() const { return u32(__builtin_ctz(m)); }
    It& operator++() {
      m &= m - 1;
      return *this;
    }
    bool operator!=(const It& o) const { return m != o.m; }
  };
  It begin() const { return It{mask_}; }
  It end() const { return It{0}; }

 private:
  u32 mask_;
};

}  // namespace tfs::dev

#endif  // TFS_DEV_DEVICE_SET_H_
