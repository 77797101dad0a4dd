// JSON writer and mountinfo parsing: the two pieces of the results document that
// are easy to get subtly wrong (commas and escapes; longest-prefix mount lookup).
#include "workloads/probe/json.h"

#include <gtest/gtest.h>

#include <cmath>

#include "workloads/probe/host.h"

namespace tfs::probe {
namespace {

TEST(JsonWriterTest, NestsAndEscapes) {
  JsonWriter w;
  w.BeginObject();
  w.Key("a");
  w.BeginArray();
  w.Uint(1);
  w.Int(-2);
  w.Double(0.5);
  w.Double(NAN);
  w.EndArray();
  w.Key("s\"");
  w.String("x\\y\n\t\x01");
  w.Key("o");
  w.BeginObject();
  w.EndObject();
  w.Key("b");
  w.Bool(true);
  w.Key("n");
  w.Null();
  w.EndObject();
  EXPECT_EQ(w.str(),
            "{\"a\":[1,-2,0.5,null],\"s\\\"\":\"x\\\\y\\n\\t\\u0001\",\"o\":{},\"b\":true,"
            "\"n\":null}");
}

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
