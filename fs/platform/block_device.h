// BlockDevice: the one I/O interface between the core and a disk.
//
// Asynchronous and callback-based, like a bio: the caller fills an IoRequest,
// Submit()s it, and the device calls `done` exactly once -- possibly on another
// thread, possibly before Submit() returns, and in any order relative to other
// requests. `done` may run in interrupt context (the kernel): it takes only
// SpinLocks and wakes waiters -- no sleeping lock, no allocation, and no
// Submit() unless Info().completions_may_submit (docs/design/core.md,
// "Completion context"). No ordering between requests is implied; a caller that needs write A on
// media before write B waits for A's completion (and a flush) before submitting B.
//
// Every request carries an IoOrigin tag saying who asked for it. Devices and the
// layers above count I/O by origin; the lab's edge inventory (which origins a slow
// device saw during a foreground phase) is built on these tags, so a request must
// never be submitted with a made-up origin.
//
// Implementations: userspace/platform/ (io_uring over a file or block device, an
// in-memory device for tests), faultdevices/ (fault-injecting wrappers), and any
// device written in C against platform/tfs_block_device.h -- the kernel module's
// bio-backed one -- through the adapter in platform/c_block_device.h.
#ifndef TFS_PLATFORM_BLOCK_DEVICE_H_
#define TFS_PLATFORM_BLOCK_DEVICE_H_

#include "platform/tfs_block_device.h"
#include "platform/types.h"
#include "util/status.h"

namespace tfs {

enum class IoOp : u8 {
  kRead = 0,
  kWrite = 1,    // with IoRequest::kFua: durable when it completes
  kFlush = 2,    // every write completed before Submit(flush) is durable when it completes
  kDiscard = 3,  // the range's contents become unspecified (reads may return anything)
};
inline constexpr int kIoOpCount = 4;
const char* IoOpName(IoOp op);

enum class IoOrigin : u8 {
  kForegroundRead = 0,
  kForegroundWrite,
  kJournal,
  kBtree,
  kReconcile,
  kPromote,
  kCopygc,
  kReadahead,
  kSuperblock,
  kFsck,
  kAlloc,  // allocation state (format version 2's per-member tables); none now: the alloc btree's writes are kBtree
  kOther,
};
inline constexpr int kIoOriginCount = 12;
// Stable lower-case names used in counters and JSON ("foreground_read", ...).
const char* IoOriginName(IoOrigin origin);
// Parses a name from IoOriginName(); kNotFound for anything else.
Result<IoOrigin> IoOriginFromName(const char* name);

struct IoRequest;
using IoDoneFn = void (*)(IoRequest* req, Status status);

// One I/O. Owned by the caller, who keeps it (and `buf`) alive and untouched from
// Submit() until `done` has been called. `offset` and `length` are in bytes and must
// be multiples of the device's LogicalBlockSize(); `buf` may have any alignment
// (devices that need aligned memory bounce internally). For flush, offset, length
// and buf are ignored.
struct IoRequest {
  static constexpr u8 kFua = 1;  // write: force unit access
  // The submitter blocks on this request in the thread that calls Submit() and
  // does nothing else meanwhile: a device may do the I/O inside Submit() (a
  // plain syscall in that thread, `done` called before Submit returns) instead
  // of handing it to another thread and back. A hint; devices may ignore it.
  static constexpr u8 kInline = 2;
  // The submitter waits for this request next in the thread that calls
  // Submit(), with tfs_plat_wait_io, among other requests and with a
  // deadline (a flight's copy). A device may give it to that thread's own
  // completion context (userspace: the thread's ring), where the waiter
  // reaps it: `done` then runs in that thread inside tfs_plat_wait_io (or
  // in another thread). Never reaped inside Submit() (a request the device
  // refuses -- bad input, no memory -- still completes there). A hint; devices may
  // ignore it. A wrapper device that forwards a request later, from another
  // thread than the submitter's, must clear kInline and kWaited in what it
  // forwards (the thread that would then do or own the I/O is not waiting).
  static constexpr u8 kWaited = 4;

  IoOp op = IoOp::kRead;
  u8 flags = 0;
  IoOrigin origin = IoOrigin::kOther;
  u64 offset = 0;
  u64 length = 0;
  void* buf = nullptr;
  IoDoneFn done = nullptr;
  void* caller_data = nullptr;  // for the caller; devices never touch it

  // Scratch space for the device that currently owns the request (between Submit
  // and done). A wrapper device that forwards work to another device must use its
  // own IoRequest for that, not this one.
  struct DevicePrivate {
    IoRequest* next = nullptr;
    void* ptr = nullptr;
    u64 u0 = 0;
    u64 u1 = 0;
    // CBlockDevice: the request its C device sees, so that no submit
    // allocates (a separate field, not a union with the words above: each
    // device's scratch stays plain and typed).
    tfs_block_request c = {};
  } dev;
};

// Static facts about a device. Mirrored for C devices by
// TFS_BLOCK_DEVICE_INFO_FIELDS (platform/tfs_block_device.h): a field added
// here is added there too (c_block_device.cc fails to build until it is).
struct BlockDeviceInfo {
  u64 size = 0;                 // bytes, a multiple of logical_block_size
  u32 logical_block_size = 0;   // smallest aligned unit for offset and length
  bool read_only = false;       // writes and discards fail with kReadOnly
  bool supports_fua = true;     // false: the device turns FUA into write + flush
  bool supports_discard = false;
  // Whether the device may be submitted to from inside its own completion
  // callback: true when completions run on an ordinary thread (the io_uring
  // reaper, the memory and fault devices); false when they may run in
  // interrupt context (the kernel's bio end_io), where dev::IoQueue leaves the
  // I/O a completion made runnable to deferred work (platform/work.h).
  bool completions_may_submit = true;
};

class BlockDevice {
 public:
  // Inline, so that a device class in the core (CBlockDevice) needs no
  // platform symbol. BlockDevice's own vtable (pure-virtual slots, a deleting
  // destructor calling operator delete) is then emitted only where it is
  // used: in the core's optimized, kernel-flag build it never is, as a base
  // class's vtable is stored only to be overwritten (kernel_safe_check.py
  // proves it for every build); userspace devices emit it in their own code.
  virtual ~BlockDevice() = default;

  // Starts the request; never blocks waiting for I/O. Invalid requests (misaligned,
  // past the end, write to a read-only device) complete with an error through `done`,
  // just like failed I/O: callers have one error path.
  virtual void Submit(IoRequest* req) = 0;

  virtual const BlockDeviceInfo& Info() const = 0;
  // A short human name ("/dev/sdb", "mem0", "hdd-7200(img.0)") for logs and stats.
  virtual const char* Name() const = 0;

  u64 Size() const { return Info().size; }
  u32 LogicalBlockSize() const { return Info().logical_block_size; }

 protected:
  BlockDevice() = default;
  BlockDevice(const BlockDevice&) = delete;
  BlockDevice& operator=(const BlockDevice&) = delete;

  // Shared validation for implementations: alignment, bounds, read-only.
  Status CheckRequest(const IoRequest& req) const;
};

// Submits `req` and sleeps until it completes; returns its status. For paths that
// must wait anyway (format, mount, fsck, tests) -- never on a foreground path that
// could be served asynchronously. Overwrites req.done and req.caller_data.
Status SubmitAndWait(BlockDevice& dev, IoRequest& req);
// One synchronous request built from its parts.
Status SyncIo(BlockDevice& dev, IoOp op, u64 offset, void* buf, u64 length, u8 flags = 0,
              IoOrigin origin = IoOrigin::kOther);

}  // namespace tfs

#endif  // TFS_PLATFORM_BLOCK_DEVICE_H_
