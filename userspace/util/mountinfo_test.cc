#include "userspace/util/mountinfo.h"

#include <gtest/gtest.h>

namespace tfs::userspace {
namespace {

TEST(Mountinfo, ParsesALineWithOptionalFieldsAndEscapes) {
  MountinfoLine m;
  ASSERT_TRUE(ParseMountinfoLine(
      "36 35 0:44 / /mnt/with\\040space rw,nosuid shared:1 master:2 - fuse.tierfs /d/a.img:/d/b\\040c.img "
      "rw,user_id=0",
      &m));
  EXPECT_EQ(m.mount_point, "/mnt/with space");
  EXPECT_EQ(m.options, "rw,nosuid");
  EXPECT_EQ(m.fstype, "fuse.tierfs");
  EXPECT_EQ(m.source, "/d/a.img:/d/b c.img");
  EXPECT_EQ(m.super_options, "rw,user_id=0");
  ASSERT_TRUE(ParseMountinfoLine("1 0 8:1 / / rw - ext4 /dev/sda1", &m));  // no super options, no optional fields
  EXPECT_EQ(m.mount_point, "/");
  EXPECT_EQ(m.source, "/dev/sda1");
  EXPECT_EQ(m.super_options, "");
}

TEST(Mountinfo, RejectsWhatIsNotALine) {
  MountinfoLine m;
  m.fstype = "untouched";
  for (const char* bad : {"", "garbage line", "1 0 8:1 / / rw ext4 /dev/sda1", "1 0 8:1 / / rw - ext4",
                          "1 0 8:1 / - rw ext4 /dev/sda1"}) {
    EXPECT_FALSE(ParseMountinfoLine(bad, &m)) << bad;
  }
  EXPECT_EQ(m.fstype, "untouched");
}

TEST(Mountinfo, UnescapeDecodesOnlyThreeOctalDigits) {
  EXPECT_EQ(UnescapeMountinfo("a\\040b\\011c\\134d"), "a b\tc\\d");
  EXPECT_EQ(UnescapeMountinfo("x\\09y"), "x\\09y");   // 9 is not octal
  EXPECT_EQ(UnescapeMountinfo("end\\04"), "end\\04");  // cut short
}

}  // namespace
}  // namespace tfs::userspace
