// Userspace implementation of the platform seam (fs/platform/platform.h):
// malloc and the huge-page arena, futex, clock_gettime(CLOCK_MONOTONIC), pthreads,
// sched_yield for spinners (no interrupts to mask), stderr logging, getrandom.
// crc32c and zstd live in their own files.
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "platform/platform.h"
#include "userspace/platform/huge_arena.h"
#include "userspace/platform/log.h"
#include "userspace/platform/thread_ring.h"

namespace tfs {
namespace {
int g_log_copy_fd = -1;  // SetLogCopy (atomic: lines come from any thread)
}  // namespace

void userspace::SetLogCopy(int fd) { __atomic_store_n(&g_log_copy_fd, fd, __ATOMIC_RELEASE); }
int userspace::LogCopy() { return __atomic_load_n(&g_log_copy_fd, __ATOMIC_ACQUIRE); }
}  // namespace tfs

extern "C" {

// Blocks of 4 KiB and more (node buffers, search indexes, I/O buffers) come from
// the huge-page arena (huge_arena.h); smaller ones, and everything when the arena
// is off or out of address space, from malloc.
void* tfs_plat_alloc(usize size, usize align, u32 flags) {
  if (align == 0 || (align & (align - 1)) != 0 || align > 4096) return nullptr;
  if (align < sizeof(void*)) align = sizeof(void*);
  void* p = nullptr;
  if (size >= tfs::userspace::kHugeArenaMinSize && tfs::userspace::HugeArenaEnabled()) {
    p = tfs::userspace::HugeArenaAlloc(size, align, (flags & TFS_ALLOC_ZERO) != 0);
    if (p != nullptr) return p;
  }
  if (posix_memalign(&p, align, size == 0 ? 1 : size) != 0) return nullptr;
  if (flags & TFS_ALLOC_ZERO) memset(p, 0, size);
  return p;
}

// The arena recognizes its own pointers (whether or not it is on now); anything
// else is malloc's.
void tfs_plat_free(void* ptr) {
  if (!tfs::userspace::HugeArenaFree(ptr)) free(ptr);
}

static struct timespec ToTimespec(u64 ns) {
  struct timespec ts;
  ts.tv_sec = time_t(ns / 1000000000ull);
  ts.tv_nsec = long(ns % 1000000000ull);
  return ts;
}

int tfs_plat_wait(const u32* word, u32 expected, u64 timeout_ns) {
  struct timespec ts;
  struct timespec* tsp = nullptr;
  if (timeout_ns != ~u64(0)) {
    ts = ToTimespec(timeout_ns);
    tsp = &ts;
  }
  // Private futex: every waiter and waker is in this process.
  long rc = syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, tsp, nullptr, 0);
  if (rc == -1 && errno == ETIMEDOUT) return -ETIMEDOUT;
  return 0;  // woken, value already changed (EAGAIN) or interrupted (EINTR)
}

int tfs_plat_wait_io(const u32* word, u32 expected, u64 timeout_ns) {
  int rc = 0;
  if (tfs::userspace::ThreadRingWait(word, expected, timeout_ns, &rc)) return rc;
  return tfs_plat_wait(word, expected, timeout_ns);
}

void tfs_plat_io_leave(void) { tfs::userspace::ThreadRingLeave(); }

void tfs_plat_wake(const u32* word, int count) {
  syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, count <= 0 ? INT32_MAX : count, nullptr,
          nullptr, 0);
  // A thread waiting in tfs_plat_wait_io may sleep on its ring, not the futex.
  tfs::userspace::ThreadRingWake(word);
}

u64 tfs_plat_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return u64(ts.tv_sec) * 1000000000ull + u64(ts.tv_nsec);
}

i64 tfs_plat_realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return i64(ts.tv_sec) * 1000000000ll + i64(ts.tv_nsec);
}

u64 tfs_plat_memory_bytes(void) {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? u64(pages) * u64(page) : 0;
}

// Userspace reclaim never calls into the process: the scope is only recorded,
// for platform::InNoFs and the checks.
static thread_local u32 nofs_scope = 0;

u32 tfs_plat_nofs_save(void) {
  const u32 old = nofs_scope;
  nofs_scope = 1;
  return old;
}

void tfs_plat_nofs_restore(u32 token) { nofs_scope = token; }

int tfs_plat_nofs_active(void) { return nofs_scope != 0 ? 1 : 0; }

u32* tfs_plat_thread_word(void) {
  static thread_local u32 words[TFS_THREAD_WORDS] = {};
  return words;
}

// No interrupts in userspace: a completion runs on an ordinary thread.
u64 tfs_plat_irq_save(void) { return 0; }
void tfs_plat_irq_restore(u64) {}

// A SpinLock's holder may have been preempted (more threads than cores):
// give it the CPU instead of spinning through the rest of the timeslice.
void tfs_plat_spin_yield(void) { sched_yield(); }

void tfs_plat_sleep_ns(u64 ns) {
  struct timespec ts = ToTimespec(ns);
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

struct tfs_plat_thread {
  pthread_t thread;
  void (*fn)(void*);
  void* arg;
  char name[16];  // pthread names are at most 15 characters
};

static void* ThreadMain(void* p) {
  auto* t = static_cast<tfs_plat_thread*>(p);
  pthread_setname_np(pthread_self(), t->name);
  t->fn(t->arg);
  return nullptr;
}

int tfs_plat_thread_start(struct tfs_plat_thread** out, void (*fn)(void*), void* arg,
                          const char* name) {
  auto* t = static_cast<tfs_plat_thread*>(calloc(1, sizeof(tfs_plat_thread)));
  if (t == nullptr) return -ENOMEM;
  t->fn = fn;
  t->arg = arg;
  snprintf(t->name, sizeof(t->name), "%s", name != nullptr ? name : "tierfs");
  int rc = pthread_create(&t->thread, nullptr, ThreadMain, t);
  if (rc != 0) {
    free(t);
    return -rc;
  }
  *out = t;
  return 0;
}

void tfs_plat_thread_join(struct tfs_plat_thread* thread) {
  pthread_join(thread->thread, nullptr);
  free(thread);
}

void tfs_plat_log(int level, const char* line) {
  static const char* const kLevels[] = {"debug", "info", "warn", "error", "fatal"};
  const char* name = level >= 0 && level < 5 ? kLevels[level] : "log";
  // One write per line so concurrent lines do not interleave.
  char buf[640];
  int n = snprintf(buf, sizeof(buf), "tierfs %s: %s\n", name, line);
  if (n < 0) return;
  if (usize(n) >= sizeof(buf)) n = int(sizeof(buf) - 1);
  ssize_t unused = write(STDERR_FILENO, buf, usize(n));
  const int copy = __atomic_load_n(&tfs::g_log_copy_fd, __ATOMIC_ACQUIRE);
  if (copy >= 0 && copy != STDERR_FILENO) unused = write(copy, buf, usize(n));
  (void)unused;
}

int tfs_plat_vsnprintf(char* buf, usize size, const char* fmt, __builtin_va_list ap) {
  return vsnprintf(buf, size, fmt, ap);
}

void tfs_plat_random_bytes(void* buf, usize len) {
  auto* p = static_cast<u8*>(buf);
  while (len > 0) {
    ssize_t n = getrandom(p, len, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      abort();  // getrandom cannot fail on Linux >= 3.17 with valid arguments
    }
    p += n;
    len -= usize(n);
  }
}

}  // extern "C"
