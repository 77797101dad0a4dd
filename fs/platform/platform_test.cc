// Tests of the seam through its core-side C++ API (the userspace implementation
// underneath): checksums, compression, logging, time, threads, memory.
#include "platform/platform.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "platform/atomic.h"
#include "platform/block_device.h"
#include "platform/sync.h"

namespace tfs::platform {
namespace {

TEST(Crc32cTest, KnownVectors) {
  // The standard check value, and vectors from RFC 3720 (iSCSI) appendix B.4.
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  std::vector<u8> zeros(32, 0), ones(32, 0xff), inc(32), dec(32);
  for (int i = 0; i < 32; i++) {
    inc[i] = u8(i);
    dec[i] = u8(31 - i);
  }
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(dec.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(Crc32c("", 0), 0u);
}

TEST(Crc32cTest, ExtendEqualsWhole) {
  std::string s = "the quick brown fox jumps over the lazy dog, twice or more";
  for (size_t cut = 0; cut <= s.size(); cut++) {
    u32 a = Crc32c(s.data(), cut);
    EXPECT_EQ(Crc32cExtend(a, s.data() + cut, s.size() - cut), Crc32c(s.data(), s.size()));
  }
}

TEST(ZstdTest, RoundTrip) {
  std::string text;
  for (int i = 0; i < 2000; i++) text += "tierfs keeps fast data fast " + std::to_string(i % 17);
  std::vector<u8> packed(ZstdBound(text.size()));
  Result<usize> n = ZstdCompress(packed.data(), packed.size(), text.data(), text.size());
  ASSERT_TRUE(n.ok());
  EXPECT_LT(*n, text.size() / 4);
  std::string out(text.size(), '\0');
  Result<usize> m = ZstdDecompress(out.data(), out.size(), packed.data(), *n);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, text.size());
  EXPECT_EQ(out, text);
}

TEST(ZstdTest, ErrorsAreStatuses) {
  std::mt19937 rng(7);
  std::vector<u8> noise(4096);
  for (auto& b : noise) b = u8(rng());
  std::vector<u8> tiny(16);
  // Incompressible data does not fit in a small buffer: kNoSpace, not a crash.
  EXPECT_TRUE(ZstdCompress(tiny.data(), tiny.size(), noise.data(), noise.size()).status().Is(ErrorClass::kNoSpace));
  // Garbage is corrupt input.
  std::vector<u8> out(8192);
  EXPECT_TRUE(ZstdDecompress(out.data(), out.size(), noise.data(), noise.size()).status().Is(ErrorClass::kCorrupt));
  // A valid frame whose output does not fit.
  std::string text(10000, 'a');
  std::vector<u8> packed(ZstdBound(text.size()));
  usize n = *ZstdCompress(packed.data(), packed.size(), text.data(), text.size());
  EXPECT_TRUE(ZstdDecompress(out.data(), 100, packed.data(), n).status().Is(ErrorClass::kNoSpace));
  // Truncated frame.
  EXPECT_FALSE(ZstdDecompress(out.data(), out.size(), packed.data(), n / 2).ok());
}

TEST(LogTest, LevelFiltersAndFormats) {
  LogLevel saved = GetLogLevel();
  SetLogLevel(LogLevel::kError);
  testing::internal::CaptureStderr();
  Log(LogLevel::kInfo, "hidden %d", 1);
  Log(LogLevel::kError, "shown %d %s", 42, "x");
  std::string err = testing::internal::GetCapturedStderr();
  SetLogLevel(saved);
  EXPECT_EQ(err.find("hidden"), std::string::npos);
  EXPECT_NE(err.find("tierfs error: shown 42 x"), std::string::npos);
}

TEST(FormatTest, TruncatesAndTerminates) {
  char buf[8];
  int n = Format(buf, sizeof(buf), "%s-%d", "abcdef", 12345);
  EXPECT_EQ(n, 12);
  EXPECT_STREQ(buf, "abcdef-");
}

TEST(TimeTest, MonotonicAndSleeps) {
  u64 a = NowNs();
  SleepNs(2 * kNsPerMs);
  u64 b = NowNs();
  EXPECT_GE(b - a, 2 * kNsPerMs);
}

void Bump(void* arg) { static_cast<Atomic<u32>*>(arg)->FetchAdd(1); }

TEST(ThreadTest, StartAndJoin) {
  Atomic<u32> count(0);
  Thread threads[4];
  for (auto& t : threads) ASSERT_TRUE(t.Start(Bump, &count, "test-worker").ok());
  for (auto& t : threads) t.Join();
  EXPECT_EQ(count.Load(), 4u);
  EXPECT_FALSE(threads[0].running());
}

TEST(MemoryTest, AlignedZeroedAllocations) {
  for (usize align : {16, 64, 512, 4096}) {
    auto* p = static_cast<u8*>(Alloc(10000, align, /*zero=*/true));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uptr>(p) % align, 0u);
    for (int i = 0; i < 10000; i++) ASSERT_EQ(p[i], 0);
    Free(p);
  }
  EXPECT_EQ(Alloc(64, 3), nullptr);  // not a power of two
  struct Obj {
    int a;
    explicit Obj(int v) : a(v) {}
  };
  Obj* o = New<Obj>(5);
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->a, 5);
  Delete(o);
}

// Userspace builds compile the allocation scopes out (fs/CMakeLists.txt:
// TFS_NOFS_SCOPES=0; nothing there reads them but the lock checks), so a lock
// guard pays no seam call for its scope. Where the checks are on (debug
// builds, fs/checked/) the header turns them back on, and
// fs/checked/lock_rules_test.cc tests them.
TEST(NoFsScopeTest, CompiledOutOfUserspaceBuilds) {
#if TFS_LOCK_CHECKS
  static_assert(TFS_NOFS_SCOPES == 1, "the lock checks need the allocation scopes");
  GTEST_SKIP() << "lock checks on: the scopes are on (fs/checked/lock_rules_test.cc tests them)";
#else
  static_assert(TFS_NOFS_SCOPES == 0, "tierfs_core's PUBLIC TFS_NOFS_SCOPES=0 did not reach this test");
  static_assert(sizeof(NoFsScope) == sizeof(u32), "same layout either way");
  NoFsScope nofs;
  EXPECT_FALSE(InNoFs());
  Mutex m;
  {
    MutexLock l(m);
    EXPECT_FALSE(InNoFs());
  }
#endif
}

TEST(RandomTest, FillsBytes) {
  u8 a[32] = {}, b[32] = {};
  RandomBytes(a, sizeof(a));
  RandomBytes(b, sizeof(b));
  EXPECT_NE(memcmp(a, b, sizeof(a)), 0);
}

TEST(OriginTest, NamesRoundTrip) {
  for (int i = 0; i < kIoOriginCount; i++) {
    const char* name = IoOriginName(IoOrigin(i));
    Result<IoOrigin> back = IoOriginFromName(name);
    ASSERT_TRUE(back.ok()) << name;
    EXPECT_EQ(int(*back), i);
  }
  EXPECT_STREQ(IoOriginName(IoOrigin::kForegroundRead), "foreground_read");
  EXPECT_STREQ(IoOriginName(IoOrigin::kCopygc), "copygc");
  EXPECT_STREQ(IoOriginName(IoOrigin::kAlloc), "alloc");
  EXPECT_TRUE(IoOriginFromName("bogus").status().Is(ErrorClass::kNotFound));
  EXPECT_STREQ(IoOpName(IoOp::kFlush), "flush");
}

}  // namespace
}  // namespace tfs::platform
