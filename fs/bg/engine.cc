// The engines' thread, switch and wake (engine.h).
//
// The thread's loop, one look per turn: it reads the wake sequence first,
// then the stop and pause flags, then decides; it sleeps only on the
// sequence it read, so a Wake, Pause, Resume or Stop after the read ends the
// sleep at once (no lost wake-up). `seen` is the sequence the last step
// started under: a Wake during a step changes it, and the thread looks
// again after the step instead of sleeping.
//
// Wake skips the futex call when the thread is not asleep: it bumps the
// sequence, then reads the state; the thread stores its sleeping state,
// then compares the sequence. Both sequentially consistent, so either the
// thread sees the new sequence (and does not sleep) or the waker sees it
// asleep (and wakes it).
#include "bg/engine.h"

namespace tfs::bg {
namespace {

constexpr const char* kEngineNames[kEngineCount] = {"reconcile", "promote", "copygc"};

bool Asleep(EngineState s) {
  return s == EngineState::kIdle || s == EngineState::kWaiting || s == EngineState::kPaused;
}

}  // namespace

const char* EngineName(EngineId id) {
  return u32(id) < kEngineCount ? kEngineNames[u32(id)] : "?";
}

u32 EngineMask(const char* name, usize len) {
  auto is = [&](const char* s) {
    usize n = 0;
    while (s[n] != '\0') n++;
    if (n != len) return false;
    for (usize i = 0; i < n; i++)
      if (s[i] != name[i]) return false;
    return true;
  };
  if (is("all")) return kAllEngines;
  for (u32 i = 0; i < kEngineCount; i++)
    if (is(kEngineNames[i])) return 1u << i;
  return 0;
}

const char* EngineStateName(EngineState s) {
  switch (s) {
    case EngineState::kOff: return "off";
    case EngineState::kIdle: return "idle";
    case EngineState::kRunning: return "running";
    case EngineState::kWaiting: return "waiting";
    case EngineState::kPaused: return "paused";
    case EngineState::kPausing: return "pausing";
    case EngineState::kStopped: return "stopped";
  }
  return "?";
}

Status Engine::Start(const Work& work, const char* name) {
  TFS_BUG_ON(EngineState(state_.Load()) != EngineState::kOff || work.step == nullptr);
  work_ = work;
  stop_.Store(false);
  state_.Store(u8(EngineState::kRunning));  // (until the thread's first look)
  Status st = thread_.Start(&Engine::ThreadMain, this, name);
  if (!st.ok()) {
    state_.Store(u8(EngineState::kOff));
    return st;
  }
  return Status::Ok();
}

void Engine::Kick() {
  seq_.FetchAdd(1);
  tfs_plat_wake(seq_.Address(), 0);
}

void Engine::Stop() {
  stop_.Store(true);
  Kick();
  thread_.Join();
  state_.Store(u8(EngineState::kStopped));
}

void Engine::Wake() {
  Bump(ctr_.wakes);
  seq_.FetchAdd(1);
  if (Asleep(EngineState(state_.Load()))) tfs_plat_wake(seq_.Address(), 0);
}

bool Engine::Pause() {
  if (paused_.Exchange(true)) return false;
  Bump(ctr_.pauses);
  Kick();
  return true;
}

bool Engine::Resume() {
  if (!paused_.Exchange(false)) return false;
  Bump(ctr_.resumes);
  Kick();
  return true;
}

EngineState Engine::State() const {
  const EngineState s = EngineState(state_.Load());
  if (s == EngineState::kOff || s == EngineState::kStopped || !paused()) return s;
  // Paused: the thread may not have looked yet; the switch is what holds.
  return s == EngineState::kRunning ? EngineState::kPausing : EngineState::kPaused;
}

EngineStats Engine::GetStats() const {
  EngineStats s;
  TFS_COUNTER_LOAD(TFS_ENGINE_COUNTERS, ctr_, s);
  s.paused = paused() ? 1 : 0;
  s.running = EngineState(state_.Load()) == EngineState::kRunning ? 1 : 0;
  return s;
}

void Engine::ThreadMain(void* self) { static_cast<Engine*>(self)->Run(); }

void Engine::Run() {
  u32 seen = seq_.Load() - 1;  // (differs: the first turn looks for work)
  u64 wait_until = 0;          // a kWait step's deadline, 0 if none
  for (;;) {
    const u32 seq = seq_.Load();
    if (stop_.Load()) break;
    if (paused_.Load()) {
      state_.Store(u8(EngineState::kPaused));
      Bump(ctr_.paused_looks);
      (void)tfs_plat_wait(seq_.Address(), seq, platform::kForever);
      continue;
    }
    const bool woken = seq != seen;
    const u64 now = platform::NowNs();
    const bool due = wait_until != 0 && now >= wait_until;
    if (!woken && !due) {
      state_.Store(u8(wait_until != 0 ? EngineState::kWaiting : EngineState::kIdle));
      // (A saturated deadline waits forever: no huge finite timeout for a
      // platform to convert.)
      const u64 wait_ns =
          wait_until == 0 || wait_until == platform::kForever - 1 ? platform::kForever : wait_until - now;
      (void)tfs_plat_wait(seq_.Address(), seq, wait_ns);
      continue;
    }
    // Running, then the switches again: a Pause (or Stop) that returned
    // before this store is seen here, and no step starts after it; one
    // after it finds kRunning and says "pausing" (both sequentially
    // consistent).
    state_.Store(u8(EngineState::kRunning));
    if (paused_.Load() || stop_.Load()) continue;
    seen = seq;
    wait_until = 0;
    const Step step = work_.step(work_.ctx);
    const u64 end = platform::NowNs();
    Bump(ctr_.steps);
    Bump(ctr_.step_ns, end - now);
    switch (step.kind) {
      case Step::kMore:
        seen = seq - 1;  // (look again at once)
        break;
      case Step::kIdle:
        Bump(ctr_.sleeps);
        break;
      case Step::kWait:
        Bump(ctr_.waits);
        // (Saturated: a wait "forever" is a deadline that never comes, not
        // one that wrapped into the past -- or to 0, "no deadline".)
        wait_until = step.wait_ns >= platform::kForever - 1 - end ? platform::kForever - 1
                                                                  : end + Max<u64>(step.wait_ns, 1);
        break;
    }
  }
  state_.Store(u8(EngineState::kStopped));
}

Engines::Engines() {
  for (Budget& b : budgets_) b.Init(BudgetConfig{}, [](void* self) { static_cast<Engines*>(self)->WakeAll(); }, this);
}

void Engines::WakeAll() {
  for (Engine& e : engines_) e.Wake();
}

void Engines::Pause(u32 mask) {
  for (u32 i = 0; i < kEngineCount; i++)
    if ((mask >> i) & 1) engines_[i].Pause();
}

void Engines::Resume(u32 mask) {
  for (u32 i = 0; i < kEngineCount; i++)
    if ((mask >> i) & 1) engines_[i].Resume();
}

void Engines::StopAll() {
  for (Engine& e : engines_) e.Stop();
}

}  // namespace tfs::bg
