// Per-second time series (see series.h). A second is summarised as soon as the
// slowest thread has advanced past it; Finish() summarises the rest and fills
// seconds that saw no operation with empty points so the series has no gaps.
#include "workloads/probe/series.h"

#include <algorithm>

namespace tfs::probe {

TimeSeries::TimeSeries(int threads) : low_(size_t(threads), 0) {}

void TimeSeries::Add(uint64_t second, const Histogram& h) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = open_[second];
  if (!slot) slot = std::make_unique<Histogram>();
  slot->Merge(h);
}

void TimeSeries::Advance(int thread, uint64_t second) {
  std::lock_guard<std::mutex> lock(mu_);
  low_[size_t(thread)] = std::max(low_[size_t(thread)], second);
  Summarise(*std::min_element(low_.begin(), low_.end()));
}

void TimeSeries::Summarise(uint64_t below) {
  while (!open_.empty() && open_.begin()->first < below) {
    const Histogram& h = *open_.begin()->second;
    SeriesPoint p;
    p.second = open_.begin()->first;
    p.count = h.count();
    p.p50_ns = h.Quantile(50, 100);
    p.p99_ns = h.Quantile(99, 100);
    p.p999_ns = h.Quantile(999, 1000);
    p.max_ns = h.max();
    done_[p.second] = p;
    open_.erase(open_.begin());
  }
}

std::vector<SeriesPoint> TimeSeries::Finish(uint64_t seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  Summarise(UINT64_MAX);
  std::vector<SeriesPoint> out;
  for (uint64_t s = 0; s < seconds; s++) {
    auto it = done_.find(s);
    if (it != done_.end()) {
      out.push_back(it->second);
    } else {
      SeriesPoint empty;
      empty.second = s;
      out.push_back(empty);
    }
  }
  return out;
}

}  // namespace tfs::probe
