// Slow paths of the core's locks (see sync.h). Fast paths are one atomic
// instruction and live in the header. The sleeping primitives' checks
// (TFS_MAY_SLEEP) are at their entry points: a wait that would not have slept
// this time is as wrong in a completion as one that does.
//
// Every sleeper follows the same protocol to avoid lost wake-ups: announce itself
// (waiters_ or the mutex's state 2), read the sequence word, re-check its
// condition, then sleep only while the sequence word is unchanged. Every releaser
// changes the state first, then bumps the sequence word and wakes. With sequentially
// consistent ordering between the two sides, a releaser either sees the sleeper and
// wakes it, or the sleeper sees the released state and does not sleep.
#include "platform/sync.h"

namespace tfs {
namespace {

// Remaining time to `deadline` (kForever stays forever); 0 once it has passed.
u64 Remaining(u64 deadline) {
  if (deadline == platform::kForever) return platform::kForever;
  u64 now = platform::NowNs();
  return now >= deadline ? 0 : deadline - now;
}

u64 DeadlineAfter(u64 timeout_ns) {
  if (timeout_ns == platform::kForever) return platform::kForever;
  u64 now = platform::NowNs();
  return timeout_ns > platform::kForever - now ? platform::kForever : now + timeout_ns;
}

}  // namespace

void Mutex::LockSlow(u32 c) {
  // Brief optimistic spin: most critical sections in the core are short.
  for (int i = 0; i < 64 && c == 1; i++) {
    CpuRelax();
    c = 0;
    if (state_.CompareExchange(c, 1, MemOrder::kAcquire)) return;
  }
  if (c != 2) c = state_.Exchange(2, MemOrder::kAcquire);
  while (c != 0) {
    tfs_plat_wait(state_.Address(), 2, platform::kForever);
    c = state_.Exchange(2, MemOrder::kAcquire);
  }
}

void Mutex::UnlockSlow() {
  state_.Store(0, MemOrder::kRelease);
  tfs_plat_wake(state_.Address(), 1);
}

void SpinLock::LockSlow() {
  // Test-and-test-and-set: spin on a plain load (the cache line stays shared
  // while the holder works), try the exchange only when it looks free. Some
  // microseconds of relaxing, then the CPU is offered to a preempted holder.
  constexpr int kSpinsBeforeYield = 128;
  for (;;) {
    for (int i = 0; i < kSpinsBeforeYield; i++) {
      if (state_.Load(MemOrder::kRelaxed) == 0 && state_.Exchange(1, MemOrder::kAcquire) == 0) return;
      CpuRelax();
    }
    tfs_plat_spin_yield();
  }
}

bool CondVar::WaitFor(Mutex& m, u64 timeout_ns) {
  TFS_MAY_SLEEP("CondVar::Wait");
  u32 seq = seq_.Load(MemOrder::kSeqCst);
  waiters_.FetchAdd(1);
  m.Unlock();
  int rc = tfs_plat_wait(seq_.Address(), seq, timeout_ns);
  waiters_.FetchSub(1);
  m.Lock();
  return rc == 0 || seq_.Load() != seq;
}

void CondVar::Signal() {
  seq_.FetchAdd(1);
  if (waiters_.Load() != 0) tfs_plat_wake(seq_.Address(), 1);
}

void CondVar::Broadcast() {
  seq_.FetchAdd(1);
  if (waiters_.Load() != 0) tfs_plat_wake(seq_.Address(), 0);
}

bool RwLock::TryRead() {
  u32 s = state_.Load(MemOrder::kRelaxed);
  while ((s & kWriter) == 0 && writers_waiting_.Load() == 0) {
    if (state_.CompareExchange(s, s + 1, MemOrder::kAcquire)) return true;
  }
  return false;
}

bool RwLock::TryReadLock() {
  TFS_MAY_SLEEP("RwLock::TryReadLock");
  const bool got = TryRead();
  if (got) TFS_NOTE_LOCKED();
  return got;
}

void RwLock::ReadLock() {
  TFS_MAY_SLEEP("RwLock::ReadLock");
  if (TFS_UNLIKELY(!TryRead())) {
    waiters_.FetchAdd(1);
    for (;;) {
      u32 seq = seq_.Load();
      if (TryRead()) break;
      tfs_plat_wait(seq_.Address(), seq, platform::kForever);
    }
    waiters_.FetchSub(1);
  }
  TFS_NOTE_LOCKED();
}

void RwLock::ReadUnlock() {
  TFS_NOTE_UNLOCKED();
  u32 prev = state_.FetchSub(1, MemOrder::kRelease);
  TFS_BUG_ON((prev & ~kWriter) == 0);
  if (prev == 1) WakeWaiters();  // last reader out: a writer may be waiting
}

bool RwLock::TryWrite() {
  u32 expected = 0;
  return state_.CompareExchange(expected, kWriter, MemOrder::kAcquire);
}

bool RwLock::TryWriteLock() {
  TFS_MAY_SLEEP("RwLock::TryWriteLock");
  const bool got = TryWrite();
  if (got) TFS_NOTE_LOCKED();
  return got;
}

void RwLock::WriteLock() {
  TFS_MAY_SLEEP("RwLock::WriteLock");
  if (TFS_UNLIKELY(!TryWrite())) {
    writers_waiting_.FetchAdd(1);
    waiters_.FetchAdd(1);
    for (;;) {
      u32 seq = seq_.Load();
      if (TryWrite()) break;
      tfs_plat_wait(seq_.Address(), seq, platform::kForever);
    }
    waiters_.FetchSub(1);
    // Readers held back by this writer re-check once it is gone (WriteUnlock wakes).
    writers_waiting_.FetchSub(1);
  }
  TFS_NOTE_LOCKED();
}

void RwLock::WriteUnlock() {
  TFS_NOTE_UNLOCKED();
  TFS_BUG_ON(state_.Load(MemOrder::kRelaxed) != kWriter);
  state_.Store(0, MemOrder::kRelease);
  WakeWaiters();
}

void RwLock::WakeWaiters() {
  seq_.FetchAdd(1);
  if (waiters_.Load() != 0) tfs_plat_wake(seq_.Address(), 0);
}

bool Latch::WaitFor(u64 timeout_ns) {
  TFS_MAY_SLEEP("Latch::Wait");
  u64 deadline = DeadlineAfter(timeout_ns);
  for (;;) {
    u32 c = count_.Load(MemOrder::kAcquire);
    if ((c & ~kSleeper) == 0) return true;
    u64 left = Remaining(deadline);
    if (left == 0) return false;
    // Announce the sleep first; a CountDown to zero in between fails the exchange.
    if (!(c & kSleeper) && !count_.CompareExchange(c, c | kSleeper, MemOrder::kAcqRel)) continue;
    tfs_plat_wait(count_.Address(), c | kSleeper, left);
  }
}

}  // namespace tfs
