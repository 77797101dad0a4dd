#include "userspace/platform/mem_device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "platform/sync.h"
#include "userspace/platform/io_testing.h"

namespace tfs::userspace {
namespace {

MemDeviceOptions Opts(bool threaded, bool volatile_cache = false) {
  MemDeviceOptions o;
  o.size = 1 << 20;
  o.threaded = threaded;
  o.volatile_cache = volatile_cache;
  return o;
}

class MemDeviceModes : public testing::TestWithParam<bool> {};

TEST_P(MemDeviceModes, RoundTripAndCountsByOrigin) {
  MemDevice dev(Opts(GetParam()));
  std::vector<uint8_t> w(4096, 0x5a), r(4096);
  ASSERT_TRUE(SyncIo(dev, IoOp::kWrite, 8192, w.data(), w.size(), 0, IoOrigin::kJournal).ok());
  ASSERT_TRUE(SyncIo(dev, IoOp::kRead, 8192, r.data(), r.size(), 0, IoOrigin::kForegroundRead).ok());
  ASSERT_TRUE(SyncIo(dev, IoOp::kFlush, 0, nullptr, 0, 0, IoOrigin::kJournal).ok());
  EXPECT_EQ(w, r);
  EXPECT_EQ(dev.ops(IoOp::kWrite, IoOrigin::kJournal), 1u);
  EXPECT_EQ(dev.ops(IoOp::kRead, IoOrigin::kForegroundRead), 1u);
  EXPECT_EQ(dev.ops(IoOp::kFlush), 1u);
  EXPECT_EQ(dev.ops(IoOp::kWrite, IoOrigin::kBtree), 0u);
  EXPECT_EQ(dev.bytes(IoOp::kWrite), 4096u);
  dev.ResetCounters();
  EXPECT_EQ(dev.ops(IoOp::kWrite), 0u);
}

TEST_P(MemDeviceModes, RejectsBadRequests) {
  MemDeviceOptions o = Opts(GetParam());
  o.read_only = true;
  MemDevice dev(o);
  std::vector<uint8_t> b(1024);
  EXPECT_EQ(SyncIo(dev, IoOp::kWrite, 0, b.data(), 512), Status(Err::kReadOnly));
  EXPECT_EQ(SyncIo(dev, IoOp::kRead, 100, b.data(), 512), Status(Err::kMisaligned));
  EXPECT_EQ(SyncIo(dev, IoOp::kRead, o.size, b.data(), 512), Status(Err::kOutOfRange));
  EXPECT_TRUE(SyncIo(dev, IoOp::kRead, 0, b.data(), 1024).ok());
}

INSTANTIATE_TEST_SUITE_P(InlineAndThreaded, MemDeviceModes, testing::Values(false, true));

TEST(MemDeviceTest, CrashDropsOnlyUnflushedWrites) {
  MemDevice dev(Opts(true, /*volatile_cache=*/true));
  std::vector<uint8_t> a(512, 0xaa), b(512, 0xbb), c(512, 0xcc), r(512);
  ASSERT_TRUE(SyncIo(dev, IoOp::kWrite, 0, a.data(), 512).ok());
  ASSERT_TRUE(SyncIo(dev, IoOp::kFlush, 0, nullptr, 0).ok());
  ASSERT_TRUE(SyncIo(dev, IoOp::kWrite, 0, b.data(), 512).ok());       // over flushed data
  ASSERT_TRUE(SyncIo(dev, IoOp::kWrite, 4096, c.data(), 512, IoRequest::kFua).ok());
  ASSERT_TRUE(SyncIo(dev, IoOp::kWrite, 8192, b.data(), 512).ok());    // never flushed
  EXPECT_EQ(dev.dirty_blocks(), 2u);
  // Before the crash the device reads what was written.
  ASSERT_TRUE(SyncIo(dev, IoOp::kRead, 0, r.data(), 512).ok());
  EXPECT_EQ(r, b);
  dev.Crash();
  EXPECT_EQ(dev.dirty_blocks(), 0u);
  ASSERT_TRUE(SyncIo(dev, IoOp::kRead, 0, r.data(), 512).ok());
  EXPECT_EQ(r, a);  // the flushed version survives, the later write is gone
  ASSERT_TRUE(SyncIo(dev, IoOp::kRead, 4096, r.data(), 512).ok());
  EXPECT_EQ(r, c);  // FUA survives without a flush
  ASSERT_TRUE(SyncIo(dev, IoOp::kRead, 8192, r.data(), 512).ok());
  EXPECT_EQ(r, std::vector<uint8_t>(512, 0));
}

// A torn snapshot keeps every durable block and a seeded half of the dirty
// ones: over a few seeds, each dirty block shows up both kept and lost.
TEST(MemDeviceTest, TornSnapshotsKeepSomeUnflushedWrites) {
  MemDevice dev(Opts(false, /*volatile_cache=*/true));
  std::vector<uint8_t> a(512, 0xaa), b(512, 0xbb);
  ASSERT_TRUE(SyncIo(dev, IoOp::kWrite, 0, a.data(), 512, IoRequest::kFua).ok());
  for (int k = 1; k <= 8; k++) ASSERT_TRUE(SyncIo(dev, IoOp::kWrite, u64(k) * 512, b.data(), 512).ok());
  int kept[9] = {};
  for (uint64_t seed = 0; seed < 32; seed++) {
    std::vector<uint8_t> img = MemDevice::SnapshotTorn({&dev}, seed)[0];
    EXPECT_EQ(img[0], 0xaa);
    for (int k = 1; k <= 8; k++) {
      EXPECT_TRUE(img[k * 512] == 0xbb || img[k * 512] == 0) << k;
      kept[k] += img[k * 512] == 0xbb;
    }
  }
  for (int k = 1; k <= 8; k++) {
    EXPECT_GT(kept[k], 0) << k;
    EXPECT_LT(kept[k], 32) << k;
  }
  EXPECT_EQ(MemDevice::SnapshotTorn({&dev}, 3)[0], MemDevice::SnapshotTorn({&dev}, 3)[0]);  // seeded
}

TEST(MemDeviceTest, RawAccessForCorruptionTests) {
  MemDevice dev(Opts(false));
  uint8_t byte = 0x42, back = 0;
  dev.WriteRaw(777, &byte, 1);
  dev.ReadRaw(777, &back, 1);
  EXPECT_EQ(back, 0x42);
  std::vector<uint8_t> r(512);
  ASSERT_TRUE(SyncIo(dev, IoOp::kRead, 512, r.data(), 512).ok());
  EXPECT_EQ(r[777 - 512], 0x42);
}

struct Tracked {
  Latch* latch;
  int calls = 0;
};

TEST(MemDeviceTest, ManyConcurrentRequestsCompleteOnce) {
  MemDevice dev(Opts(true));
  constexpr int kN = 200;
  Latch latch(kN);
  std::vector<IoRequest> reqs(kN);
  std::vector<Tracked> tracked(kN, Tracked{&latch});
  std::vector<std::vector<uint8_t>> bufs(kN);
  for (int i = 0; i < kN; i++) {
    bufs[i].assign(512, uint8_t(i));
    reqs[i].op = IoOp::kWrite;
    reqs[i].offset = uint64_t(i) * 512;
    reqs[i].length = 512;
    reqs[i].buf = bufs[i].data();
    reqs[i].caller_data = &tracked[i];
    reqs[i].done = [](IoRequest* r, Status st) {
      EXPECT_TRUE(st.ok());
      auto* t = static_cast<Tracked*>(r->caller_data);
      t->calls++;
      t->latch->CountDown();
    };
    dev.Submit(&reqs[i]);
  }
  ASSERT_TRUE(latch.WaitFor(60 * platform::kNsPerSec));
  for (int i = 0; i < kN; i++) EXPECT_EQ(tracked[i].calls, 1);
  EXPECT_EQ(dev.ops(IoOp::kWrite), uint64_t(kN));
  std::vector<uint8_t> r(512);
  ASSERT_TRUE(SyncIo(dev, IoOp::kRead, 199 * 512, r.data(), 512).ok());
  EXPECT_EQ(r[0], 199);
}

}  // namespace
}  // namespace tfs::userspace
