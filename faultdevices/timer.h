// Timer: the one timing mechanism of a fault device.
//
// A single thread sleeps on one timerfd (CLOCK_MONOTONIC, absolute expiry, timer
// slack 1 ns) armed for the earliest pending event, and runs every due event in
// deadline order. There is never a thread per request and never a busy-wait: a
// device with 10 000 delayed requests still has one sleeping thread. Measured
// lateness is tens of microseconds (see docs/faultdevices.md), well inside the
// 0.2 ms median the models promise.
//
// Events run on the timer thread with no Timer lock held; they may schedule more
// events. Events due at the same instant run in the order they were scheduled.
//
// Thread safety: At() and Post() from any thread, including from inside an event.
// The destructor drops every event not yet run (their owners must not need them
// any more) and joins the thread; it must not be called from an event.
#ifndef TFS_FAULTDEVICES_TIMER_H_
#define TFS_FAULTDEVICES_TIMER_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <unordered_set>
#include <vector>

namespace faultdev {

// Monotonic nanoseconds (the same clock as tfs::platform::NowNs).
uint64_t NowNs();

class Timer {
 public:
  using Fn = std::function<void()>;

  Timer();
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Runs `fn` on the timer thread at `when_ns` (NowNs() clock); at once if past.
  void At(uint64_t when_ns, Fn fn);
  // Same, but the event can be cancelled with the returned id.
  uint64_t AtCancellable(uint64_t when_ns, Fn fn);
  // Drops an AtCancellable event. True if it had not started and now never will
  // (its owner may release what it holds for it); false if it has run or is
  // about to run (it will run to the end). Never waits for a running event.
  bool Cancel(uint64_t id);
  // Runs `fn` on the timer thread as soon as possible.
  void Post(Fn fn) { At(0, std::move(fn)); }
  // Events scheduled and not yet run.
  size_t pending() const;
  // Blocks until every event due at or before the call has run (for tests).
  void Sync();

 private:
  struct Event {
    uint64_t when;
    uint64_t order;
    Fn fn;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.when != b.when ? a.when > b.when : a.order > b.order;
    }
  };

  void Loop();
  void Arm(uint64_t when_ns);  // caller holds mu_

  int tfd_ = -1;
  uint64_t Push(uint64_t when_ns, Fn fn);  // caller holds mu_; returns the order

  // mu_ guards heap_, next_order_, armed_, stop_ and the two id sets; never held
  // while an event runs.
  mutable std::mutex mu_;
  std::priority_queue<Event, std::vector<Event>, Later> heap_;
  uint64_t next_order_ = 0;
  uint64_t armed_ = UINT64_MAX;
  bool stop_ = false;
  std::unordered_set<uint64_t> cancellable_;  // AtCancellable events still in heap_
  std::unordered_set<uint64_t> cancelled_;    // cancelled, still in heap_ until due
  std::thread thread_;
};

}  // namespace faultdev

#endif  // TFS_FAULTDEVICES_TIMER_H_
