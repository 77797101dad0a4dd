// The engine's thread, switch and wake (bg/engine.h), driven by a test work
// function. Nothing here waits for time to pass and then asserts: each test
// waits (bounded, generously) for a counter the thread moves, then checks
// what must hold at that point -- a paused engine's thread counts each look
// that found it paused, so "no step while paused" is checked after a look
// the test caused, not after a sleep.
#include "bg/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace tfs::bg {
namespace {

// Waits until `cond` holds; fails the test after 60 s (a hang, not a slow
// machine).
bool WaitUntil(const std::function<bool()>& cond) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// A work function: `available` units of work; each step takes one (kMore
// while more remain, kIdle when it took the last or found none). A step can
// be held: `hold` makes the next step announce itself and wait for release.
struct TestWork {
  std::atomic<int> available{0};
  std::atomic<int> taken{0};
  std::atomic<int> calls{0};
  std::atomic<bool> hold{false};
  std::atomic<bool> in_step{false};
  std::atomic<bool> release{false};
  std::vector<Step> script;  // steps to return first, in order (then the rule above)

  static Step Run(void* self) { return static_cast<TestWork*>(self)->Step1(); }
  Step Step1() {
    const int call = calls.fetch_add(1);
    if (hold.load()) {
      in_step.store(true);
      while (!release.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
      in_step.store(false);
    }
    if (size_t(call) < script.size()) return script[size_t(call)];
    int a = available.load();
    while (a > 0 && !available.compare_exchange_weak(a, a - 1)) {
    }
    if (a <= 0) return Step::Idle();
    taken.fetch_add(1);
    return a > 1 ? Step::More() : Step::Idle();
  }
  Work work() { return Work{&TestWork::Run, this}; }
};

TEST(EngineTest, NamesAndMasks) {
  EXPECT_STREQ(EngineName(EngineId::kReconcile), "reconcile");
  EXPECT_STREQ(EngineName(EngineId::kPromote), "promote");
  EXPECT_STREQ(EngineName(EngineId::kCopygc), "copygc");
  EXPECT_EQ(EngineMask("all", 3), kAllEngines);
  EXPECT_EQ(EngineMask("reconcile", 9), 1u << u32(EngineId::kReconcile));
  EXPECT_EQ(EngineMask("promote", 7), 1u << u32(EngineId::kPromote));
  EXPECT_EQ(EngineMask("copygc", 6), 1u << u32(EngineId::kCopygc));
  EXPECT_EQ(EngineMask("copygc!", 6), 1u << u32(EngineId::kCopygc)) << "only len bytes are read";
  EXPECT_EQ(EngineMask("recon", 5), 0u);
  EXPECT_EQ(EngineMask("reconciles", 10), 0u);
  EXPECT_EQ(EngineMask("ALL", 3), 0u);
  EXPECT_EQ(EngineMask("", 0), 0u);
  EXPECT_STREQ(EngineStateName(EngineState::kPausing), "pausing");
}

TEST(EngineTest, AnEngineNeverStartedIsOffAndStopsStopped) {
  Engine e;
  EXPECT_EQ(e.State(), EngineState::kOff);
  EXPECT_TRUE(e.Pause());
  EXPECT_EQ(e.State(), EngineState::kOff) << "no thread: the switch holds, the state stays off";
  EXPECT_TRUE(e.paused());
  e.Wake();  // (no thread to wake: nothing happens)
  e.Stop();
  EXPECT_EQ(e.State(), EngineState::kStopped);
  e.Stop();  // idempotent
}

TEST(EngineTest, StepsRunUntilIdleAndAWakeRunsMore) {
  TestWork w;
  w.available = 3;
  Engine e;
  ASSERT_TRUE(e.Start(w.work(), "tfs-test").ok());
  // The first look at start: three units, kMore, kMore, then kIdle.
  ASSERT_TRUE(WaitUntil([&] { return e.State() == EngineState::kIdle && w.taken == 3; }));
  EXPECT_EQ(w.calls, 3);
  EXPECT_EQ(e.GetStats().steps, 3u);
  EXPECT_EQ(e.GetStats().sleeps, 1u);
  // New work and a wake: it runs; a wake with nothing to do costs one step.
  w.available = 2;
  e.Wake();
  ASSERT_TRUE(WaitUntil([&] { return w.taken == 5 && e.GetStats().sleeps == 2; }));
  e.Wake();
  ASSERT_TRUE(WaitUntil([&] { return e.GetStats().sleeps == 3; }));
  EXPECT_EQ(w.calls, 6);
  const EngineStats s = e.GetStats();
  EXPECT_EQ(s.steps, 6u);
  EXPECT_EQ(s.wakes, 2u);
  EXPECT_EQ(s.waits, 0u);
  EXPECT_FALSE(s.paused);
  e.Stop();
  EXPECT_EQ(e.State(), EngineState::kStopped);
}

// No lost wake-up: work offered one unit at a time, each with one wake, from
// the moment the engine is idle -- or still finishing the step before (the
// wake lands during a step). A lost wake would leave a unit untaken forever.
TEST(EngineTest, NoWakeIsLost) {
  TestWork w;
  Engine e;
  ASSERT_TRUE(e.Start(w.work(), "tfs-test").ok());
  for (int i = 1; i <= 500; i++) {
    w.available.fetch_add(1);
    e.Wake();
    if (i % 2 == 0) {
      ASSERT_TRUE(WaitUntil([&] { return w.taken == i; })) << "unit " << i << " never taken";
    }
  }
  ASSERT_TRUE(WaitUntil([&] { return w.taken == 500; }));
  // Wakes from many threads at once: every unit is taken.
  std::vector<std::thread> wakers;
  for (int t = 0; t < 4; t++) {
    wakers.emplace_back([&] {
      for (int k = 0; k < 250; k++) {
        w.available.fetch_add(1);
        e.Wake();
      }
    });
  }
  for (auto& t : wakers) t.join();
  ASSERT_TRUE(WaitUntil([&] { return w.taken == 1500 && e.State() == EngineState::kIdle; }));
  e.Stop();
}

TEST(EngineTest, APausedEngineRunsNoStepHoweverOftenWoken) {
  TestWork w;
  Engine e;
  ASSERT_TRUE(e.Start(w.work(), "tfs-test").ok());
  ASSERT_TRUE(WaitUntil([&] { return e.State() == EngineState::kIdle; }));
  EXPECT_TRUE(e.Pause());
  EXPECT_FALSE(e.Pause()) << "pausing a paused engine changes nothing";
  EXPECT_EQ(e.State(), EngineState::kPaused);
  ASSERT_TRUE(WaitUntil([&] { return e.GetStats().paused_looks >= 1; }));
  const u64 steps = e.GetStats().steps;
  w.available = 5;
  for (int i = 0; i < 3; i++) {
    const u64 looks = e.GetStats().paused_looks;
    e.Wake();
    // The thread woke, looked, found the engine paused and slept again.
    ASSERT_TRUE(WaitUntil([&] { return e.GetStats().paused_looks > looks; }));
    EXPECT_EQ(e.GetStats().steps, steps) << "a step ran while paused";
    EXPECT_EQ(e.State(), EngineState::kPaused);
  }
  EXPECT_EQ(w.taken, 0);
  EXPECT_TRUE(e.GetStats().paused);
  // Resume is a wake: the work offered meanwhile runs.
  EXPECT_TRUE(e.Resume());
  EXPECT_FALSE(e.Resume());
  ASSERT_TRUE(WaitUntil([&] { return w.taken == 5 && e.State() == EngineState::kIdle; }));
  const EngineStats s = e.GetStats();
  EXPECT_EQ(s.pauses, 1u);
  EXPECT_EQ(s.resumes, 1u);
  EXPECT_FALSE(s.paused);
  e.Stop();
}

// Paused during a step: the step ends on its own (Pause does not wait for
// it), the state says "pausing" until it does, then "paused"; no further
// step starts.
TEST(EngineTest, PausedDuringAStepItEndsAndNoOtherStarts) {
  TestWork w;
  w.hold = true;
  w.available = 4;
  Engine e;
  ASSERT_TRUE(e.Start(w.work(), "tfs-test").ok());
  ASSERT_TRUE(WaitUntil([&] { return w.in_step.load(); }));
  EXPECT_EQ(e.State(), EngineState::kRunning);
  EXPECT_TRUE(e.GetStats().running);
  EXPECT_TRUE(e.Pause());  // (returns with the step still held)
  EXPECT_EQ(e.State(), EngineState::kPausing);
  w.hold = false;
  w.release = true;
  ASSERT_TRUE(WaitUntil([&] { return e.GetStats().paused_looks >= 1 && e.State() == EngineState::kPaused; }));
  EXPECT_EQ(w.calls, 1) << "the step said kMore, but the engine is paused";
  EXPECT_EQ(w.taken, 1);
  EXPECT_FALSE(e.GetStats().running);
  e.Resume();
  ASSERT_TRUE(WaitUntil([&] { return w.taken == 4 && e.State() == EngineState::kIdle; }));
  e.Stop();
}

// kWait: the engine looks again after the wait without being woken (work
// that could not go: a busy destination), and counts the wait.
TEST(EngineTest, AWaitLooksAgainWithoutAWake) {
  TestWork w;
  w.script = {Step::WaitFor(2'000'000), Step::WaitFor(1)};
  w.available = 1;
  Engine e;
  ASSERT_TRUE(e.Start(w.work(), "tfs-test").ok());
  ASSERT_TRUE(WaitUntil([&] { return w.taken == 1 && e.State() == EngineState::kIdle; }));
  const EngineStats s = e.GetStats();
  EXPECT_EQ(s.waits, 2u);
  EXPECT_EQ(s.steps, 3u);
  EXPECT_EQ(s.wakes, 0u);
  e.Stop();
}

// While waiting, a wake runs the step at once (long before the deadline);
// a wait "forever" (kForever ns) does not wrap into a deadline passed.
TEST(EngineTest, AWakeEndsAWaitEarly) {
  TestWork w;
  w.script = {Step::WaitFor(3600ull * 1'000'000'000), Step::WaitFor(platform::kForever)};
  w.available = 1;
  Engine e;
  ASSERT_TRUE(e.Start(w.work(), "tfs-test").ok());
  ASSERT_TRUE(WaitUntil([&] { return e.State() == EngineState::kWaiting; }));
  e.Wake();
  ASSERT_TRUE(WaitUntil([&] { return w.calls == 2 && e.State() == EngineState::kWaiting; }));
  EXPECT_EQ(e.GetStats().steps, 2u) << "a wrapped deadline would have run it again";
  e.Wake();
  ASSERT_TRUE(WaitUntil([&] { return w.taken == 1 && e.State() == EngineState::kIdle; }));
  e.Stop();
}

TEST(EngineTest, StopJoinsASleepingAPausedAndARunningEngine) {
  {
    TestWork w;
    Engine e;
    ASSERT_TRUE(e.Start(w.work(), "tfs-test").ok());
    ASSERT_TRUE(WaitUntil([&] { return e.State() == EngineState::kIdle; }));
    e.Stop();
    EXPECT_EQ(e.State(), EngineState::kStopped);
  }
  {
    TestWork w;
    Engine e;
    ASSERT_TRUE(e.Start(w.work(), "tfs-test").ok());
    e.Pause();
    ASSERT_TRUE(WaitUntil([&] { return e.GetStats().paused_looks >= 1; }));
    e.Stop();
    EXPECT_EQ(e.State(), EngineState::kStopped);
  }
  {
    // Stop waits for the step it is in, and no other step starts.
    TestWork w;
    w.hold = true;
    w.available = 10;
    Engine e;
    ASSERT_TRUE(e.Start(w.work(), "tfs-test").ok());
    ASSERT_TRUE(WaitUntil([&] { return w.in_step.load(); }));
    std::atomic<bool> stopped{false};
    std::thread stopper([&] {
      e.Stop();
      stopped = true;
    });
    // Released once Stop has said so: the step's kMore must not start
    // another. (Stop cannot return while the step is held.)
    ASSERT_TRUE(WaitUntil([&] { return e.stopping(); }));
    EXPECT_FALSE(stopped.load());
    w.hold = false;
    w.release = true;
    stopper.join();
    EXPECT_TRUE(stopped.load());
    EXPECT_EQ(w.calls, 1);
    EXPECT_EQ(e.State(), EngineState::kStopped);
  }
}

// The engines' budgets are wired to wake them: the release that makes
// room after a refusal wakes every engine (a refused engine sleeps until
// then).
TEST(EngineTest, ABudgetsReleaseAfterARefusalWakesTheEngines) {
  Engines all;
  TestWork w;
  ASSERT_TRUE(all.get(EngineId::kCopygc).Start(w.work(), "tfs-test").ok());
  ASSERT_TRUE(WaitUntil([&] { return all.get(EngineId::kCopygc).State() == EngineState::kIdle; }));
  dev::ReadState healthy;
  healthy.ewma_ns = 1'000'000;
  Budget& b = all.budget(3);
  const u64 limit = b.GetStats().limit;
  ASSERT_GT(limit, 0u);
  for (u64 i = 0; i < limit; i++) ASSERT_EQ(b.Admit(4096, healthy), Budget::Verdict::kAdmitted);
  ASSERT_EQ(b.Admit(4096, healthy), Budget::Verdict::kBusy);
  EXPECT_EQ(all.get(EngineId::kReconcile).GetStats().wakes, 0u);
  b.Release(4096);
  for (u32 i = 0; i < kEngineCount; i++) EXPECT_EQ(all.get(EngineId(i)).GetStats().wakes, 1u) << i;
  // The running engine looked again: one more step, with nothing to do.
  ASSERT_TRUE(WaitUntil([&] { return w.calls == 2; }));
  for (u64 i = 1; i < limit; i++) b.Release(4096);
  all.StopAll();
}

TEST(EngineTest, EnginesPauseAndResumeByMask) {
  Engines all;
  all.Pause(1u << u32(EngineId::kPromote));
  EXPECT_FALSE(all.get(EngineId::kReconcile).paused());
  EXPECT_TRUE(all.get(EngineId::kPromote).paused());
  all.Pause(kAllEngines);
  for (u32 i = 0; i < kEngineCount; i++) EXPECT_TRUE(all.get(EngineId(i)).paused());
  all.Resume(1u << u32(EngineId::kCopygc));
  EXPECT_TRUE(all.get(EngineId::kReconcile).paused());
  EXPECT_FALSE(all.get(EngineId::kCopygc).paused());
  all.Resume(kAllEngines);
  for (u32 i = 0; i < kEngineCount; i++) EXPECT_FALSE(all.get(EngineId(i)).paused());
  all.StopAll();
}

}  // namespace
}  // namespace tfs::bg
