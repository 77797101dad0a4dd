// A member's background budget (docs/design/tiering.md, "Step 22-2"): how
// many background I/Os, and bytes, the engines may have out on one member
// at once. Not a bandwidth cap: an idle member gets the whole budget at
// once; one that is slow gets less, one that is stalling none, so a stalled
// HDD stops receiving new background I/O instead of piling it up in its
// queue, ahead of the foreground.
//
// The current limit adapts to the member's read state (dev::ReadState, as
// the data path's choice of a copy reads it): stalling -> 0; slow (its
// oldest request at the device past half its late bound) -> halved, at
// most once per completion seen since the last cut; healthy -> one more
// after each `limit` completions, up to max_ios. A look that finds it no
// longer stalling (slow or healthy) restarts it at 1. The limit moves only
// at an Admit: the ctl document shows it as of the last admission.
//
// Thread safety: every method from any thread. Release may run in a
// completion (a SpinLock, counts, and the wake callback -- which must obey
// the completion rule too: bg::Engine::Wake does).
#ifndef TFS_BG_BUDGET_H_
#define TFS_BG_BUDGET_H_

#include "dev/io_queue.h"
#include "platform/sync.h"
#include "platform/types.h"
#include "util/counters.h"

namespace tfs::bg {

struct BudgetConfig {
  u32 max_ios = 8;            // background I/Os in flight on the member, at most
  u64 max_bytes = 8ull << 20;  // and their bytes (one I/O is admitted whatever its size)
};

#define TFS_BUDGET_COUNTERS(X, A)                                                              \
  X(admitted, counter, "background I/Os admitted")                                             \
  X(refused_busy, counter, "admissions refused: the member had its limit out")                 \
  X(refused_stalling, counter, "admissions refused: the member was stalling")                  \
  X(lowered, counter, "times the limit was cut (halved on a slow member, to 0 on a stalling one)") \
  X(raised, counter, "times the limit grew by one (a window of completions; back from a stall)") \
  X(ios, level, "background I/Os out now")                                                     \
  X(bytes, level, "their bytes")                                                               \
  X(limit, level, "the current limit on I/Os out")

struct BudgetStats {
  TFS_COUNTER_FIELDS(TFS_BUDGET_COUNTERS)
};

class Budget {
 public:
  enum class Verdict : u8 {
    kAdmitted,  // counted out: Release(bytes) when it completes
    kBusy,      // the member has its limit out: a Release will wake the engines
    kStalling,  // the member is stalling: look again after its late bound (or a wake)
  };

  Budget() = default;
  Budget(const Budget&) = delete;
  Budget& operator=(const Budget&) = delete;

  // Before any Admit. `wake(ctx)` is called by a Release after a refusal.
  void Init(const BudgetConfig& config, void (*wake)(void*), void* ctx);

  // One background I/O of `bytes` on the member whose read state is `rs`
  // (read just before). Adapts the limit, then admits or refuses.
  Verdict Admit(u64 bytes, const dev::ReadState& rs);
  // An admitted I/O completed: its budget back, the completion counted
  // toward the limit's growth.
  void Release(u64 bytes);
  // An admitted I/O that was never sent (the move's other member refused):
  // its budget back, no completion counted -- the member answered nothing.
  void Cancel(u64 bytes);

  BudgetStats GetStats() const;

 private:
  BudgetConfig config_;
  void (*wake_)(void*) = nullptr;
  void* wake_ctx_ = nullptr;

  void GiveBack(u64 bytes, bool completed);

  mutable SpinLock mu_;
  u32 ios_ TFS_GUARDED_BY(mu_) = 0;
  u64 bytes_ TFS_GUARDED_BY(mu_) = 0;
  u32 limit_ TFS_GUARDED_BY(mu_) = 0;           // set by Init to max_ios
  u32 window_ TFS_GUARDED_BY(mu_) = 0;          // completions at this limit
  u32 since_cut_ TFS_GUARDED_BY(mu_) = 1;       // completions since the last halving
  bool refused_ TFS_GUARDED_BY(mu_) = false;    // a refusal since the last release
  BudgetStats ctr_ TFS_GUARDED_BY(mu_);
};

}  // namespace tfs::bg

#endif  // TFS_BG_BUDGET_H_
