// Timer on one timerfd (see timer.h). The loop pops every due event under the lock,
// re-arms the timerfd for the next deadline, and runs the popped events unlocked.
// When nothing is due it blocks in read() on the timerfd; At() re-arms the timerfd
// when a new event is earlier than the armed deadline, which ends that read. An
// expiry that happens while the loop is busy stays pending in the timerfd, so no
// wake-up is ever lost.
#include "faultdevices/timer.h"

#include <sys/prctl.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace faultdev {

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

Timer::Timer() {
  tfd_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
  if (tfd_ < 0) {
    std::perror("faultdev: timerfd_create");
    std::abort();  // no timer, no fault device: nothing sensible to fall back to
  }
  thread_ = std::thread([this] { Loop(); });
}

Timer::~Timer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    Arm(1);  // expires at once
  }
  thread_.join();
  close(tfd_);
}

void Timer::Arm(uint64_t when_ns) {
  itimerspec its{};
  if (when_ns != UINT64_MAX) {
    if (when_ns == 0) when_ns = 1;  // 0 would disarm
    its.it_value.tv_sec = time_t(when_ns / 1'000'000'000ull);
    its.it_value.tv_nsec = long(when_ns % 1'000'000'000ull);
  }
  timerfd_settime(tfd_, TFD_TIMER_ABSTIME, &its, nullptr);
  armed_ = when_ns;
}

uint64_t Timer::Push(uint64_t when_ns, Fn fn) {
  uint64_t order = next_order_++;
  heap_.push(Event{when_ns, order, std::move(fn)});
  if (when_ns < armed_) Arm(when_ns);
  return order;
}

void Timer::At(uint64_t when_ns, Fn fn) {
  std::lock_guard<std::mutex> lock(mu_);
  Push(when_ns, std::move(fn));
}

uint64_t Timer::AtCancellable(uint64_t when_ns, Fn fn) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = Push(when_ns, std::move(fn));
  cancellable_.insert(id);
  return id;
}

bool Timer::Cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancellable_.erase(id) == 0) return false;
  // The heap cannot remove from the middle: the event stays until due, then is
  // dropped unrun.
  cancelled_.insert(id);
  return true;
}

size_t Timer::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return heap_.size();
}

void Timer::Sync() {
  // A marker event due now runs after every event due before it.
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  At(NowNs(), [&] {
    std::lock_guard<std::mutex> lock(m);
    done = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(m);
  cv.wait(lock, [&] { return done; });
}

void Timer::Loop() {
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // hrtimer precision, not the 50 us default
  std::vector<Event> due;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      uint64_t now = NowNs();
      while (!heap_.empty() && heap_.top().when <= now) {
        // priority_queue::top is const; the event is popped right after the move.
        uint64_t order = heap_.top().order;
        if (!cancelled_.empty() && cancelled_.erase(order) != 0) {
          heap_.pop();
          continue;
        }
        if (!cancellable_.empty()) cancellable_.erase(order);  // started: too late to cancel
        due.push_back(std::move(const_cast<Event&>(heap_.top())));
        heap_.pop();
      }
      Arm(heap_.empty() ? UINT64_MAX : heap_.top().when);
    }
    if (!due.empty()) {
      for (Event& e : due) e.fn();
      due.clear();
      continue;  // new events may have become due while these ran
    }
    uint64_t expirations;
    ssize_t n = read(tfd_, &expirations, sizeof(expirations));
    if (n < 0 && errno != EINTR && errno != EAGAIN) {
      std::perror("faultdev: timerfd read");
      std::abort();
    }
  }
}

}  // namespace faultdev
