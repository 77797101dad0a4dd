// The userspace shrinker registry and its pressure thread (see pressure.h).
//
// One registry per process: the shrinkers (held in a vector under one mutex,
// which every call of a shrinker runs under, so that unregistering waits for
// it) and the thread, started with the first shrinker and joined with the
// last. The thread reads its files without the mutex, decides with the pure
// functions below (PagesToShrink, UnderPressure, PressureEpisode) and logs
// when pressure starts and ends. It may not take any filesystem lock itself:
// the shrinkers try theirs.
#include "userspace/platform/pressure.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "platform/platform.h"

namespace tfs::userspace {
namespace {

struct Registry {
  std::mutex mu;  // the shrinkers and the stats; held across their calls
  std::vector<tfs_plat_shrinker*> shrinkers;
  PressureOptions options;
  PressureStats stats;
  // The thread: started with the first shrinker, stopped with the last.
  std::mutex thread_mu;  // serializes start and stop (taken before mu)
  std::thread thread;
  std::condition_variable cv;  // with mu: wakes the thread to stop
  bool stop = false;
  bool pressured = false;  // the last look found pressure (logged on change)
  PressureEpisode episode;
};

Registry& R() {
  static Registry* r = new Registry();  // never destroyed: shrinkers may unregister at exit
  return *r;
}

// "0::/path" of /proc/self/cgroup: the cgroup v2 path ("" if none).
std::string CgroupV2Path() {
  FILE* f = fopen("/proc/self/cgroup", "re");
  if (f == nullptr) return "";
  char line[4096];
  std::string path;
  while (fgets(line, sizeof(line), f) != nullptr) {
    if (strncmp(line, "0::", 3) != 0) continue;
    path = line + 3;
    while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
  }
  fclose(f);
  return path;
}

bool Readable(const std::string& p) { return access(p.c_str(), R_OK) == 0; }

u64 ShrinkLocked(Registry& r, u64 pages) {
  std::vector<u64> counts(r.shrinkers.size());
  u64 total = 0;
  for (size_t i = 0; i < r.shrinkers.size(); i++) {
    counts[i] = r.shrinkers[i]->count(r.shrinkers[i]->ctx);
    total += counts[i];
  }
  if (total == 0 || pages == 0) return 0;
  u64 freed = 0;
  for (size_t i = 0; i < r.shrinkers.size(); i++) {
    if (counts[i] == 0) continue;
    // Its share, rounded up (so that a small request still reaches someone).
    const unsigned __int128 share = (unsigned __int128)pages * counts[i];
    const u64 ask = std::min<u64>(counts[i], u64((share + total - 1) / total));
    if (ask > 0) freed += r.shrinkers[i]->scan(r.shrinkers[i]->ctx, ask);
  }
  return freed;
}

void ThreadMain() {
  Registry& r = R();
  std::unique_lock<std::mutex> l(r.mu);
  while (!r.stop) {
    const auto interval = std::chrono::milliseconds(std::max<u32>(r.options.interval_ms, 10));
    r.cv.wait_for(l, interval, [&] { return r.stop; });
    if (r.stop) break;
    const PressureOptions options = r.options;
    l.unlock();
    const PressureReading reading = ReadPressure();  // (files read without the mutex)
    l.lock();
    if (r.stop) break;
    r.stats.looks++;
    u64 countable = 0;
    for (tfs_plat_shrinker* s : r.shrinkers) countable += s->count(s->ctx);
    const bool pressured = UnderPressure(options, reading);
    const u64 pages = r.episode.Ask(pressured, PagesToShrink(options, reading, countable), countable);
    if (pressured != r.pressured) {
      r.pressured = pressured;
      char line[200];
      snprintf(line, sizeof(line),
               pressured ? "memory pressure: some avg10 %.1f%%, rss %llu MiB: caches give memory back"
                         : "memory pressure over (some avg10 %.1f%%, rss %llu MiB)",
               reading.some_avg10, (unsigned long long)(reading.rss >> 20));
      tfs_plat_log(int(platform::LogLevel::kInfo), line);
    }
    if (!pressured) continue;
    r.stats.pressured++;
    if (pages == 0) continue;
    r.stats.pages_asked += pages;
    r.stats.pages_freed += ShrinkLocked(r, pages);
  }
}

}  // namespace

void SetPressureOptions(const PressureOptions& options) {
  std::lock_guard<std::mutex> l(R().mu);
  R().options = options;
}

PressureOptions GetPressureOptions() {
  std::lock_guard<std::mutex> l(R().mu);
  return R().options;
}

std::string PressureFile() {
  const std::string cg = CgroupV2Path();
  if (!cg.empty()) {
    for (const char* root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
      const std::string p = std::string(root) + (cg == "/" ? "" : cg) + "/memory.pressure";
      if (Readable(p)) return p;
    }
  }
  return Readable("/proc/pressure/memory") ? "/proc/pressure/memory" : "";
}

PressureReading ReadPressure() {
  PressureReading out;
  static const std::string file = PressureFile();  // the cgroup does not change
  if (!file.empty()) {
    if (FILE* f = fopen(file.c_str(), "re")) {
      char line[256];
      while (fgets(line, sizeof(line), f) != nullptr) {
        double v;
        if (sscanf(line, "some avg10=%lf", &v) == 1) {
          out.psi_known = true;
          out.some_avg10 = v;
        }
      }
      fclose(f);
    }
  }
  if (FILE* f = fopen("/proc/self/statm", "re")) {
    unsigned long long size, resident;
    if (fscanf(f, "%llu %llu", &size, &resident) == 2) out.rss = resident * u64(sysconf(_SC_PAGESIZE));
    fclose(f);
  }
  return out;
}

u64 PagesToShrink(const PressureOptions& options, const PressureReading& reading, u64 countable) {
  u64 pages = 0;
  if (options.rss_limit > 0 && reading.rss > options.rss_limit)
    pages = (reading.rss - options.rss_limit + options.rss_limit / 10 + platform::kShrinkPage - 1) /
            platform::kShrinkPage;
  if (options.psi_some_pct > 0 && reading.psi_known && reading.some_avg10 >= double(options.psi_some_pct))
    pages = std::max<u64>(pages, (countable + 3) / 4);
  return std::min(pages, countable);
}

bool UnderPressure(const PressureOptions& options, const PressureReading& reading) {
  return (options.rss_limit > 0 && reading.rss > options.rss_limit) ||
         (options.psi_some_pct > 0 && reading.psi_known && reading.some_avg10 >= double(options.psi_some_pct));
}

u64 PressureEpisode::Ask(bool pressure, u64 pages, u64 countable) {
  if (!pressure) {
    active = false;
    return 0;
  }
  if (!active) {
    active = true;
    floor = countable - std::min(pages, countable);
    return pages;
  }
  return countable > floor ? std::min(pages, countable - floor) : 0;
}

u64 ShrinkAll(u64 pages) {
  Registry& r = R();
  std::lock_guard<std::mutex> l(r.mu);
  return ShrinkLocked(r, pages);
}

u64 CountAll() {
  Registry& r = R();
  std::lock_guard<std::mutex> l(r.mu);
  u64 n = 0;
  for (tfs_plat_shrinker* s : r.shrinkers) n += s->count(s->ctx);
  return n;
}

PressureStats GetPressureStats() {
  Registry& r = R();
  std::lock_guard<std::mutex> l(r.mu);
  PressureStats s = r.stats;
  s.shrinkers = u32(r.shrinkers.size());
  return s;
}

}  // namespace tfs::userspace

extern "C" int tfs_plat_shrinker_register(struct tfs_plat_shrinker* shrinker) {
  using tfs::userspace::R;
  if (shrinker == nullptr || shrinker->count == nullptr || shrinker->scan == nullptr) return -EINVAL;
  auto& r = R();
  std::lock_guard<std::mutex> t(r.thread_mu);
  {
    std::lock_guard<std::mutex> l(r.mu);
    if (std::find(r.shrinkers.begin(), r.shrinkers.end(), shrinker) != r.shrinkers.end()) return -EBUSY;
    r.shrinkers.push_back(shrinker);
    if (r.thread.joinable()) return 0;
    r.stop = false;
  }
  try {
    r.thread = std::thread(tfs::userspace::ThreadMain);
  } catch (...) {  // no thread: the caches keep their bounds, nothing shrinks them
    std::lock_guard<std::mutex> l(r.mu);
    r.shrinkers.pop_back();
    return -EAGAIN;
  }
  return 0;
}

extern "C" void tfs_plat_shrinker_unregister(struct tfs_plat_shrinker* shrinker) {
  using tfs::userspace::R;
  auto& r = R();
  std::lock_guard<std::mutex> t(r.thread_mu);
  bool last;
  {
    std::lock_guard<std::mutex> l(r.mu);  // waits for a call of it that runs
    r.shrinkers.erase(std::remove(r.shrinkers.begin(), r.shrinkers.end(), shrinker), r.shrinkers.end());
    last = r.shrinkers.empty() && r.thread.joinable();
    if (last) r.stop = true;
  }
  if (!last) return;
  r.cv.notify_all();
  r.thread.join();
}
