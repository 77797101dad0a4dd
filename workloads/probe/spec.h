// What one tierprobe run does: the operation mix, the arrival schedule, the phases
// and the injected faults, parsed from the command line's small text specs.
//
// Everything here is plain data plus parsers that turn text into it. Parsers never
// throw and never print: they return false and fill a one-line error that the
// command line prints as is, so "bad spec" is a clear message, not a crash. Units
// are explicit on input ("250ms", "64M") and nanoseconds/bytes inside.
//
// The op names are the probe's vocabulary and appear unchanged as keys in the
// results JSON (results/schema/), so renaming one is a schema change.
#ifndef TFS_WORKLOADS_PROBE_SPEC_H_
#define TFS_WORKLOADS_PROBE_SPEC_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tfs::probe {

enum class OpType : int {
  kRead = 0,     // 4 KiB pread at a random aligned offset of the data file
  kWrite,        // 4 KiB pwrite at a random aligned offset
  kFsync,        // 4 KiB pwrite, then fsync
  kFdatasync,    // 4 KiB pwrite, then fdatasync
  kStat,         // stat of a random small file
  kReaddir,      // opendir + read every entry + closedir of a small directory
  kOpenRead,     // open, read 4 KiB, close of a random small file
  kCreate,       // create a new file, close it, unlink it
  kCreateSync,   // create a new file, fsync it and its directory, close, unlink:
                 // a metadata-only durable commit (no data to place)
};
inline constexpr int kOpTypes = 9;

// Name used on the command line and in the results ("read", "fsync", ...).
std::string_view OpName(OpType op);
std::optional<OpType> OpFromName(std::string_view name);

// Relative weights per op type; at least one is positive.
using Mix = std::array<double, kOpTypes>;

enum class Arrivals { kConstant, kPoisson };

// A fixed delay added inside a fraction of operations (the planted slowdown of an
// A/B check): counted in both latency and service time.
struct InjectDelay {
  uint64_t delay_ns = 0;
  double fraction = 0;
  std::optional<OpType> op;  // only this op (DELAY:FRACTION:OP); all ops if unset
};

// A pause of every probe thread before it issues its next operation, `at_ns` after
// the start, for `length_ns`: a stall outside the operations, the way a frozen
// filesystem or machine looks to an open-loop client. Service times do not see it;
// latencies from the intended start do.
struct InjectStall {
  uint64_t at_ns = 0;
  uint64_t length_ns = 0;
};

struct ProbeSpec {
  std::string dir;
  double rate = 0;            // target ops/s over all threads
  uint64_t duration_ns = 0;   // measured phase
  uint64_t warmup_ns = 0;     // excluded from the histograms, kept in the time series
  Mix mix{};
  std::string mix_text;
  Arrivals arrivals = Arrivals::kConstant;
  int threads = 1;
  // Each op of the mix gets its own `threads` threads at its share of the rate,
  // so an op that hangs (a commit frozen behind a stalled device) delays only
  // its own later arrivals, not the other ops' -- whose latencies then say
  // whether they wait too.
  bool lane_per_op = false;
  // A failed op is counted (errors, errors_OP) and the run goes on, instead of
  // ending the run with the error: for runs whose point is to see what fails.
  bool keep_going = false;
  uint64_t working_set = 64ull << 20;  // bytes of the data file
  int small_files = 256;               // files for stat / open-read-close
  int dir_entries = 32;                // entries of the readdir directory
  bool direct = false;                 // O_DIRECT on the data file
  uint64_t spin_ns = 0;                // busy-wait this long before each start
  uint64_t seed = 1;
  std::optional<InjectDelay> inject_delay;
  std::optional<InjectStall> inject_stall;
};

// "read=40,write=20,fsync=5": weights by op name; omitted ops get 0.
bool ParseMix(std::string_view text, Mix* mix, std::string* error);
// "1.5s", "250ms", "40us", "100ns", "2min"; a bare number is seconds.
bool ParseDuration(std::string_view text, uint64_t* ns, std::string* error);
// "4096", "64K", "64M", "2G" (powers of 1024).
bool ParseSize(std::string_view text, uint64_t* bytes, std::string* error);
// "2ms:0.01": add 2 ms to 1% of operations.
bool ParseInjectDelay(std::string_view text, InjectDelay* out, std::string* error);
// "5s:1s": at 5 s after the start, stall for 1 s.
bool ParseInjectStall(std::string_view text, InjectStall* out, std::string* error);
bool ParseArrivals(std::string_view text, Arrivals* out, std::string* error);

// The default mix: every op type, reads and writes most.
Mix DefaultMix();
std::string MixToString(const Mix& mix);

// Cross-field checks (rate, duration, threads, sizes); false with a message.
bool Validate(const ProbeSpec& spec, std::string* error);

}  // namespace tfs::probe

#endif  // TFS_WORKLOADS_PROBE_SPEC_H_
