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
  w.StringField("producer", "tierprobe");
  w.StringField("workload", "tierprobe");
  w.Key("tool_versions");
  w.BeginObject();
  w.StringField("tierprobe", kTierprobeVersion);
  w.EndObject();
  w.StringField("git_commit", kTierfsGitCommit);
  w.BoolField("git_dirty", kTierfsGitDirty);
  w.Key("host");
  w.BeginObject();
  w.StringField("hostname", host.hostname);
  w.UintField("cpus", host.cpus);
  w.UintField("memory_bytes", host.memory_bytes);
  w.EndObject();
  w.Key("kernel");
  w.BeginObject();
  w.StringField("release", host.kernel_release);
  w.StringField("version", host.kernel_version);
  w.StringField("machine", host.machine);
  w.EndObject();
  w.Key("filesystem");
  w.BeginObject();
  w.StringField("path", spec.dir);
  w.StringField("mount_point", mount.mount_point);
  w.StringField("type", mount.fstype);
  w.StringField("source", mount.source);
  std::string options = mount.options;
  if (!mount.super_options.empty()) {
    options += (options.empty() ? "" : ",") + mount.super_options;
  }
  w.StringField("options", options);
  w.EndObject();
  w.Key("device_layout");
  if (meta.device_layout.empty()) {
    w.Null();
  } else {
    w.String(meta.device_layout);
  }
  w.StringField("fault_profile", meta.fault_profile);
  w.UintField("seed", spec.seed);
  w.StringField("start", IsoTime(r.start_unix_ns));
  w.StringField("end", IsoTime(r.end_unix_ns));
  w.StringField("arm", meta.arm);
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
  w.DoubleField("rate", spec.rate);
  w.DoubleField("duration_s", double(spec.duration_ns) / 1e9);
  w.DoubleField("warmup_s", double(spec.warmup_ns) / 1e9);
  w.IntField("threads", spec.threads);
  w.BoolField("lane_per_op", spec.lane_per_op);
  w.BoolField("keep_going", spec.keep_going);
  w.StringField("mix", MixToString(spec.mix));
  w.StringField("schedule", spec.arrivals == Arrivals::kPoisson ? "poisson" : "constant");
  w.UintField("working_set", spec.working_set);
  w.IntField("files", spec.small_files);
  w.IntField("dir_entries", spec.dir_entries);
  w.BoolField("direct", spec.direct);
  w.UintField("spin_ns", spec.spin_ns);
  w.Key("inject_delay");
  if (spec.inject_delay) {
    w.BeginObject();
    w.UintField("delay_ns", spec.inject_delay->delay_ns);
    w.DoubleField("fraction", spec.inject_delay->fraction);
    if (spec.inject_delay->op) w.StringField("op", OpName(*spec.inject_delay->op));
    w.EndObject();
  } else {
    w.Null();
  }
  w.Key("inject_stall");
  if (spec.inject_stall) {
    w.BeginObject();
    w.UintField("at_ns", spec.inject_stall->at_ns);
    w.UintField("length_ns", spec.inject_stall->length_ns);
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
    w.StringField("name", "warmup");
    w.DoubleField("start_s", 0);
    w.DoubleField("end_s", double(spec.warmup_ns) / 1e9);
    w.BoolField("measured", false);
    w.EndObject();
  }
  w.BeginObject();
  w.StringField("name", "measure");
  w.DoubleField("start_s", double(spec.warmup_ns) / 1e9);
  w.DoubleField("end_s", double(spec.warmup_ns + spec.duration_ns) / 1e9);
  w.BoolField("measured", true);
  w.EndObject();
  w.EndArray();

  w.Key("timeseries");
  w.BeginObject();
  w.DoubleField("interval_s", 1);
  w.StringField("of", "latency");
  w.Key("points");
  w.BeginArray();
  for (const SeriesPoint& p : r.series) {
    w.BeginObject();
    w.UintField("t", p.second);
    w.StringField("phase", p.second * kSecond < spec.warmup_ns ? "warmup" : "measure");
    w.UintField("count", p.count);
    w.UintField("p50_ns", p.p50_ns);
    w.UintField("p99_ns", p.p99_ns);
    w.UintField("p999_ns", p.p999_ns);
    w.UintField("max_ns", p.max_ns);
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();

  w.Key("throughput");
  w.BeginObject();
  w.UintField("ops", r.ops_measured);
  w.DoubleField("seconds", double(r.measured_elapsed_ns) / 1e9);
  w.DoubleField("ops_per_s", r.achieved_rate);
  w.DoubleField("target_ops_per_s", spec.rate);
  w.EndObject();

  bool behind = FellBehind(r);
  w.Key("counters");
  w.BeginObject();
  w.UintField("ops_warmup", r.ops_warmup);
  w.UintField("ops_measured", r.ops_measured);
  w.UintField("lag_p50_ns", r.lag->Quantile(50, 100));
  w.UintField("lag_p99_ns", r.lag->Quantile(99, 100));
  w.UintField("late_ops", r.late_ops);
  w.UintField("max_lag_ns", r.max_lag_ns);
  w.UintField("backlog_at_end", r.backlog_at_end);
  w.UintField("injected_delays", r.injected_delays);
  w.UintField("stalled_threads", r.stalled_threads);
  if (spec.keep_going) {
    uint64_t total = 0;
    for (int k = 0; k < kOpTypes; k++) {
      total += r.errors[size_t(k)];
      w.UintField("errors_" + std::string(OpName(OpType(k))), r.errors[size_t(k)]);
    }
    w.UintField("errors", total);
  }
  w.UintField("fell_behind", behind ? 1 : 0);
  w.EndObject();
  w.EndObject();
}

}  // namespace

void WriteHistogram(JsonWriter& w, const Histogram& h) {
  w.BeginObject();
  w.StringField("unit", "ns");
  w.UintField("count", h.count());
  w.UintField("min", h.min());
  w.UintField("max", h.max());
  w.UintField("sum", h.sum());
  w.UintField("p50", h.Quantile(50, 100));
  w.UintField("p90", h.Quantile(90, 100));
  w.UintField("p99", h.Quantile(99, 100));
  w.UintField("p999", h.Quantile(999, 1000));
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
  w.StringField("format", "tierfs-results");
  w.UintField("version", 1);
  w.Key("manifest");
  WriteManifest(w, spec, meta, host, mount, result);
  w.Key("measurements");
  WriteMeasurements(w, spec, result);
  w.EndObject();
  return w.str() + "\n";
}

}  // namespace tfs::probe
