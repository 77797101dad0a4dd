#include "dev/device_set.h"

#include <gtest/gtest.h>

#include "userspace/platform/io_testing.h"

namespace tfs::dev {
namespace {

TEST(DeviceSetTest, LabelsGroupsAndTargets) {
  userspace::ManualDevice a, b, c;
  DeviceSet set;
  ASSERT_TRUE(set.Add(&a, "ssd.nvme0", QueueConfig{}).ok());
  ASSERT_TRUE(set.Add(&b, "ssd.sata1", QueueConfig{}).ok());
  Result<Member*> m = set.Add(&c, "hdd", QueueConfig{});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->index(), 2u);
  EXPECT_STREQ((*m)->group(), "hdd");
  EXPECT_STREQ(set.member(0)->group(), "ssd");
  EXPECT_EQ(set.size(), 3u);
  EXPECT_EQ(set.all(), 0b111u);
  EXPECT_EQ(*set.ResolveTarget("ssd"), 0b011u);
  EXPECT_EQ(*set.ResolveTarget("ssd.sata1"), 0b010u);
  EXPECT_EQ(*set.ResolveTarget("hdd"), 0b100u);
  EXPECT_EQ(*set.ResolveTarget(""), 0u);
  EXPECT_EQ(*set.ResolveTarget("none"), 0u);
  EXPECT_TRUE(set.ResolveTarget("nvme").status().Is(ErrorClass::kNotFound));
  int n = 0;
  for (u32 i : Bits(0b1010)) n += int(i);
  EXPECT_EQ(n, 4);
}

TEST(DeviceSetTest, RejectsBadAndDuplicateLabels) {
  userspace::ManualDevice a;
  DeviceSet set;
  for (const char* bad : {"", ".x", "x.", "a.b.c", "UPPER", "has space", "none",
                          "a-very-long-label-that-is-over-31-chars"}) {
    EXPECT_TRUE(set.Add(&a, bad, QueueConfig{}).status().Is(ErrorClass::kInvalid)) << bad;
  }
  ASSERT_TRUE(set.Add(&a, "ssd.a", QueueConfig{}).ok());
  EXPECT_TRUE(set.Add(&a, "ssd.a", QueueConfig{}).status().Is(ErrorClass::kInvalid));
}

}  // namespace
}  // namespace tfs::dev
