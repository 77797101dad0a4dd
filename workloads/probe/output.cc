// Results document for a probe run (see output.h). The layout is the schema's;
// keep the two in step (the Python tests validate real probe output against it).
#include "workloads/probe/output.h"

#include "workloads/probe/build_info.h"

namespace tfs::probe {
namespace {

constexpr uint64_t kSecond = 1'000'000'000;

void WriteOptionalInt(JsonWriter& w, const std::optional<int64_t>& v) {
  if (v) {
    w.Int(*v);
  } else {
    w.Null();
  }
}

void WriteManifest(JsonWriter& w, const ProbeSpec& spec, const RunMeta& meta,
                   const HostInfo& host, const MountInfo& mount, const RunResult& r) {
  w.BeginObject();
  w.Key("producer");
  w.String("tierprobe");
  w.Key("workload");
  w.String("tierprobe");
  w.Key("tool_versions");
  w.BeginObject();
  w.Key("tierprobe");
  w.String(kTierprobeVersion);
  w.EndObject();
  w.Key("git_commit");
  w.String(kTierfsGitCommit);
  w.Key("git_dirty");
  w.Bool(kTierfsGitDirty);
  w.Key("host");
  w.BeginObject();
  w.Key("hostname");
  w.String(host.hostname);
  w.Key("cpus");
  w.Uint(host.cpus);
  w.Key("memory_bytes");
  w.Uint(host.memory_bytes);
  w.EndObject();
  w.Key("kernel");
  w.BeginObject();
  w.Key("release");
  w.String(host.kernel_release);
  w.Key("version");
  w.String(host.kernel_version);
  w.Key("machine");
  w.String(host.machine);
  w.EndObject();
  w.Key("filesystem");
  w.BeginObject();
  w.Key("path");
  w.String(spec.dir);
  w.Key("mount_point");
  w.String(mount.mount_point);
  w.Key("type");
  w.String(mount.fstype);
  w.Key("source");
  w.String(mount.source);
  w.Key("options");
  w.String(mount.options.empty() ? mount.super_options
                                 : mount.options + (mount.super_options.empty()
                                                        ? ""
                                                        : "," + mount.super_options));
  w.EndObject();
  w.Key("device_layout");
  if (meta.device_layout.empty()) {
    w.Null();
  } else {
    w.String(meta.device_layout);
  }
  w.Key("fault_profile");
  w.String(meta.fault_profile);
  w.Key("seed");
  w.Uint(spec.seed);
  w.Key("start");
  w.String(IsoTime(r.start_unix_ns));
  w.Key("end");
  w.String(IsoTime(r.end_unix_ns));
  w.Key("arm");
  w.String(meta.arm);
  w.Key("pair");
  WriteOptionalInt(w, meta.pair);
  w.Key("boot");
  WriteOptionalInt(w, meta.boot);
  w.Key("command");
  w.BeginArray();
  for (const auto& a : meta.argv) w.String(a);
  w.EndArray();
  w.Key("parameters");
  w.BeginObject();
  w.Key("rate");
  w.Double(spec.rate);
  w.Key("duration_s");
  w.Double(double(spec.duration_ns) / 1e9);
  w.Key("warmup_s");
  w.Double(double(spec.warmup_ns) / 1e9);
  w.Key("threads");
  w.Int(spec.threads);
  w.Key("mix");
  w.String(MixToString(spec.mix));
  w.Key("schedule");
  w.String(spec.arrivals == Arrivals::kPoisson ? "poisson" : "constant");
  w.Key("working_set");
  w.Uint(spec.working_set);
  w.Key("files");
  w.Int(spec.small_files);
  w.Key("dir_entries");
  w.Int(spec.dir_entries);
  w.Key("direct");
  w.Bool(spec.direct);
  w.Key("spin_ns");
  w.Uint(spec.spin_ns);
  w.Key("inject_delay");
  if (spec.inject_delay) {
    w.BeginObject();
    w.Key("delay_ns");
    w.Uint(spec.inject_delay->delay_ns);
    w.Key("fraction");
    w.Double(spec.inject_delay->fraction);
    w.EndObject();
  } else {
    w.Null();
  }
  w.Key("inject_stall");
  if (spec.inject_stall) {
    w.BeginObject();
    w.Key("at_ns");
    w.Uint(spec.inject_stall->at_ns);
    w.Key("length_ns");
    w.Uint(spec.inject_stall->length_ns);
    w.EndObject();
  } else {
    w.Null();
  }
  w.EndObject();
  w.Key("labels");
  w.BeginObject();
  for (const auto& [k, v] : meta.labels) {
    w.Key(k);
    w.String(v);
  }
  w.EndObject();
  w.EndObject();
}

void WriteMeasurements(JsonWriter& w, const ProbeSpec& spec, const RunResult& r) {
  w.BeginObject();
  w.Key("ops");
  w.BeginObject();
  auto all_latency = std::make_unique<Histogram>();
  auto all_service = std::make_unique<Histogram>();
  for (int k = 0; k < kOpTypes; k++) {
    if (spec.mix[k] <= 0) continue;
    w.Key(OpName(static_cast<OpType>(k)));
    w.BeginObject();
    w.Key("latency");
    WriteHistogram(w, *r.ops[k].latency);
    w.Key("service");
    WriteHistogram(w, *r.ops[k].service);
    w.EndObject();
    all_latency->Merge(*r.ops[k].latency);
    all_service->Merge(*r.ops[k].service);
  }
  w.Key("all");
  w.BeginObject();
  w.Key("latency");
  WriteHistogram(w, *all_latency);
  w.Key("service");
  WriteHistogram(w, *all_service);
  w.EndObject();
  w.EndObject();

  w.Key("phases");
  w.BeginArray();
  if (spec.warmup_ns > 0) {
    w.BeginObject();
    w.Key("name");
    w.String("warmup");
    w.Key("start_s");
    w.Double(0);
    w.Key("end_s");
    w.Double(double(spec.warmup_ns) / 1e9);
    w.Key("measured");
    w.Bool(false);
    w.EndObject();
  }
  w.BeginObject();
  w.Key("name");
  w.String("measure");
  w.Key("start_s");
  w.Double(double(spec.warmup_ns) / 1e9);
  w.Key("end_s");
  w.Double(double(spec.warmup_ns + spec.duration_ns) / 1e9);
  w.Key("measured");
  w.Bool(true);
  w.EndObject();
  w.EndArray();

  w.Key("timeseries");
  w.BeginObject();
  w.Key("interval_s");
  w.Double(1);
  w.Key("of");
  w.String("latency");
  w.Key("points");
  w.BeginArray();
  for (const SeriesPoint& p : r.series) {
    w.BeginObject();
    w.Key("t");
    w.Uint(p.second);
    w.Key("phase");
    w.String(p.second * kSecond < spec.warmup_ns ? "warmup" : "measure");
    w.Key("count");
    w.Uint(p.count);
    w.Key("p50_ns");
    w.Uint(p.p50_ns);
    w.Key("p99_ns");
    w.Uint(p.p99_ns);
    w.Key("p999_ns");
    w.Uint(p.p999_ns);
    w.Key("max_ns");
    w.Uint(p.max_ns);
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();

  w.Key("throughput");
  w.BeginObject();
  w.Key("ops");
  w.Uint(r.ops_measured);
  w.Key("seconds");
  w.Double(double(r.measured_elapsed_ns) / 1e9);
  w.Key("ops_per_s");
  w.Double(r.achieved_rate);
  w.Key("target_ops_per_s");
  w.Double(spec.rate);
  w.EndObject();

  bool behind = r.achieved_rate < 0.95 * spec.rate;
  w.Key("counters");
  w.BeginObject();
  w.Key("ops_warmup");
  w.Uint(r.ops_warmup);
  w.Key("ops_measured");
  w.Uint(r.ops_measured);
  w.Key("lag_p50_ns");
  w.Uint(r.lag->Quantile(50, 100));
  w.Key("lag_p99_ns");
  w.Uint(r.lag->Quantile(99, 100));
  w.Key("late_ops");
  w.Uint(r.late_ops);
  w.Key("max_lag_ns");
  w.Uint(r.max_lag_ns);
  w.Key("injected_delays");
  w.Uint(r.injected_delays);
  w.Key("stalled_threads");
  w.Uint(r.stalled_threads);
  w.Key("fell_behind");
  w.Uint(behind ? 1 : 0);
  w.EndObject();
  w.EndObject();
}

}  // namespace

void WriteHistogram(JsonWriter& w, const Histogram& h) {
  w.BeginObject();
  w.Key("unit");
  w.String("ns");
  w.Key("count");
  w.Uint(h.count());
  w.Key("min");
  w.Uint(h.min());
  w.Key("max");
  w.Uint(h.max());
  w.Key("sum");
  w.Uint(h.sum());
  w.Key("p50");
  w.Uint(h.Quantile(50, 100));
  w.Key("p90");
  w.Uint(h.Quantile(90, 100));
  w.Key("p99");
  w.Uint(h.Quantile(99, 100));
  w.Key("p999");
  w.Uint(h.Quantile(999, 1000));
  w.Key("buckets");
  w.BeginArray();
  for (u32 i = 0; i < Histogram::kBuckets; i++) {
    if (h.bucket(i) == 0) continue;
    w.BeginArray();
    w.Uint(Histogram::BucketLow(i));
    w.Uint(Histogram::BucketHigh(i));
    w.Uint(h.bucket(i));
    w.EndArray();
  }
  w.EndArray();
  w.EndObject();
}

std::string RenderResults(const ProbeSpec& spec, const RunMeta& meta, const HostInfo& host,
                          const MountInfo& mount, const RunResult& result) {
  JsonWriter w;
  w.BeginObject();
  w.Key("format");
  w.String("tierfs-results");
  w.Key("version");
  w.Uint(1);
  w.Key("manifest");
  WriteManifest(w, spec, meta, host, mount, result);
  w.Key("measurements");
  WriteMeasurements(w, spec, result);
  w.EndObject();
  return w.str() + "\n";
}

}  // namespace tfs::probe
