// tierfs bench journal: commit throughput and latency of the journal, no-flush
// and flush commits, with 1..T committing threads, on an image file in --dir
// (io_uring, O_DIRECT when the file system allows it).
//
// Each phase commits --commits keys of --size bytes in total, split over the
// threads. Latency is measured per commit (from the call to its return) into
// log-bucketed histograms; group commit shows up as entries < commits and, for
// flush commits, as more commits/s with 2 threads than with 1.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "store/store.h"
#include "userspace/tools/common.h"
#include "userspace/util/json.h"
#include "util/histogram.h"

namespace tfs::tools {
namespace {

struct Phase {
  std::string mode;
  unsigned threads = 0;
  uint64_t commits = 0;
  double seconds = 0;
  double cpu_seconds = 0;
  uint64_t entries = 0, flush_entries = 0, bytes = 0, preflushes = 0;
  std::unique_ptr<Histogram> latency = std::make_unique<Histogram>();
};

double CpuSeconds() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

Status RunPhase(store::Store& e, journal::CommitMode mode, unsigned threads, uint64_t commits,
                uint32_t size, Phase* out) {
  journal::Stats before = e.journal().GetStats();
  std::vector<std::unique_ptr<Histogram>> hist;
  for (unsigned t = 0; t < threads; t++) hist.push_back(std::make_unique<Histogram>());
  std::vector<Status> status(threads);
  double cpu0 = CpuSeconds();
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; t++) {
    pool.emplace_back([&, t] {
      std::vector<uint8_t> value(size, uint8_t(t));
      uint64_t n = commits / threads + (t < commits % threads ? 1 : 0);
      for (uint64_t i = 0; i < n; i++) {
        journal::Key k{journal::kKeyTest, size, value.data()};
        uint64_t start = platform::NowNs();
        Result<uint64_t> r = e.journal().Commit(&k, 1, 0, mode);
        hist[t]->Record(platform::NowNs() - start);
        if (!r.ok()) {
          status[t] = r.status();
          return;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  out->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out->cpu_seconds = CpuSeconds() - cpu0;
  for (const Status& st : status) TFS_TRY(st);
  for (auto& h : hist) out->latency->Merge(*h);
  journal::Stats after = e.journal().GetStats();
  out->mode = mode == journal::CommitMode::kFlush ? "flush" : "noflush";
  out->threads = threads;
  out->commits = commits;
  out->entries = after.entries - before.entries;
  out->flush_entries = after.flush_entries - before.flush_entries;
  out->bytes = after.bytes - before.bytes;
  for (uint32_t i = 0; i < dev::kMaxDevices; i++) out->preflushes += after.preflushes[i] - before.preflushes[i];
  return Status::Ok();
}

}  // namespace

int BenchJournal(int argc, char** argv) {
  CLI::App app("Journal commits/s and commit latency.", "tierfs bench journal");
  CLI::App* j = &app;
  uint64_t commits = 20000;
  uint32_t size = 64;
  std::vector<unsigned> threads = {1, 2};
  std::string dir = "/var/tmp", json_path, image_size = "256M";
  j->add_option("--commits", commits, "commits per phase")->check(CLI::Range(uint64_t(1), uint64_t(1) << 32));
  j->add_option("--size", size, "bytes per committed key")->check(CLI::Range(1u, 64u * 1024));
  j->add_option("--threads", threads, "committing thread counts, one phase each")->delimiter(',');
  j->add_option("--dir", dir, "directory for the image file (on the disk to measure)");
  j->add_option("--image-size", image_size, "size of the image file");
  j->add_option("--json", json_path, "write results as JSON to this file");
  if (int rc = ParseCommandLine(app, "bench journal", argc, argv); rc >= 0) return rc;
  for (unsigned t : threads) {
    if (t == 0 || t > 64) {
      PrintError("bench journal", "--threads values must be 1..64");
      return 2;
    }
  }
  auto bytes = ParseSize(image_size);
  if (!bytes || *bytes < (64u << 20)) {
    PrintError("bench journal", "--image-size must be at least 64M");
    return 2;
  }

  std::string path = dir + "/tierfs-bench-journal-" + std::to_string(getpid()) + ".img";
  int fd = open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    PrintError("bench journal", path + ": " + strerror(errno));
    return 1;
  }
  int rc = posix_fallocate(fd, 0, off_t(*bytes));
  close(fd);
  struct Cleanup {
    std::string p;
    ~Cleanup() { unlink(p.c_str()); }
  } cleanup{path};
  if (rc != 0) {
    PrintError("bench journal", path + ": " + strerror(rc));
    return 1;
  }
  auto devs = OpenDevices("bench journal", {path}, false);
  if (devs.empty()) return 1;
  store::FormatMember m{devs[0].get(), "ssd", 1};
  store::FormatOptions fo;
  fo.journal_buckets = uint32_t(std::min<uint64_t>(64, (*bytes >> 20) / 4));
  Diag diag;
  Status st = store::Format(&m, 1, fo, &diag);
  std::vector<BlockDevice*> raw = Raw(devs);
  store::Store e;
  if (st.ok()) st = e.Open(raw.data(), 1, store::OpenOptions{}, &diag);
  if (!st.ok()) {
    PrintError("bench journal", diag.empty() ? st.Message() : diag.text);
    return 1;
  }

  std::vector<Phase> phases;
  for (journal::CommitMode mode : {journal::CommitMode::kNoFlush, journal::CommitMode::kFlush}) {
    for (unsigned t : threads) {
      Phase p;
      st = RunPhase(e, mode, t, commits, size, &p);
      if (st.ok()) st = e.journal().Flush();  // each phase ends durable
      if (!st.ok()) {
        PrintError("bench journal", std::string("commit failed: ") + st.Message());
        return 1;
      }
      phases.push_back(std::move(p));
    }
  }
  st = e.Close();
  if (!st.ok()) {
    PrintError("bench journal", std::string("close failed: ") + st.Message());
    return 1;
  }

  printf("journal benchmark: %llu commits of %u bytes per phase, image %s (%s)\n",
         (unsigned long long)commits, size, path.c_str(), devs[0]->direct() ? "O_DIRECT" : "buffered");
  printf("%-8s %7s %12s %10s %10s %10s %8s %8s\n", "mode", "threads", "commits/s", "p50_us", "p99_us", "max_us",
         "entries", "flushes");
  userspace::JsonWriter w;
  w.BeginObject();
  w.StringField("benchmark", "journal");
  w.UintField("commits", commits);
  w.UintField("size", size);
  w.StringField("image", path);
  w.BoolField("direct", devs[0]->direct());
  w.Key("phases");
  w.BeginArray();
  for (const Phase& p : phases) {
    double rate = p.seconds > 0 ? double(p.commits) / p.seconds : 0;
    double p50 = double(p.latency->Quantile(50, 100)) / 1e3, p99 = double(p.latency->Quantile(99, 100)) / 1e3;
    double mx = double(p.latency->max()) / 1e3;
    printf("%-8s %7u %12.0f %10.1f %10.1f %10.1f %8llu %8llu\n", p.mode.c_str(), p.threads, rate, p50, p99, mx,
           (unsigned long long)p.entries, (unsigned long long)p.flush_entries);
    w.BeginObject();
    w.StringField("mode", p.mode);
    w.UintField("threads", p.threads);
    w.UintField("commits", p.commits);
    w.DoubleField("seconds", p.seconds);
    w.DoubleField("cpu_seconds", p.cpu_seconds);
    w.DoubleField("commits_per_sec", rate);
    w.DoubleField("latency_p50_us", p50);
    w.DoubleField("latency_p99_us", p99);
    w.DoubleField("latency_max_us", mx);
    w.UintField("entries", p.entries);
    w.UintField("flush_entries", p.flush_entries);
    w.UintField("preflushes", p.preflushes);
    w.UintField("bytes_written", p.bytes);
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << w.str() << "\n";
    if (!f) {
      PrintError("bench journal", json_path + ": cannot write");
      return 1;
    }
  }
  return 0;
}

}  // namespace tfs::tools
