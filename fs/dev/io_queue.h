// IoQueue: the per-device queue every core I/O goes through.
//
// It exists to keep slow-device waits out of the foreground (docs/design/io-queues.md):
//  - requests are served in class priority order (foreground sync, journal,
//    foreground async, btree, background, readahead);
//  - the device has a bounded number of in-flight slots, and the last `reserved`
//    of them may only be taken by foreground and journal I/O, so background work
//    can never fill the device's queue ahead of a foreground request;
//  - readahead is *declined* (kNotAdmitted) rather than queued when the device is
//    busy or stalled;
//  - it counts I/O by origin (ops, bytes, queue and service time histograms), keeps
//    a service-latency EWMA and detects a stall (requests outstanding, nothing
//    completed for longer than a threshold);
//  - it tracks durability debt: writes that completed but that no later flush has
//    covered. A journal commit pre-flushes only devices with debt.
//
// Completion context: the device's completion (OnComplete) may run in
// interrupt context in the kernel. It does only the queue's bookkeeping under
// a SpinLock, then calls the Io's `done`, which obeys the same rule (only
// SpinLocks, wakes; no Mutex, no allocation, no submission). The I/Os a
// completion makes runnable go to the device from the completion itself when
// the device allows it (BlockDeviceInfo::completions_may_submit: every
// userspace device -- no thread hop on the foreground path), otherwise from
// deferred work on the owner's WorkQueue (process context). Checked builds
// (TFS_LOCK_CHECKS) mark the whole completion as one where nothing may sleep.
//
// Thread safety: all methods from any thread; Submit and SubmitReadahead from
// process context only. `mu_` (a SpinLock: completions take it) guards the
// queues, slot counts and statistics; it is never held while calling into the
// BlockDevice or a completion callback (both may re-enter the queue).
#ifndef TFS_DEV_IO_QUEUE_H_
#define TFS_DEV_IO_QUEUE_H_

#include "platform/atomic.h"
#include "platform/block_device.h"
#include "platform/sync.h"
#include "platform/work.h"
#include "util/counters.h"
#include "util/histogram.h"
#include "util/list.h"
#include "util/status.h"

namespace tfs::dev {

// Service classes, highest priority first.
enum class IoClass : u8 {
  kForegroundSync = 0,  // a user is waiting: reads, O_SYNC writes, fsck
  kJournal,             // journal writes and their pre-flushes
  kForegroundAsync,     // writeback of user data
  kBtree,               // btree node writes (journal reclaim), superblock
  kBackground,          // reconcile, copygc, promote
  kReadahead,           // speculative reads: admitted or declined, never queued
};
inline constexpr int kIoClassCount = 6;
const char* IoClassName(IoClass c);
// The class an origin gets when the caller does not choose one.
IoClass DefaultClass(IoOrigin origin);

class IoQueue;

// One queued I/O. The caller fills `req` (op, flags, origin, offset, length, buf),
// `cls`, `done` and `caller_data`; `req.done` and `req.caller_data` belong to the
// queue. The Io must stay valid until `done` runs (exactly once, any thread).
struct Io {
  IoRequest req;
  IoClass cls = IoClass::kForegroundSync;
  void (*done)(Io* io, Status st) = nullptr;
  void* caller_data = nullptr;

  // Queue-private.
  ListNode link;
  ListNode dispatched_link;  // IoQueue::dispatched_: at the device, oldest first
  IoQueue* queue = nullptr;
  u64 enqueue_ns = 0;
  u64 dispatch_ns = 0;
  // A flush: the write generation it covers. A volatile write, once it
  // completed: its own generation (Covered() says when a flush has covered
  // it); a FUA write (emulated or not) or a failed one: 0.
  u64 flush_gen = 0;
  u8 fua_phase = 0;   // FUA on a device without FUA: 1 = write part, 2 = flush part
};

struct QueueConfig {
  u32 max_in_flight = 32;          // slots at the device
  u32 reserved = 4;                // of which only foreground and journal may use the last
  u32 readahead_max_in_flight = 8;  // readahead admitted only below this many in flight
  u64 stall_threshold_ns = 1000ull * 1000 * 1000;  // 1 s without a completion
};

// Counters for one origin. Histograms are in nanoseconds.
struct OriginStats {
  u64 ops[kIoOpCount];
  u64 bytes[kIoOpCount];
  u64 errors;
  Histogram queue_time;    // enqueue -> dispatch to the device
  Histogram service_time;  // dispatch -> completion
};

// The last kSize values recorded (service times in ns), and a high
// quantile of them: a ring, no allocation, not thread-safe (the queue keeps
// one under its lock). Quantile(99, 100) of 128 samples is the second
// largest: the value ceil(n * 99 / 100) of the sorted window.
class LatencyWindow {
 public:
  static constexpr u32 kSize = 128;
  void Record(u64 ns) {
    v_[pos_] = ns;
    pos_ = (pos_ + 1) % kSize;
    if (n_ < kSize) n_++;
  }
  u32 samples() const { return n_; }
  // The smallest value v such that at least ceil(n * num / den) samples are
  // <= v; 0 with none. For num/den of 0.97 and above (a top-4 selection: a
  // lower quantile gets the 4th largest value).
  u64 Quantile(u32 num, u32 den) const;

 private:
  u64 v_[kSize] = {};
  u32 pos_ = 0;
  u32 n_ = 0;
};

// What the data path's choice of a copy and its hedge bound read of a
// member's queue, in one lock hold (docs/design/copies.md, "Step 6").
struct ReadState {
  u64 p99_ns = 0;      // of the last LatencyWindow::kSize reads' service times (0: none yet)
  u32 samples = 0;     // reads in that window
  u64 ewma_ns = 0;     // service time of every op, moving average (0: none yet)
  u64 oldest_ns = 0;   // how long the oldest read or write at the device has been there (0: none; flushes left out)
  u32 in_flight = 0;
  u32 queued = 0;
  bool stalled = false;  // quiet for stall_threshold_ns
};

// A bound of `times` x `base` within [lo, hi]; `hi` when base is unknown
// (0). The data path's hedge bound and the late bound below.
inline u64 ScaledBoundNs(u64 base, u64 times, u64 lo, u64 hi) {
  if (base == 0) return hi;
  return Min(Max(base > hi ? hi : times * base, lo), hi);
}

// A member's *late bound* (docs/design/copies.md, "Step 6c"): 8 x its
// service-time EWMA within [kLateMinNs, kLateMaxNs]; none known yet:
// kLateMaxNs. A replicated write leaves a copy there behind that is not
// written within it (once another copy is), and the journal gives up a
// pre-flush there that is not done within it (6c-2) -- each only while
// the member is Stalling.
inline constexpr u64 kLateMinNs = 250'000'000ull;
inline constexpr u64 kLateMaxNs = 1'000'000'000ull;
inline u64 LateBoundNs(const ReadState& rs) { return ScaledBoundNs(rs.ewma_ns, 8, kLateMinNs, kLateMaxNs); }
// Whether the member is *stalling*: its queue reports a stall, or its
// oldest read or write at the device is older than its late bound (a busy
// member's queue may simply not have sent a request yet: that is not one).
inline bool Stalling(const ReadState& rs) { return rs.stalled || rs.oldest_ns > LateBoundNs(rs); }

class IoQueue;

// The late-bound watch of up to N I/Os out on members (6c): what each
// waiter that may leave an I/O behind runs -- a replicated write's copies
// (data/write.cc), the journal's ring writes and pre-flushes
// (journal.cc), the checkpoint's node copies, flushes and roots writes
// (btree/checkpoint.cc). Slot i watches one I/O (or a member's batch)
// from Start, against its member's late bound read then; the waiter
// sleeps until Deadline() of the slots it may give up, then asks Late()
// which of them it may. Not thread-safe (one waiter's stack).
template <u32 N>
class LateWatch {
 public:
  static_assert(N <= 32, "slots are a u32 mask");
  // Slot i's I/O on `queue` went out at `now` (or its bound starts again).
  void Start(u32 i, const IoQueue& queue, u64 now);
  void Restart(u32 i, u64 now) { since_[i] = now; }
  // The nearest bound's end among the slots in `mask` (started ones);
  // kForever for none.
  u64 Deadline(u32 mask) const {
    u64 d = ~u64(0);
    for (u32 i = 0; i < N; i++)
      if (((mask >> i) & 1) != 0 && queue_[i] != nullptr && since_[i] + bound_[i] < d) d = since_[i] + bound_[i];
    return d;
  }
  // The slots of `mask` past their bound at `now` whose member is
  // Stalling: those the waiter may leave behind. A slot past its bound
  // whose member is not stalling starts its bound again: a busy member's
  // queue may simply not have sent the I/O yet.
  u32 Late(u32 mask, u64 now);

 private:
  const IoQueue* queue_[N] = {};
  u64 since_[N] = {};
  u64 bound_[N] = {};
};

// A queue's state and counters now (util/counters.h; State() fills them).
#define TFS_QUEUE_COUNTERS(X, A)                                        \
  X(in_flight, gauge, "requests at the device")                         \
  X(queued, gauge, "requests waiting in the queue")                     \
  X(latency_ewma_ns, gauge, "service time, moving average")             \
  X(stalled, flag, "no completion for stall_threshold_ns")              \
  X(durability_debt, flag, "writes completed that no later flush has covered") \
  X(readahead_declined, counter, "readaheads declined: the queue was busy or stalled") \
  X(stall_events, counter, "times a stall was observed (see Stalled())") \
  X(deferred_dispatches, counter, "I/Os a completion made runnable, sent to the device by deferred work")

struct QueueState {
  TFS_COUNTER_FIELDS(TFS_QUEUE_COUNTERS)
};

class IoQueue {
 public:
  IoQueue() = default;
  ~IoQueue();
  IoQueue(const IoQueue&) = delete;
  IoQueue& operator=(const IoQueue&) = delete;

  // kInvalidArgument for an unusable config (reserved >= max_in_flight, zeros)
  // or for a device whose completions may not submit without a `work` queue
  // to defer to (it must outlive the IoQueue); kNoMemory if the statistics
  // cannot be allocated.
  Status Init(BlockDevice* bdev, const QueueConfig& config, WorkQueue* work = nullptr);

  // Starts `io` now if its class may take a slot, else queues it. Never blocks,
  // unless `waiting` (the caller waits for it next, in this thread): then an io
  // started here goes to the device with IoRequest::kInline, and the device may
  // do it before Submit returns.
  void Submit(Io* io, bool waiting = false);
  // Submit for one I/O of a flight the caller waits for next, in this thread,
  // with tfs_plat_wait_io (among others, with a deadline): never inline, but
  // an io started here goes to the device with IoRequest::kWaited (the
  // thread may reap it itself while it waits).
  void SubmitFlight(Io* io);
  // Readahead admission: starts `io` (class kReadahead) only if the device is idle
  // enough; otherwise returns kNotAdmitted and `done` is never called.
  Status SubmitReadahead(Io* io);

  BlockDevice* bdev() const { return bdev_; }
  QueueState State() const;
  // True while requests are outstanding and none completed for stall_threshold_ns.
  bool Stalled() const;
  // The read state (data::DataPath's choice of a copy). Without `p99`, the
  // window's quantile is not computed (p99_ns 0): a writer's look at a
  // member's load (its EWMA, its oldest request, a stall) costs no scan.
  ReadState GetReadState(bool p99 = true) const;
  bool HasDurabilityDebt() const {
    return write_gen_.Load(MemOrder::kAcquire) != flushed_gen_.Load(MemOrder::kAcquire);
  }
  // Whether a flush that covers the write whose completion gave it `gen`
  // (Io::flush_gen) has completed -- a flush dispatched after that write
  // completed, anyone's. Always true for 0. The background engines' batches
  // send a flush only when this says they must (docs/design/tiering.md,
  // step 22-2).
  bool Covered(u64 gen) const { return flushed_gen_.Load(MemOrder::kAcquire) >= gen; }
  // Copies the counters of one origin (histograms included) under the lock.
  void ReadStats(IoOrigin origin, OriginStats* out) const;

 private:
  // Submit's work; `own_flag` (kInline, kWaited or 0) marks `io` when it is
  // dispatched here, in the caller's thread.
  void SubmitAs(Io* io, u8 own_flag);
  static void OnComplete(IoRequest* req, Status st);
  void Complete(Io* io, Status st);
  // The deferred work: sends deferred_ to the device (process context).
  static void DispatchDeferred(void* self);
  // Whether an I/O of class `c` may take a slot now.
  bool SlotAvailable(IoClass c) const TFS_REQUIRES(mu_);
  // Moves queued I/Os that may run into `out` (in priority order).
  void TakeRunnable(IntrusiveList<Io, &Io::link>* out) TFS_REQUIRES(mu_);
  // Marks `io` dispatched (slot taken, timestamps).
  void MarkDispatched(Io* io, u64 now) TFS_REQUIRES(mu_);
  void Dispatch(IntrusiveList<Io, &Io::link>* ready);
  bool StalledLocked(u64 now) const TFS_REQUIRES(mu_);

  BlockDevice* bdev_ = nullptr;
  QueueConfig config_;
  // !completions_may_submit: what completions make runnable goes through
  // deferred_ and dispatch_work_ on work_.
  bool defer_ = false;
  WorkQueue* work_ = nullptr;
  Work dispatch_work_;

  mutable SpinLock mu_;
  IntrusiveList<Io, &Io::link> queues_[kIoClassCount] TFS_GUARDED_BY(mu_);
  // Dispatched (slot taken, in priority order) by a completion, waiting for
  // dispatch_work_ to send them to the device.
  IntrusiveList<Io, &Io::link> deferred_ TFS_GUARDED_BY(mu_);
  u64 deferred_dispatches_ TFS_GUARDED_BY(mu_) = 0;
  u32 in_flight_ TFS_GUARDED_BY(mu_) = 0;
  // The requests at the device (in_flight_ of them), in dispatch order.
  IntrusiveList<Io, &Io::dispatched_link> dispatched_ TFS_GUARDED_BY(mu_);
  u32 queued_ TFS_GUARDED_BY(mu_) = 0;
  u64 busy_since_ns_ TFS_GUARDED_BY(mu_) = 0;
  u64 last_completion_ns_ TFS_GUARDED_BY(mu_) = 0;
  u64 latency_ewma_ns_ TFS_GUARDED_BY(mu_) = 0;
  LatencyWindow read_window_ TFS_GUARDED_BY(mu_);  // service times of reads
  u64 readahead_declined_ TFS_GUARDED_BY(mu_) = 0;
  mutable u64 stall_events_ TFS_GUARDED_BY(mu_) = 0;
  mutable bool stall_seen_ TFS_GUARDED_BY(mu_) = false;
  OriginStats* stats_ = nullptr;  // [kIoOriginCount], guarded by mu_

  // Durability debt: generation of completed volatile writes vs. the newest
  // generation a completed flush covered.
  Atomic<u64> write_gen_{0};
  Atomic<u64> flushed_gen_{0};
};

// Waits for a batch of Ios (on any queues) and keeps the first error: set each
// Io's done = IoBatch::Done and caller_data = the batch, submit them, Wait().
struct IoBatch {
  explicit IoBatch(u32 n) : latch(n) {}
  Latch latch;
  Atomic<i32> first_error{0};

  static void Done(Io* io, Status st);
  Status Wait();
};

// One I/O among several in flight whose results the waiter reads one by
// one (IoBatch keeps only the first error): io.done = LatchedIo::Done,
// io.caller_data = the LatchedIo, latch = the waiter's, which counts them
// down. Done is an atomic store and a wake only (it may run in interrupt
// context); the waiter may free the LatchedIo once the latch opens.
struct LatchedIo {
  Io io;
  Latch* latch = nullptr;
  Atomic<i32> err{0};

  static void Done(Io* io, Status st);
  Status status() const { return Status(Err(err.Load(MemOrder::kAcquire))); }
};

// Submits one I/O through `queue` and sleeps until it completes (format, mount,
// fsck and tests only). Fills io->done and io->caller_data.
Status SubmitAndWait(IoQueue& queue, Io* io);
// The same for a request built from its parts, with the origin's default class.
Status QueueSyncIo(IoQueue& queue, IoOp op, u64 offset, void* buf, u64 length, u8 flags,
                   IoOrigin origin);

template <u32 N>
void LateWatch<N>::Start(u32 i, const IoQueue& queue, u64 now) {
  queue_[i] = &queue;
  since_[i] = now;
  bound_[i] = LateBoundNs(queue.GetReadState(/*p99=*/false));
}

template <u32 N>
u32 LateWatch<N>::Late(u32 mask, u64 now) {
  u32 late = 0;
  for (u32 i = 0; i < N; i++) {
    if (((mask >> i) & 1) == 0 || queue_[i] == nullptr || now < since_[i] + bound_[i]) continue;
    if (Stalling(queue_[i]->GetReadState(/*p99=*/false)))
      late |= 1u << i;
    else
      since_[i] = now;
  }
  return late;
}

}  // namespace tfs::dev

#endif  // TFS_DEV_IO_QUEUE_H_
