// Deferred work: what a completion may not do itself, done soon after on a
// thread of the core's own (process context).
//
// A completion may run in interrupt context in the kernel (a bio's end_io):
// it may take only SpinLocks and wake waiters (docs/design/core.md,
// "Completion context"). What it would have done next -- submit the I/O it
// made runnable, continue a chain of writes, take a sleeping lock -- it hands
// to a WorkQueue instead: Queue() links a Work item the caller owns into a
// SpinLock-guarded list (no allocation, no sleeping lock) and wakes the worker
// (tfs_plat_wake) only when it sleeps. The worker runs items one at a time in
// the order they were queued.
//
// Why our own queue and not a seam call to the kernel's workqueue: it is built
// from seam calls that exist (a thread, wait/wake, the SpinLock), so both
// builds behave alike and the userspace tests prove the kernel's behaviour
// (FIFO, one item at a time, drained at Stop); the kernel's work_struct would
// need mirroring through the seam with its own lifetime rules. One worker per
// owner is cheap (it sleeps while there is nothing to do), so owners do not
// share: each member of a dev::DeviceSet whose completions may not submit has
// its own for its dispatch, the set one for the allocator's table writes.
//
// Rules for a Work's fn: process context, may sleep and take Mutexes, but must
// not wait for I/O (or for a lock held across I/O): everything else queued on
// the same queue waits behind it. It may free its own Work (the worker
// never touches an item after calling it) and queue items, itself included.
//
// Thread safety: Queue() from any context, completions included; Start,
// Cancel, Stop from process context. Lifetime: a Work must stay valid while
// queued or running (Cancel makes sure it is neither); the owner stops the
// queue before anything its items touch goes away.
#ifndef TFS_PLATFORM_WORK_H_
#define TFS_PLATFORM_WORK_H_

#include "platform/atomic.h"
#include "platform/platform.h"
#include "platform/sync.h"
#include "util/counters.h"
#include "util/list.h"
#include "util/status.h"

namespace tfs {

// One deferred job, embedded in its owner: fn(arg) runs on the worker.
struct Work {
  void (*fn)(void* arg) = nullptr;
  void* arg = nullptr;

  // The queue's, under its lock.
  ListNode link;
  bool queued = false;
};

// A work queue's counters (util/counters.h), kept under its lock.
#define TFS_WORK_COUNTERS(X, A)                                                           \
  X(queued, counter, "work items queued (completions deferring what they may not do)")   \
  X(requeued, counter, "queue calls for an item already waiting (it runs once for them)") \
  X(ran, counter, "work items the worker ran")

struct WorkStats {
  TFS_COUNTER_FIELDS(TFS_WORK_COUNTERS)
};

class WorkQueue {
 public:
  WorkQueue() = default;
  ~WorkQueue() { Stop(); }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Starts the worker thread (kNoMemory, kAgain). Once.
  Status Start(const char* name);
  // Queues `w` to run once; true if it was not waiting already (a Work
  // queued twice before it runs runs once; one queued while it runs runs
  // again). Never sleeps, never allocates: completions call it. Only between
  // Start and Stop.
  bool Queue(Work* w);
  // Takes `w` off the queue if it waits there, and waits until it is not
  // running (the kernel's cancel_work_sync). Process context only.
  void Cancel(Work* w);
  // Runs everything queued, and what those items queue, then ends the
  // worker; returns when it has. Idempotent; the queue accepts nothing after.
  void Stop();

  bool started() const { return thread_.running(); }
  WorkStats Stats() const;

 private:
  enum class State : u8 { kIdle, kRunning, kStopping, kExited };
  static void Main(void* self);
  void Run();

  mutable SpinLock lock_;
  IntrusiveList<Work, &Work::link> list_ TFS_GUARDED_BY(lock_);
  Work* running_ TFS_GUARDED_BY(lock_) = nullptr;
  State state_ TFS_GUARDED_BY(lock_) = State::kIdle;
  WorkStats stats_ TFS_GUARDED_BY(lock_);
  // Wait/wake words (the CondVar protocol: announce, re-check, sleep while
  // the word is unchanged). The worker sleeps on seq_ (Queue and Stop bump
  // it); Cancel sleeps on done_seq_ (bumped after each item).
  Atomic<u32> seq_{0};
  Atomic<u32> worker_asleep_{0};
  Atomic<u32> done_seq_{0};
  Atomic<u32> cancel_waiters_{0};
  platform::Thread thread_;
};

}  // namespace tfs

#endif  // TFS_PLATFORM_WORK_H_
