// LogLimit: at most one log line per period for one kind of event that can
// repeat without end (a failing member fails every copy written to it; a
// node read past a bad copy on a read-only mount is read again after every
// eviction). It keeps when its last line was logged and how many events
// were not logged since, which the next line says. Lock-free: a race only
// logs a line more or counts one in the next line.
#ifndef TFS_UTIL_LOG_LIMIT_H_
#define TFS_UTIL_LOG_LIMIT_H_

#include "platform/atomic.h"
#include "platform/platform.h"

namespace tfs {

struct LogLimit {
  Atomic<u64> logged{0};    // platform::NowNs() + 1 of the last line (0: never)
  Atomic<u64> unlogged{0};  // events since, not logged

  // Whether to log a line now (none in the last period_ns); if so, `more`
  // (size bytes) says how many were not logged since the last (empty for
  // none), else this one is counted.
  bool Admit(u64 period_ns, char* more, usize size) {
    const u64 now = platform::NowNs();
    u64 last = logged.Load(MemOrder::kRelaxed);
    // (now + 1: a clock at 0 still counts as logged)
    if ((last != 0 && now + 1 < last + period_ns) || !logged.CompareExchange(last, now + 1, MemOrder::kRelaxed)) {
      unlogged.FetchAdd(1, MemOrder::kRelaxed);
      return false;
    }
    const u64 skipped = unlogged.Exchange(0, MemOrder::kRelaxed);
    more[0] = '\0';
    if (skipped != 0)
      platform::Format(more, size, " (and %llu more not logged since the last line)",
                       static_cast<unsigned long long>(skipped));
    return true;
  }
};

}  // namespace tfs

#endif  // TFS_UTIL_LOG_LIMIT_H_
