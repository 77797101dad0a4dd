// The platform seam: every OS service the core uses, and nothing else.
//
// The core (fs/) is kernel-safe C++ and must build unchanged as a userspace
// library and inside a Linux kernel module. Everything that touches the OS goes
// through the C functions below (plus the BlockDevice interface in
// platform/block_device.h). They have C linkage with a `tfs_plat_` prefix so the
// kernel side can implement them in plain C against kernel headers, and so the
// kernel-safe check can tell seam symbols from anything else: an object in fs/ may
// reference only `tfs_plat_*`, memcpy, memset, memmove, memcmp and
// __stack_chk_fail.
//
// Implementations: userspace/platform/ (pthreads, futex, clock_gettime, SSE4.2
// crc32c, libzstd, getrandom, sched_yield) and, later, fs/kernel/ (kmalloc,
// wait_var_event, ktime, kthreads, printk, crc32c(), zstd_*, get_random_bytes,
// local_irq_save, cpu_relax).
//
// Conventions: functions that can fail return 0 or a negative Linux errno (the
// kernel's convention; the C++ wrappers turn it into a Status). All functions are
// thread-safe. Nothing here may be called with a btree node lock held if it can
// block for device I/O -- none of them does device I/O.
#ifndef TFS_PLATFORM_PLATFORM_H_
#define TFS_PLATFORM_PLATFORM_H_

#include "platform/types.h"
#include "util/status.h"

// Lock-rule checks (docs/design/core.md, "Completion context"): a completion
// and a SpinLock holder must not sleep -- no Mutex, RwLock, CondVar or Latch
// wait, no platform::Alloc, no I/O submission. On in debug builds and in the
// checked test build (fs/checked/ compiles the core with TFS_LOCK_CHECKS=1,
// because `make test` builds with NDEBUG); off, and free, in release builds.
// Every file linked into one program must see the same value.
#ifndef TFS_LOCK_CHECKS
#ifdef NDEBUG
#define TFS_LOCK_CHECKS 0
#else
#define TFS_LOCK_CHECKS 1
#endif
#endif

// Allocation scopes (NoFsScope below). The kernel needs them: they are its
// memalloc_nofs_save. Userspace reclaim never calls into the process, so
// there only the lock checks read them, and a release build compiles them
// out: CMake gives tierfs_core, and so everything linked with it,
// TFS_NOFS_SCOPES=0 (a guard then costs nothing for its scope; 3-5% of a
// single-key btree commit otherwise, docs/benchmarks.md). Default on (the
// kernel build, the kernel-safe check); always on where the checks are.
// Every file linked into one program must see the same value.
#ifndef TFS_NOFS_SCOPES
#define TFS_NOFS_SCOPES 1
#endif
#if TFS_LOCK_CHECKS && !TFS_NOFS_SCOPES
#undef TFS_NOFS_SCOPES
#define TFS_NOFS_SCOPES 1
#endif

extern "C" {

// --- memory -----------------------------------------------------------------
// `align` is a power of two <= 4096; TFS_ALLOC_ZERO zero-fills. Returns null on
// failure. Blocks for reclaim at most like GFP_KERNEL / malloc.
enum { TFS_ALLOC_ZERO = 1 };
void* tfs_plat_alloc(usize size, usize align, u32 flags);
void tfs_plat_free(void* ptr);

// --- wait and wake ------------------------------------------------------------
// Sleep while *word == expected, until woken or `timeout_ns` passes (~0 = forever).
// Returns 0 when woken (or the word already differed), -ETIMEDOUT on timeout.
// Spurious wake-ups are allowed: callers re-check their condition. *word is
// compared after a full barrier (a futex's compare does, and so does the
// kernel's wait_var_event, whose set_current_state is one): a store the
// caller made before the call is visible to a waker before the compare
// (bg::Engine::Wake skips the wake call for a thread not asleep on it).
int tfs_plat_wait(const u32* word, u32 expected, u64 timeout_ns);
// Wake up to `count` waiters on `word` (count <= 0: all of them).
void tfs_plat_wake(const u32* word, int count);
// tfs_plat_wait for a thread that waits for its own I/O submitted with
// IoRequest::kWaited (a flight's copies): the same contract, and meanwhile
// the calling thread may reap such I/O and run its completions itself
// (userspace: the thread's own io_uring, userspace/platform/thread_ring.h;
// where the platform has no such thing, a plain tfs_plat_wait). Any
// tfs_plat_wake of `word` still ends the wait. Callers hold no SpinLock.
int tfs_plat_wait_io(const u32* word, u32 expected, u64 timeout_ns);
// The calling thread is done waiting for its kWaited I/O (a flight's end):
// what is still out is reaped elsewhere from now on (userspace: the ring
// goes to the janitor). Every flight that submitted kWaited I/O ends with it.
void tfs_plat_io_leave(void);

// --- time ---------------------------------------------------------------------
u64 tfs_plat_now_ns(void);  // monotonic clock, nanoseconds
i64 tfs_plat_realtime_ns(void);  // wall clock, nanoseconds since the Unix epoch (file times)
void tfs_plat_sleep_ns(u64 ns);

// --- memory -------------------------------------------------------------------
u64 tfs_plat_memory_bytes(void);  // physical memory of the machine, bytes (0: unknown)

// --- reclaim scope ----------------------------------------------------------------
// Between nofs_save and the restore given its token, on the calling thread,
// no allocation may recurse into filesystem reclaim: the kernel's
// memalloc_nofs_save/restore (every allocation in the scope is GFP_NOFS), so
// that reclaim never calls into tierfs -- evicting an inode, which commits --
// while the allocating thread holds a lock that call would need. Scopes nest:
// restore puts back the state save found. nofs_active says whether the thread
// is inside one (the checks). Userspace reclaim never calls back into the
// process: the scope is only recorded.
u32 tfs_plat_nofs_save(void);
void tfs_plat_nofs_restore(u32 token);
int tfs_plat_nofs_active(void);

// --- memory pressure ------------------------------------------------------------
// A cache that can give memory back registers a shrinker; the platform calls
// it when memory is short (the kernel: a struct shrinker, from reclaim; the
// userspace build: a thread watching the cgroup's PSI memory pressure and the
// process's RSS against a limit, userspace/platform/pressure.h). Units are
// 4 KiB pages. `count` says how many the cache could give back now; `scan`
// gives back up to `pages` and returns how many it did. Both may run in
// reclaim, from any thread, also one that holds the cache's own locks or is
// inside the filesystem: they never wait for a lock (try-locks only), never
// do device I/O and never allocate; work that needs any of that (writing
// dirty data out) is handed to the cache's own thread, and scan returns what
// it freed itself. `plat` is the platform's (zero it before registering).
struct tfs_plat_shrinker {
  u64 (*count)(void* ctx);
  u64 (*scan)(void* ctx, u64 pages);
  void* ctx;
  const char* name;  // for logs and counters
  void* plat;
};
// 0 or a negative errno. Unregister returns once no call of it runs or will.
int tfs_plat_shrinker_register(struct tfs_plat_shrinker* shrinker);
void tfs_plat_shrinker_unregister(struct tfs_plat_shrinker* shrinker);

// --- debugging ------------------------------------------------------------------
// TFS_THREAD_WORDS words private to the calling thread (the kernel: the task),
// zero when the thread starts, for the lock-rule checks and nothing else:
// [TFS_THREAD_WORD_SHARED_LOCKS] posix's count of held shared locks (its
// slow-member rule, debug builds), [TFS_THREAD_WORD_NO_SLEEP] the depth of
// completions and SpinLocks the thread is inside (platform::NoSleepEnter,
// checked builds), [TFS_THREAD_WORD_LOCKS] the Mutexes and RwLocks it holds
// (checked builds). In interrupt context the kernel may hand out the
// interrupted task's words: a completion's enter and leave are balanced, so it
// leaves them as it found them.
enum {
  TFS_THREAD_WORD_SHARED_LOCKS = 0,
  TFS_THREAD_WORD_NO_SLEEP = 1,
  TFS_THREAD_WORD_LOCKS = 2,
  TFS_THREAD_WORDS = 3
};
u32* tfs_plat_thread_word(void);

// --- interrupts and spinning (SpinLock, platform/sync.h) --------------------------
// irq_save disables the calling CPU's interrupts and returns their previous
// state; irq_restore puts it back (the kernel: local_irq_save/restore). A
// SpinLock holds them off so that a completion running in interrupt context
// on the same CPU never spins on a lock its own CPU holds. Userspace has no
// interrupts: both do nothing.
u64 tfs_plat_irq_save(void);
void tfs_plat_irq_restore(u64 flags);
// A spinner that has spun for a while without getting its SpinLock calls
// this: userspace yields the CPU (sched_yield: the holder may have been
// preempted, and spinning on would only burn the rest of a timeslice); the
// kernel only relaxes (cpu_relax: a holder has interrupts off and runs on).
// Never sleeps.
void tfs_plat_spin_yield(void);

// --- threads ------------------------------------------------------------------
// A thread runs fn(arg) once and ends when fn returns; join waits for that and
// frees the handle. The core stops its threads itself (flag + wake), so the
// platform never kills one.
struct tfs_plat_thread;
int tfs_plat_thread_start(struct tfs_plat_thread** out, void (*fn)(void*), void* arg,
                          const char* name);
void tfs_plat_thread_join(struct tfs_plat_thread* thread);

// --- logging ------------------------------------------------------------------
// Writes one already-formatted line (no trailing newline) at a level (LogLevel).
void tfs_plat_log(int level, const char* line);
// vsnprintf semantics (C99): returns the length the full output would have.
int tfs_plat_vsnprintf(char* buf, usize size, const char* fmt, __builtin_va_list ap);

// --- checksums and compression -------------------------------------------------
// Raw CRC-32C (Castagnoli) update, no pre/post inversion (the kernel's crc32c()).
u32 tfs_plat_crc32c(u32 crc, const void* data, usize len);
usize tfs_plat_zstd_bound(usize src_len);
// Return the output length or a negative errno (-ENOSPC: dst too small; -EBADMSG:
// corrupt input for decompress).
isize tfs_plat_zstd_compress(void* dst, usize dst_cap, const void* src, usize src_len,
                             int level);
isize tfs_plat_zstd_decompress(void* dst, usize dst_cap, const void* src, usize src_len);

// --- randomness -----------------------------------------------------------------
// Unpredictable bytes (uuids, seeds). Never fails.
void tfs_plat_random_bytes(void* buf, usize len);

}  // extern "C"

namespace tfs::platform {

// The lock-rule checks' per-thread state (TFS_LOCK_CHECKS). The calling thread
// enters and leaves a section that must not sleep -- a completion (dev::IoQueue
// marks each, done callback included) or a held SpinLock; they nest.
// CheckMaySleep is a bug, naming `what`, inside one. Always defined (so
// checked and unchecked objects link alike); called only where
// TFS_LOCK_CHECKS is on, through TFS_MAY_SLEEP.
void NoSleepEnter();
void NoSleepLeave();
bool InNoSleep();
void CheckMaySleep(const char* what);
// Mutexes and RwLocks the thread holds (NoteLocked on every acquisition,
// NoteUnlocked on every release; a release by a thread that holds none is a
// bug: the core's locks are released by the thread that took them).
// CheckMayAlloc is CheckMaySleep, and a bug when the thread holds a lock
// outside a NoFsScope (the allocation rule, docs/design/core.md).
void NoteLocked();
void NoteUnlocked();
u32 LocksHeld();
void CheckMayAlloc(const char* what);

}  // namespace tfs::platform

#if TFS_LOCK_CHECKS
#define TFS_MAY_SLEEP(what) ::tfs::platform::CheckMaySleep(what)
#define TFS_MAY_ALLOC(what) ::tfs::platform::CheckMayAlloc(what)
#define TFS_NOTE_LOCKED() ::tfs::platform::NoteLocked()
#define TFS_NOTE_UNLOCKED() ::tfs::platform::NoteUnlocked()
#else
#define TFS_MAY_SLEEP(what) ((void)0)
#define TFS_MAY_ALLOC(what) ((void)0)
#define TFS_NOTE_LOCKED() ((void)0)
#define TFS_NOTE_UNLOCKED() ((void)0)
#endif

namespace tfs::platform {

// Memory. New/Delete replace operator new/delete, which the core may not use.
// Neither in a completion nor under a SpinLock, and under a Mutex or RwLock
// only inside a NoFsScope (TFS_MAY_ALLOC); Free may, anywhere.
inline void* Alloc(usize size, usize align = 16, bool zero = false) {
  TFS_MAY_ALLOC("platform::Alloc");
  return tfs_plat_alloc(size, align, zero ? TFS_ALLOC_ZERO : 0);
}
inline void Free(void* p) { tfs_plat_free(p); }

template <typename T, typename... Args>
T* New(Args&&... args) {
  TFS_MAY_ALLOC("platform::New");
  void* mem = tfs_plat_alloc(sizeof(T), alignof(T) < 16 ? 16 : alignof(T), 0);
  if (mem == nullptr) return nullptr;
  return new (mem) T(Forward<Args>(args)...);
}
template <typename T>
void Delete(T* p) {
  if (p == nullptr) return;
  p->~T();
  tfs_plat_free(p);
}

// Allocations in this scope never recurse into filesystem reclaim (the
// kernel's memalloc_nofs_save: GFP_NOFS for all of them), so reclaim cannot
// call into tierfs -- evict an inode, commit -- while this thread holds a lock
// that call needs. Rule (docs/design/core.md, "Allocation scope"): an
// allocation under a core lock is made inside one. The lock guards
// (MutexLock, ReadGuard, WriteGuard) open one for as long as they hold their
// lock, btree::Transaction for its life, the core's threads for theirs;
// an object holding one is destroyed on its thread, inside the scopes
// opened before it; a lock taken without a guard around an allocation needs
// its own. Nests; on one thread, LIFO. Compiled out (empty, same layout) when
// TFS_NOFS_SCOPES is 0: userspace release builds, where nothing reads it.
class NoFsScope {
 public:
#if TFS_NOFS_SCOPES
  NoFsScope() : token_(tfs_plat_nofs_save()) {}
  ~NoFsScope() { tfs_plat_nofs_restore(token_); }
#else
  NoFsScope() : token_(0) {}
  ~NoFsScope() = default;
#endif
  NoFsScope(const NoFsScope&) = delete;
  NoFsScope& operator=(const NoFsScope&) = delete;

 private:
  const u32 token_;
};

// Whether the calling thread is inside a scope (always false when scopes are
// compiled out: only the checks and their tests ask).
inline bool InNoFs() { return tfs_plat_nofs_active() != 0; }

// The one owner of an object from New, deleted with its owner: how big
// objects (a Store, a DeviceSet, an Allocator) stay off the stack -- the
// kernel's frames are limited to 2 KiB (scripts/kernel_safe_check.py enforces
// it). Null when New failed: callers test it (kNoMemory).
template <typename T>
class Owned {
 public:
  Owned() = default;
  explicit Owned(T* p) : p_(p) {}
  ~Owned() { Delete(p_); }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  template <typename... Args>
  static Owned Make(Args&&... args) {
    return Owned(New<T>(Forward<Args>(args)...));
  }
  Owned(Owned&& o) : p_(o.p_) { o.p_ = nullptr; }

  T* get() const { return p_; }
  T& operator*() const { return *p_; }
  T* operator->() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  T* p_ = nullptr;
};

inline u64 MemoryBytes() { return tfs_plat_memory_bytes(); }
inline constexpr u64 kShrinkPage = 4096;  // the shrinkers' unit

// A registered shrinker for the lifetime of its owner: Register() once the
// cache exists, Unregister() (also the destructor) before it goes.
class Shrinker {
 public:
  Shrinker() = default;
  ~Shrinker() { Unregister(); }
  Shrinker(const Shrinker&) = delete;
  Shrinker& operator=(const Shrinker&) = delete;
  Status Register(u64 (*count)(void*), u64 (*scan)(void*, u64), void* ctx, const char* name) {
    if (registered_) return Err::kBusy;
    s_.count = count;
    s_.scan = scan;
    s_.ctx = ctx;
    s_.name = name;
    s_.plat = nullptr;
    const int rc = tfs_plat_shrinker_register(&s_);
    if (rc < 0) return Status::FromErrno(-rc);
    registered_ = true;
    return Status::Ok();
  }
  void Unregister() {
    if (!registered_) return;
    tfs_plat_shrinker_unregister(&s_);
    registered_ = false;
  }

 private:
  tfs_plat_shrinker s_ = {};
  bool registered_ = false;
};

// Time.
inline u64 NowNs() { return tfs_plat_now_ns(); }
inline i64 RealTimeNs() { return tfs_plat_realtime_ns(); }
inline void SleepNs(u64 ns) {
  TFS_MAY_SLEEP("platform::SleepNs");
  tfs_plat_sleep_ns(ns);
}
constexpr u64 kNsPerUs = 1000;
constexpr u64 kNsPerMs = 1000 * 1000;
constexpr u64 kNsPerSec = 1000 * 1000 * 1000;
constexpr u64 kForever = ~u64(0);

// Logging. Messages below the current level are dropped before formatting.
enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kFatal = 4 };
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void Log(LogLevel level, const char* fmt, ...) TFS_PRINTF(2, 3);
// Bounded formatting into a caller's buffer; always NUL-terminates (size > 0).
int Format(char* buf, usize size, const char* fmt, ...) TFS_PRINTF(3, 4);

// CRC-32C of a buffer (standard: initial ~0, final inversion). Extend continues a
// checksum over more data: Crc32c(ab) == Crc32cExtend(Crc32c(a), b).
inline u32 Crc32cExtend(u32 crc, const void* data, usize len) {
  return ~tfs_plat_crc32c(~crc, data, len);
}
inline u32 Crc32c(const void* data, usize len) { return Crc32cExtend(0, data, len); }
// CRC-32C of a block that stores its own checksum in the 4 bytes at `csum_offset`:
// computed as if those bytes were zero (how every on-disk structure is summed).
inline u32 Crc32cSkippingField(const void* data, usize len, usize csum_offset) {
  static const u8 kZero[4] = {0, 0, 0, 0};
  const u8* p = static_cast<const u8*>(data);
  u32 crc = Crc32c(p, csum_offset);
  crc = Crc32cExtend(crc, kZero, 4);
  return Crc32cExtend(crc, p + csum_offset + 4, len - csum_offset - 4);
}

// zstd. Compress returns kNoSpace when the output would not fit in dst_cap (the
// caller then stores the data uncompressed); Decompress returns kCorrupt for bad
// input and kNoSpace when the output would not fit.
inline usize ZstdBound(usize src_len) { return tfs_plat_zstd_bound(src_len); }
Result<usize> ZstdCompress(void* dst, usize dst_cap, const void* src, usize src_len,
                           int level = 3);
Result<usize> ZstdDecompress(void* dst, usize dst_cap, const void* src, usize src_len);

inline void RandomBytes(void* buf, usize len) { tfs_plat_random_bytes(buf, len); }

// A joinable thread. Start() may fail (kNoMemory, kAgain); Join() must be called
// before destruction if Start() succeeded. The core's threads run in a
// NoFsScope for their whole life, as a filesystem's kernel threads do.
class Thread {
 public:
  Thread() = default;
  Thread(const Thread&) = delete;
  Thread& operator=(const Thread&) = delete;
  ~Thread() { TFS_BUG_ON(handle_ != nullptr); }

  Status Start(void (*fn)(void*), void* arg, const char* name) {
    TFS_BUG_ON(handle_ != nullptr);
    fn_ = fn;
    arg_ = arg;
    return Status::FromErrno(tfs_plat_thread_start(&handle_, &Thread::Run, this, name));
  }
  void Join() {
    if (handle_ == nullptr) return;
    tfs_plat_thread_join(handle_);
    handle_ = nullptr;
  }
  bool running() const { return handle_ != nullptr; }

 private:
  static void Run(void* self) {
    const auto* t = static_cast<const Thread*>(self);
    NoFsScope nofs;
    t->fn_(t->arg_);
  }

  tfs_plat_thread* handle_ = nullptr;
  void (*fn_)(void*) = nullptr;
  void* arg_ = nullptr;
};

}  // namespace tfs::platform

#endif  // TFS_PLATFORM_PLATFORM_H_
