// Profile: the parameters of a fault device, as read from a TOML file.
//
// A profile stacks models; every section is optional and absent means "off":
// [delay] fixed latency + jitter, [hdd] (+ [smr]) a mechanical drive with an NCQ
// queue, [bandwidth] a MB/s cap, [queue] host-side request slots, [stall] periodic or
// scripted stalls, [timeout] one chosen request that hangs and fails, [[errors]] EIO
// on byte ranges, [cache] a volatile write cache with power cut. docs/faultdevices.md
// documents every key with its unit and default.
//
// Loading never throws and never crashes on bad input: every problem comes back as
// one line "FILE:LINE: KEY: what is wrong" (or "FILE: ..." when there is no line).
// Overrides ("timeout.duration_s=1") are parsed as TOML too and merged over the
// file, so tests can shorten a shipped profile instead of copying it.
//
// A profile may start from another: `base = "hdd-7200"` takes that profile's
// values first (NAME.toml beside the file, else in the shipped directory).
//
// Plain data, no threads: copy freely.
#ifndef TFS_FAULTDEVICES_PROFILE_H_
#define TFS_FAULTDEVICES_PROFILE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "platform/block_device.h"

namespace faultdev {

enum class Jitter { kNone, kUniform, kExponential };

// Per operation type: read, write, flush, discard (indexed by tfs::IoOp).
struct DelayModel {
  uint64_t base_ns[4] = {};
  uint64_t jitter_ns[4] = {};  // uniform: [0, j]; exponential: mean j
  Jitter jitter = Jitter::kNone;
};

struct HddModel {
  double rpm = 7200;
  uint64_t track_to_track_ns = 1'000'000;
  uint64_t average_seek_ns = 8'500'000;
  uint64_t full_stroke_seek_ns = 16'000'000;
  double outer_mb_s = 250;   // sustained transfer rate at the first LBA (1 MB = 1e6 bytes)
  double inner_mb_s = 120;   // ... and at the last
  uint64_t command_overhead_ns = 100'000;
  uint32_t ncq_depth = 32;
  uint64_t max_queue_wait_ns = 500'000'000;  // NCQ aging: older requests go first
  uint64_t write_cache_bytes = 0;  // drive DRAM write-back cache (timing only); 0 = write-through
  double interface_mb_s = 550;     // host link speed, for cache-hit acknowledgements
};

struct SmrModel {
  uint64_t media_cache_bytes = 0;
  double media_cache_percent = 0;  // if set: this share of the device (real drives ~1%)
  uint64_t band_bytes = 32 << 20;
  double high_water = 0.8;          // fraction of the media cache: cleaning takes priority
  uint64_t idle_clean_after_ns = 1'000'000'000;  // idle this long -> clean bands
  uint64_t clean_overhead_ns = 20'000'000;       // per band: seeks, rotation, merge
};

struct BandwidthModel {
  double mb_s = 0;  // 0 = unlimited
};

struct QueueModel {
  uint32_t max_in_flight = 0;  // 0 = unlimited
};

struct StallWindow {
  uint64_t at_ns = 0;
  uint64_t duration_ns = 0;
};

struct StallModel {
  uint64_t period_ns = 0;  // 0 = no periodic stall
  uint64_t duration_ns = 0;
  uint64_t offset_ns = 0;  // first periodic stall starts here (after open)
  std::vector<StallWindow> scripted;
};

struct TimeoutModel {
  bool enabled = false;
  uint64_t after_requests = 0;  // the Nth admitted request (1-based); 0 = not by count
  std::optional<uint64_t> offset;  // first data request covering this byte
  std::optional<uint64_t> at_ns;   // first request admitted at or after this time
  uint64_t duration_ns = 30'000'000'000ull;
  bool link_reset = false;  // on expiry, everything in flight fails too
  uint32_t count = 1;       // how many requests time out
};

enum class ErrorMode { kPersistent, kOnce, kRate };

struct ErrorRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool reads = true;
  bool writes = false;
  ErrorMode mode = ErrorMode::kPersistent;
  double rate = 1.0;  // kRate: probability per matching request
};

struct CacheModel {
  bool enabled = false;
  uint64_t size_bytes = 64 << 20;
  double keep = 0.34, drop = 0.33, tear = 0.33;  // power-cut fate of each unflushed write
  std::optional<uint64_t> powercut_at_ns;
  uint64_t powercut_after_writes = 0;  // 0 = never
  // Cut when the Nth flush arrives (0 = never): no write-back starts after it
  // (one already running finishes first), and what the flush would have made
  // durable meets its keep/drop/tear fate.
  uint64_t powercut_at_flush = 0;
  // Count only this origin's writes and flushes for the two triggers above
  // ("btree": a cut in the middle of a checkpoint); unset = every request.
  std::optional<tfs::IoOrigin> powercut_origin;
  // A drive that lies: flushes and FUA complete at once and make nothing
  // durable (a cut treats every cached write as unflushed). For testing that a
  // checker notices lost fsyncs; no real profile should set it.
  bool ignore_flushes = false;
};

struct Profile {
  std::string name;         // the file's stem, or "inline"
  std::string description;
  uint64_t seed = 1;
  std::optional<DelayModel> delay;
  std::optional<HddModel> hdd;
  std::optional<SmrModel> smr;  // requires hdd
  BandwidthModel bandwidth;
  QueueModel queue;
  StallModel stall;
  TimeoutModel timeout;
  std::vector<ErrorRange> errors;
  CacheModel cache;
};

// Loads `path` and applies `overrides` ("section.key=value", TOML value syntax) in
// order. On failure returns nullopt and sets *error to one line.
std::optional<Profile> LoadProfile(const std::string& path, const std::vector<std::string>& overrides,
                                   std::string* error);
// The same from text; `origin` names it in errors.
std::optional<Profile> ParseProfile(const std::string& text, const std::string& origin,
                                    const std::vector<std::string>& overrides, std::string* error);

// Finds a profile by name ("hdd-7200") or path: a path that exists wins, otherwise
// NAME.toml in the shipped profile directory. Empty if neither exists.
std::string FindProfile(const std::string& name_or_path);
// "4096", "64MiB", "1.5G", "20GB" -> bytes (K/M/G/T and KiB.. binary, KB.. decimal).
std::optional<uint64_t> ParseSize(const std::string& text);
// The shipped profiles directory (source tree, baked in at build time).
std::string ProfileDir();

}  // namespace faultdev

#endif  // TFS_FAULTDEVICES_PROFILE_H_
