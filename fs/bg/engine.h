// Background engines (docs/design/tiering.md, "Step 22-1"): the thread,
// pause switch, wake and counters every engine -- reconcile, promote, copygc
// -- runs on. An engine's work is one function doing one bounded step (a
// batch of moves) and saying what next; the engine calls it on its own
// thread, sleeps when it says there is nothing to do, and never polls.
//
// The engines sit beside posix on the data path (docs/design/core.md's
// layers): mount::Instance owns them, starts each after posix has mounted
// -- once its work exists (22-4 on; until then none has a thread) -- and
// stops them all before posix unmounts; nothing below them knows they
// exist.
//
// Thread safety: Wake may be called from anywhere, a completion and the data
// path's commit hook included: it takes no lock and never sleeps. Pause,
// Resume, State and GetStats from any thread. Start and Stop from the thread
// that owns the mount (Instance's Open and Close), not concurrently.
#ifndef TFS_BG_ENGINE_H_
#define TFS_BG_ENGINE_H_

#include "bg/budget.h"
#include "dev/device_set.h"
#include "platform/atomic.h"
#include "platform/platform.h"
#include "platform/types.h"
#include "util/counters.h"
#include "util/status.h"

namespace tfs::bg {

// The engines the control command names (`tierfs ctl MNT pause ENGINE`).
enum class EngineId : u8 { kReconcile = 0, kPromote = 1, kCopygc = 2 };
inline constexpr u32 kEngineCount = 3;
inline constexpr u32 kAllEngines = (1u << kEngineCount) - 1;

const char* EngineName(EngineId id);
// The engines a name on the control line stands for: one bit per EngineId,
// every bit for "all"; 0 for anything else. `name` need not be
// NUL-terminated.
u32 EngineMask(const char* name, usize len);

// What a step says the engine should do next.
struct Step {
  enum Kind : u8 {
    kIdle,  // nothing to do: sleep until Wake()
    kMore,  // run again at once
    kWait,  // work exists but cannot go now (its destination is busy): run
            // again after wait_ns, or at the next Wake() if sooner
  };
  Kind kind = kIdle;
  u64 wait_ns = 0;

  static Step Idle() { return Step{kIdle, 0}; }
  static Step More() { return Step{kMore, 0}; }
  static Step WaitFor(u64 ns) { return Step{kWait, ns}; }
};

// An engine's work: `step(ctx)` on the engine's thread, with nothing locked.
// A step is bounded (Stop waits for the one running; after a Pause it ends
// on its own) and reports its own errors (counted and logged by the work:
// an engine only schedules).
struct Work {
  Step (*step)(void* ctx) = nullptr;
  void* ctx = nullptr;
};

enum class EngineState : u8 {
  kOff,      // no thread: a read-only mount, or the engine's work is not built yet
  kIdle,     // asleep until woken: no work
  kRunning,  // in a step
  kWaiting,  // asleep until a deadline or a wake: work that cannot go now
  kPaused,   // asleep until resumed
  kPausing,  // paused, with the step that was running when it was paused still running
  kStopped,  // stopped (an unmount)
};
const char* EngineStateName(EngineState s);

#define TFS_ENGINE_COUNTERS(X, A)                                                                         \
  X(steps, counter, "steps of work run")                                                                  \
  X(step_ns, counter, "nanoseconds spent in steps")                                                       \
  X(wakes, counter, "wakes asked for (new work, room, a member back, a resume)")                          \
  X(sleeps, counter, "steps that found nothing to do (it sleeps, unless woken meanwhile)")                \
  X(waits, counter, "timed waits: work that could not go yet (a busy destination)")                       \
  X(paused_looks, counter, "looks that found the engine paused (the pause itself, then each wake)")        \
  X(pauses, counter, "pause commands that paused it (a paused engine's pause is not counted)")            \
  X(resumes, counter, "resume commands that resumed it")                                                  \
  X(paused, flag, "paused now")                                                                           \
  X(running, flag, "in a step now")

struct EngineStats {
  TFS_COUNTER_FIELDS(TFS_ENGINE_COUNTERS)
};

class Engine {
 public:
  Engine() = default;
  ~Engine() { TFS_BUG_ON(thread_.running()); }  // Stop() before destruction
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Starts the thread (named `name`, e.g. "tfs-reconcile") running `work`;
  // it looks for work once at once. kAgain/kNoMemory if the thread does not
  // start (the engine stays off). Once per engine (an engine off).
  Status Start(const Work& work, const char* name);
  // Ends the thread: the step running (if any) finishes, no other starts.
  // Idempotent; an engine never started is only marked stopped.
  void Stop();

  // There may be work: the thread looks (now, or after the step it is in).
  void Wake();
  // Pause: no step starts until Resume(); the one running, if any, ends on
  // its own (this does not wait for it). Both return whether they changed
  // anything (pausing a paused engine does not).
  bool Pause();
  bool Resume();

  bool paused() const { return paused_.Load(MemOrder::kAcquire); }
  bool stopping() const { return stop_.Load(MemOrder::kAcquire); }
  EngineState State() const;
  EngineStats GetStats() const;

 private:
  static void ThreadMain(void* self);
  void Run();
  // Bumps the sequence and wakes the thread, whatever it is doing.
  void Kick();

  Work work_;
  platform::Thread thread_;
  Atomic<u32> seq_{0};  // bumped by Wake/Pause/Resume/Stop; the thread sleeps on it
  Atomic<bool> paused_{false};
  Atomic<bool> stop_{false};
  Atomic<u8> state_{u8(EngineState::kOff)};  // what the thread is doing (kRunning, kIdle, ...)
  struct Live {
    TFS_COUNTER_ATOMICS(TFS_ENGINE_COUNTERS)
  } ctr_;
};

// The engines of one mount, by EngineId, and the members' background
// budgets they share (budget.h; a refused engine is woken by the release
// that makes room: WakeAll).
class Engines {
 public:
  Engines();
  Engines(const Engines&) = delete;
  Engines& operator=(const Engines&) = delete;

  Engine& get(EngineId id) { return engines_[u32(id)]; }
  const Engine& get(EngineId id) const { return engines_[u32(id)]; }
  Budget& budget(u32 member) { return budgets_[member]; }
  const Budget& budget(u32 member) const { return budgets_[member]; }
  // Pause or resume every engine in `mask` (EngineMask's bits).
  void Pause(u32 mask);
  void Resume(u32 mask);
  // Wakes every engine (completion-safe).
  void WakeAll();
  // Stops them all (unmount), idempotent.
  void StopAll();

 private:
  Engine engines_[kEngineCount];
  Budget budgets_[dev::kMaxDevices];
};

}  // namespace tfs::bg

#endif  // TFS_BG_ENGINE_H_
