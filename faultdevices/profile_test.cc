// Profiles: every shipped profile loads, the schema rejects mistakes with one line
// naming file, line and key, and overrides and `base` merge as documented.
#include "faultdevices/profile.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace faultdev {
namespace {

std::optional<Profile> Parse(const std::string& text, std::string* error,
                             const std::vector<std::string>& sets = {}) {
  return ParseProfile(text, "test.toml", sets, error);
}

TEST(Profile, EveryShippedProfileLoads) {
  std::vector<std::string> required = {"nvme",      "sata-ssd",  "hdd-7200",    "hdd-fixed-10ms", "hdd-smr-dm",
                                       "hdd-stall", "hdd-timeout", "hdd-flaky", "powercut"};
  for (const std::string& name : required) {
    std::string path = FindProfile(name);
    ASSERT_FALSE(path.empty()) << name;
  }
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(ProfileDir())) {
    if (e.path().extension() != ".toml") continue;
    std::string error;
    std::optional<Profile> p = LoadProfile(e.path().string(), {}, &error);
    EXPECT_TRUE(p.has_value()) << error;
    if (p) {
      EXPECT_FALSE(p->description.empty()) << e.path();
    }
    n++;
  }
  EXPECT_GE(n, 9);
}

TEST(Profile, ShippedShapes) {
  std::string error;
  auto fixed = LoadProfile(FindProfile("hdd-fixed-10ms"), {}, &error);
  ASSERT_TRUE(fixed) << error;
  ASSERT_TRUE(fixed->delay);
  EXPECT_EQ(fixed->delay->base_ns[0], 10'000'000u);
  auto stall = LoadProfile(FindProfile("hdd-stall"), {}, &error);
  ASSERT_TRUE(stall) << error;
  EXPECT_TRUE(stall->hdd.has_value());  // from base = "hdd-7200"
  EXPECT_EQ(stall->stall.period_ns, 60'000'000'000u);
  EXPECT_EQ(stall->stall.duration_ns, 10'000'000'000u);
  auto timeout = LoadProfile(FindProfile("hdd-timeout"), {}, &error);
  ASSERT_TRUE(timeout) << error;
  EXPECT_TRUE(timeout->timeout.enabled);
  EXPECT_EQ(timeout->timeout.duration_ns, 30'000'000'000u);
  auto flaky = LoadProfile(FindProfile("hdd-flaky"), {}, &error);
  ASSERT_TRUE(flaky) << error;
  ASSERT_EQ(flaky->errors.size(), 1u);
  EXPECT_EQ(flaky->errors[0].offset, 16u << 20);
  EXPECT_TRUE(flaky->errors[0].reads);
  EXPECT_FALSE(flaky->errors[0].writes);
  auto smr = LoadProfile(FindProfile("hdd-smr-dm"), {}, &error);
  ASSERT_TRUE(smr) << error;
  ASSERT_TRUE(smr->smr);
  EXPECT_DOUBLE_EQ(smr->smr->media_cache_percent, 1.0);
  auto pc = LoadProfile(FindProfile("powercut"), {}, &error);
  ASSERT_TRUE(pc) << error;
  EXPECT_TRUE(pc->cache.enabled);
  EXPECT_NEAR(pc->cache.keep + pc->cache.drop + pc->cache.tear, 1.0, 1e-9);
}

TEST(Profile, UnknownKeyNamesFileLineAndKey) {
  std::string error;
  EXPECT_FALSE(Parse("[delay]\nread_ms = 1\nraed_ms = 2\n", &error));
  EXPECT_EQ(error, "test.toml:3: delay.raed_ms: unknown key");
  EXPECT_EQ(error.find('\n'), std::string::npos);
}

TEST(Profile, UnknownSection) {
  std::string error;
  EXPECT_FALSE(Parse("seed = 3\n\n[hddd]\nrpm = 1\n", &error));
  EXPECT_EQ(error, "test.toml:3: hddd: unknown key or section");
}

TEST(Profile, WrongTypeAndRange) {
  std::string error;
  EXPECT_FALSE(Parse("[hdd]\nrpm = \"fast\"\n", &error));
  EXPECT_EQ(error, "test.toml:2: hdd.rpm: must be a number");
  EXPECT_FALSE(Parse("[hdd]\nrpm = 99\n", &error));
  EXPECT_NE(error.find("test.toml:2: hdd.rpm: must be between 1000 and 20000"), std::string::npos) << error;
  EXPECT_FALSE(Parse("[queue]\nmax_in_flight = 1.5\n", &error));
  EXPECT_EQ(error, "test.toml:2: queue.max_in_flight: must be an integer");
  EXPECT_FALSE(Parse("[cache]\nsize = \"12 parsecs\"\n", &error));
  EXPECT_NE(error.find("test.toml:2: cache.size: must be bytes or a size"), std::string::npos) << error;
  EXPECT_FALSE(Parse("[[errors]]\noffset = 0\nlength = 512\nmode = \"sometimes\"\n", &error));
  EXPECT_EQ(error, "test.toml:4: errors.mode: must be one of persistent, once, rate");
  EXPECT_FALSE(Parse("[cache]\npowercut_origin = \"checkpoint\"\n", &error));
  EXPECT_NE(error.find("test.toml:2: cache.powercut_origin: must be one of foreground_read,"), std::string::npos)
      << error;
  EXPECT_FALSE(Parse("[cache]\npowercut_at_flush = -1\n", &error));
  EXPECT_NE(error.find("cache.powercut_at_flush"), std::string::npos) << error;
  // Regression: 1e-300 MB/s made the transfer time infinite (UB converting to uint64_t).
  EXPECT_FALSE(Parse("[bandwidth]\nmb_s = 1e-300\n", &error));
  EXPECT_EQ(error, "test.toml:2: bandwidth.mb_s: must be 0 (unlimited) or at least 0.001");
  EXPECT_TRUE(Parse("[bandwidth]\nmb_s = 0\n", &error)) << error;
  EXPECT_TRUE(Parse("[bandwidth]\nmb_s = 0.001\n", &error)) << error;
}

TEST(Profile, SyntaxErrorHasLine) {
  std::string error;
  EXPECT_FALSE(Parse("[delay]\nread_ms = = 3\n", &error));
  EXPECT_EQ(error.rfind("test.toml:2: syntax: ", 0), 0u) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos);
}

TEST(Profile, ConsistencyChecks) {
  std::string error;
  EXPECT_FALSE(Parse("[smr]\nmedia_cache = \"1GiB\"\n", &error));
  EXPECT_NE(error.find("smr: needs an [hdd] section"), std::string::npos) << error;
  EXPECT_FALSE(Parse("[timeout]\nduration_s = 1\n", &error));
  EXPECT_NE(error.find("timeout: needs exactly one of"), std::string::npos) << error;
  EXPECT_FALSE(Parse("[stall]\nperiod_s = 5\nduration_s = 5\n", &error));
  EXPECT_EQ(error, "test.toml:3: stall.duration_s: must be shorter than stall.period_s");
  EXPECT_FALSE(Parse("[hdd]\naverage_seek_ms = 30\n", &error));
  EXPECT_NE(error.find("hdd.average_seek_ms"), std::string::npos) << error;
}

TEST(Profile, SizesUnitsAndDurations) {
  std::string error;
  auto p = Parse(
      "[cache]\nsize = \"2MiB\"\n[delay]\nread_ms = 1.5\njitter = \"uniform\"\nwrite_jitter_ms = 0.25\n"
      "[stall]\nscripted = [[1, 0.5], [3, 2]]\n[[errors]]\noffset = \"1KB\"\nlength = 4096\nops = \"both\"\n"
      "mode = \"rate\"\nrate = 0.5\n",
      &error);
  ASSERT_TRUE(p) << error;
  EXPECT_EQ(p->cache.size_bytes, 2u << 20);
  EXPECT_EQ(p->delay->base_ns[0], 1'500'000u);
  EXPECT_EQ(p->delay->jitter_ns[1], 250'000u);
  EXPECT_EQ(p->delay->jitter, Jitter::kUniform);
  ASSERT_EQ(p->stall.scripted.size(), 2u);
  EXPECT_EQ(p->stall.scripted[1].at_ns, 3'000'000'000u);
  EXPECT_EQ(p->stall.scripted[1].duration_ns, 2'000'000'000u);
  EXPECT_EQ(p->errors[0].offset, 1000u);
  EXPECT_TRUE(p->errors[0].reads && p->errors[0].writes);
  EXPECT_EQ(p->errors[0].mode, ErrorMode::kRate);
}

TEST(Profile, OverridesMergeAndReportTheirSource) {
  std::string error;
  auto p = LoadProfile(FindProfile("hdd-timeout"), {"timeout.duration_s=0.5", "seed=42"}, &error);
  ASSERT_TRUE(p) << error;
  EXPECT_EQ(p->timeout.duration_ns, 500'000'000u);
  EXPECT_EQ(p->seed, 42u);
  EXPECT_EQ(p->timeout.after_requests, 1000u);  // untouched
  auto smr = LoadProfile(FindProfile("hdd-smr-dm"), {"smr.band=8MiB"}, &error);  // bare word = string
  ASSERT_TRUE(smr) << error;
  EXPECT_EQ(smr->smr->band_bytes, 8u << 20);
  EXPECT_FALSE(LoadProfile(FindProfile("hdd-timeout"), {"timeout.duraton_s=1"}, &error));
  EXPECT_EQ(error, "--set 'timeout.duraton_s=1':1: timeout.duraton_s: unknown key");
  EXPECT_FALSE(LoadProfile(FindProfile("hdd-timeout"), {"nonsense"}, &error));
  EXPECT_EQ(error, "--set 'nonsense': expected section.key=value");
}

TEST(Profile, BaseKeepsTheFilesOwnLines) {
  std::string error;
  auto p = Parse("base = \"hdd-7200\"\n[hdd]\nrpm = 5400\n", &error);
  ASSERT_TRUE(p) << error;
  EXPECT_EQ(p->hdd->rpm, 5400);
  EXPECT_EQ(p->hdd->average_seek_ns, 8'500'000u);  // from the base
  EXPECT_FALSE(Parse("base = \"hdd-7200\"\n\n[stall]\nperod_s = 1\n", &error));
  EXPECT_EQ(error, "test.toml:4: stall.perod_s: unknown key");
}

TEST(Profile, MissingFileAndBadBase) {
  std::string error;
  EXPECT_FALSE(LoadProfile("/nonexistent/x.toml", {}, &error));
  EXPECT_EQ(error, "/nonexistent/x.toml: cannot open profile");
  EXPECT_FALSE(Parse("base = \"no-such-profile\"\n", &error));
  EXPECT_EQ(error, "test.toml:1: base: no profile named 'no-such-profile'");
}

}  // namespace
}  // namespace faultdev
