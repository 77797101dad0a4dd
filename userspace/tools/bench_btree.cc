// tierfs bench btree: the btree's inserts, lookups, deletes and a mixed load on a
// freshly formatted filesystem, in the shape of bcachefs's btree perf tests
// (docs/benchmarks.md has the results and the peers they are compared with).
//
// Keys and values. One key per 64-bit number k at position {kBtreeTest, inode 0,
// offset k} (bcachefs's tests use inode 0 too), with an 8-byte little-endian value.
// The value of k is ValueFor(k) with its top byte xored by the number of updates
// rand_mixed made to k (mod 256): every lookup checks its key is there and that the
// low 56 bits of the value are exactly ValueFor(k); a miss or a wrong value ends the
// run with one line and exit 1. Random keys are RandKey(i) for i in [0, N), a
// bijection of i (the same keys as /work/shared/kvbench), so they are distinct.
//
// Phases, always in this order (a phase whose keys another phase should have
// inserted gets them from an untimed setup run first):
//   seq_insert   keys 0..N-1 ascending, one key per transaction (kNoFlush)
//   seq_lookup   one ascending Iterator pass over them
//   seq_delete   keys 0..N-1 ascending, one deletion per transaction (kNoFlush)
//   rand_insert  N random keys, one per transaction (kNoFlush)
//   rand_lookup  max(1, N/10) Gets of uniformly chosen inserted random keys
//   rand_mixed   max(1, N/10) such Gets; every 4th also updates the key (kNoFlush)
// Each phase that writes ends with a journal Flush, timed as part of the phase, so
// its updates are durable when its clock stops (the nodes are written later by
// checkpoints, as in normal operation). With --threads T each phase's operations are
// split over T threads: contiguous key (or index) ranges for the seq phases and
// rand_insert, per-thread random streams for rand_lookup and rand_mixed.
//
// Bytes written and read are counted per device by a wrapper between the store and
// each image's UringDevice (by I/O origin: journal, btree, superblock, ...).
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "btree/tree.h"
#include "store/store.h"
#include "userspace/platform/huge_arena.h"
#include "userspace/tools/common.h"
#include "userspace/util/json.h"

namespace tfs::tools {
namespace {

const char kCmd[] = "bench btree";

// ---- keys and values ----

// splitmix64's finalizer: a bijection on 64-bit numbers.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}
constexpr uint64_t kKeySeed = 0x6b7662656e636821ull;  // as kvbench: same random keys
inline uint64_t RandKey(uint64_t i) { return Mix64(i + kKeySeed); }
inline uint64_t ValueFor(uint64_t key) { return key ^ 0xa5a5a5a5a5a5a5a5ull; }
constexpr uint64_t kUpdateStep = uint64_t(1) << 56;  // rand_mixed bumps the top byte
inline bool ValueOk(uint64_t key, uint64_t v) { return ((v ^ ValueFor(key)) << 8) == 0; }
inline btree::Pos KeyPos(uint64_t key) { return btree::Pos{btree::kBtreeTest, 0, key}; }

// Per-thread stream of uniformly chosen indexes in [0, n).
struct Rng {
  uint64_t state;
  uint64_t Next() { return Mix64(state += 0x9e3779b97f4a7c15ull); }
  uint64_t Below(uint64_t n) { return uint64_t((unsigned __int128)Next() * n >> 64); }
};

// ---- device byte counters ----

struct DevCounters {
  uint64_t writes = 0, write_bytes = 0, fua_writes = 0, reads = 0, read_bytes = 0, flushes = 0;
  uint64_t write_bytes_by_origin[kIoOriginCount] = {};
};

// Counts what is submitted to a device and forwards the caller's request untouched.
// It keeps no per-request state and never touches req->dev or req->done, so the
// inner device owns the request exactly as if the caller had submitted it there.
class CountingDevice final : public BlockDevice {
 public:
  explicit CountingDevice(BlockDevice* inner) : inner_(inner) {}
  void Submit(IoRequest* req) override {
    switch (req->op) {
      case IoOp::kWrite:
        writes_.fetch_add(1, std::memory_order_relaxed);
        write_bytes_.fetch_add(req->length, std::memory_order_relaxed);
        by_origin_[int(req->origin) % kIoOriginCount].fetch_add(req->length, std::memory_order_relaxed);
        if (req->flags & IoRequest::kFua) fua_writes_.fetch_add(1, std::memory_order_relaxed);
        break;
      case IoOp::kRead:
        reads_.fetch_add(1, std::memory_order_relaxed);
        read_bytes_.fetch_add(req->length, std::memory_order_relaxed);
        break;
      case IoOp::kFlush:
        flushes_.fetch_add(1, std::memory_order_relaxed);
        break;
      case IoOp::kDiscard:
        break;
    }
    inner_->Submit(req);
  }
  const BlockDeviceInfo& Info() const override { return inner_->Info(); }
  const char* Name() const override { return inner_->Name(); }

  DevCounters Get() const {
    DevCounters c;
    c.writes = writes_.load(std::memory_order_relaxed);
    c.write_bytes = write_bytes_.load(std::memory_order_relaxed);
    c.fua_writes = fua_writes_.load(std::memory_order_relaxed);
    c.reads = reads_.load(std::memory_order_relaxed);
    c.read_bytes = read_bytes_.load(std::memory_order_relaxed);
    c.flushes = flushes_.load(std::memory_order_relaxed);
    for (int i = 0; i < kIoOriginCount; i++) c.write_bytes_by_origin[i] = by_origin_[i].load(std::memory_order_relaxed);
    return c;
  }

 private:
  BlockDevice* inner_;
  std::atomic<uint64_t> writes_{0}, write_bytes_{0}, fua_writes_{0}, reads_{0}, read_bytes_{0}, flushes_{0};
  std::atomic<uint64_t> by_origin_[kIoOriginCount] = {};
};

DevCounters Minus(const DevCounters& a, const DevCounters& b) {
  DevCounters d;
  d.writes = a.writes - b.writes;
  d.write_bytes = a.write_bytes - b.write_bytes;
  d.fua_writes = a.fua_writes - b.fua_writes;
  d.reads = a.reads - b.reads;
  d.read_bytes = a.read_bytes - b.read_bytes;
  d.flushes = a.flushes - b.flushes;
  for (int i = 0; i < kIoOriginCount; i++) d.write_bytes_by_origin[i] = a.write_bytes_by_origin[i] - b.write_bytes_by_origin[i];
  return d;
}

// ---- btree stats ----

// Every scalar row of the btree's counter table (btree/tree.h): the monotonic
// ones as their increase from `before`, the rest as they are in `after`; of
// the arrays, the depth of the benchmark's tree.
#define BENCH_BTREE_ROW(name, kind, help) \
  w.UintField(#name, CounterMonotonic(TFS_COUNTER_KIND(kind)) ? after.name - before.name : after.name);
#define BENCH_BTREE_ARRAY(name, n, kind, help)
void WriteBtreeStats(userspace::JsonWriter& w, const btree::Stats& before, const btree::Stats& after) {
  w.BeginObject();
  TFS_BTREE_COUNTERS(BENCH_BTREE_ROW, BENCH_BTREE_ARRAY)
  w.UintField("depth", after.depth[btree::kBtreeTest]);
  w.EndObject();
}
#undef BENCH_BTREE_ROW
#undef BENCH_BTREE_ARRAY

// ---- process and machine ----

double CpuSeconds() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

uint64_t PeakRssKib() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return uint64_t(ru.ru_maxrss);  // KiB on Linux
}

double LoadAverage1() {
  double l = -1;
  if (FILE* f = fopen("/proc/loadavg", "r")) {
    if (fscanf(f, "%lf", &l) != 1) l = -1;
    fclose(f);
  }
  return l;
}

// The value after "prefix...:" on the first line of `path` starting with prefix.
std::string ProcField(const char* path, const char* prefix) {
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) {
    if (line.rfind(prefix, 0) != 0) continue;
    size_t colon = line.find(':');
    std::string v = colon == std::string::npos ? line : line.substr(colon + 1);
    size_t start = v.find_first_not_of(" \t");
    return start == std::string::npos ? "" : v.substr(start);
  }
  return "";
}

std::string UtcNow() {
  char buf[32];
  time_t t = time(nullptr);
  tm tm_utc;
  gmtime_r(&t, &tm_utc);
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm_utc);
  return buf;
}

// An interrupted run (^C, timeout) still removes its images.
char g_image_paths[btree::kMaxNodeCopies][4096];
void OnSignal(int sig) {
  for (const char* p : g_image_paths)
    if (p[0] != '\0') unlink(p);
  signal(sig, SIG_DFL);
  raise(sig);
}
void UnlinkOnSignal(const std::vector<std::string>& paths) {
  for (size_t i = 0; i < paths.size() && i < btree::kMaxNodeCopies; i++)
    snprintf(g_image_paths[i], sizeof g_image_paths[i], "%s", paths[i].c_str());
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, OnSignal);
}

// ---- phases ----

const char* const kWorkloads[] = {"seq_insert", "seq_lookup", "seq_delete", "rand_insert", "rand_lookup", "rand_mixed"};

struct Phase {
  std::string name;
  unsigned threads = 0;
  uint64_t ops = 0;
  double seconds = 0, flush_seconds = 0, cpu_seconds = 0;
  uint64_t peak_rss_kib = 0;
  std::vector<DevCounters> devs;  // per device, the phase's increase
  btree::Stats before{}, after{};
  userspace::HugeArenaStats arena_before{}, arena_after{};
};

class Bench {
 public:
  Bench(store::Store* e, std::vector<CountingDevice*> devs, uint64_t n, unsigned threads)
      : e_(e), devs_(std::move(devs)), n_(n), rand_ops_(std::max<uint64_t>(1, n / 10)), threads_(threads) {}

  // Runs `name` (timed unless `setup`); false with *error set on any failure.
  bool Run(const std::string& name, bool setup, std::string* error) {
    using Work = std::function<std::string(unsigned t, uint64_t lo, uint64_t hi)>;
    Work work;
    uint64_t ops = n_;
    bool writes = true;
    if (name == "seq_insert") {
      work = [this](unsigned, uint64_t lo, uint64_t hi) { return SeqInsert(lo, hi); };
    } else if (name == "seq_lookup") {
      work = [this](unsigned, uint64_t lo, uint64_t hi) { return SeqLookup(lo, hi); };
      writes = false;
    } else if (name == "seq_delete") {
      work = [this](unsigned, uint64_t lo, uint64_t hi) { return SeqDelete(lo, hi); };
    } else if (name == "rand_insert") {
      work = [this](unsigned, uint64_t lo, uint64_t hi) { return RandInsert(lo, hi); };
    } else if (name == "rand_lookup") {
      work = [this](unsigned t, uint64_t lo, uint64_t hi) { return RandLookup(t, lo, hi, false); };
      ops = rand_ops_;
      writes = false;
    } else {
      work = [this](unsigned t, uint64_t lo, uint64_t hi) { return RandLookup(t, lo, hi, true); };
      ops = rand_ops_;
    }

    Phase p;
    p.name = name;
    p.threads = threads_;
    p.ops = ops;
    std::vector<DevCounters> dev0;
    for (CountingDevice* d : devs_) dev0.push_back(d->Get());
    p.before = e_->btrees().GetStats();
    p.arena_before = userspace::HugeArenaGetStats();
    std::vector<std::string> errors(threads_);
    double cpu0 = CpuSeconds();
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads_; t++) {
      uint64_t lo = ops * t / threads_, hi = ops * (t + 1) / threads_;
      pool.emplace_back([&, t, lo, hi] { errors[t] = work(t, lo, hi); });
    }
    for (std::thread& th : pool) th.join();
    auto t1 = std::chrono::steady_clock::now();
    Status st = Status::Ok();
    if (writes) st = e_->journal().Flush();  // the phase ends durable
    auto t2 = std::chrono::steady_clock::now();
    p.cpu_seconds = CpuSeconds() - cpu0;
    p.seconds = std::chrono::duration<double>(t2 - t0).count();
    p.flush_seconds = std::chrono::duration<double>(t2 - t1).count();
    p.after = e_->btrees().GetStats();
    p.arena_after = userspace::HugeArenaGetStats();
    p.peak_rss_kib = PeakRssKib();
    for (size_t i = 0; i < devs_.size(); i++) p.devs.push_back(Minus(devs_[i]->Get(), dev0[i]));
    for (const std::string& err : errors) {
      if (!err.empty()) {
        *error = name + ": " + err;
        return false;
      }
    }
    if (!st.ok()) {
      *error = name + ": journal flush failed: " + st.Message();
      return false;
    }
    if (name == "seq_delete") {
      std::string err = CheckSeqGone();
      if (!err.empty()) {
        *error = name + ": " + err;
        return false;
      }
    }
    if (!setup) phases_.push_back(std::move(p));
    return true;
  }

  const std::vector<Phase>& phases() const { return phases_; }
  uint64_t rand_ops() const { return rand_ops_; }

 private:
  // One transaction per key; a Transaction is empty again after each Commit.
  std::string SeqInsert(uint64_t lo, uint64_t hi) {
    btree::Transaction tx(&e_->btrees());
    for (uint64_t k = lo; k < hi; k++) {
      std::string err = Put(&tx, k, ValueFor(k));
      if (!err.empty()) return err;
    }
    return "";
  }

  std::string SeqLookup(uint64_t lo, uint64_t hi) {
    if (lo == hi) return "";
    btree::Iterator it(&e_->btrees(), btree::kBtreeTest);
    Status st = it.Seek(KeyPos(lo));
    for (uint64_t k = lo; k < hi; k++) {
      if (!st.ok()) return "iterator failed before key " + std::to_string(k) + ": " + st.Message();
      if (!it.Valid() || it.pos() != KeyPos(k)) {
        return "key " + std::to_string(k) + " missing: iterator " +
               (it.Valid() ? "at inode " + std::to_string(it.pos().inode) + " offset " + std::to_string(it.pos().offset)
                           : std::string("at the end"));
      }
      uint64_t v = 0;
      if (it.val_bytes() != 8) return "key " + std::to_string(k) + " has a " + std::to_string(it.val_bytes()) + "-byte value";
      memcpy(&v, it.value(), 8);
      if (!ValueOk(k, v)) return "key " + std::to_string(k) + " has a wrong value";
      if (k + 1 < hi) st = it.Next();
    }
    return "";
  }

  std::string SeqDelete(uint64_t lo, uint64_t hi) {
    btree::Transaction tx(&e_->btrees());
    for (uint64_t k = lo; k < hi; k++) {
      Status st = tx.Delete(KeyPos(k));
      if (!st.ok()) return "delete of key " + std::to_string(k) + " refused: " + st.Message();
      Result<u64> seq = tx.Commit(journal::CommitMode::kNoFlush);
      if (!seq.ok()) return "commit of key " + std::to_string(k) + " failed: " + seq.status().Message();
    }
    return "";
  }

  // After seq_delete no key in [0, N) is left: the first key at or after 0 is not one.
  std::string CheckSeqGone() {
    btree::Iterator it(&e_->btrees(), btree::kBtreeTest);
    Status st = it.Seek(KeyPos(0));
    if (!st.ok()) return std::string("iterator failed: ") + st.Message();
    if (it.Valid() && it.pos().inode == 0 && it.pos().offset < n_) {
      return "key " + std::to_string(it.pos().offset) + " still present after its deletion";
    }
    return "";
  }

  std::string RandInsert(uint64_t lo, uint64_t hi) {
    btree::Transaction tx(&e_->btrees());
    for (uint64_t i = lo; i < hi; i++) {
      uint64_t k = RandKey(i);
      std::string err = Put(&tx, k, ValueFor(k));
      if (!err.empty()) return err;
    }
    return "";
  }

  // rand_lookup, or with `mixed` rand_mixed: op i (i % 4 == 0) also updates.
  std::string RandLookup(unsigned t, uint64_t lo, uint64_t hi, bool mixed) {
    Rng rng{(mixed ? 0x6d69786564000000ull : 0x6c6f6f6b75700000ull) + 0x632be59bd9b4e019ull * (t + 1)};
    btree::Transaction tx(&e_->btrees());
    for (uint64_t i = lo; i < hi; i++) {
      uint64_t k = RandKey(rng.Below(n_));
      uint64_t v = 0;
      Result<u32> len = e_->btrees().Get(KeyPos(k), &v, sizeof v);
      if (!len.ok()) {
        return len.status().Is(ErrorClass::kNotFound) ? "key " + std::to_string(k) + " not found"
                                                      : "lookup of key " + std::to_string(k) + " failed: " +
                                                            len.status().Message();
      }
      if (len.value() != 8) return "key " + std::to_string(k) + " has a " + std::to_string(len.value()) + "-byte value";
      if (!ValueOk(k, v)) return "key " + std::to_string(k) + " has a wrong value";
      if (mixed && i % 4 == 0) {
        std::string err = Put(&tx, k, v + kUpdateStep);
        if (!err.empty()) return err;
      }
    }
    return "";
  }

  std::string Put(btree::Transaction* tx, uint64_t k, uint64_t v) {
    Status st = tx->Set(KeyPos(k), &v, sizeof v);
    if (!st.ok()) return "set of key " + std::to_string(k) + " refused: " + st.Message();
    Result<u64> seq = tx->Commit(journal::CommitMode::kNoFlush);
    if (!seq.ok()) return "commit of key " + std::to_string(k) + " failed: " + seq.status().Message();
    return "";
  }

  store::Store* e_;
  std::vector<CountingDevice*> devs_;
  uint64_t n_, rand_ops_;
  unsigned threads_;
  std::vector<Phase> phases_;
};

std::string Human(double v) {
  char buf[32];
  if (v >= 1e6) {
    snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  } else if (v >= 1e4) {
    snprintf(buf, sizeof buf, "%.0fk", v / 1e3);
  } else {
    snprintf(buf, sizeof buf, "%.0f", v);
  }
  return buf;
}

}  // namespace

int BenchBtree(int argc, char** argv) {
  CLI::App app("Btree inserts, lookups, deletes and a mixed load (bcachefs perf-test shape) on a freshly "
               "formatted filesystem made of an image file in --dir.",
               "tierfs bench btree");
  std::vector<std::string> workloads(std::begin(kWorkloads), std::end(kWorkloads));
  uint64_t n = 1000000;
  unsigned threads = 1;
  uint64_t cache_mb = 0;
  uint32_t journal_mb = 0;
  unsigned replicas = 1;
  std::string dir = "/var/tmp", json_path, image_size;
  app.add_option("--workload", workloads, "phases to run, comma-separated (always run in the order listed in --help)")
      ->delimiter(',');
  app.add_option("--n", n, "keys inserted by seq_insert and rand_insert (lookups and mixed ops: N/10)")
      ->check(CLI::Range(uint64_t(1), uint64_t(1) << 32));
  app.add_option("--threads", threads, "threads sharing each phase's operations")->check(CLI::Range(1u, 64u));
  app.add_option("--json", json_path, "write results as JSON to this file");
  app.add_option("--dir", dir, "directory for the image file (on the disk to measure)");
  app.add_option("--cache-mb", cache_mb, "btree node cache in MiB (default: the store's default)")
      ->check(CLI::Range(uint64_t(1), uint64_t(1) << 20));
  app.add_option("--image-size", image_size, "size of the SSD image (default: N*256 bytes + 256M)");
  app.add_option("--journal-mb", journal_mb, "journal size in MiB, 1 MiB buckets (default: format's automatic size)")
      ->check(CLI::Range(8u, 4096u));
  app.add_option("--metadata-replicas", replicas,
                 "copies of every btree node (and journal entry): this many SSD images in --dir (default 1)")
      ->check(CLI::Range(1u, unsigned(btree::kMaxNodeCopies)));
  app.footer(
      "phases: seq_insert seq_lookup seq_delete rand_insert rand_lookup rand_mixed.\n"
      "Keys are at {kBtreeTest, inode 0, offset KEY} with 8-byte values; one key per transaction,\n"
      "kNoFlush, and each writing phase ends with a (timed) journal flush.");
  if (int rc = ParseCommandLine(app, kCmd, argc, argv); rc >= 0) return rc;
  std::vector<bool> want(std::size(kWorkloads), false);
  for (const std::string& w : workloads) {
    size_t i = 0;
    while (i < std::size(kWorkloads) && w != kWorkloads[i]) i++;
    if (i == std::size(kWorkloads)) {
      PrintError(kCmd, "unknown workload '" + w +
                           "' (known: seq_insert, seq_lookup, seq_delete, rand_insert, rand_lookup, rand_mixed)");
      return 2;
    }
    want[i] = true;
  }
  std::ofstream json_file;
  if (!json_path.empty()) {  // fail before a long run, not after it
    json_file.open(json_path);
    if (!json_file) {
      PrintError(kCmd, json_path + ": cannot write");
      return 2;
    }
  }
  uint64_t bytes = n * 256 + (uint64_t(256) << 20);
  if (!image_size.empty()) {
    auto b = ParseSize(image_size);
    if (!b || *b < (uint64_t(64) << 20)) {
      PrintError(kCmd, "--image-size must be a size of at least 64M");
      return 2;
    }
    bytes = *b;
  }

  // One image per copy (ssd.0, ssd.1, ...), each `bytes` long.
  std::vector<std::string> paths;
  for (unsigned i = 0; i < replicas; i++)
    paths.push_back(dir + "/tierfs-bench-btree-" + std::to_string(getpid()) + (i == 0 ? "" : "-" + std::to_string(i)) +
                    ".img");
  struct Cleanup {
    std::vector<std::string> made;
    ~Cleanup() {
      for (const std::string& p : made) unlink(p.c_str());
    }
  } cleanup;
  UnlinkOnSignal(paths);
  for (const std::string& path : paths) {
    int fd = open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      PrintError(kCmd, path + ": " + strerror(errno));
      return 1;
    }
    cleanup.made.push_back(path);
    int rc = posix_fallocate(fd, 0, off_t(bytes));
    close(fd);
    if (rc != 0) {
      PrintError(kCmd, path + ": " + strerror(rc));
      return 1;
    }
  }
  const std::string& path = paths[0];
  auto devs = OpenDevices(kCmd, paths, false);
  if (devs.empty()) return 1;
  std::vector<std::unique_ptr<CountingDevice>> counted;
  std::vector<CountingDevice*> counted_raw;
  std::vector<BlockDevice*> raw;
  std::vector<std::string> labels;
  std::vector<store::FormatMember> members;
  for (size_t i = 0; i < devs.size(); i++) {
    counted.push_back(std::make_unique<CountingDevice>(devs[i].get()));
    counted_raw.push_back(counted.back().get());
    raw.push_back(counted.back().get());
    labels.push_back("ssd." + std::to_string(i));
  }
  for (size_t i = 0; i < devs.size(); i++) members.push_back(store::FormatMember{raw[i], labels[i].c_str(), 1});
  store::FormatOptions fo;
  fo.journal_buckets = journal_mb;  // 0: automatic
  fo.metadata_replicas = uint8_t(replicas);
  Diag diag;
  Status st = store::Format(members.data(), u32(members.size()), fo, &diag);
  store::OpenOptions oo;
  if (cache_mb != 0) oo.btree.cache_bytes = cache_mb << 20;
  store::Store e;
  if (st.ok()) st = e.Open(raw.data(), u32(raw.size()), oo, &diag);
  if (!st.ok()) {
    PrintError(kCmd, diag.empty() ? st.Message() : diag.text);
    return 1;
  }

  uint64_t journal_bytes = uint64_t(e.sb().members[0].journal_nbuckets) * e.sb().bucket_size;
  std::string started = UtcNow();
  double load_start = LoadAverage1();
  Bench bench(&e, counted_raw, n, threads);
  std::vector<std::string> setups;
  bool seq_present = false, rand_present = false;
  for (size_t i = 0; i < std::size(kWorkloads); i++) {
    std::string name = kWorkloads[i];
    bool needs_seq = name == "seq_lookup" || name == "seq_delete";
    bool needs_rand = name == "rand_lookup" || name == "rand_mixed";
    if (!want[i]) continue;
    std::string error;
    if ((needs_seq && !seq_present) || (needs_rand && !rand_present)) {
      std::string setup = needs_seq ? "seq_insert" : "rand_insert";
      if (!bench.Run(setup, true, &error)) {
        PrintError(kCmd, "setup " + error);
        return 1;
      }
      setups.push_back(setup);
      (needs_seq ? seq_present : rand_present) = true;
    }
    if (!bench.Run(name, false, &error)) {
      PrintError(kCmd, error);
      return 1;
    }
    if (name == "seq_insert") seq_present = true;
    if (name == "seq_delete") seq_present = false;
    if (name == "rand_insert") rand_present = true;
  }
  double load_end = LoadAverage1();
  btree::Stats final_stats = e.btrees().GetStats();
  uint32_t node_size = e.btrees().node_size();
  auto c0 = std::chrono::steady_clock::now();
  st = e.Close();
  double close_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
  if (!st.ok()) {
    PrintError(kCmd, std::string("close failed: ") + st.Message());
    return 1;
  }

  uint64_t cache_bytes = cache_mb != 0 ? cache_mb << 20 : btree::DefaultCacheBytes();
  printf("btree benchmark: N=%llu, %u thread(s), cache %llu MiB, node %u KiB, journal %llu MiB, %u node cop%s, "
         "image %s%s (%s)\n",
         (unsigned long long)n, threads, (unsigned long long)(cache_bytes >> 20), node_size >> 10,
         (unsigned long long)(journal_bytes >> 20), replicas, replicas == 1 ? "y" : "ies", path.c_str(),
         replicas > 1 ? " and the others beside it" : "", devs[0]->direct() ? "O_DIRECT" : "buffered");
  printf("%-11s %9s %8s %9s %8s %7s %7s %9s %7s %8s %8s %10s %8s %8s %8s\n", "phase", "ops", "seconds", "ops/s",
         "ns/op", "cpu_s", "rss_MiB", "write_MiB", "splits", "node_rd", "node_wr", "hits", "misses", "evicts",
         "restarts");
  userspace::JsonWriter w;
  w.BeginObject();
  w.StringField("benchmark", "btree");
  w.StringField("started", started);
  w.Key("config");
  w.BeginObject();
  w.UintField("n", n);
  w.UintField("rand_ops", bench.rand_ops());
  w.UintField("threads", threads);
  w.Key("workloads");
  w.BeginArray();
  for (size_t i = 0; i < std::size(kWorkloads); i++) {
    if (want[i]) w.String(kWorkloads[i]);
  }
  w.EndArray();
  w.Key("setup_phases");
  w.BeginArray();
  for (const std::string& s : setups) w.String(s);
  w.EndArray();
  w.UintField("cache_bytes", cache_bytes);
  w.UintField("cache_mb_option", cache_mb);  // 0: --cache-mb not given
  w.UintField("node_size", node_size);
  w.UintField("bucket_size", fo.bucket_size);
  w.UintField("image_bytes", bytes);
  w.UintField("journal_mb_option", journal_mb);  // 0: --journal-mb not given (automatic)
  w.UintField("journal_bytes", journal_bytes);
  w.UintField("metadata_replicas", replicas);  // images (members), each image_bytes
  w.StringField("image", path);
  w.BoolField("direct", devs[0]->direct());
  w.StringField("key_layout", "pos {btree kBtreeTest, inode 0, offset key}, 8-byte little-endian value");
  w.StringField("transactions", "one key per transaction, CommitMode::kNoFlush; writing phases end with a timed journal Flush");
  w.EndObject();
  utsname u{};
  uname(&u);
  w.Key("machine");
  w.BeginObject();
  w.StringField("hostname", u.nodename);
  w.StringField("kernel", std::string(u.sysname) + " " + u.release);
  w.UintField("cpus", std::thread::hardware_concurrency());
  w.StringField("cpu_model", ProcField("/proc/cpuinfo", "model name"));
  w.StringField("mem_total", ProcField("/proc/meminfo", "MemTotal"));
  w.DoubleField("load1_start", load_start);
  w.DoubleField("load1_end", load_end);
  w.EndObject();
  w.Key("phases");
  w.BeginArray();
  for (const Phase& p : bench.phases()) {
    double rate = p.seconds > 0 ? double(p.ops) / p.seconds : 0;
    double ns = p.ops > 0 ? p.seconds * 1e9 / double(p.ops) : 0;
    DevCounters total;
    for (const DevCounters& d : p.devs) {
      total.write_bytes += d.write_bytes;
      total.read_bytes += d.read_bytes;
    }
    auto delta = [&](u64 btree::Stats::*f) { return p.after.*f - p.before.*f; };
    printf("%-11s %9llu %8.3f %9s %8.1f %7.2f %7.0f %9.1f %7llu %8llu %8llu %10llu %8llu %8llu %8llu\n",
           p.name.c_str(), (unsigned long long)p.ops, p.seconds, Human(rate).c_str(), ns, p.cpu_seconds,
           double(p.peak_rss_kib) / 1024, double(total.write_bytes) / (1 << 20),
           (unsigned long long)delta(&btree::Stats::splits), (unsigned long long)delta(&btree::Stats::node_reads),
           (unsigned long long)delta(&btree::Stats::node_writes), (unsigned long long)delta(&btree::Stats::cache_hits),
           (unsigned long long)delta(&btree::Stats::cache_misses), (unsigned long long)delta(&btree::Stats::evictions),
           (unsigned long long)delta(&btree::Stats::restarts));
    w.BeginObject();
    w.StringField("phase", p.name);
    w.UintField("threads", p.threads);
    w.UintField("ops", p.ops);
    w.DoubleField("seconds", p.seconds);
    w.DoubleField("flush_seconds", p.flush_seconds);
    w.DoubleField("ops_per_sec", rate);
    w.DoubleField("ns_per_op", ns);
    w.DoubleField("cpu_seconds", p.cpu_seconds);
    w.UintField("peak_rss_kib", p.peak_rss_kib);
    w.UintField("bytes_written", total.write_bytes);
    w.UintField("bytes_read", total.read_bytes);
    w.Key("devices");
    w.BeginArray();
    for (size_t i = 0; i < p.devs.size(); i++) {
      const DevCounters& d = p.devs[i];
      w.BeginObject();
      w.StringField("label", "ssd.0");
      w.UintField("writes", d.writes);
      w.UintField("bytes_written", d.write_bytes);
      w.UintField("fua_writes", d.fua_writes);
      w.UintField("reads", d.reads);
      w.UintField("bytes_read", d.read_bytes);
      w.UintField("flushes", d.flushes);
      w.Key("bytes_written_by_origin");
      w.BeginObject();
      for (int o = 0; o < kIoOriginCount; o++) {
        if (d.write_bytes_by_origin[o] != 0) w.UintField(IoOriginName(IoOrigin(o)), d.write_bytes_by_origin[o]);
      }
      w.EndObject();
      w.EndObject();
    }
    w.EndArray();
    // The huge-page arena (userspace/platform/huge_arena.h): its size at the end
    // of the phase, and the chunks it mapped and returned during it.
    w.Key("arena");
    w.BeginObject();
    w.BoolField("enabled", userspace::HugeArenaEnabled());
    w.UintField("mapped_bytes", p.arena_after.mapped_bytes);
    w.UintField("in_use_bytes", p.arena_after.in_use_bytes);
    w.UintField("chunks", p.arena_after.chunks);
    w.UintField("chunks_unmapped", p.arena_after.chunks_unmapped - p.arena_before.chunks_unmapped);
    w.UintField("hugepage_advice_failures",
                p.arena_after.hugepage_advice_failures - p.arena_before.hugepage_advice_failures);
    w.EndObject();
    w.Key("btree");
    WriteBtreeStats(w, p.before, p.after);
    w.EndObject();
  }
  w.EndArray();
  w.Key("final_btree");
  WriteBtreeStats(w, btree::Stats{}, final_stats);
  w.DoubleField("close_seconds", close_seconds);
  w.EndObject();
  printf("(ops/s and ns/op are wall-clock over all threads; write phases include their closing journal flush; "
         "close %.2f s)\n",
         close_seconds);
  if (!json_path.empty()) {
    json_file << w.str() << "\n";
    json_file.close();
    if (!json_file) {
      PrintError(kCmd, json_path + ": cannot write");
      return 1;
    }
  }
  return 0;
}

}  // namespace tfs::tools
