// RefusalLog: what a caller chose cannot forge or flood the mount's log --
// control bytes shown as '?', names and values cut at 64 bytes, at most 10
// lines per 10 s with one "suppressed" line when logging resumes. The clock
// is injected: no test here waits.
#include "userspace/fuse/refusal_log.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tfs::fuse {
namespace {

int64_t fake_now = 0;
int64_t FakeNow() { return fake_now; }

constexpr char kWhy[] = "names no member or group of this filesystem";

TEST(RefusalLogTest, NamesAndValuesAreOneLineEach) {
  RefusalLog log(FakeNow);
  fake_now = 0;
  auto lines = log.Refused("setxattr", 12, "tierfs.foreground_target", "nvme", 4, kWhy);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], std::string("setxattr tierfs.foreground_target=\"nvme\" on inode 12 refused: ") + kWhy);
  // A name and a value that would forge lines of their own.
  const std::string name = "tierfs.x\nsetxattr tierfs.replicas=\"2\" on inode 1 refused: forged\r";
  const std::string value = "a\nb\x7f\x01";
  lines = log.Refused("setxattr", 7, name.c_str(), value.data(), value.size(), kWhy);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].find('\n'), std::string::npos) << lines[0];
  EXPECT_EQ(lines[0].find('\r'), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("tierfs.x?setxattr"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("=\"a?b??\""), std::string::npos) << lines[0];
  // Long ones are cut at 64 bytes; a remove has no value.
  const std::string long_name = "tierfs." + std::string(200, 'n');
  lines = log.Refused("removexattr", 3, long_name.c_str(), nullptr, 0, "not an option");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "removexattr " + long_name.substr(0, 64) + " on inode 3 refused: not an option");
  const std::string long_value(1000, 'v');
  lines = log.Refused("setxattr", 3, "tierfs.replicas", long_value.data(), long_value.size(), "x");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("=\"" + std::string(64, 'v') + "\" on"), std::string::npos) << lines[0];
  EXPECT_EQ(RefusalLog::Shown(std::string("\0\t ok", 5).data(), 5), "?? ok");
}

TEST(RefusalLogTest, AtMostTenLinesPerTenSecondsThenOneSuppressedLine) {
  RefusalLog log(FakeNow);
  fake_now = 1'000;
  auto refuse = [&] { return log.Refused("setxattr", 5, "tierfs.replicas", "9", 1, "replicas must be 1, 2, 3 or 4"); };
  for (int i = 0; i < 10; i++) ASSERT_EQ(refuse().size(), 1u) << i;
  for (int i = 0; i < 25; i++) {
    fake_now += 100'000'000;  // 2.5 s in all: still the same window
    EXPECT_TRUE(refuse().empty()) << i;
  }
  fake_now = 1'000 + RefusalLog::kWindowNs;  // the window is over
  auto lines = refuse();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("25 refusal(s) of tierfs.* option changes suppressed", 0), 0u) << lines[0];
  EXPECT_NE(lines[1].find("tierfs.replicas=\"9\""), std::string::npos) << lines[1];
  // A new window of ten; the count starts again.
  for (int i = 0; i < 9; i++) ASSERT_EQ(refuse().size(), 1u) << i;
  EXPECT_TRUE(refuse().empty());
  fake_now += RefusalLog::kWindowNs;
  lines = refuse();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("1 refusal(s)", 0), 0u) << lines[0];
  // Without suppressions, a new window logs no extra line.
  fake_now += RefusalLog::kWindowNs;
  EXPECT_EQ(refuse().size(), 1u);
}

}  // namespace
}  // namespace tfs::fuse
