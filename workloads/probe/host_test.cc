// Mountinfo parsing (longest-prefix mount lookup) and time formatting for the
// results manifest.
#include "workloads/probe/host.h"

#include <gtest/gtest.h>

namespace tfs::probe {
namespace {

constexpr const char* kMountinfo =
    "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "30 22 0:25 / /tmp rw,nosuid shared:2 - tmpfs tmpfs rw,size=1024k\n"
    "31 22 0:26 / /tmpx rw - tmpfs other rw\n"
    "32 22 7:0 / /mnt/with\\040space rw,noatime - ext4 /dev/loop0 rw,errors=remount-ro\n";

TEST(HostTest, FindsLongestMatchingMount) {
  MountInfo m;
  ASSERT_TRUE(FindMount(kMountinfo, "/tmp/a/b", &m));
  EXPECT_EQ(m.mount_point, "/tmp");
  EXPECT_EQ(m.fstype, "tmpfs");
  EXPECT_EQ(m.super_options, "rw,size=1024k");
  ASSERT_TRUE(FindMount(kMountinfo, "/tmpx", &m));
  EXPECT_EQ(m.source, "other");
  ASSERT_TRUE(FindMount(kMountinfo, "/tmpfoo", &m));  // a prefix of the name is not a parent
  EXPECT_EQ(m.mount_point, "/");
  ASSERT_TRUE(FindMount(kMountinfo, "/mnt/with space/d", &m));
  EXPECT_EQ(m.source, "/dev/loop0");
  EXPECT_EQ(m.options, "rw,noatime");
  EXPECT_FALSE(FindMount("garbage line\n", "/x", &m));
}

TEST(HostTest, IsoTimeFormatsUtcMilliseconds) {
  EXPECT_EQ(IsoTime(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(IsoTime(1'700'000'000'123'456'789ull), "2023-11-14T22:13:20.123Z");
}

}  // namespace
}  // namespace tfs::probe
