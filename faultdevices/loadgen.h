// LoadGen: a synthetic closed-loop load for `faultdev run` and the benchmark.
//
// Keeps `qd` requests in flight until `ops` have completed. The sequence of
// requests (kind, offset, and the bytes each write carries) is fixed by the seed
// and submitted in sequence order, so two runs with the same seed issue the same
// writes in the same order -- which is what makes a recorded power cut
// replayable. Latency is measured by the caller, from Submit() to callback.
//
// Patterns: randread, randwrite, seqread, seqwrite, mixed (70% random reads, 30%
// random writes, a flush after every 64 writes).
//
// Thread safety: Run() blocks its thread; callbacks may come from any thread.
#ifndef TFS_FAULTDEVICES_LOADGEN_H_
#define TFS_FAULTDEVICES_LOADGEN_H_

#include <cstdint>
#include <optional>
#include <string>

#include "platform/block_device.h"
#include "userspace/util/json.h"
#include "util/histogram.h"

namespace faultdev {

enum class Pattern { kRandRead, kRandWrite, kSeqRead, kSeqWrite, kMixed };
std::optional<Pattern> ParsePattern(const std::string& name);
const char* PatternName(Pattern p);

struct LoadOptions {
  Pattern pattern = Pattern::kRandRead;
  uint64_t ops = 1000;
  uint32_t qd = 1;
  uint32_t block = 4096;
  uint64_t span = 0;  // bytes of the device to touch (0 = all)
  uint64_t seed = 1;
  tfs::IoOrigin origin = tfs::IoOrigin::kOther;
};

struct LoadResult {
  uint64_t completed = 0;
  uint64_t errors = 0;
  uint64_t reads = 0, writes = 0, flushes = 0;
  double seconds = 0;
  tfs::Histogram latency_ns;  // as the client saw it
  void Write(tfs::userspace::JsonWriter& w) const;  // one JSON object
};

// Runs the load to completion. The device's logical block size must divide `block`.
LoadResult RunLoad(tfs::BlockDevice& dev, const LoadOptions& options);

// The bytes write number `index` of a load with `seed` carries (deterministic).
void FillWriteData(uint64_t seed, uint64_t index, uint8_t* buf, uint64_t len);

}  // namespace faultdev

#endif  // TFS_FAULTDEVICES_LOADGEN_H_
