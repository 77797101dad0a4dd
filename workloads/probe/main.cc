// tierprobe: open-loop foreground latency probe for any mounted filesystem.
//
//   tierprobe --dir DIR --rate OPS --duration S [--mix SPEC] [--threads N] --json FILE
//
// Builds a small working set inside DIR, issues a mix of operations at intended
// start times fixed by a schedule (constant or Poisson), and writes one results
// document (results/schema/) with per-op histograms of latency (from the intended
// start) and service time (from the actual start), a per-second series and
// counters. Bad input (missing directory, bad spec, no space, unwritable output)
// ends with one line on stderr and a nonzero exit: 2 for usage, 1 for the run.
// `--inject-delay` and `--inject-stall` plant known slowdowns for the lab's own
// checks (A/B significance, coordinated-omission test).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "workloads/probe/host.h"
#include "workloads/probe/ops.h"
#include "workloads/probe/output.h"
#include "workloads/probe/runner.h"
#include "workloads/probe/spec.h"

namespace tfs::probe {
namespace {

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "tierprobe: %s\n", message.c_str());
  return code;
}

std::string Micros(uint64_t ns) {
  char buf[32];
  if (ns >= 1'000'000'000) std::snprintf(buf, sizeof(buf), "%.2fs", double(ns) / 1e9);
  else if (ns >= 1'000'000) std::snprintf(buf, sizeof(buf), "%.2fms", double(ns) / 1e6);
  else std::snprintf(buf, sizeof(buf), "%.1fus", double(ns) / 1e3);
  return buf;
}

int Main(int argc, char** argv) {
  CLI::App app{
      "tierprobe: open-loop foreground latency probe. Latency is measured from each "
      "operation's intended start (no coordinated omission); service time from its "
      "actual start. Writes one results JSON document (results/schema/)."};
  ProbeSpec spec;
  RunMeta meta;
  std::string json_path, duration = "", warmup = "0", mix, schedule = "constant";
  std::string working_set = "64M", inject_delay, inject_stall, spin = "0";
  std::vector<std::string> labels;
  int64_t pair = -1, boot = -1;
  bool keep = false, quiet = false;

  app.add_option("--dir", spec.dir, "directory on the filesystem under test (must exist)")
      ->required();
  app.add_option("--rate", spec.rate, "target operations per second, all threads together")
      ->required();
  app.add_option("--duration", duration, "measured phase: 10s, 90s, 500ms...")->required();
  app.add_option("--json", json_path, "write the results document here")->required();
  app.add_option("--mix", mix,
                 "op weights, e.g. read=50,write=30,fsync=5 (ops: read write fsync "
                 "fdatasync stat readdir openread create createsync; default: all but createsync)");
  app.add_option("--threads", spec.threads, "probe threads (each runs rate/threads)")
      ->capture_default_str();
  app.add_flag("--lane-per-op", spec.lane_per_op,
               "give every op of the mix its own --threads threads at its share of the rate: an op "
               "that hangs then delays only itself");
  app.add_flag("--keep-going", spec.keep_going,
               "count a failed op (counters errors, errors_OP) and go on instead of ending the run");
  app.add_option("--schedule", schedule, "arrivals: constant or poisson")->capture_default_str();
  app.add_option("--warmup", warmup, "warm-up before the measured phase (excluded)")
      ->capture_default_str();
  app.add_option("--working-set", working_set, "size of the data file read and written")
      ->capture_default_str();
  app.add_option("--files", spec.small_files, "small files for stat/openread")
      ->capture_default_str();
  app.add_option("--dir-entries", spec.dir_entries, "entries of the readdir directory")
      ->capture_default_str();
  app.add_flag("--direct", spec.direct, "open the data file with O_DIRECT");
  app.add_option("--spin", spin,
                 "wake this long early and busy-wait to each intended start (e.g. 100us): "
                 "less wake-up lag for more CPU")
      ->capture_default_str();
  app.add_option("--seed", spec.seed, "seed for offsets, op choice and Poisson gaps")
      ->capture_default_str();
  app.add_option("--inject-delay", inject_delay,
                 "DELAY:FRACTION[:OP], add DELAY inside FRACTION of operations (of OP only if given; e.g. "
                 "2ms:0.01, 300ms:1:read)");
  app.add_option("--inject-stall", inject_stall,
                 "AT:LENGTH, pause all threads for LENGTH at AT after the start (e.g. 5s:1s)");
  app.add_option("--arm", meta.arm, "manifest: arm of this run")
      ->check(CLI::IsMember({"active", "control", "other"}))
      ->capture_default_str();
  app.add_option("--pair", pair, "manifest: pair index");
  app.add_option("--boot", boot, "manifest: boot index");
  app.add_option("--fault-profile", meta.fault_profile, "manifest: fault profile name")
      ->capture_default_str();
  app.add_option("--device-layout", meta.device_layout, "manifest: device layout (free text)");
  app.add_option("--label", labels, "manifest: extra KEY=VALUE (repeatable)");
  app.add_flag("--keep", keep, "keep the working set in DIR afterwards");
  app.add_flag("--quiet", quiet, "no summary line on stderr");
  std::string ready_file;
  app.add_option("--ready-file", ready_file,
                 "once the working set is written, write the wall-clock time (ns since the "
                 "epoch) the schedule starts at here (for runners that time phases)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return Fail(std::string(e.what()) + " (see --help)", 2);
  }

  std::string err;
  if (!ParseDuration(duration, &spec.duration_ns, &err)) return Fail("--duration: " + err, 2);
  if (!ParseDuration(warmup, &spec.warmup_ns, &err)) return Fail("--warmup: " + err, 2);
  if (!ParseDuration(spin, &spec.spin_ns, &err)) return Fail("--spin: " + err, 2);
  if (!ParseSize(working_set, &spec.working_set, &err)) return Fail("--working-set: " + err, 2);
  if (!ParseArrivals(schedule, &spec.arrivals, &err)) return Fail("--schedule: " + err, 2);
  spec.mix = DefaultMix();
  if (!mix.empty() && !ParseMix(mix, &spec.mix, &err)) return Fail("--mix: " + err, 2);
  if (!inject_delay.empty()) {
    InjectDelay d;
    if (!ParseInjectDelay(inject_delay, &d, &err)) return Fail(err, 2);
    spec.inject_delay = d;
  }
  if (!inject_stall.empty()) {
    InjectStall s;
    if (!ParseInjectStall(inject_stall, &s, &err)) return Fail(err, 2);
    spec.inject_stall = s;
  }
  for (const auto& l : labels) {
    size_t eq = l.find('=');
    if (eq == 0 || eq == std::string::npos) return Fail("--label '" + l + "': want KEY=VALUE", 2);
    meta.labels.emplace_back(l.substr(0, eq), l.substr(eq + 1));
  }
  if (pair >= 0) meta.pair = pair;
  if (boot >= 0) meta.boot = boot;
  if (!Validate(spec, &err)) return Fail(err, 2);
  meta.argv.assign(argv, argv + argc);

  // Open the output first: an unwritable --json should fail before a long run.
  std::string tmp_path = json_path + ".tmp";
  std::ofstream out(tmp_path, std::ios::trunc);
  if (!out) return Fail("--json " + json_path + ": cannot write: " + std::strerror(errno));

  auto ws = Workspace::Create(spec, &err);
  if (!ws) {
    out.close();
    ::unlink(tmp_path.c_str());
    return Fail(err);
  }
  ws->set_keep(keep);
  if (!ready_file.empty()) {
    // RunProbe puts time zero 20 ms ahead; this says when, to within a few ms.
    std::ofstream ready(ready_file, std::ios::trunc);
    ready << (RealtimeNs() + 20'000'000) << "\n";
    if (!ready) {
      out.close();
      ::unlink(tmp_path.c_str());
      return Fail("--ready-file " + ready_file + ": cannot write: " + std::strerror(errno));
    }
  }
  RunResult result;
  bool ok = RunProbe(spec, *ws, &result, &err);
  if (!ok) {
    out.close();
    ::unlink(tmp_path.c_str());
    return Fail(err);
  }
  std::string doc = RenderResults(spec, meta, GetHostInfo(), MountOf(spec.dir), result);
  out << doc;
  out.close();
  if (!out || std::rename(tmp_path.c_str(), json_path.c_str()) != 0) {
    ::unlink(tmp_path.c_str());
    return Fail("--json " + json_path + ": write failed: " + std::strerror(errno));
  }

  if (!quiet) {
    auto all = std::make_unique<Histogram>();
    for (auto& o : result.ops) all->Merge(*o.latency);
    std::fprintf(stderr,
                 "tierprobe: %llu ops in %.1fs (%.1f/s, target %.1f/s), latency p50 %s p99 %s "
                 "max %s -> %s\n",
                 static_cast<unsigned long long>(result.ops_measured),
                 double(result.measured_elapsed_ns) / 1e9, result.achieved_rate, spec.rate,
                 Micros(all->Quantile(50, 100)).c_str(), Micros(all->Quantile(99, 100)).c_str(),
                 Micros(all->max()).c_str(), json_path.c_str());
  }
  if (!result.first_error.empty()) {
    uint64_t n = 0;
    for (uint64_t e : result.errors) n += e;
    std::fprintf(stderr, "tierprobe: warning: %llu measured op(s) failed (counters errors_OP); the first: %s\n",
                 static_cast<unsigned long long>(n), result.first_error.c_str());
  }
  if (FellBehind(result)) {
    std::fprintf(stderr,
                 "tierprobe: warning: the probe fell behind its schedule: %llu of %llu operations "
                 "were still waiting to start when it ended (max lag %s); latencies are still "
                 "charged from the intended start\n",
                 static_cast<unsigned long long>(result.backlog_at_end),
                 static_cast<unsigned long long>(result.ops_measured),
                 Micros(result.max_lag_ns).c_str());
  }
  return 0;
}

}  // namespace
}  // namespace tfs::probe

int main(int argc, char** argv) { return tfs::probe::Main(argc, argv); }
