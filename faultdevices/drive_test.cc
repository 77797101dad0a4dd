// DriveModel in virtual time: the characteristic shapes of a hard drive and of a
// drive-managed SMR drive, checked in milliseconds of real time.
#include "faultdevices/drive.h"

#include <gtest/gtest.h>

#include <deque>
#include <random>

namespace faultdev {
namespace {

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kGiB = 1ull << 30;

// Runs `n` requests with `qd` in flight through the model (closed loop) and
// returns the virtual time taken. `next(i)` gives request i.
template <typename NextFn>
uint64_t Simulate(DriveModel& d, int n, int qd, NextFn next, std::vector<uint64_t>* latencies = nullptr) {
  struct Req {
    uint64_t submit;
  };
  std::vector<Req> reqs(n);
  std::vector<DriveModel::Done> done;
  uint64_t now = 0;
  int issued = 0, finished = 0;
  auto issue = [&](uint64_t t) {
    DriveModel::HostIo io = next(issued);
    io.tag = reinterpret_cast<void*>(uintptr_t(issued + 1));
    reqs[issued].submit = t;
    issued++;
    d.Submit(io, t, &done);
  };
  while (issued < qd && issued < n) issue(0);
  std::multimap<uint64_t, void*> acks;  // completions not needing the head
  std::optional<uint64_t> end;           // of the job on the head
  while (finished < n) {
    for (auto& x : done) acks.emplace(x.end, x.tag);
    done.clear();
    if (!d.busy()) end = d.StartNext(now);
    if (!d.busy() && acks.empty()) {
      std::optional<uint64_t> idle = d.IdleCleanAt();
      if (!idle) ADD_FAILURE() << "model stuck";
      if (!idle) return now;
      now = *idle;
      continue;
    }
    uint64_t t_job = d.busy() ? *end : UINT64_MAX;
    uint64_t t_ack = acks.empty() ? UINT64_MAX : acks.begin()->first;
    if (t_ack <= t_job) {
      now = t_ack;
      void* tag = acks.begin()->second;
      acks.erase(acks.begin());
      done.push_back({tag, 0, now});
    } else {
      now = t_job;
      d.FinishJob(&done);
    }
    std::vector<DriveModel::Done> finished_now;
    for (auto& x : done) {
      if (x.end <= now) finished_now.push_back(x);
      else acks.emplace(x.end, x.tag);
    }
    done.clear();
    for (auto& x : finished_now) {
      finished++;
      if (latencies) latencies->push_back(now - reqs[uintptr_t(x.tag) - 1].submit);
      if (issued < n) issue(now);
    }
  }
  return now;
}

HddModel Hdd7200() {
  HddModel h;
  h.write_cache_bytes = 0;
  return h;
}

TEST(Drive, SeekCurveMatchesTheFigures) {
  HddModel h = Hdd7200();
  DriveModel d(h, std::nullopt, 8000 * kGiB, 1);
  EXPECT_EQ(d.SeekNs(0), 0u);
  EXPECT_NEAR(double(d.SeekNs(1)), double(h.track_to_track_ns), 0.05 * kMs);
  EXPECT_NEAR(double(d.SeekNs(8000 * kGiB)), double(h.full_stroke_seek_ns), 0.01 * kMs);
  // Mean over random pairs of positions is the average seek.
  std::mt19937_64 rng(7);
  double sum = 0;
  const int kN = 20000;
  for (int i = 0; i < kN; i++) {
    uint64_t a = rng() % (8000 * kGiB), b = rng() % (8000 * kGiB);
    sum += double(d.SeekNs(a > b ? a - b : b - a));
  }
  EXPECT_NEAR(sum / kN, double(h.average_seek_ns), 0.2 * kMs);
  EXPECT_EQ(d.RevolutionNs(), 8'333'333u);
  // 1 MiB at the outer zone (250 MB/s) vs the inner zone (120 MB/s).
  EXPECT_NEAR(double(d.TransferNs(0, 1 << 20)), 1048576.0 / 250e6 * 1e9, 1e3);
  EXPECT_NEAR(double(d.TransferNs(8000 * kGiB, 1 << 20)), 1048576.0 / 120e6 * 1e9, 1e3);
}

TEST(Drive, RandomIsMuchSlowerThanSequential) {
  const uint64_t cap = 8000 * kGiB;
  DriveModel rnd(Hdd7200(), std::nullopt, cap, 1);
  std::mt19937_64 rng(3);
  uint64_t t_rand = Simulate(rnd, 500, 1, [&](int) {
    return DriveModel::HostIo{nullptr, DriveModel::Kind::kRead, (rng() % (cap / 4096)) * 4096, 4096};
  });
  DriveModel seq(Hdd7200(), std::nullopt, cap, 1);
  uint64_t t_seq = Simulate(seq, 500, 1, [&](int i) {
    return DriveModel::HostIo{nullptr, DriveModel::Kind::kRead, uint64_t(i) * 4096, 4096};
  });
  double rand_ms = double(t_rand) / 500 / kMs, seq_ms = double(t_seq) / 500 / kMs;
  // Random: seek (8.5) + half a revolution (4.2) + overhead ~ 12.8 ms.
  EXPECT_GT(rand_ms, 10.0);
  EXPECT_LT(rand_ms, 16.0);
  EXPECT_LT(seq_ms, 0.5);
  EXPECT_GT(rand_ms / seq_ms, 50);
}

TEST(Drive, NcqReorderingHelpsAtDepth) {
  const uint64_t cap = 8000 * kGiB;
  auto run = [&](int qd) {
    DriveModel d(Hdd7200(), std::nullopt, cap, 1);
    std::mt19937_64 rng(5);
    return Simulate(d, 2000, qd, [&](int) {
      return DriveModel::HostIo{nullptr, DriveModel::Kind::kRead, (rng() % (cap / 4096)) * 4096, 4096};
    });
  };
  uint64_t qd1 = run(1), qd32 = run(32);
  EXPECT_GT(double(qd1) / 2000, 11.0 * kMs);
  EXPECT_LT(double(qd1) / 2000, 14.5 * kMs);
  EXPECT_LT(double(qd32), 0.75 * double(qd1)) << "shortest-seek-first should shorten seeks at QD32";
}

TEST(Drive, AgingBoundsTheWait) {
  HddModel h = Hdd7200();
  h.max_queue_wait_ns = 100 * kMs;
  const uint64_t cap = 8000 * kGiB;
  DriveModel d(h, std::nullopt, cap, 1);
  std::mt19937_64 rng(9);
  std::vector<uint64_t> lat;
  Simulate(
      d, 3000, 32,
      [&](int) { return DriveModel::HostIo{nullptr, DriveModel::Kind::kRead, (rng() % (cap / 4096)) * 4096, 4096}; },
      &lat);
  uint64_t worst = *std::max_element(lat.begin(), lat.end());
  // Aging kicks in after 100 ms; then at most the NCQ backlog of aged requests.
  EXPECT_LT(worst, 800 * kMs);
}

TEST(Drive, WriteCacheAcksFastAndFlushWaitsForDestage) {
  HddModel h = Hdd7200();
  h.write_cache_bytes = 64 << 20;
  DriveModel d(h, std::nullopt, 8000 * kGiB, 1);
  std::vector<DriveModel::Done> done;
  std::mt19937_64 rng(1);
  for (int i = 0; i < 100; i++) {
    d.Submit({reinterpret_cast<void*>(uintptr_t(i + 1)), DriveModel::Kind::kWrite, (rng() % 1000000) * 4096, 4096}, 0,
             &done);
  }
  ASSERT_EQ(done.size(), 100u);  // all acknowledged from the cache
  for (auto& x : done) EXPECT_LT(x.end, 1 * kMs);
  done.clear();
  d.Submit({reinterpret_cast<void*>(uintptr_t(999)), DriveModel::Kind::kFlush, 0, 0}, 0, &done);
  EXPECT_TRUE(done.empty());  // 100 random writes to destage first
  uint64_t now = 0;
  while (done.empty()) {
    std::optional<uint64_t> end = d.StartNext(now);
    ASSERT_TRUE(end.has_value());
    now = *end;
    d.FinishJob(&done);
  }
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(uintptr_t(done[0].tag), 999u);
  EXPECT_EQ(d.stats().destaged, 100u);
  EXPECT_GT(done[0].end, 100 * 5 * kMs);  // ~100 seeks, shortened by reordering
}

// A small SMR drive so the media cache fills quickly.
SmrModel SmallSmr() {
  SmrModel s;
  s.media_cache_bytes = 16 << 20;
  s.band_bytes = 4 << 20;
  s.high_water = 0.8;
  s.idle_clean_after_ns = 500 * kMs;
  s.clean_overhead_ns = 20 * kMs;
  return s;
}

TEST(Drive, SmrRandomWritesCollapseWhenTheMediaCacheFills) {
  const uint64_t cap = 1 * kGiB;
  HddModel h = Hdd7200();
  DriveModel d(h, SmallSmr(), cap, 1);
  std::mt19937_64 rng(11);
  std::vector<uint64_t> lat;
  const int kN = 12000;  // 47 MiB of random 4k writes into a 16 MiB media cache
  Simulate(
      d, kN, 8,
      [&](int) { return DriveModel::HostIo{nullptr, DriveModel::Kind::kWrite, (rng() % (cap / 4096)) * 4096, 4096}; },
      &lat);
  // Fast at first: media-cache appends at near-sequential speed.
  std::vector<uint64_t> first(lat.begin(), lat.begin() + 2000);
  std::sort(first.begin(), first.end());
  EXPECT_LT(first[1000], 2 * kMs);
  // Then cleaning: each band rewrite takes tens of ms and frees little.
  EXPECT_GT(d.stats().bands_cleaned, 10u);
  std::vector<uint64_t> last(lat.end() - 2000, lat.end());
  uint64_t worst = *std::max_element(last.begin(), last.end());
  EXPECT_GT(worst, 50 * kMs);
  double mean_first = 0, mean_last = 0;
  for (uint64_t x : first) mean_first += double(x);
  for (uint64_t x : last) mean_last += double(x);
  EXPECT_GT(mean_last, 10 * mean_first) << "throughput should collapse once cleaning starts";
  EXPECT_GE(d.stats().media_cache_peak, uint64_t(0.8 * (16 << 20)));
}

TEST(Drive, SmrCleansWhileIdleAfterTheHostStops) {
  const uint64_t cap = 1 * kGiB;
  DriveModel d(Hdd7200(), SmallSmr(), cap, 1);
  std::mt19937_64 rng(13);
  uint64_t end = Simulate(d, 1000, 4, [&](int) {
    return DriveModel::HostIo{nullptr, DriveModel::Kind::kWrite, (rng() % (cap / 4096)) * 4096, 4096};
  });
  uint64_t fill = d.stats().media_cache_bytes;
  ASSERT_GT(fill, 0u);
  EXPECT_EQ(d.stats().bands_cleaned, 0u);  // below high water: nothing cleaned yet
  std::optional<uint64_t> at = d.IdleCleanAt();
  ASSERT_TRUE(at.has_value());
  EXPECT_GE(*at, end + SmallSmr().idle_clean_after_ns);
  // Let the drive run idle: it cleans band after band until the cache is empty.
  uint64_t now = *at;
  int jobs = 0;
  while (d.stats().media_cache_bytes > 0 && jobs < 10000) {
    std::optional<uint64_t> e = d.StartNext(now);
    if (!e) {
      now = *d.IdleCleanAt();
      continue;
    }
    now = *e;
    std::vector<DriveModel::Done> done;
    d.FinishJob(&done);
    jobs++;
  }
  EXPECT_EQ(d.stats().media_cache_bytes, 0u);
  EXPECT_GT(d.stats().idle_cleans, 0u);
  EXPECT_EQ(d.stats().idle_cleans, d.stats().bands_cleaned);
}

TEST(Drive, SmrSequentialWritesBypassTheMediaCache) {
  const uint64_t cap = 1 * kGiB;
  DriveModel d(Hdd7200(), SmallSmr(), cap, 1);
  uint64_t t = Simulate(d, 2000, 4, [&](int i) {
    return DriveModel::HostIo{nullptr, DriveModel::Kind::kWrite, uint64_t(i) * 65536, 65536};
  });
  EXPECT_EQ(d.stats().media_cache_writes, 0u);
  EXPECT_EQ(d.stats().bands_cleaned, 0u);
  double mb_s = 2000.0 * 65536 / (double(t) / 1e9) / 1e6;
  EXPECT_GT(mb_s, 100);  // near the zone rate
}

TEST(Drive, AbortForgetsQueuedRequests) {
  DriveModel d(Hdd7200(), std::nullopt, 8000 * kGiB, 1);
  std::vector<DriveModel::Done> done;
  for (int i = 0; i < 40; i++) {
    d.Submit({reinterpret_cast<void*>(uintptr_t(i + 1)), DriveModel::Kind::kRead, uint64_t(i) * (1ull << 33), 4096}, 0,
             &done);
  }
  ASSERT_TRUE(d.StartNext(0).has_value());  // one on the head
  std::vector<void*> aborted = d.Abort();
  EXPECT_EQ(aborted.size(), 39u);
  EXPECT_EQ(d.queued(), 0u);
  d.FinishJob(&done);
  EXPECT_EQ(done.size(), 1u);  // the one on the head still comes back
}

}  // namespace
}  // namespace faultdev
