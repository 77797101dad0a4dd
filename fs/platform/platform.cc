// Core-side half of the seam: the C++ wrappers that add policy on top of the raw
// tfs_plat_* entry points (log level filtering, bounded formatting, errno ->
// Status) and the lock-rule checks' per-thread depth (platform.h). Shared by
// the userspace and kernel builds.
#include "platform/platform.h"

#include "platform/atomic.h"

namespace tfs::platform {
namespace {

// Constant-initialized: no static constructor runs (the kernel has none).
Atomic<int> g_log_level{int(LogLevel::kInfo)};

constexpr usize kLogLineMax = 512;

}  // namespace

void SetLogLevel(LogLevel level) { g_log_level.Store(int(level), MemOrder::kRelaxed); }
LogLevel GetLogLevel() { return LogLevel(g_log_level.Load(MemOrder::kRelaxed)); }

void Log(LogLevel level, const char* fmt, ...) {
  if (int(level) < g_log_level.Load(MemOrder::kRelaxed)) return;
  char line[kLogLineMax];
  __builtin_va_list ap;
  __builtin_va_start(ap, fmt);
  tfs_plat_vsnprintf(line, sizeof(line), fmt, ap);
  __builtin_va_end(ap);
  tfs_plat_log(int(level), line);
}

int Format(char* buf, usize size, const char* fmt, ...) {
  __builtin_va_list ap;
  __builtin_va_start(ap, fmt);
  int n = tfs_plat_vsnprintf(buf, size, fmt, ap);
  __builtin_va_end(ap);
  return n;
}

void NoSleepEnter() { tfs_plat_thread_word()[TFS_THREAD_WORD_NO_SLEEP]++; }

void NoSleepLeave() {
  u32& depth = tfs_plat_thread_word()[TFS_THREAD_WORD_NO_SLEEP];
  TFS_BUG_ON(depth == 0);
  depth--;
}

bool InNoSleep() { return tfs_plat_thread_word()[TFS_THREAD_WORD_NO_SLEEP] != 0; }

void NoteLocked() { tfs_plat_thread_word()[TFS_THREAD_WORD_LOCKS]++; }

void NoteUnlocked() {
  u32& held = tfs_plat_thread_word()[TFS_THREAD_WORD_LOCKS];
  if (TFS_UNLIKELY(held == 0)) {
    Log(LogLevel::kFatal, "lock rule: a lock released by a thread that holds none (taken by another thread?)");
    TFS_BUG_ON(held == 0);
  }
  held--;
}

u32 LocksHeld() { return tfs_plat_thread_word()[TFS_THREAD_WORD_LOCKS]; }

void CheckMayAlloc(const char* what) {
  CheckMaySleep(what);
  const u32 held = tfs_plat_thread_word()[TFS_THREAD_WORD_LOCKS];
  if (TFS_LIKELY(held == 0 || tfs_plat_nofs_active() != 0)) return;
  Log(LogLevel::kFatal,
      "lock rule: %s under %u lock(s) outside a NoFsScope: in the kernel, reclaim could call into "
      "tierfs and need them",
      what, held);
  TFS_BUG_ON(true);
}

void CheckMaySleep(const char* what) {
  const u32 depth = tfs_plat_thread_word()[TFS_THREAD_WORD_NO_SLEEP];
  if (TFS_LIKELY(depth == 0)) return;
  Log(LogLevel::kFatal, "lock rule: %s in a completion or under a SpinLock (depth %u), where nothing may sleep",
      what, depth);
  TFS_BUG_ON(depth != 0);
}

Result<usize> ZstdCompress(void* dst, usize dst_cap, const void* src, usize src_len,
                           int level) {
  isize n = tfs_plat_zstd_compress(dst, dst_cap, src, src_len, level);
  if (n < 0) return Status::FromErrno(int(n));
  return usize(n);
}

Result<usize> ZstdDecompress(void* dst, usize dst_cap, const void* src, usize src_len) {
  isize n = tfs_plat_zstd_decompress(dst, dst_cap, src, src_len);
  if (n < 0) return Status::FromErrno(int(n));
  return usize(n);
}

}  // namespace tfs::platform
