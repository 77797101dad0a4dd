// Thread rings (see thread_ring.h for the contract).
//
// A ring's state is guarded by its lock `mu`, except its submission side
// (only the owner submits) and the registry links (the bucket's lock). The
// owner sets `owner_waiting` while it sleeps on the ring; the janitor reaps a
// ring only while it is in the janitor's epoll set (`in_janitor`), and only
// when the owner is not waiting on it. Only the janitor frees a ring (after
// its owner exited and nothing is left on it): an epoll event it already took
// for a ring never names freed memory.
#include "userspace/platform/thread_ring.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "platform/platform.h"

namespace tfs::userspace {
namespace {

// user_data of the poll on wake_fd (not ~0: liburing's own timeout tag)
constexpr uint64_t kWakeTag = ~uint64_t(0) - 1;

// The rings' eventfds are nonblocking: a read empties the count (or finds
// none), a write adds one.
void DrainEventfd(int fd) {
  uint64_t v;
  (void)!read(fd, &v, sizeof v);
}
void SignalEventfd(int fd) {
  uint64_t one = 1;
  (void)!write(fd, &one, sizeof one);
}

struct Slot {
  RingDoneFn done = nullptr;
  void* owner = nullptr;
  IoRequest* req = nullptr;
  int next_free = -1;
};

struct Ring {
  io_uring ring{};
  int wake_fd = -1;  // written by ThreadRingWake, polled by the ring (kWakeTag)
  int cq_fd = -1;    // registered with the ring: signalled per completion (janitor)
  std::mutex mu;
  Slot slots[kThreadRingDepth];
  int free_head = 0;
  std::atomic<unsigned> out{0};  // requests submitted and not reaped (changed under mu)
  bool owner_waiting = false;  // the owner sleeps on the ring or reaps it
  bool in_janitor = false;     // cq_fd is in the janitor's epoll set
  bool poll_armed = false;     // a poll on wake_fd is in the ring
  bool orphaned = false;       // the owner exited
  int pending_slot = -1;       // between GetSqe and Submit (owner only)
  // Registry links (the bucket's lock).
  const uint32_t* waiting_word = nullptr;
  Ring* bucket_next = nullptr;
  // All rings (g_all_mu): reachable for leak checkers while the kernel holds them.
  Ring* all_prev = nullptr;
  Ring* all_next = nullptr;
};

struct LiveStats {
  TFS_COUNTER_ATOMICS(TFS_THREAD_RING_COUNTERS)
};
LiveStats g_stats;

std::mutex g_all_mu;
Ring* g_all = nullptr;

// --- the registry of ring waiters, by word ---------------------------------
struct alignas(64) Bucket {
  std::atomic<uint32_t> n{0};  // ring waiters registered here
  std::mutex mu;
  Ring* head = nullptr;
};
constexpr unsigned kBuckets = 64;
Bucket g_buckets[kBuckets];

Bucket& BucketOf(const uint32_t* word) {
  return g_buckets[(uintptr_t(word) * 0x9E3779B97F4A7C15ull) >> 58];
}

void Register(Ring* r, const uint32_t* word) {
  Bucket& b = BucketOf(word);
  {
    std::lock_guard<std::mutex> lock(b.mu);
    r->waiting_word = word;
    r->bucket_next = b.head;
    b.head = r;
    b.n.fetch_add(1, std::memory_order_seq_cst);
  }
  // Pairs with ThreadRingWake's fence: either the waker sees this entry, or
  // the caller's next load of the word sees the waker's store.
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void Deregister(Ring* r) {
  Bucket& b = BucketOf(r->waiting_word);
  std::lock_guard<std::mutex> lock(b.mu);
  for (Ring** p = &b.head; *p != nullptr; p = &(*p)->bucket_next) {
    if (*p == r) {
      *p = r->bucket_next;
      break;
    }
  }
  r->bucket_next = nullptr;
  r->waiting_word = nullptr;
  b.n.fetch_sub(1, std::memory_order_relaxed);
}

// --- the janitor -------------------------------------------------------------
struct Janitor {
  int epfd = -1;
};
Janitor* g_janitor = nullptr;  // never freed: rings may be handed over until exit
std::once_flag g_janitor_once;

void JanitorLoop(Janitor* j);

bool StartJanitor() {
  std::call_once(g_janitor_once, [] {
    auto* j = new Janitor();
    j->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (j->epfd < 0) {
      platform::Log(platform::LogLevel::kWarn, "thread rings: epoll_create1: %s (flights use the shared rings)",
                    strerror(errno));
      delete j;
      return;
    }
    std::thread t([j] {
      pthread_setname_np(pthread_self(), "tfs-ring-janitor");
      ThreadRingNever();
      JanitorLoop(j);
    });
    t.detach();
    g_janitor = j;
  });
  return g_janitor != nullptr;
}

// Caller holds r->mu.
void JanitorWatch(Ring* r, bool on) {
  if (r->in_janitor == on) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = r;
  int rc = epoll_ctl(g_janitor->epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, r->cq_fd, &ev);
  if (rc != 0 && on) {
    // ENOMEM, or ENOSPC (fs.epoll.max_user_watches): not a crash. The ring
    // stays its owner's -- its next wait reaps it -- and says so, since
    // its leftovers now wait for that (g_stats.unwatched).
    Bump(g_stats.unwatched);
    platform::Log(platform::LogLevel::kWarn,
                  "thread ring: epoll_ctl: %s (its leftovers are reaped at its thread's next wait)", strerror(errno));
    return;
  }
  TFS_BUG_ON(rc != 0);  // (DEL of a watched eventfd: cannot fail)
  r->in_janitor = on;
}

// Hands `r` (requests out, its owner not waiting) to the janitor: its
// completion eventfd emptied of the counts of completions the owner reaped
// itself, then re-signalled if a completion is already posted and not yet
// reaped (its signal went with the emptying). Caller holds r->mu.
void HandToJanitor(Ring* r) {
  DrainEventfd(r->cq_fd);
  JanitorWatch(r, true);
  if (io_uring_cq_ready(&r->ring) != 0) SignalEventfd(r->cq_fd);
}

// Puts slot `i` back on the free list: its request is no longer on the ring.
// Caller holds r->mu.
void FreeSlot(Ring* r, int i) {
  r->slots[i] = Slot{};
  r->slots[i].next_free = r->free_head;
  r->free_head = i;
  r->out--;
}

// Takes what completed off `r` (caller holds r->mu) into `out`; returns how many.
struct Reaped {
  Slot slot;
  int res;
};
unsigned TakeCompletions(Ring* r, Reaped* out) {
  unsigned n = 0;
  unsigned seen = 0;
  unsigned head;
  io_uring_cqe* cqe;
  io_uring_for_each_cqe(&r->ring, head, cqe) {
    seen++;
    uint64_t tag = io_uring_cqe_get_data64(cqe);
    if (tag == kWakeTag) {
      DrainEventfd(r->wake_fd);
      r->poll_armed = false;
      continue;
    }
    TFS_BUG_ON(tag >= kThreadRingDepth);
    out[n].slot = r->slots[tag];
    out[n].res = cqe->res;
    n++;
    FreeSlot(r, int(tag));
  }
  io_uring_cq_advance(&r->ring, seen);
  return n;
}

void RunCompletions(const Reaped* done, unsigned n) {
  for (unsigned i = 0; i < n; i++) done[i].slot.done(done[i].slot.owner, done[i].slot.req, done[i].res);
}

void FreeRing(Ring* r) {
  {
    std::lock_guard<std::mutex> lock(g_all_mu);
    if (r->all_prev != nullptr) r->all_prev->all_next = r->all_next;
    else g_all = r->all_next;
    if (r->all_next != nullptr) r->all_next->all_prev = r->all_prev;
  }
  io_uring_queue_exit(&r->ring);  // (cancels the poll on wake_fd)
  close(r->wake_fd);
  close(r->cq_fd);
  delete r;
}

void JanitorLoop(Janitor* j) {
  Reaped done[kThreadRingDepth];
  for (;;) {
    epoll_event evs[16];
    int n = epoll_wait(j->epfd, evs, 16, -1);
    if (n < 0) {
      TFS_BUG_ON(errno != EINTR);
      continue;
    }
    for (int i = 0; i < n; i++) {
      auto* r = static_cast<Ring*>(evs[i].data.ptr);
      DrainEventfd(r->cq_fd);
      unsigned got = 0;
      bool free_it = false;
      {
        std::lock_guard<std::mutex> lock(r->mu);
        if (r->owner_waiting || !r->in_janitor) continue;  // the owner reaps it now
        got = TakeCompletions(r, done);
        if (r->out == 0) {
          JanitorWatch(r, false);
          free_it = r->orphaned;
        }
      }
      Bump(g_stats.reaped_by_janitor, got);
      RunCompletions(done, got);
      if (free_it) {
        Bump(g_stats.handed_over);
        FreeRing(r);
      }
    }
  }
}

// --- the calling thread's ring ------------------------------------------------
Ring* NewRing() {
  if (!StartJanitor()) return nullptr;
  auto* r = new Ring();
  io_uring_params p{};
  p.flags = IORING_SETUP_CQSIZE;
  p.cq_entries = 2 * kThreadRingDepth;
  int rc = io_uring_queue_init_params(kThreadRingDepth, &r->ring, &p);
  if (rc == 0 && !(p.features & IORING_FEAT_EXT_ARG)) {
    // (Before 5.11 a timed wait is a timeout SQE of liburing's own, whose
    // completion would land among the slots': no thread rings there.)
    io_uring_queue_exit(&r->ring);
    rc = -EOPNOTSUPP;
  }
  if (rc < 0) {
    platform::Log(platform::LogLevel::kWarn, "thread ring: io_uring setup: %s (this thread's flights use the shared rings)",
                  strerror(-rc));
    delete r;
    return nullptr;
  }
  r->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  r->cq_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (r->wake_fd < 0 || r->cq_fd < 0 || io_uring_register_eventfd(&r->ring, r->cq_fd) < 0) {
    platform::Log(platform::LogLevel::kWarn, "thread ring: eventfd: %s (this thread's flights use the shared rings)",
                  strerror(errno));
    io_uring_queue_exit(&r->ring);
    if (r->wake_fd >= 0) close(r->wake_fd);
    if (r->cq_fd >= 0) close(r->cq_fd);
    delete r;
    return nullptr;
  }
  for (unsigned i = 0; i < kThreadRingDepth; i++) r->slots[i].next_free = i + 1 < kThreadRingDepth ? int(i + 1) : -1;
  r->free_head = 0;
  std::lock_guard<std::mutex> lock(g_all_mu);
  r->all_next = g_all;
  if (g_all != nullptr) g_all->all_prev = r;
  g_all = r;
  return r;
}

// The calling thread's ring: made on first use, handed to the janitor when
// the thread exits.
struct ThreadRingHolder {
  Ring* ring = nullptr;
  bool tried = false;
  ~ThreadRingHolder() {
    if (ring == nullptr) return;
    // Always the janitor's to free (it may hold an epoll event for it).
    Ring* r = ring;
    ring = nullptr;  // (a later thread-local destructor doing I/O gets no ring)
    tried = true;
    {
      std::lock_guard<std::mutex> lock(r->mu);
      r->orphaned = true;
      JanitorWatch(r, true);
      if (r->in_janitor) {
        SignalEventfd(r->cq_fd);  // (under the lock: the janitor frees it after)
        return;
      }
    }
    // The janitor's epoll refused it (logged): this thread reaps what is
    // left before it goes, and the ring, empty, is left allocated (only the
    // janitor frees rings).
    Reaped done[kThreadRingDepth];
    while (r->out.load() != 0) {
      (void)io_uring_submit_and_wait(&r->ring, 1);  // (sends what a failed submit left)
      unsigned got;
      {
        std::lock_guard<std::mutex> lock(r->mu);
        got = TakeCompletions(r, done);
      }
      RunCompletions(done, got);
    }
  }
};
thread_local ThreadRingHolder tl_ring;

Ring* MyRing(bool create) {
  if (tl_ring.ring == nullptr && create && !tl_ring.tried) {
    tl_ring.tried = true;
    tl_ring.ring = NewRing();
    Bump(tl_ring.ring != nullptr ? g_stats.rings : g_stats.rings_refused);
  }
  return tl_ring.ring;
}

}  // namespace

void ThreadRingNever() { tl_ring.tried = true; }

io_uring_sqe* ThreadRingGetSqe() {
  Ring* r = MyRing(true);
  if (r == nullptr) return nullptr;
  TFS_BUG_ON(r->pending_slot >= 0);
  {
    std::lock_guard<std::mutex> lock(r->mu);
    if (r->free_head < 0) {
      Bump(g_stats.full);
      return nullptr;
    }
    r->pending_slot = r->free_head;
    r->free_head = r->slots[r->pending_slot].next_free;
    r->out++;
  }
  io_uring_sqe* sqe = io_uring_get_sqe(&r->ring);
  if (sqe == nullptr) {
    // Every SQE is sent at once, so the SQ (kThreadRingDepth) fills only
    // after failed submits: the shared ring then.
    std::lock_guard<std::mutex> lock(r->mu);
    FreeSlot(r, r->pending_slot);
    r->pending_slot = -1;
    Bump(g_stats.full);
  }
  return sqe;
}

void ThreadRingSubmit(io_uring_sqe* sqe, RingDoneFn done, void* owner, IoRequest* req) {
  Ring* r = tl_ring.ring;
  TFS_BUG_ON(r == nullptr || r->pending_slot < 0);
  const int s = r->pending_slot;
  r->pending_slot = -1;
  // (Not under the lock: the slot is reserved, and no reaper reads it before
  // its completion, which the submit below orders after these stores.)
  r->slots[s].done = done;
  r->slots[s].owner = owner;
  r->slots[s].req = req;
  io_uring_sqe_set_data64(sqe, uint64_t(s));
  int rc;
  int tries = 0;
  do {
    rc = io_uring_submit(&r->ring);
  } while ((rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) && ++tries < 100);
  // A failure leaves the SQE in the ring; the owner's next wait sends it
  // before it sleeps (or falls back to short plain waits until it can).
  if (rc < 0) platform::Log(platform::LogLevel::kWarn, "thread ring: io_uring_submit: %s", strerror(-rc));
  Bump(g_stats.submitted);
}

bool ThreadRingWait(const uint32_t* word, uint32_t expected, uint64_t timeout_ns, int* rc) {
  Ring* r = MyRing(false);
  if (r == nullptr) return false;
  bool arm = false;
  {
    std::lock_guard<std::mutex> lock(r->mu);
    if (r->out == 0) return false;
    r->owner_waiting = true;
    JanitorWatch(r, false);
    arm = !r->poll_armed;
    r->poll_armed = true;
  }
  // poll_armed: the poll is in the ring, or prepared in its SQ (sent by the
  // submit below, or failing that by a later one, before any ring sleep).
  bool sent = true;
  bool no_poll = false;
  if (arm) {
    io_uring_sqe* sqe = io_uring_get_sqe(&r->ring);
    if (sqe != nullptr) {
      io_uring_prep_poll_add(sqe, r->wake_fd, POLLIN);
      io_uring_sqe_set_data64(sqe, kWakeTag);
    }
    no_poll = sqe == nullptr;
    sent = !no_poll;
  }
  // The poll, and any SQE a failed submit left (the wait below sends
  // nothing). On its own: an enter that submits returns the count it sent,
  // not the wait's timeout. The poll is armed once; again after each wake.
  if (sent && io_uring_sq_ready(&r->ring) > 0) {
    int s;
    do {
      s = io_uring_submit(&r->ring);
    } while (s == -EINTR || s == -EAGAIN);
    sent = s >= 0;
  }
  if (!sent) {
    // Without the wake poll a wake from elsewhere would not reach a ring
    // wait: a plain one, the janitor reaping the ring meanwhile -- and short
    // (1 ms), so that the caller comes back and the submit of what the SQ
    // still holds (maybe this flight's own copies) is tried again.
    {
      std::lock_guard<std::mutex> lock(r->mu);
      if (no_poll) r->poll_armed = false;
      r->owner_waiting = false;
      HandToJanitor(r);
    }
    const uint64_t kRetryNs = 1000000;
    const int w = tfs_plat_wait(word, expected, timeout_ns < kRetryNs ? timeout_ns : kRetryNs);
    *rc = w == -ETIMEDOUT && timeout_ns <= kRetryNs ? -ETIMEDOUT : 0;
    return true;
  }
  Register(r, word);
  *rc = 0;
  if (__atomic_load_n(word, __ATOMIC_SEQ_CST) == expected) {
    __kernel_timespec ts;
    __kernel_timespec* tsp = nullptr;
    if (timeout_ns != ~uint64_t(0)) {
      ts.tv_sec = int64_t(timeout_ns / 1000000000ull);
      ts.tv_nsec = int64_t(timeout_ns % 1000000000ull);
      tsp = &ts;
    }
    io_uring_cqe* cqe = nullptr;
    int w = tsp != nullptr ? io_uring_wait_cqe_timeout(&r->ring, &cqe, tsp) : io_uring_wait_cqe(&r->ring, &cqe);
    if (w == -ETIME) *rc = -ETIMEDOUT;
  }
  Deregister(r);
  Reaped done[kThreadRingDepth];
  unsigned got;
  {
    std::lock_guard<std::mutex> lock(r->mu);
    got = TakeCompletions(r, done);
    // (Not the janitor's yet: the flight waits again, or leaves with
    // ThreadRingLeave.)
    r->owner_waiting = false;
  }
  Bump(g_stats.reaped_by_owner, got);
  RunCompletions(done, got);
  return true;
}

void ThreadRingLeave() {
  Ring* r = tl_ring.ring;
  if (r == nullptr || r->out.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(r->mu);
  if (r->out == 0 || r->in_janitor) return;
  HandToJanitor(r);
}

unsigned ThreadRingPosted() {
  Ring* r = tl_ring.ring;
  if (r == nullptr) return 0;
  std::lock_guard<std::mutex> lock(r->mu);
  return io_uring_cq_ready(&r->ring);
}

bool ThreadRingBusy() {
  Ring* r = tl_ring.ring;
  return r != nullptr && r->out.load(std::memory_order_relaxed) != 0;
}

void ThreadRingWake(const uint32_t* word) {
  // Pairs with Register's fence (the waker stored to the word before this call).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  Bucket& b = BucketOf(word);
  if (b.n.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(b.mu);
  for (Ring* r = b.head; r != nullptr; r = r->bucket_next) {
    if (r->waiting_word != word) continue;
    SignalEventfd(r->wake_fd);
    Bump(g_stats.wakes);
  }
}

ThreadRingStats GetThreadRingStats() {
  ThreadRingStats s;
  TFS_COUNTER_LOAD(TFS_THREAD_RING_COUNTERS, g_stats, s);
  for (Bucket& b : g_buckets) s.waiting += b.n.load(std::memory_order_relaxed);
  return s;
}

}  // namespace tfs::userspace
