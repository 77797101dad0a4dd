// The open-loop engine (see runner.h). Threads share nothing on the hot path but
// the Workspace (pread/pwrite on one fd) and, once per second, the TimeSeries;
// their histograms are merged after they join.
#include "workloads/probe/runner.h"

#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "workloads/probe/schedule.h"

namespace tfs::probe {
namespace {

constexpr uint64_t kSecond = 1'000'000'000;
constexpr uint64_t kLateNs = 1'000'000;

uint64_t ClockNs(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * kSecond + uint64_t(ts.tv_nsec);
}

void SleepUntil(uint64_t monotonic_ns) {
  struct timespec ts;
  ts.tv_sec = time_t(monotonic_ns / kSecond);
  ts.tv_nsec = long(monotonic_ns % kSecond);
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

struct ThreadOut {
  std::array<OpHistograms, kOpTypes> ops;
  uint64_t ops_warmup = 0;
  uint64_t ops_measured = 0;
  uint64_t last_measured_done = 0;  // monotonic ns
  std::unique_ptr<Histogram> lag = std::make_unique<Histogram>();
  uint64_t late_ops = 0;
  uint64_t backlog_at_end = 0;
  uint64_t injected_delays = 0;
  std::array<uint64_t, kOpTypes> errors{};
  bool stalled = false;
};

struct Shared {
  const ProbeSpec* spec;
  Workspace* ws;
  TimeSeries* series;
  uint64_t start;  // monotonic ns of the schedule's time zero
  std::atomic<bool> stop{false};
  std::mutex error_mu;  // guards error; held only to set it
  std::string error;
};

// One thread's part of the schedule: `threads` threads share `rate`, this one is
// `index` among them; `op` < 0 picks each op from the mix, else always runs op.
struct Lane {
  int op = -1;
  double rate = 0;
  int threads = 1;
  int index = 0;
  uint64_t seed = 1;
  double phase = 0;  // Schedule's phase: lanes of equal rate are staggered
};

// `slot`: the thread's index among all of them (its files, its series slot).
void ProbeThread(Shared& sh, int slot, const Lane& lane, ThreadOut& out) {
  const ProbeSpec& spec = *sh.spec;
  const int index = slot;
  // The default 50 us timer slack would make every wake-up late by up to 50 us and
  // charge that to the filesystem; ask for the tightest wake-ups the kernel gives.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  Schedule schedule(spec.arrivals, lane.rate, lane.threads, lane.index, lane.seed, lane.phase);
  OpContext ctx(slot, spec.seed);
  std::discrete_distribution<int> pick(spec.mix.begin(), spec.mix.end());
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const uint64_t end = spec.warmup_ns + spec.duration_ns;
  const uint64_t stall_from = spec.inject_stall ? sh.start + spec.inject_stall->at_ns : 0;
  const uint64_t stall_to = spec.inject_stall ? stall_from + spec.inject_stall->length_ns : 0;
  auto second_hist = std::make_unique<Histogram>();
  uint64_t cur_second = 0;

  while (!sh.stop.load(std::memory_order_relaxed)) {
    uint64_t t = schedule.Next();
    if (t >= end) break;
    uint64_t intended = sh.start + t;
    if (spec.spin_ns > 0) {
      // Sleep to just before the intended start, then poll the clock: trades CPU
      // for a wake-up lag of a few microseconds instead of the timer's tens.
      SleepUntil(intended - std::min(intended, spec.spin_ns));
      while (MonotonicNs() < intended) {
      }
    } else {
      SleepUntil(intended);
    }
    if (spec.inject_stall) {
      uint64_t now = MonotonicNs();
      if (now >= stall_from && now < stall_to) {
        SleepUntil(stall_to);
        out.stalled = true;
      }
    }
    OpType op = static_cast<OpType>(lane.op >= 0 ? lane.op : pick(ctx.rng()));
    std::string what;
    uint64_t actual = MonotonicNs();
    int err = sh.ws->Run(op, ctx, &what);
    if (spec.inject_delay && (!spec.inject_delay->op || *spec.inject_delay->op == op) &&
        unit(ctx.rng()) < spec.inject_delay->fraction) {
      SleepUntil(MonotonicNs() + spec.inject_delay->delay_ns);
      out.injected_delays++;
    }
    uint64_t done = MonotonicNs();
    const bool measured = t >= spec.warmup_ns;
    if (err != 0) {
      std::lock_guard<std::mutex> lock(sh.error_mu);
      // With --keep-going only a measured failure is reported (a warm-up one is
      // neither counted nor named).
      if (sh.error.empty() && (!spec.keep_going || measured)) {
        sh.error = std::string(OpName(op)) + " op failed in " + sh.ws->path() + ": " + what +
                   ": " + std::strerror(err);
      }
      if (!spec.keep_going) {
        sh.stop = true;
        break;
      }
      if (measured) out.errors[size_t(op)]++;
    }
    uint64_t latency = done - intended;
    uint64_t service = done - actual;
    uint64_t lag = actual > intended ? actual - intended : 0;
    out.lag->Record(lag);
    if (lag > kLateNs) out.late_ops++;
    if (actual > sh.start + end + kLateNs) out.backlog_at_end++;

    uint64_t second = t / kSecond;
    if (second != cur_second) {
      sh.series->Add(cur_second, *second_hist);
      second_hist->Reset();
      cur_second = second;
      sh.series->Advance(index, second);
    }
    if (err != 0) continue;  // kept going: in the lag and the series' seconds, in no histogram
    second_hist->Record(latency);

    if (measured) {
      out.ops[int(op)].latency->Record(latency);
      out.ops[int(op)].service->Record(service);
      out.ops_measured++;
      out.last_measured_done = std::max(out.last_measured_done, done);
    } else {
      out.ops_warmup++;
    }
  }
  sh.series->Add(cur_second, *second_hist);
  sh.series->Advance(index, UINT64_MAX);
}

}  // namespace

uint64_t MonotonicNs() { return ClockNs(CLOCK_MONOTONIC); }
uint64_t RealtimeNs() { return ClockNs(CLOCK_REALTIME); }

bool RunProbe(const ProbeSpec& spec, Workspace& ws, RunResult* result, std::string* error) {
  const uint64_t total_ns = spec.warmup_ns + spec.duration_ns;
  std::vector<Lane> lanes;
  if (spec.lane_per_op) {
    double sum = 0;
    int nops = 0;
    for (double w : spec.mix) {
      sum += w;
      nops += w > 0 ? 1 : 0;
    }
    int j = 0;  // the lane's place among the ops' lanes
    for (int k = 0; k < kOpTypes; k++) {
      if (!(spec.mix[size_t(k)] > 0)) continue;
      for (int i = 0; i < spec.threads; i++) {
        // Each lane its own arrival stream (seed), so Poisson lanes are independent,
        // and its own phase, so constant lanes of equal rate do not arrive together.
        lanes.push_back(Lane{k, spec.rate * spec.mix[size_t(k)] / sum, spec.threads, i,
                             spec.seed + 0x9e3779b97f4a7c15ull * uint64_t(k + 1), double(j) / nops});
      }
      j++;
    }
  } else {
    for (int i = 0; i < spec.threads; i++) lanes.push_back(Lane{-1, spec.rate, spec.threads, i, spec.seed, 0});
  }
  const int nthreads = int(lanes.size());
  TimeSeries series(nthreads);
  Shared sh;
  sh.spec = &spec;
  sh.ws = &ws;
  sh.series = &series;
  // Time zero a little in the future so every thread is waiting when it arrives.
  sh.start = MonotonicNs() + 20'000'000;
  result->start_unix_ns = RealtimeNs() + 20'000'000;

  std::vector<ThreadOut> outs(static_cast<size_t>(nthreads));
  std::vector<std::thread> threads;
  for (int i = 0; i < nthreads; i++) {
    threads.emplace_back([&sh, &outs, &lanes, i] { ProbeThread(sh, i, lanes[size_t(i)], outs[size_t(i)]); });
  }
  for (auto& t : threads) t.join();
  result->end_unix_ns = RealtimeNs();
  if (!sh.error.empty() && !spec.keep_going) {
    *error = sh.error;
    return false;
  }
  result->first_error = sh.error;

  uint64_t last_done = 0;
  for (auto& o : outs) {
    for (int k = 0; k < kOpTypes; k++) {
      result->ops[k].latency->Merge(*o.ops[k].latency);
      result->ops[k].service->Merge(*o.ops[k].service);
    }
    result->ops_warmup += o.ops_warmup;
    result->ops_measured += o.ops_measured;
    result->lag->Merge(*o.lag);
    result->late_ops += o.late_ops;
    result->backlog_at_end += o.backlog_at_end;
    result->injected_delays += o.injected_delays;
    for (int k = 0; k < kOpTypes; k++) result->errors[size_t(k)] += o.errors[size_t(k)];
    result->stalled_threads += o.stalled ? 1 : 0;
    last_done = std::max(last_done, o.last_measured_done);
  }
  uint64_t measured_start = sh.start + spec.warmup_ns;
  uint64_t elapsed = last_done > measured_start ? last_done - measured_start : 0;
  result->measured_elapsed_ns = std::max(elapsed, spec.duration_ns);
  result->max_lag_ns = result->lag->max();
  result->achieved_rate = double(result->ops_measured) * 1e9 / double(result->measured_elapsed_ns);
  result->series = series.Finish((total_ns + kSecond - 1) / kSecond);
  return true;
}

}  // namespace tfs::probe
