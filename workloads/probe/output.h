// Renders one probe run as a results document (results/schema/run-v1.schema.json):
// the manifest that says what ran where, and the measurements: per-op latency and
// service-time histograms (only non-empty buckets, as [low, high, count] in ns),
// the per-second series, the phases, throughput and counters.
//
// Every quantile the document states (p50, p99, ...) is computed by tfs::Histogram
// from the same buckets it serialises, so a reader that recomputes quantiles from
// the buckets with the same rule gets the same numbers (tested in Python).
#ifndef TFS_WORKLOADS_PROBE_OUTPUT_H_
#define TFS_WORKLOADS_PROBE_OUTPUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "util/histogram.h"
#include "workloads/probe/host.h"
#include "userspace/util/json.h"
#include "workloads/probe/runner.h"
#include "workloads/probe/spec.h"

namespace tfs::probe {

using userspace::JsonWriter;

// Manifest fields that come from the caller, not from the run itself.
struct RunMeta {
  std::string arm = "other";  // active | control | other
  std::optional<int64_t> pair;
  std::optional<int64_t> boot;
  std::string fault_profile = "none";
  std::string device_layout;  // free text; empty = not stated
  std::vector<std::pair<std::string, std::string>> labels;
  std::vector<std::string> argv;
};

// Writes a histogram object ({"unit": "ns", "count": ..., "buckets": [...]}).
void WriteHistogram(JsonWriter& w, const Histogram& h);

std::string RenderResults(const ProbeSpec& spec, const RunMeta& meta, const HostInfo& host,
                          const MountInfo& mount, const RunResult& result);

}  // namespace tfs::probe

#endif  // TFS_WORKLOADS_PROBE_OUTPUT_H_
