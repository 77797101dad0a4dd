// Volatile write cache and power cut: reads see cached writes, flush and FUA make
// data durable, flushed data always survives a cut, the same seed gives the same
// image byte for byte, different seeds give different images.
#include "faultdevices/cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "faultdevices/testing.h"

namespace faultdev {
namespace {

using testing::Batch;
using testing::MakeDevice;
using testing::MustParse;
using tfs::IoOp;

constexpr const char* kCache = "[cache]\nsize = \"1MiB\"\nkeep = 0.4\ndrop = 0.4\ntear = 0.2\n";

std::vector<uint8_t> Raw(tfs::userspace::MemDevice* mem, uint64_t off, uint64_t len) {
  std::vector<uint8_t> v(len);
  mem->ReadRaw(off, v.data(), len);
  return v;
}

TEST(WriteCache, PatchPlanRetire) {
  WriteCache c(512);
  std::vector<uint8_t> a(1024, 1), b(512, 2);
  uint64_t s1 = c.Add(0, a.data(), a.size());
  uint64_t s2 = c.Add(512, b.data(), b.size());
  EXPECT_EQ(c.bytes(), 1536u);
  std::vector<uint8_t> buf(2048, 9);
  c.PatchRead(0, 2048, buf.data());
  EXPECT_EQ(buf[0], 1);
  EXPECT_EQ(buf[600], 2);
  EXPECT_EQ(buf[1500], 9);
  auto plan = c.Plan(s1);  // only the first record: both of its sectors, its own data
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].data, a);
  auto plan2 = c.Plan(s2);  // newest per sector
  ASSERT_EQ(plan2.size(), 1u);
  EXPECT_EQ(plan2[0].data[600], 2);
  c.Retire(s1);
  std::vector<uint8_t> buf2(1024, 9);
  c.PatchRead(0, 1024, buf2.data());
  EXPECT_EQ(buf2[0], 9);  // retired: now read from the backing image
  EXPECT_EQ(buf2[600], 2);
  EXPECT_EQ(c.SeqToShrinkTo(0), s2);
}

TEST(PowerCut, PlanIsDeterministicPerSeed) {
  std::deque<CacheRecord> recs;
  for (uint64_t i = 0; i < 64; i++) recs.push_back({i + 1, i * 4096, std::vector<uint8_t>(4096, uint8_t(i + 1))});
  CutPolicy pol{0.4, 0.4, 0.2};
  CutOutcome a = PlanPowerCut(recs, 512, 7, pol), b = PlanPowerCut(recs, 512, 7, pol);
  CutOutcome c = PlanPowerCut(recs, 512, 8, pol);
  EXPECT_EQ(a.kept, b.kept);
  EXPECT_EQ(a.torn, b.torn);
  ASSERT_EQ(a.runs.size(), b.runs.size());
  for (size_t i = 0; i < a.runs.size(); i++) {
    EXPECT_EQ(a.runs[i].offset, b.runs[i].offset);
    EXPECT_EQ(a.runs[i].data, b.runs[i].data);
  }
  EXPECT_EQ(a.kept + a.dropped + a.torn, 64u);
  EXPECT_GT(a.kept, 10u);
  EXPECT_GT(a.dropped, 10u);
  bool differ = a.kept != c.kept || a.runs.size() != c.runs.size();
  for (size_t i = 0; !differ && i < a.runs.size(); i++) differ = a.runs[i].offset != c.runs[i].offset;
  EXPECT_TRUE(differ);
}

TEST(VolatileCache, ReadsSeeCachedWritesAndFlushMakesThemDurable) {
  auto t = MakeDevice(MustParse(kCache));
  Batch b(*t.dev);
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 8192, 4096, 0x11).status.ok());
  EXPECT_EQ(Raw(t.mem, 8192, 4096), std::vector<uint8_t>(4096, 0));  // not durable yet
  testing::Pending& r = b.Sync(IoOp::kRead, 4096, 12288);
  EXPECT_EQ(r.buf[4096], 0x11);
  EXPECT_EQ(r.buf[0], 0);
  EXPECT_TRUE(b.Sync(IoOp::kFlush, 0, 0).status.ok());
  EXPECT_EQ(Raw(t.mem, 8192, 4096), std::vector<uint8_t>(4096, 0x11));
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 0, 4096, 0x22, tfs::IoRequest::kFua).status.ok());
  EXPECT_EQ(Raw(t.mem, 0, 4096), std::vector<uint8_t>(4096, 0x22));  // FUA: durable on completion
  EXPECT_EQ(t.dev->Stats().cache_bytes, 0u);
}

TEST(VolatileCache, FullCacheDestagesAndKeepsData) {
  auto t = MakeDevice(MustParse("[cache]\nsize = 65536\n"));
  Batch b(*t.dev);
  for (int i = 0; i < 64; i++) b.Add(IoOp::kWrite, uint64_t(i) * 4096, 4096, uint8_t(i + 1));
  b.Submit();
  b.Wait();
  t.dev->Drain();
  DeviceStats s = t.dev->Stats();
  EXPECT_LE(s.cache_bytes, 65536u);
  EXPECT_GT(s.writebacks, 0u);
  for (int i = 0; i < 64; i++) {
    testing::Pending& r = b.Sync(IoOp::kRead, uint64_t(i) * 4096, 4096);
    ASSERT_EQ(r.buf[0], uint8_t(i + 1)) << i;
  }
}

// Runs the same write history on a fresh device and cuts with `seed`.
std::vector<uint8_t> CutImage(uint64_t seed, CutOutcome* out = nullptr) {
  auto t = MakeDevice(MustParse(kCache), 4 << 20);
  Batch b(*t.dev);
  // Durable: blocks 0..31 = 0xA0+i, flushed.
  for (int i = 0; i < 32; i++) b.Sync(IoOp::kWrite, uint64_t(i) * 4096, 4096, uint8_t(0xA0 + i));
  b.Sync(IoOp::kFlush, 0, 0);
  // Unflushed: blocks 16..63 overwritten / written with 0x10+i.
  for (int i = 16; i < 64; i++) b.Sync(IoOp::kWrite, uint64_t(i) * 4096, 4096, uint8_t(0x10 + i));
  CutOutcome o = t.dev->PowerCut(seed);
  if (out != nullptr) *out = o;
  EXPECT_FALSE(t.dev->powered());
  EXPECT_EQ(b.Sync(IoOp::kRead, 0, 4096).status, tfs::Status(tfs::Err::kIo));  // powered off
  t.dev->PowerOn();
  EXPECT_TRUE(b.Sync(IoOp::kRead, 0, 4096).status.ok());
  return Raw(t.mem, 0, 4 << 20);
}

TEST(PowerCut, FlushedDataAlwaysSurvives) {
  for (uint64_t seed : {1, 2, 3, 4, 5}) {
    std::vector<uint8_t> img = CutImage(seed);
    for (int i = 0; i < 64; i++) {
      for (int s = 0; s < 8; s++) {
        uint8_t v = img[size_t(i) * 4096 + size_t(s) * 512];
        if (i < 16) {
          ASSERT_EQ(v, uint8_t(0xA0 + i)) << "flushed block " << i << " lost, seed " << seed;
        } else if (i < 32) {
          ASSERT_TRUE(v == uint8_t(0xA0 + i) || v == uint8_t(0x10 + i)) << "block " << i << " seed " << seed;
        } else {
          ASSERT_TRUE(v == 0 || v == uint8_t(0x10 + i)) << "block " << i << " seed " << seed;
        }
      }
    }
  }
}

TEST(PowerCut, SameSeedSameImageDifferentSeedDifferentImage) {
  CutOutcome o1, o2;
  std::vector<uint8_t> a = CutImage(42, &o1), b = CutImage(42, &o2), c = CutImage(43);
  EXPECT_TRUE(a == b) << "same seed, different images";
  EXPECT_TRUE(a != c) << "different seeds, same image";
  EXPECT_EQ(o1.kept + o1.dropped + o1.torn, 48u);
  EXPECT_GT(o1.kept, 0u);
  EXPECT_GT(o1.dropped, 0u);
}

TEST(PowerCut, TriggeredAfterNWrites) {
  auto t = MakeDevice(MustParse(std::string(kCache) + "powercut_after_writes = 5\n"));
  Batch b(*t.dev);
  for (int i = 0; i < 5; i++) EXPECT_TRUE(b.Sync(IoOp::kWrite, uint64_t(i) * 4096, 4096, 1).status.ok());
  uint64_t deadline = NowNs() + 2'000'000'000ull;
  while (t.dev->powered() && NowNs() < deadline) usleep(1000);
  EXPECT_FALSE(t.dev->powered());
  EXPECT_EQ(b.Sync(IoOp::kWrite, 0, 4096, 1).status, tfs::Status(tfs::Err::kIo));
  EXPECT_EQ(t.dev->Stats().power_cuts, 1u);
}

// The Nth flush is never served: the cut comes first, and the writes it would
// have made durable meet their fate (keep = 0: none survives).
TEST(PowerCut, TriggeredAtTheNthFlushBeforeItIsServed) {
  auto t = MakeDevice(MustParse("[cache]\nkeep = 0\ndrop = 1\ntear = 0\npowercut_at_flush = 2\n"));
  Batch b(*t.dev);
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 0, 4096, 1).status.ok());
  EXPECT_TRUE(b.Sync(IoOp::kFlush, 0, 0).status.ok());  // the first flush is served
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 4096, 4096, 2).status.ok());
  EXPECT_EQ(b.Sync(IoOp::kFlush, 0, 0).status, tfs::Status(tfs::Err::kIo));
  EXPECT_FALSE(t.dev->powered());
  t.dev->Drain();
  EXPECT_EQ(Raw(t.mem, 0, 4096), std::vector<uint8_t>(4096, 1));
  EXPECT_EQ(Raw(t.mem, 4096, 4096), std::vector<uint8_t>(4096, 0));
  EXPECT_EQ(t.dev->Stats().power_cuts, 1u);
  EXPECT_EQ(t.dev->Stats().cut_dropped, 1u);
}

// ignore_flushes: a drive that lies -- the flush and the FUA write succeed and
// the cut still loses them.
TEST(PowerCut, ALyingDriveLosesWhatItCalledDurable) {
  auto t = MakeDevice(MustParse("[cache]\nkeep = 0\ndrop = 1\ntear = 0\nignore_flushes = true\n"));
  Batch b(*t.dev);
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 0, 4096, 1).status.ok());
  EXPECT_TRUE(b.Sync(IoOp::kFlush, 0, 0).status.ok());
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 4096, 4096, 2, tfs::IoRequest::kFua).status.ok());
  t.dev->PowerCut();
  EXPECT_EQ(Raw(t.mem, 0, 8192), std::vector<uint8_t>(8192, 0));
  EXPECT_EQ(t.dev->Stats().cut_dropped, 2u);
}

// powercut_origin: only that origin's writes count toward powercut_after_writes.
TEST(PowerCut, TriggerCountsOnlyItsOrigin) {
  auto t = MakeDevice(MustParse(std::string(kCache) + "powercut_after_writes = 2\npowercut_origin = \"btree\"\n"));
  Batch b(*t.dev);
  for (int i = 0; i < 6; i++) EXPECT_TRUE(b.Sync(IoOp::kWrite, uint64_t(i) * 4096, 4096, 1).status.ok());
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 65536, 4096, 2, 0, tfs::IoOrigin::kBtree).status.ok());
  usleep(50'000);
  EXPECT_TRUE(t.dev->powered()) << "writes of another origin counted";
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 69632, 4096, 3, 0, tfs::IoOrigin::kBtree).status.ok());
  uint64_t deadline = NowNs() + 2'000'000'000ull;
  while (t.dev->powered() && NowNs() < deadline) usleep(1000);
  EXPECT_FALSE(t.dev->powered());
  EXPECT_EQ(t.dev->Stats().power_cuts, 1u);
}

TEST(PowerCut, TriggeredAtATime) {
  auto t = MakeDevice(MustParse(std::string(kCache) + "powercut_at_s = 0.2\n"));
  Batch b(*t.dev);
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 0, 4096, 3).status.ok());
  EXPECT_TRUE(t.dev->powered());
  uint64_t deadline = NowNs() + 3'000'000'000ull;
  while (t.dev->powered() && NowNs() < deadline) usleep(5000);
  EXPECT_FALSE(t.dev->powered());
  EXPECT_EQ(t.dev->Stats().power_cuts, 1u);
  EXPECT_EQ(t.dev->Stats().cut_kept + t.dev->Stats().cut_dropped + t.dev->Stats().cut_torn, 1u);
}

TEST(PowerCut, RecordsRoundTripThroughAFile) {
  std::deque<CacheRecord> recs;
  recs.push_back({3, 4096, std::vector<uint8_t>(1024, 5)});
  recs.push_back({4, 0, std::vector<uint8_t>(512, 6)});
  std::string path = "/tmp/faultdev-cache-test-" + std::to_string(getpid());
  std::string error;
  ASSERT_TRUE(SaveRecords(path, 512, recs, &error)) << error;
  uint32_t sector = 0;
  std::deque<CacheRecord> back;
  ASSERT_TRUE(LoadRecords(path, &sector, &back, &error)) << error;
  EXPECT_EQ(sector, 512u);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].offset, 4096u);
  EXPECT_EQ(back[1].data, recs[1].data);
  FILE* f = fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  fputs("garbage!", f);
  fclose(f);
  back.clear();
  EXPECT_FALSE(LoadRecords(path, &sector, &back, &error));
  EXPECT_NE(error.find("not a faultdev cache record file"), std::string::npos);
  unlink(path.c_str());
}

// Regression: a write parked while the cache held at most half its size planned an
// empty write-back, which finished at once and started another: endless recursion.
TEST(VolatileCache, ParkedWriteInASmallCacheCompletes) {
  auto t = MakeDevice(MustParse("[cache]\nsize = 8192\n"));
  Batch b(*t.dev);
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 0, 512, 1).status.ok());
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 4096, 8192, 2).status.ok());  // does not fit beside the first
  EXPECT_TRUE(b.Sync(IoOp::kWrite, 65536, 32768, 3).status.ok());  // larger than the whole cache
  EXPECT_TRUE(b.Sync(IoOp::kFlush, 0, 0).status.ok());
  t.dev->Drain();
  EXPECT_EQ(Raw(t.mem, 0, 512), std::vector<uint8_t>(512, 1));
  EXPECT_EQ(Raw(t.mem, 4096, 8192), std::vector<uint8_t>(8192, 2));
  EXPECT_EQ(Raw(t.mem, 65536, 32768), std::vector<uint8_t>(32768, 3));
}

}  // namespace
}  // namespace faultdev
