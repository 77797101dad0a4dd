// Arrival schedules (see schedule.h). The constant schedule computes t_k = offset +
// k * interval from k rather than summing gaps, so it does not drift over long runs.
#include "workloads/probe/schedule.h"

#include <cmath>

namespace tfs::probe {

Schedule::Schedule(Arrivals arrivals, double rate, int threads, int thread_index, uint64_t seed, double phase)
    : arrivals_(arrivals),
      interval_ns_(1e9 * threads / rate),
      offset_ns_(1e9 * (thread_index + phase) / rate),
      rng_(seed * 0x9E3779B97F4A7C15ull + uint64_t(thread_index) + 1),
      gap_(1.0) {}

uint64_t Schedule::Next() {
  if (arrivals_ == Arrivals::kConstant) {
    double t = offset_ns_ + double(index_++) * interval_ns_;
    return uint64_t(std::llround(t));
  }
  poisson_t_ += gap_(rng_) * interval_ns_;
  return uint64_t(std::llround(poisson_t_));
}

}  // namespace tfs::probe
