// The open-loop engine: runs a ProbeSpec against a Workspace and collects
// histograms, the per-second series and counters.
//
// Each thread follows its own Schedule. It sleeps until an operation's intended
// start; when it is already late (the previous operation ran long, or the machine
// stalled) it issues at once and never skips. Every operation records two times:
// latency = completion - intended start (what a user with that arrival rate sees;
// a stall is charged to every operation it delays) and service = completion -
// actual start (what the filesystem took for that one call). Operations intended
// during the warm-up go to the time series only.
//
// The engine reports how far behind schedule it fell: a probe that cannot keep up
// has become closed-loop and would understate stalls, so the start lags, the
// backlog left at the end of the schedule and the achieved rate are part of the
// result, and the caller warns when the probe fell behind (see FellBehind).
#ifndef TFS_WORKLOADS_PROBE_RUNNER_H_
#define TFS_WORKLOADS_PROBE_RUNNER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "util/histogram.h"
#include "workloads/probe/ops.h"
#include "workloads/probe/series.h"
#include "workloads/probe/spec.h"

namespace tfs::probe {

struct OpHistograms {
  std::unique_ptr<Histogram> latency = std::make_unique<Histogram>();
  std::unique_ptr<Histogram> service = std::make_unique<Histogram>();
};

struct RunResult {
  std::array<OpHistograms, kOpTypes> ops;  // measured phase only
  std::vector<SeriesPoint> series;          // every second, warm-up included
  uint64_t ops_warmup = 0;
  uint64_t ops_measured = 0;
  uint64_t measured_elapsed_ns = 0;  // from the measured phase's start to its last completion
  double achieved_rate = 0;          // ops_measured / measured_elapsed
  uint64_t max_lag_ns = 0;           // largest actual-start minus intended-start
  // Actual start minus intended start of every operation (warm-up included): the
  // probe's own wake-up overhead when on time, the backlog when behind.
  std::unique_ptr<Histogram> lag = std::make_unique<Histogram>();
  uint64_t late_ops = 0;             // operations issued more than 1 ms late
  // Operations scheduled before the end of the schedule (warm-up + duration) but
  // issued more than 1 ms after it: the backlog the probe had not worked off.
  uint64_t backlog_at_end = 0;
  uint64_t injected_delays = 0;
  uint64_t stalled_threads = 0;      // threads that served the injected stall
  // --keep-going: failed ops (not in the histograms), per op, and the first one's message.
  std::array<uint64_t, kOpTypes> errors{};
  std::string first_error;
  uint64_t start_unix_ns = 0;        // wall clock at the schedule's time zero
  uint64_t end_unix_ns = 0;
};

// A run "fell behind" when, at the end of its schedule, more than this fraction of
// its measured operations were still waiting to be issued (backlog_at_end): the
// probe could not keep up with its arrivals and was, for part of the run,
// closed-loop. This asks about start times, not throughput: the number of Poisson
// arrivals is itself random (about +-2% at 2000 operations), and the last
// operation's duration stretches the elapsed time, so an achieved rate below the
// target says nothing about keeping the schedule. A stall the probe recovers from
// before the end is not falling behind (its wait is charged to every operation
// it delayed, and shows in late_ops and max_lag_ns).
inline constexpr double kMaxBacklogFraction = 0.01;

// True when `result` fell behind its schedule (see kMaxBacklogFraction).
inline bool FellBehind(const RunResult& result) {
  return double(result.backlog_at_end) > kMaxBacklogFraction * double(result.ops_measured);
}

// Runs the probe. False with a one-line error when an operation fails (the run
// stops at the first failure: results with failed operations are not latency
// data) -- unless spec.keep_going: then failures are counted in result->errors,
// the first measured one is in result->first_error, and the run goes on.
bool RunProbe(const ProbeSpec& spec, Workspace& ws, RunResult* result, std::string* error);

uint64_t MonotonicNs();
uint64_t RealtimeNs();

}  // namespace tfs::probe

#endif  // TFS_WORKLOADS_PROBE_RUNNER_H_
