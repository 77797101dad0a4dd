// Locks and wait/wake for the core, built on two seam calls (tfs_plat_wait and
// tfs_plat_wake: a futex in userspace, wait_var_event/wake_up_var in the kernel).
//
// Building the primitives here, once, instead of wrapping pthreads and kernel
// mutexes separately gives both builds identical semantics and keeps the seam
// small. All types are constant-initializable (no static constructors) and none is
// recursive. None of them may be held across device I/O when it protects a btree
// node: the btree drops its locks, does the I/O, and retries.
//
// Two kinds of lock. Mutex, RwLock, CondVar and Latch sleep: never in a
// completion (which may run in interrupt context in the kernel) nor under a
// SpinLock. SpinLock never sleeps: it is what a completion may take, held for a
// few instructions with local interrupts off. Checked builds (TFS_LOCK_CHECKS,
// platform.h) catch a sleeping primitive used where it may not sleep: every
// Mutex/RwLock acquisition and every CondVar/Latch wait asks.
//
// Thread safety: every method is safe to call from any thread. Lifetime: a lock must
// outlive all its users; destroying a held lock is a bug.
#ifndef TFS_PLATFORM_SYNC_H_
#define TFS_PLATFORM_SYNC_H_

#include "platform/atomic.h"
#include "platform/platform.h"

namespace tfs {

// A sleeping mutex (0 = free, 1 = held, 2 = held with possible waiters).
class TFS_CAPABILITY("mutex") Mutex {
 public:
  constexpr Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  // The check is here, not in LockSlow: an uncontended Lock in a completion
  // is as wrong as a contended one, it only fails less often. Release builds
  // compile it out (the fast path stays one CAS).
  void Lock() TFS_ACQUIRE() {
    TFS_MAY_SLEEP("Mutex::Lock");
    u32 c = 0;
    if (TFS_UNLIKELY(!state_.CompareExchange(c, 1, MemOrder::kAcquire))) LockSlow(c);
    TFS_NOTE_LOCKED();
  }
  // (Not in a completion either: the kernel's mutex_trylock is not for
  // interrupt context.)
  bool TryLock() TFS_TRY_ACQUIRE(true) {
    TFS_MAY_SLEEP("Mutex::TryLock");
    u32 c = 0;
    const bool got = state_.CompareExchange(c, 1, MemOrder::kAcquire);
    if (got) TFS_NOTE_LOCKED();
    return got;
  }
  void Unlock() TFS_RELEASE() {
    TFS_NOTE_UNLOCKED();
    if (TFS_UNLIKELY(state_.FetchSub(1, MemOrder::kRelease) != 1)) UnlockSlow();
  }
  bool held() const { return state_.Load(MemOrder::kRelaxed) != 0; }

 private:
  void LockSlow(u32 c);
  void UnlockSlow();
  Atomic<u32> state_{0};
};

// The guards also hold a NoFsScope (platform.h) for as long as they hold
// their lock: what is allocated under a core lock never recurses into
// filesystem reclaim.
class MutexLock {
 public:
  explicit MutexLock(Mutex& m) TFS_ACQUIRE(m) : m_(m) { m_.Lock(); }
  ~MutexLock() TFS_RELEASE() { m_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& m_;
  platform::NoFsScope nofs_;
};

// A lock that never sleeps, for what a completion shares with the rest of the
// core (dev::IoQueue's queues and counters, WorkQueue's list). Lock() turns
// local interrupts off (tfs_plat_irq_save: the kernel's local_irq_save;
// nothing in userspace) before it takes the lock, so that a completion in
// interrupt context on this CPU cannot spin on it forever, and returns the
// state Unlock() puts back -- use SpinGuard. A spinner relaxes the CPU, and
// after a while yields it (tfs_plat_spin_yield): in userspace a holder can be
// preempted. So: critical sections of a few dozen instructions and bounded
// copies; under a SpinLock nothing may sleep, allocate, take another lock
// that a completion takes, or call into a BlockDevice. Not recursive.
class TFS_CAPABILITY("spinlock") SpinLock {
 public:
  constexpr SpinLock() = default;
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  [[nodiscard]] u64 Lock() TFS_ACQUIRE() {
    const u64 irq = tfs_plat_irq_save();
    if (TFS_UNLIKELY(state_.Exchange(1, MemOrder::kAcquire) != 0)) LockSlow();
#if TFS_LOCK_CHECKS
    platform::NoSleepEnter();
#endif
    return irq;
  }
  void Unlock(u64 irq) TFS_RELEASE() {
#if TFS_LOCK_CHECKS
    platform::NoSleepLeave();
#endif
    state_.Store(0, MemOrder::kRelease);
    tfs_plat_irq_restore(irq);
  }
  bool held() const { return state_.Load(MemOrder::kRelaxed) != 0; }

 private:
  void LockSlow();
  Atomic<u32> state_{0};  // 0 free, 1 held
};

class TFS_SCOPED_CAPABILITY SpinGuard {
 public:
  explicit SpinGuard(SpinLock& l) TFS_ACQUIRE(l) : l_(l), irq_(l.Lock()) {}
  ~SpinGuard() TFS_RELEASE() { l_.Unlock(irq_); }
  SpinGuard(const SpinGuard&) = delete;
  SpinGuard& operator=(const SpinGuard&) = delete;

 private:
  SpinLock& l_;
  const u64 irq_;
};

// Condition variable for Mutex. Wait may return spuriously: loop on the predicate.
class CondVar {
 public:
  constexpr CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex& m) TFS_REQUIRES(m) { (void)WaitFor(m, platform::kForever); }
  // Returns false if `timeout_ns` passed without a signal.
  bool WaitFor(Mutex& m, u64 timeout_ns) TFS_REQUIRES(m);
  void Signal();
  void Broadcast();

 private:
  Atomic<u32> seq_{0};
  Atomic<u32> waiters_{0};
};

// Reader-writer lock, writer-preferring (a waiting writer blocks new readers), not
// recursive: a thread must not take a read lock it already holds while a writer
// may be waiting.
class TFS_CAPABILITY("rwlock") RwLock {
 public:
  constexpr RwLock() = default;
  RwLock(const RwLock&) = delete;
  RwLock& operator=(const RwLock&) = delete;

  void ReadLock() TFS_ACQUIRE_SHARED();
  bool TryReadLock() TFS_TRY_ACQUIRE(true);
  void ReadUnlock() TFS_RELEASE_SHARED();
  void WriteLock() TFS_ACQUIRE();
  bool TryWriteLock() TFS_TRY_ACQUIRE(true);
  void WriteUnlock() TFS_RELEASE();

 private:
  static constexpr u32 kWriter = 1u << 31;
  bool TryRead();
  bool TryWrite();
  void WakeWaiters();

  Atomic<u32> state_{0};            // kWriter | reader count
  Atomic<u32> writers_waiting_{0};  // blocks new readers while nonzero
  Atomic<u32> waiters_{0};          // threads asleep on seq_
  Atomic<u32> seq_{0};              // bumped on every release that may unblock
};

class ReadGuard {
 public:
  explicit ReadGuard(RwLock& l) TFS_ACQUIRE_SHARED(l) : l_(l) { l_.ReadLock(); }
  ~ReadGuard() TFS_RELEASE() { l_.ReadUnlock(); }
  ReadGuard(const ReadGuard&) = delete;
  ReadGuard& operator=(const ReadGuard&) = delete;

 private:
  RwLock& l_;
  platform::NoFsScope nofs_;
};

class WriteGuard {
 public:
  explicit WriteGuard(RwLock& l) TFS_ACQUIRE(l) : l_(l) { l_.WriteLock(); }
  ~WriteGuard() TFS_RELEASE() { l_.WriteUnlock(); }
  WriteGuard(const WriteGuard&) = delete;
  WriteGuard& operator=(const WriteGuard&) = delete;

 private:
  RwLock& l_;
  platform::NoFsScope nofs_;
};

// A countdown latch: Wait() returns once CountDown() has been called `count` times.
// Used to wait for a batch of asynchronous completions.
class Latch {
 public:
  constexpr explicit Latch(u32 count = 1) : count_(count) {}
  Latch(const Latch&) = delete;
  Latch& operator=(const Latch&) = delete;

  // Wakes only a waiter that sleeps: a latch that reaches zero before anyone
  // waits (an inline I/O done inside Submit) costs no wake-up call.
  // May run in a completion (a wake, never a sleep); Wait may not.
  void CountDown() {
    if (count_.FetchSub(1, MemOrder::kAcqRel) == (kSleeper | 1)) tfs_plat_wake(count_.Address(), 0);
  }
  void Wait() { (void)WaitFor(platform::kForever); }
  // Returns false on timeout.
  bool WaitFor(u64 timeout_ns);
  bool done() const { return (count_.Load(MemOrder::kAcquire) & ~kSleeper) == 0; }

 private:
  static constexpr u32 kSleeper = 1u << 31;  // set by a waiter before it sleeps
  Atomic<u32> count_;  // the count (below kSleeper), | kSleeper
};

}  // namespace tfs

#endif  // TFS_PLATFORM_SYNC_H_
