#include "userspace/platform/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace tfs::userspace {
namespace {

uint32_t Standard(uint32_t (*fn)(uint32_t, const void*, size_t), const void* p, size_t n) {
  return ~fn(~0u, p, n);
}

TEST(Crc32cImplTest, SoftwareKnownVector) {
  EXPECT_EQ(Standard(Crc32cSoftware, "123456789", 9), 0xE3069283u);
}

TEST(Crc32cImplTest, HardwareMatchesSoftwareAtEveryAlignmentAndLength) {
  if (!CpuHasSse42()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  EXPECT_EQ(Standard(Crc32cHardware, "123456789", 9), 0xE3069283u);
  std::mt19937 rng(3);
  std::vector<uint8_t> buf(4096 + 16);
  for (auto& b : buf) b = uint8_t(rng());
  for (size_t off = 0; off < 16; off++) {
    for (size_t len : {0, 1, 7, 8, 9, 63, 64, 65, 1000, 4096}) {
      EXPECT_EQ(Crc32cHardware(0x1234u, buf.data() + off, len),
                Crc32cSoftware(0x1234u, buf.data() + off, len))
          << off << " " << len;
    }
  }
}

}  // namespace
}  // namespace tfs::userspace
