// Thread rings: each thread that waits for a flight's I/O (IoRequest::kWaited,
// tfs_plat_wait_io) gets its own small io_uring, so that the kernel's
// completion work runs in the thread that waits for it anyway and nothing is
// handed to another thread and back (docs/design/copies.md, "Step 7b").
//
// - A device takes an SQE from the calling thread's ring (ThreadRingGetSqe),
//   fills it and submits it (ThreadRingSubmit) naming the function that
//   completes it. Only the ring's owner thread submits: no submission lock.
// - The owner reaps its ring while it waits (ThreadRingWait, under
//   tfs_plat_wait_io): the completion functions then run in the owner's
//   thread. They must obey the completion rules (no sleeping).
// - Any tfs_plat_wake of the word a ring waiter sleeps on reaches it: the
//   waiter registers the word, and the wake writes an eventfd the ring polls
//   (ThreadRingWake). A request of the flight sent elsewhere (a queue that
//   dispatched it later from another thread; the shared ring) still wakes it.
// - Requests left on a ring when its owner leaves the flight
//   (ThreadRingLeave: a late write copy, a hedge's loser) or exits are reaped
//   by the janitor thread ("tfs-ring-janitor") as soon as they complete
//   (unless the janitor's epoll refuses the ring: `unwatched`, logged; then
//   at the owner's next wait),
//   woken by an eventfd registered for the ring's completions: until a
//   completion is reaped its member's queue counts the request in flight,
//   and a request left unreaped would make a healthy member look slow or
//   stalled. (A completion is posted by io_uring task work of the owner
//   thread: while the ring has requests out, the owner does no inline I/O,
//   which could hold it in an uninterruptible sleep -- UringDevice sends
//   such I/O on its shared ring instead.)
// - Two consumers of a ring's completions (owner, janitor) take the ring's
//   lock to reap; the owner sleeps outside it. A thread that exits hands its
//   ring to the janitor, which closes it once nothing is left on it.
//
// Without io_uring for a thread (setup refused), ThreadRingGetSqe returns null
// and the device uses its shared ring.
#ifndef TFS_USERSPACE_PLATFORM_THREAD_RING_H_
#define TFS_USERSPACE_PLATFORM_THREAD_RING_H_

#include <liburing.h>

#include <cstdint>

#include "platform/block_device.h"
#include "util/counters.h"

namespace tfs::userspace {

// Completes `req` with the result of its SQE (cqe->res): called once, in the
// thread that reaped it (the owner in ThreadRingWait, or the janitor).
using RingDoneFn = void (*)(void* owner, IoRequest* req, int res);

// Requests one thread's ring holds at most (its CQ is twice that: never overflows).
inline constexpr unsigned kThreadRingDepth = 64;

// An SQE of the calling thread's ring for one request, or null: no ring for
// this thread (setup refused, or ThreadRingNever), kThreadRingDepth
// requests already on it, or its SQ full of SQEs failed submits left.
// Every non-null SQE must be passed to ThreadRingSubmit before the next call.
io_uring_sqe* ThreadRingGetSqe();
// Marks the calling thread as one that never waits for its own I/O (a
// device's completion thread; the janitor is one): ThreadRingGetSqe returns
// null there, so a kWaited request that reaches it by mistake (a wrapper
// that forwarded it from another thread) goes to the shared ring instead of
// a ring nobody reaps.
void ThreadRingNever();
// Sends the SQE from ThreadRingGetSqe; `done(owner, req, res)` completes it.
void ThreadRingSubmit(io_uring_sqe* sqe, RingDoneFn done, void* owner, IoRequest* req);

// tfs_plat_wait_io's work: if the calling thread has requests on its ring,
// sleeps on the ring while *word == expected (at most `timeout_ns`, ~0 =
// forever), reaps what completed and runs their completions here, sets *rc
// (0, or -ETIMEDOUT when the time ran out) and returns true. (If it cannot
// send what its SQ holds or arm its wake poll, it hands the ring to the
// janitor and does a plain wait of at most 1 ms instead: the caller comes
// back and it tries again.) False when the thread has nothing on its ring
// (the caller does a plain tfs_plat_wait).
bool ThreadRingWait(const uint32_t* word, uint32_t expected, uint64_t timeout_ns, int* rc);
// tfs_plat_io_leave's work: the calling thread waits for none of its ring's
// requests any more; those still out become the janitor's.
void ThreadRingLeave();
// True if the calling thread has requests on its ring: it must not sleep
// uninterruptibly for long (an inline syscall on a device that may stall),
// or their completions -- io_uring task work of this thread -- wait for it.
bool ThreadRingBusy();
// Completions posted on the calling thread's ring and not reaped yet (tests).
unsigned ThreadRingPosted();
// tfs_plat_wake's part: wakes the ring waiters sleeping on `word` (cheap
// when there are none: a fence and a load).
void ThreadRingWake(const uint32_t* word);

// Process-wide counters (tests, tierfs ctl's devices[].uring.thread_rings;
// util/counters.h).
#define TFS_THREAD_RING_COUNTERS(X, A)                                                       \
  X(rings, counter, "rings created (one per thread that used one)")                          \
  X(rings_refused, counter, "threads whose io_uring setup failed (shared ring used)")        \
  X(submitted, counter, "requests sent on thread rings")                                     \
  X(reaped_by_owner, counter, "completions reaped by the ring's own thread")                 \
  X(reaped_by_janitor, counter, "completions reaped by the janitor")                         \
  X(wakes, counter, "ring waiters woken through their eventfd by a wake")                    \
  X(full, counter, "GetSqe refused: the ring held kThreadRingDepth requests, or its SQ was full") \
  X(handed_over, counter, "rings of exited threads closed by the janitor")                   \
  X(unwatched, counter, "hand-overs the janitor's epoll refused (left to the owner)")         \
  X(waiting, level, "threads registered as ring waiters now")

struct ThreadRingStats {
  TFS_COUNTER_FIELDS(TFS_THREAD_RING_COUNTERS)
};
ThreadRingStats GetThreadRingStats();

}  // namespace tfs::userspace

#endif  // TFS_USERSPACE_PLATFORM_THREAD_RING_H_
