// Arrival schedule of one probe thread: the intended start time of each operation,
// decided in advance and independent of how long earlier operations took. That
// independence is what makes the probe open-loop: when the filesystem stalls, the
// schedule does not slow down with it, so every operation the stall delays is
// charged the delay (no coordinated omission).
//
// With N threads each thread runs rate/N: constant arrivals are staggered by 1/rate
// between threads so the merged stream is evenly spaced; Poisson arrivals draw
// exponential gaps from a per-thread seeded generator, and the merge of independent
// Poisson streams is again Poisson at the full rate. Not thread-safe: one per thread.
#ifndef TFS_WORKLOADS_PROBE_SCHEDULE_H_
#define TFS_WORKLOADS_PROBE_SCHEDULE_H_

#include <cstdint>
#include <random>

#include "workloads/probe/spec.h"

namespace tfs::probe {

class Schedule {
 public:
  // `phase` in [0, 1) shifts a constant schedule by that share of the gap between
  // consecutive threads' starts (lanes use it so that lanes of equal rate do not
  // all arrive at the same instants).
  Schedule(Arrivals arrivals, double rate, int threads, int thread_index, uint64_t seed, double phase = 0);

  // Intended start of the next operation, in ns after the run's start. Increasing.
  uint64_t Next();

 private:
  Arrivals arrivals_;
  double interval_ns_;  // mean gap between this thread's operations
  double offset_ns_;    // constant: this thread's stagger
  uint64_t index_ = 0;  // constant: operations handed out so far
  double poisson_t_ = 0;
  std::mt19937_64 rng_;
  std::exponential_distribution<double> gap_;
};

}  // namespace tfs::probe

#endif  // TFS_WORKLOADS_PROBE_SCHEDULE_H_
