// FaultDevice in real time: each model's characteristic shape is visible to a
// caller. Bounds are lower bounds plus generous upper bounds: the machine is shared.
#include "faultdevices/device.h"

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>

#include "faultdevices/control.h"
#include "faultdevices/loadgen.h"
#include "faultdevices/testing.h"
#include "userspace/platform/mem_device.h"

namespace faultdev {
namespace {

using testing::Batch;
using testing::MakeDevice;
using testing::Ms;
using testing::MustParse;
using tfs::Err;
using tfs::IoOp;

// Waits up to `ms` for every request of `b`; returns how many are still pending.
// For tests of requests that used to be lost: Batch::Wait() would hang forever.
int WaitFor(Batch& b, int ms) {
  int left = 0;
  for (int i = 0; i <= ms / 10; i++) {
    left = 0;
    for (size_t k = 0; k < b.size(); k++) left += !b[k].done;  // a racy probe is fine here
    if (left == 0) return 0;
    usleep(10000);
  }
  return left;
}

TEST(FaultDevice, PassThroughMovesData) {
  auto t = MakeDevice(MustParse(""));
  Batch b(*t.dev);
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 4096, 8192, 0xab).status.ok());
  testing::Pending& r = b.Sync(IoOp::kRead, 4096, 8192);
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(r.buf, std::vector<uint8_t>(8192, 0xab));
  EXPECT_TRUE(b.Sync(IoOp::kFlush, 0, 0).status.ok());
  EXPECT_EQ(b.Sync(IoOp::kRead, 100, 512).status, tfs::Status(Err::kMisaligned));
  EXPECT_EQ(t.mem->ops(IoOp::kWrite), 1u);  // the backing device saw our own request
}

TEST(FaultDevice, FixedDelayIsNeverEarly) {
  auto t = MakeDevice(MustParse("[delay]\nall_ms = 10\n"));
  LoadOptions lo;
  lo.pattern = Pattern::kRandRead;
  lo.ops = 120;
  lo.qd = 4;
  // A delay is never early. How late it is depends on the machine's load, so
  // the model's accuracy is measured, not asserted (docs/faultdevices.md:
  // `faultdev run ... --set delay.all_ms=10`, median within 1 ms on an idle
  // machine); an upper bound here failed under load (11.9 ms beside the gate).
  LoadResult r = RunLoad(*t.dev, lo);
  EXPECT_EQ(r.errors, 0u);
  EXPECT_EQ(r.latency_ns.count(), 120u);
  EXPECT_GE(Ms(r.latency_ns.min()), 10.0);
  EXPECT_GE(Ms(r.latency_ns.Quantile(50, 100)), 10.0);
}

TEST(FaultDevice, JitterAddsWithinItsBound) {
  auto t = MakeDevice(MustParse("[delay]\nall_ms = 2\njitter = \"uniform\"\njitter_ms = 4\n"));
  LoadOptions lo;
  lo.ops = 100;
  lo.qd = 8;
  LoadResult r = RunLoad(*t.dev, lo);
  EXPECT_GE(Ms(r.latency_ns.min()), 2.0);
  EXPECT_GT(Ms(r.latency_ns.Quantile(90, 100)) - Ms(r.latency_ns.Quantile(10, 100)), 1.5);
}

TEST(FaultDevice, HddRandomIsMuchSlowerThanSequential) {
  std::string error;
  std::optional<Profile> p = LoadProfile(FindProfile("hdd-7200"), {}, &error);
  ASSERT_TRUE(p) << error;
  auto t = MakeDevice(*p, 256 << 20);
  LoadOptions lo;
  lo.pattern = Pattern::kRandRead;
  lo.ops = 40;
  LoadResult rnd = RunLoad(*t.dev, lo);
  lo.pattern = Pattern::kSeqRead;
  lo.ops = 200;
  LoadResult seq = RunLoad(*t.dev, lo);
  double rnd_ms = Ms(rnd.latency_ns.Mean()), seq_ms = Ms(seq.latency_ns.Mean());
  EXPECT_GT(rnd_ms, 8.0);
  EXPECT_LT(rnd_ms, 40.0);
  EXPECT_LT(seq_ms, 2.0);
  EXPECT_GT(rnd_ms, 10 * seq_ms);
  DeviceStats s = t.dev->Stats();
  EXPECT_GT(s.drive.seeks, 30u);
  EXPECT_GT(s.drive.sequential, 150u);
}

TEST(FaultDevice, SmrCollapsesAndCleansForReal) {
  Profile p = MustParse(
      "[hdd]\nwrite_cache = 0\n[smr]\nmedia_cache = \"1MiB\"\nband = \"256KiB\"\nhigh_water = 0.8\n"
      "idle_clean_after_ms = 200\nclean_overhead_ms = 15\n");
  auto t = MakeDevice(p, 64 << 20);
  LoadOptions lo;
  lo.pattern = Pattern::kRandWrite;
  lo.ops = 300;  // ~205 fit under high water, the rest wait for cleaning
  lo.qd = 4;
  LoadResult r = RunLoad(*t.dev, lo);
  EXPECT_EQ(r.errors, 0u);
  DeviceStats s = t.dev->Stats();
  EXPECT_GT(s.drive.bands_cleaned, 3u);
  EXPECT_GE(s.drive.media_cache_peak, uint64_t(0.8 * (1 << 20)));
  EXPECT_LT(Ms(r.latency_ns.Quantile(25, 100)), 5.0);  // the early writes were fast
  EXPECT_GT(Ms(r.latency_ns.max()), 15.0);             // later ones waited for a band
  // Cleaning goes on after the host stops (idle cleaning).
  uint64_t cleaned = s.drive.bands_cleaned;
  uint64_t deadline = NowNs() + 3'000'000'000ull;
  while (t.dev->Stats().drive.bands_cleaned == cleaned && NowNs() < deadline) usleep(20'000);
  EXPECT_GT(t.dev->Stats().drive.idle_cleans, 0u);
}

TEST(FaultDevice, StallCompletesNothingThenEverything) {
  auto t = MakeDevice(MustParse("[delay]\nall_ms = 1\n"));
  Batch b(*t.dev);
  uint64_t start = NowNs();
  t.dev->StallFor(300'000'000);
  for (int i = 0; i < 16; i++) b.Add(IoOp::kRead, uint64_t(i) * 4096, 4096);
  b.Submit();
  b.Wait();
  for (size_t i = 0; i < b.size(); i++) {
    EXPECT_TRUE(b[i].status.ok());
    EXPECT_GE(b[i].completed, start + 300'000'000) << "completed during the stall";
    EXPECT_LT(b[i].completed, start + 1'500'000'000);
  }
  DeviceStats s = t.dev->Stats();
  EXPECT_EQ(s.stalls, 1u);
  EXPECT_GE(s.stalled_ns, 290'000'000u);
}

TEST(FaultDevice, ScriptedAndPeriodicStalls) {
  auto t = MakeDevice(MustParse("[stall]\nscripted = [[0.2, 0.3]]\n"));
  Batch b(*t.dev);
  uint64_t open = NowNs();
  EXPECT_TRUE(b.Sync(IoOp::kRead, 0, 4096).status.ok());
  EXPECT_LT(b[0].completed - open, 150'000'000u);  // before the stall: immediate
  usleep(250'000);
  testing::Pending& r = b.Sync(IoOp::kRead, 0, 4096);
  EXPECT_GE(r.completed, open + 500'000'000 - 20'000'000);  // held to the stall's end
  auto p = MakeDevice(MustParse("[stall]\nperiod_s = 0.4\nduration_s = 0.2\n"));
  Batch pb(*p.dev);
  uint64_t s0 = NowNs();
  testing::Pending& q = pb.Sync(IoOp::kRead, 0, 4096);  // t=0 is inside the first stall
  EXPECT_GE(q.completed - s0, 180'000'000u);
}

// Unstall() ends a long stall at once, for the completion gate and for an HDD's
// head alike; the 60 s stall would outlast the test's bound by far.
TEST(FaultDevice, UnstallReleasesWhatTheStallHeld) {
  for (const char* text : {"[delay]\nall_ms = 1\n", "[hdd]\n", "[stall]\nscripted = [[0, 60]]\n"}) {
    SCOPED_TRACE(text);
    auto t = MakeDevice(MustParse(text));
    Batch b(*t.dev);
    uint64_t start = NowNs();
    if (std::string(text).find("scripted") == std::string::npos) t.dev->StallFor(60'000'000'000);
    for (int i = 0; i < 8; i++) b.Add(IoOp::kRead, uint64_t(i) << 20, 4096);
    b.Submit();
    usleep(50'000);
    EXPECT_GT(t.dev->Stats().stall_remaining_ns, 50'000'000'000u);
    for (size_t i = 0; i < b.size(); i++) EXPECT_FALSE(b[i].done) << "completed during the stall";
    t.dev->Unstall();
    b.Wait();
    for (size_t i = 0; i < b.size(); i++) {
      EXPECT_TRUE(b[i].status.ok());
      EXPECT_LT(b[i].completed, start + 30'000'000'000) << "held to the old end";
    }
    DeviceStats s = t.dev->Stats();
    EXPECT_EQ(s.stall_remaining_ns, 0u);
    EXPECT_EQ(s.unstalls, 1u);
    EXPECT_LT(s.stalled_ns, 30'000'000'000u);
    // A new stall still stalls.
    t.dev->StallFor(200'000'000);
    EXPECT_GT(t.dev->Stats().stall_remaining_ns, 0u);
    testing::Pending& r = b.Sync(IoOp::kRead, 0, 4096);
    EXPECT_GE(r.completed - r.submitted, 150'000'000u);
  }
}

// A stall extended while the HDD head waits for the first one's end: the head
// must not start the job at the new end (in the future), or unstall would not
// release it.
TEST(FaultDevice, UnstallReleasesAnHddHeadAfterTheStallWasExtended) {
  auto t = MakeDevice(MustParse("[hdd]\n"));
  Batch b(*t.dev);
  uint64_t start = NowNs();
  t.dev->StallFor(300'000'000);
  b.Add(IoOp::kRead, 1 << 20, 4096);
  b.Submit();
  usleep(100'000);
  t.dev->StallFor(60'000'000'000);  // from now: ends ~60 s after the first one
  usleep(400'000);                  // past the first stall's end: its kick has run
  EXPECT_FALSE(b[0].done);
  t.dev->Unstall();
  b.Wait();
  EXPECT_TRUE(b[0].status.ok());
  EXPECT_LT(b[0].completed, start + 30'000'000'000) << "held to the extended stall's end";
}

// Error ranges added at run time fail exactly their op and range, and
// ClearErrors() disables them with the profile's.
TEST(FaultDevice, RunTimeErrorRanges) {
  auto t = MakeDevice(MustParse("[delay]\nall_ms = 0\n"));
  Batch b(*t.dev);
  faultdev::ErrorRange e;
  e.offset = 1 << 20;
  e.length = 1 << 20;
  e.reads = false;
  e.writes = true;
  t.dev->AddErrors(e);
  EXPECT_TRUE(b.Sync(IoOp::kRead, 1 << 20, 4096).status.ok());
  EXPECT_FALSE(b.Sync(IoOp::kWrite, (1 << 20) + 8192, 4096).status.ok());
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 2 << 20, 4096).status.ok());
  EXPECT_EQ(t.dev->Stats().error_ranges_active, 1u);
  t.dev->ClearErrors();
  EXPECT_TRUE(b.Sync(IoOp::kWrite, (1 << 20) + 8192, 4096).status.ok());
  EXPECT_EQ(t.dev->Stats().error_ranges_active, 0u);
}

// The control commands' parsing: units, ranges, one-line errors.
TEST(FaultDevice, ControlCommands) {
  auto t = MakeDevice(MustParse("[delay]\nall_ms = 0\n"), 64 << 20);
  EXPECT_EQ(faultdev::ParseSeconds("30s"), std::optional<uint64_t>(30'000'000'000));
  EXPECT_EQ(faultdev::ParseSeconds("1.5"), std::optional<uint64_t>(1'500'000'000));
  EXPECT_EQ(faultdev::ParseSeconds("500ms"), std::optional<uint64_t>(500'000'000));
  for (const char* bad : {"", "x", "-1", "3h", "1e9", "nan"}) EXPECT_FALSE(faultdev::ParseSeconds(bad)) << bad;
  EXPECT_EQ(faultdev::HandleControl(*t.dev, "stall 20s").rfind("ok", 0), 0u);
  EXPECT_GT(t.dev->Stats().stall_remaining_ns, 10'000'000'000u);
  EXPECT_EQ(faultdev::HandleControl(*t.dev, "unstall"), "ok unstalled");
  EXPECT_EQ(t.dev->Stats().stall_remaining_ns, 0u);
  EXPECT_EQ(faultdev::HandleControl(*t.dev, "error write 1MiB+64K").rfind("ok", 0), 0u);
  EXPECT_EQ(t.dev->Stats().error_ranges_active, 1u);
  for (const char* bad : {"stall", "stall 3h", "stall 1 2", "error", "error read", "error sideways 0+1",
                          "error read 1M", "error read 0+0", "error read 64MiB+1", "error read 63MiB+2MiB",
                          "powercut x", "powercut -1", "frobnicate"}) {
    std::string reply = faultdev::HandleControl(*t.dev, bad);
    EXPECT_EQ(reply.rfind("error: ", 0), 0u) << bad << " -> " << reply;
    EXPECT_EQ(reply.find('\n'), std::string::npos);
  }
  EXPECT_EQ(faultdev::HandleControl(*t.dev, "clear"), "ok stalls ended, errors cleared");
  EXPECT_EQ(t.dev->Stats().error_ranges_active, 0u);
}

TEST(FaultDevice, TimeoutFailsExactlyTheChosenRequest) {
  auto t = MakeDevice(MustParse("[timeout]\nafter_requests = 4\nduration_s = 0.5\n"));
  Batch b(*t.dev);
  for (int i = 0; i < 8; i++) b.Sync(IoOp::kRead, uint64_t(i) * 4096, 4096);
  for (int i = 0; i < 8; i++) {
    if (i == 3) {
      EXPECT_EQ(b[i].status, tfs::Status(Err::kIoTimeout));
      EXPECT_TRUE(b[i].status.Is(tfs::ErrorClass::kIo));
      EXPECT_GE(b[i].completed - b[i].submitted, 500'000'000u);
      EXPECT_LT(b[i].completed - b[i].submitted, 2'000'000'000u);
    } else {
      EXPECT_TRUE(b[i].status.ok()) << i;
      EXPECT_LT(b[i].completed - b[i].submitted, 100'000'000u) << i;
    }
  }
  EXPECT_EQ(t.dev->Stats().timeouts_injected, 1u);
}

TEST(FaultDevice, TimeoutByOffset) {
  auto t = MakeDevice(MustParse("[timeout]\noffset = 65536\nduration_s = 0.2\n"));
  Batch b(*t.dev);
  EXPECT_TRUE(b.Sync(IoOp::kRead, 0, 4096).status.ok());
  EXPECT_EQ(b.Sync(IoOp::kRead, 65536 - 4096, 8192).status, tfs::Status(Err::kIoTimeout));
  EXPECT_TRUE(b.Sync(IoOp::kRead, 65536, 4096).status.ok());  // count = 1: only once
}

TEST(FaultDevice, TimeoutByTime) {
  auto t = MakeDevice(MustParse("[timeout]\nat_s = 0.15\nduration_s = 0.2\n"));
  Batch b(*t.dev);
  EXPECT_TRUE(b.Sync(IoOp::kRead, 0, 4096).status.ok());
  usleep(200'000);
  testing::Pending& r = b.Sync(IoOp::kWrite, 0, 4096);
  EXPECT_EQ(r.status, tfs::Status(Err::kIoTimeout));
  EXPECT_GE(r.completed - r.submitted, 200'000'000u);
  EXPECT_TRUE(b.Sync(IoOp::kRead, 0, 4096).status.ok());
}

TEST(FaultDevice, LinkResetFailsEverythingInFlight) {
  auto t = MakeDevice(MustParse("[delay]\nall_ms = 1500\n[timeout]\nafter_requests = 1\nduration_s = 0.3\n"
                                "link_reset = true\n"));
  Batch b(*t.dev);
  for (int i = 0; i < 5; i++) b.Add(IoOp::kRead, uint64_t(i) * 4096, 4096);
  b.Submit();
  b.Wait();
  for (int i = 0; i < 5; i++) {
    EXPECT_EQ(b[i].status, tfs::Status(Err::kIoTimeout)) << i;
    EXPECT_GE(b[i].completed - b[0].submitted, 300'000'000u);
    EXPECT_LT(b[i].completed - b[0].submitted, 1'200'000'000u) << "should fail at the reset, not after 1.5 s";
  }
  DeviceStats s = t.dev->Stats();
  EXPECT_EQ(s.link_resets, 1u);
  EXPECT_EQ(s.reset_failures, 4u);
}

TEST(FaultDevice, ErrorsOnlyOnTheRange) {
  auto t = MakeDevice(MustParse("[[errors]]\noffset = \"1MiB\"\nlength = \"64KiB\"\nops = \"read\"\n"));
  Batch b(*t.dev);
  EXPECT_EQ(b.Sync(IoOp::kRead, 1 << 20, 4096).status, tfs::Status(Err::kIo));
  EXPECT_EQ(b.Sync(IoOp::kRead, (1 << 20) - 512, 1024).status, tfs::Status(Err::kIo));  // overlaps
  EXPECT_EQ(b.Sync(IoOp::kRead, (1 << 20) + 60 * 1024, 4096).status, tfs::Status(Err::kIo));
  EXPECT_TRUE(b.Sync(IoOp::kRead, (1 << 20) - 4096, 4096).status.ok());
  EXPECT_TRUE(b.Sync(IoOp::kRead, (1 << 20) + 64 * 1024, 4096).status.ok());
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 1 << 20, 4096, 7).status.ok());  // reads only
  EXPECT_EQ(b.Sync(IoOp::kRead, 1 << 20, 4096).status, tfs::Status(Err::kIo));  // persistent
  EXPECT_EQ(t.dev->Stats().errors_injected, 4u);
  t.dev->ClearErrors();
  EXPECT_TRUE(b.Sync(IoOp::kRead, 1 << 20, 4096).status.ok());
}

TEST(FaultDevice, OneShotAndRateErrors) {
  auto t = MakeDevice(MustParse("[[errors]]\noffset = 0\nlength = 4096\nops = \"write\"\nmode = \"once\"\n"
                                "[[errors]]\noffset = 8192\nlength = 4096\nops = \"both\"\nmode = \"rate\"\n"
                                "rate = 0.5\n"));
  Batch b(*t.dev);
  EXPECT_EQ(b.Sync(IoOp::kWrite, 0, 4096).status, tfs::Status(Err::kIo));
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 0, 4096).status.ok());
  int failed = 0;
  for (int i = 0; i < 200; i++) failed += !b.Sync(IoOp::kRead, 8192, 4096).status.ok();
  EXPECT_GT(failed, 60);
  EXPECT_LT(failed, 140);
}

TEST(FaultDevice, QueueSlotsBoundInFlight) {
  auto t = MakeDevice(MustParse("[delay]\nall_ms = 20\n[queue]\nmax_in_flight = 2\n"));
  Batch b(*t.dev);
  for (int i = 0; i < 8; i++) b.Add(IoOp::kRead, uint64_t(i) * 4096, 4096);
  uint64_t start = NowNs();
  b.Submit();
  b.Wait();
  uint64_t last = 0;
  for (size_t i = 0; i < b.size(); i++) last = std::max(last, b[i].completed);
  EXPECT_GE(last - start, 80'000'000u);  // 8 requests, 2 at a time, 20 ms each
  EXPECT_LT(last - start, 1'000'000'000u);
  DeviceStats s = t.dev->Stats();
  EXPECT_EQ(s.max_in_flight, 2u);
  EXPECT_EQ(s.slot_waits, 6u);
  EXPECT_GE(Ms(s.queue_ns.max()), 55.0);
}

TEST(FaultDevice, BandwidthCap) {
  auto t = MakeDevice(MustParse("[bandwidth]\nmb_s = 10\n"));
  Batch b(*t.dev);
  for (int i = 0; i < 10; i++) b.Add(IoOp::kWrite, uint64_t(i) << 17, 128 << 10);
  uint64_t start = NowNs();
  b.Submit();
  b.Wait();
  uint64_t last = 0;
  for (size_t i = 0; i < b.size(); i++) last = std::max(last, b[i].completed);
  EXPECT_GE(last - start, 125'000'000u);  // 1.31 MB at 10 MB/s
  EXPECT_LT(last - start, 2'000'000'000u);
}

TEST(FaultDevice, CountsByOpAndOrigin) {
  auto t = MakeDevice(MustParse(""));
  Batch b(*t.dev);
  b.Add(IoOp::kWrite, 0, 4096, 1, 0, tfs::IoOrigin::kJournal);
  b.Add(IoOp::kWrite, 4096, 8192, 1, 0, tfs::IoOrigin::kReconcile);
  b.Add(IoOp::kRead, 0, 4096, 0, 0, tfs::IoOrigin::kForegroundRead);
  b.Submit();
  b.Wait();
  DeviceStats s = t.dev->Stats();
  EXPECT_EQ(s.by_op[int(IoOp::kWrite)].ops, 2u);
  EXPECT_EQ(s.by_op[int(IoOp::kWrite)].bytes, 12288u);
  EXPECT_EQ(s.by_origin[int(tfs::IoOrigin::kJournal)][int(IoOp::kWrite)].ops, 1u);
  EXPECT_EQ(s.by_origin[int(tfs::IoOrigin::kReconcile)][int(IoOp::kWrite)].bytes, 8192u);
  EXPECT_EQ(s.by_origin[int(tfs::IoOrigin::kForegroundRead)][int(IoOp::kRead)].ops, 1u);
  std::string json = s.ToJson();
  for (const char* key : {"\"seed\":1", "\"journal\"", "\"reconcile\"", "\"p999\"", "\"max_in_flight\"",
                          "\"stalled_s\"", "\"timeouts\"", "\"eio\""}) {
    EXPECT_NE(json.find(key), std::string::npos) << key;
  }
}

TEST(FaultDevice, ProfileMustFitTheDevice) {
  tfs::userspace::MemDeviceOptions o;
  o.size = 1 << 20;
  std::string error;
  auto dev = FaultDevice::Open(MustParse("[[errors]]\noffset = \"2MiB\"\nlength = 512\n"),
                               std::make_unique<tfs::userspace::MemDevice>(o), &error);
  EXPECT_EQ(dev, nullptr);
  EXPECT_NE(error.find("beyond the device end"), std::string::npos) << error;
  // Regression: a huge smr.band overflowed the drive model's band arithmetic.
  dev = FaultDevice::Open(MustParse("[hdd]\n[smr]\nmedia_cache = \"1MiB\"\nband = \"16000000TB\"\n"),
                          std::make_unique<tfs::userspace::MemDevice>(o), &error);
  EXPECT_EQ(dev, nullptr);
  EXPECT_NE(error.find("smr.band"), std::string::npos) << error;
}

// Regression: a link reset used to force its victims first (which admits requests
// waiting for a [queue] slot into the drive) and abort the drive after, throwing
// away the newly admitted requests: they never completed and Drain() hung.
TEST(FaultDevice, LinkResetKeepsRequestsAdmittedFromTheSlotQueue) {
  auto t = MakeDevice(MustParse("[hdd]\n[queue]\nmax_in_flight = 2\n"
                                "[timeout]\nafter_requests = 1\nduration_s = 0.2\nlink_reset = true\n"),
                      256 << 20);
  Batch b(*t.dev);
  b.Add(IoOp::kRead, 0, 4096);              // the timeout victim
  b.Add(IoOp::kRead, 128 << 20, 96 << 20);  // a drive job of ~0.4 s, failed by the reset
  b.Add(IoOp::kRead, 64 << 20, 4096);       // waits for a slot
  b.Add(IoOp::kRead, 200 << 20, 4096);      // waits for a slot
  b.Submit();
  int left = WaitFor(b, 5000);
  EXPECT_EQ(left, 0) << "requests never completed";
  if (left != 0) {
    (void)t.dev.release();  // its destructor would wait forever
    std::_Exit(1);
  }
  EXPECT_EQ(b[0].status, tfs::Status(Err::kIoTimeout));
  EXPECT_EQ(b[1].status, tfs::Status(Err::kIoTimeout));
  EXPECT_TRUE(b[2].status.ok()) << b[2].status.Message();  // admitted after the reset
  EXPECT_TRUE(b[3].status.ok()) << b[3].status.Message();
}

// Regression: a timeout victim failed early by a power cut kept its timeout event,
// which later link-reset unrelated requests submitted after PowerOn().
TEST(FaultDevice, PowerCutCancelsThePendingTimeout) {
  auto t = MakeDevice(MustParse("[delay]\nall_ms = 1000\n"
                                "[timeout]\nafter_requests = 1\nduration_s = 0.5\nlink_reset = true\n"));
  Batch b(*t.dev);
  b.Add(IoOp::kRead, 0, 4096);  // the timeout victim
  b.Submit();
  usleep(50'000);
  t.dev->PowerCut();
  t.dev->PowerOn();
  ASSERT_EQ(WaitFor(b, 1000), 0);
  EXPECT_EQ(b[0].status, tfs::Status(Err::kIo));
  b.Add(IoOp::kRead, 4096, 4096);  // after power-on: succeeds after its 1 s delay
  b.Submit();
  ASSERT_EQ(WaitFor(b, 5000), 0);
  EXPECT_TRUE(b[1].status.ok()) << b[1].status.Message();
  EXPECT_GE(b[1].completed - b[1].submitted, 1'000'000'000u);
  EXPECT_EQ(t.dev->Stats().link_resets, 0u);
}

// Regression: the cancelled victim's timeout event kept a reference, so Drain() (and
// the destructor) waited out the whole timeout after a power cut.
TEST(FaultDevice, DrainAfterPowerCutDoesNotWaitForTheTimeout) {
  auto t = MakeDevice(MustParse("[timeout]\nafter_requests = 1\nduration_s = 3\n"));
  Batch b(*t.dev);
  b.Add(IoOp::kRead, 0, 4096);  // the timeout victim
  b.Submit();
  usleep(50'000);
  t.dev->PowerCut();
  uint64_t start = NowNs();
  t.dev->Drain();
  EXPECT_LT(NowNs() - start, 1'500'000'000u) << "Drain() waited for the cancelled timeout";
  ASSERT_EQ(WaitFor(b, 1000), 0);
  EXPECT_EQ(b[0].status, tfs::Status(Err::kIo));
}

// Regression: each request failed at admission (powered off) admitted the next one
// from the slot queue recursively; a long backlog overflowed the stack.
TEST(FaultDevice, PowerCutWithALongSlotQueueDoesNotRecurse) {
  // The request in flight must still be in flight at the cut, however long
  // submitting the backlog takes on a busy machine (a 300 ms delay was not):
  // a stall holds it at the completion gate until the cut releases it. (A
  // 60 s delay did too, but the device's teardown then waited out the
  // delay's event: a minute of make test.)
  auto t = MakeDevice(MustParse("[queue]\nmax_in_flight = 1\n"));
  t.dev->StallFor(3600'000'000'000u);
  Batch b(*t.dev);
  constexpr int kQueued = 100000;
  for (int i = 0; i < kQueued; i++) b.Add(IoOp::kRead, 0, 512);
  b.Submit();
  t.dev->PowerCut();
  b.Wait();
  for (size_t i = 0; i < b.size(); i++) ASSERT_EQ(b[i].status, tfs::Status(Err::kIo)) << i;
  EXPECT_EQ(t.dev->Stats().powered_off_failures, uint64_t(kQueued));
}

// A backing device that records the flags of what reaches it.
class FlagLog final : public tfs::BlockDevice {
 public:
  FlagLog() : mem_(Options()) {}
  void Submit(tfs::IoRequest* req) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      flags_.push_back(req->flags);
    }
    mem_.Submit(req);
  }
  const tfs::BlockDeviceInfo& Info() const override { return mem_.Info(); }
  const char* Name() const override { return "flaglog"; }
  std::vector<uint8_t> flags() {
    std::lock_guard<std::mutex> lock(mu_);
    return flags_;
  }

 private:
  static tfs::userspace::MemDeviceOptions Options() {
    tfs::userspace::MemDeviceOptions o;
    o.size = 1 << 20;
    o.threaded = false;
    return o;
  }
  tfs::userspace::MemDevice mem_;
  std::mutex mu_;
  std::vector<uint8_t> flags_;
};

// An op that waited for one of the profile's slots is admitted by whatever
// thread finished the op before it (here the one that ends the stall): the promises of
// kInline and kWaited -- "the submitter waits in this very thread" -- do not
// hold there, and must not reach the backing device (a blocking syscall in
// the timer's thread; a request on a ring nobody reaps).
TEST(FaultDeviceTest, OpsAdmittedLaterDropTheSubmitterThreadHints) {
  auto log = std::make_unique<FlagLog>();
  FlagLog* seen = log.get();
  std::string error;
  auto dev = FaultDevice::Open(MustParse("[queue]\nmax_in_flight = 1\n"), std::move(log), &error);
  ASSERT_TRUE(dev != nullptr) << error;
  struct Req {
    tfs::IoRequest req;
    char buf[512];
    std::promise<tfs::Status> done;
  };
  Req a, b;
  for (Req* r : {&a, &b}) {
    r->req.op = IoOp::kRead;
    r->req.flags = tfs::IoRequest::kInline | tfs::IoRequest::kWaited;
    r->req.length = 512;
    r->req.buf = r->buf;
    r->req.caller_data = r;
    r->req.done = [](tfs::IoRequest* q, tfs::Status st) { static_cast<Req*>(q->caller_data)->done.set_value(st); };
  }
  auto fa = a.done.get_future();
  auto fb = b.done.get_future();
  dev->StallFor(3600'000'000'000u);  // (`a` cannot finish before `b` queues, however slow this thread)
  dev->Submit(&a.req);  // admitted at once, in this thread
  dev->Submit(&b.req);  // waits for the slot: admitted when `a` finishes
  ASSERT_EQ(dev->Stats().slot_waits, 1u);
  dev->Unstall();
  EXPECT_TRUE(fa.get().ok());
  EXPECT_TRUE(fb.get().ok());
  const std::vector<uint8_t> f = seen->flags();
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0], tfs::IoRequest::kInline | tfs::IoRequest::kWaited);
  EXPECT_EQ(f[1], 0u);
}

// Connects to a unix socket and stays silent; returns the fd (-1 on failure).
int SilentClient(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), std::min(path.size(), sizeof(addr.sun_path) - 1));
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Regression: the control server read a client's line with no timeout, so a client
// that connected and said nothing blocked every other client and Stop() (nbdkit
// could not exit).
TEST(ControlServer, SilentClientNeitherBlocksOthersNorStop) {
  auto t = MakeDevice(MustParse(""));
  std::string path = "/tmp/faultdev-ctl-test-" + std::to_string(getpid()) + ".sock";
  {
    ControlServer server(300);
    std::string error;
    ASSERT_TRUE(server.Start(t.dev.get(), path, &error)) << error;
    int silent = SilentClient(path);
    ASSERT_GE(silent, 0);
    auto reply = std::async(std::launch::async, [&] {
      std::string r, e;
      return SendControl(path, "poweron", &r, &e) ? r : e;
    });
    if (reply.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      ADD_FAILURE() << "a silent client blocked the control socket";
      std::_Exit(1);
    }
    EXPECT_EQ(reply.get(), "ok powered on");
    char buf[128] = {};
    EXPECT_GT(read(silent, buf, sizeof(buf) - 1), 0);  // told why, then dropped
    EXPECT_EQ(std::string(buf).rfind("error: no command", 0), 0u) << buf;
    close(silent);
  }
  {
    ControlServer server;  // default 5 s read timeout
    std::string error;
    ASSERT_TRUE(server.Start(t.dev.get(), path, &error)) << error;
    int silent = SilentClient(path);
    ASSERT_GE(silent, 0);
    usleep(50'000);  // the server is now reading from the silent client
    uint64_t start = NowNs();
    auto stopped = std::async(std::launch::async, [&] { server.Stop(); });
    if (stopped.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      ADD_FAILURE() << "Stop() blocked on a silent client";
      std::_Exit(1);
    }
    EXPECT_LT(NowNs() - start, 2'000'000'000u) << "Stop() waited for the silent client";
    close(silent);
  }
}

}  // namespace
}  // namespace faultdev
