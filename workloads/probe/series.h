// Per-second time series of operation latency, so a stall shows up in time and not
// only as a fatter tail.
//
// Operations are placed in the second of their *intended* start, so an operation a
// stall held back for a second is charged to the second it should have run in. Each
// probe thread keeps one histogram for its current second and hands it over when
// its schedule moves on; the series merges threads' histograms and turns a second
// into a summary point (count, p50, p99, p99.9, max) once every thread has moved
// past it. Memory therefore stays at a few histograms however long the run is.
//
// Thread-safe: Add/Advance may be called from any probe thread. The mutex guards
// only in-memory maps; nothing under it touches the filesystem under test.
#ifndef TFS_WORKLOADS_PROBE_SERIES_H_
#define TFS_WORKLOADS_PROBE_SERIES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "util/histogram.h"

namespace tfs::probe {

struct SeriesPoint {
  uint64_t second = 0;  // since the start of the run (warm-up included)
  uint64_t count = 0;
  uint64_t p50_ns = 0;
  uint64_t p99_ns = 0;
  uint64_t p999_ns = 0;
  uint64_t max_ns = 0;
};

class TimeSeries {
 public:
  explicit TimeSeries(int threads);

  // Adds one thread's latencies for `second` (merged with other threads').
  void Add(uint64_t second, const Histogram& h);
  // Thread `thread` will report no second below `second` again.
  void Advance(int thread, uint64_t second);
  // All threads are done: summarises what is left and returns every second from 0
  // to `seconds` - 1 (a second without operations has count 0).
  std::vector<SeriesPoint> Finish(uint64_t seconds);

 private:
  void Summarise(uint64_t below);  // requires mu_

  std::mutex mu_;  // guards everything below
  std::map<uint64_t, std::unique_ptr<Histogram>> open_;
  std::vector<uint64_t> low_;  // per thread: lowest second it may still report
  std::map<uint64_t, SeriesPoint> done_;
};

}  // namespace tfs::probe

#endif  // TFS_WORKLOADS_PROBE_SERIES_H_
